//! The managed lifecycle across real processes: reference counting, collective release and
//! restart, classification of every failure, injected faults and killed ranks at every stage,
//! and threads racing a restart.

use std::sync::Arc;

use hm_testkit::{is_pe, print_error, u8_spec, Job, Options, MIB};
use hyper_multicore::control::GroupChannel;
use hyper_multicore::lifecycle::{self, Replacement, Stage, FAULT_VARIABLE};
use hyper_multicore::shmem::{AllocationSpec, Dtype, Symmetric};
use hyper_multicore::world::World;
use hyper_multicore::{ErrorKind, Recovery};

#[test]
fn references_are_counted_and_the_last_release_shuts_down() {
    if is_pe() {
        lifecycle::acquire(None, Some(8 * MIB)).unwrap();
        lifecycle::acquire(None, None).unwrap();
        lifecycle::acquire(None, Some(4 * MIB)).unwrap();
        assert_eq!(lifecycle::reference_count(), 3);
        lifecycle::quiet().unwrap();
        lifecycle::fence().unwrap();
        let error = lifecycle::acquire(None, Some(16 * MIB)).unwrap_err();
        assert!(error.to_string().contains("larger heap"), "{error}");
        assert_eq!(lifecycle::debug_state().reference_count, Some(3));
        lifecycle::release().unwrap();
        lifecycle::release().unwrap();
        assert_eq!(lifecycle::reference_count(), 1);
        assert!(
            lifecycle::debug_state().heap.is_some(),
            "one reference keeps the runtime"
        );
        lifecycle::release().unwrap();
        assert_eq!(lifecycle::reference_count(), 0);
        let state = lifecycle::debug_state();
        assert!(state.heap.is_none() && state.allocations.is_empty() && state.root_rank.is_none());
        let error = lifecycle::release().unwrap_err();
        assert!(error.to_string().contains("no reference"), "{error}");
        let error = lifecycle::guarded("put", |_| Ok(())).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::InvalidState);
        // A quiet or fence needs a runtime too, even where it is a memory fence alone.
        for error in [lifecycle::quiet(), lifecycle::fence()].map(Result::unwrap_err) {
            assert_eq!(error.kind(), ErrorKind::InvalidState);
            assert!(error.to_string().contains("no reference"), "{error}");
        }
        // A new lifetime with another heap size.
        lifecycle::acquire(None, Some(12 * MIB)).unwrap();
        assert_eq!(
            lifecycle::guarded("heap", |s| Ok(s.heap_size())).unwrap(),
            12 * MIB
        );
        lifecycle::host_barrier().unwrap();
        lifecycle::release().unwrap();
        return;
    }
    Job::launch("references_are_counted_and_the_last_release_shuts_down", 3)
        .wait()
        .assert_all_succeeded();
}

#[test]
fn a_second_acquire_must_name_the_same_ordered_group() {
    if is_pe() {
        let world = World::global().unwrap();
        let members: Vec<usize> = if world.rank() < 2 {
            vec![1, 0]
        } else {
            vec![2, 3]
        };
        let group: Arc<dyn GroupChannel> = Arc::new(world.new_group(&members).unwrap());
        lifecycle::acquire(Some(Arc::clone(&group)), Some(4 * MIB)).unwrap();
        assert_eq!(
            lifecycle::root_members(Some(group.as_ref())).unwrap(),
            members
        );
        let state = lifecycle::debug_state();
        assert_eq!(state.root_size, Some(2));
        let error = lifecycle::acquire(None, None).unwrap_err();
        print_error("MEMBERSHIP", &error);
        assert!(
            error.to_string().contains(&format!("{members:?}"))
                && error.to_string().contains("[0, 1, 2, 3]"),
            "{error}"
        );
        lifecycle::release().unwrap();
        return;
    }
    Job::launch("a_second_acquire_must_name_the_same_ordered_group", 4)
        .wait()
        .assert_all_succeeded();
}

#[test]
fn a_standalone_process_is_a_one_pe_root() {
    if is_pe() {
        return;
    }
    // This test process itself has no launcher environment: it is standalone.
    let run = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "standalone_body",
            "--exact",
            "--nocapture",
            "--ignored",
            "-q",
        ])
        .env("HM_TEST_STANDALONE", "1")
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(String::from_utf8_lossy(&run.stdout).contains("STANDALONE OK"));
}

#[test]
#[ignore = "run by a_standalone_process_is_a_one_pe_root in a clean process"]
fn standalone_body() {
    if std::env::var_os("HM_TEST_STANDALONE").is_none() {
        return;
    }
    assert_eq!(lifecycle::root_members(None).unwrap(), vec![0]);
    lifecycle::acquire(None, Some(4 * MIB)).unwrap();
    assert_eq!(lifecycle::debug_state().root_size, Some(1));
    let world = World::global().unwrap();
    let named: Arc<dyn GroupChannel> = world;
    let error = lifecycle::acquire(Some(named), None).unwrap_err();
    assert!(
        error.to_string().contains("no distributed world"),
        "{error}"
    );
    let counter = lifecycle::guarded("allocate", |s| s.allocate::<u64>(1, None)).unwrap();
    lifecycle::guarded("atomic", |s| s.atomic_add(&counter, 5u64, 0)).unwrap();
    assert_eq!(
        lifecycle::guarded("atomic", |s| s.atomic_fetch(&counter, 0)).unwrap(),
        5
    );
    lifecycle::guarded("free", |s| s.free(counter)).unwrap();
    lifecycle::release().unwrap();
    println!("STANDALONE OK");
}

#[test]
fn release_with_live_allocations_is_retryable_and_keeps_the_reference() {
    if is_pe() {
        lifecycle::acquire(None, Some(4 * MIB)).unwrap();
        let buffer = lifecycle::guarded("allocate", |s| s.allocate::<u8>(100, None)).unwrap();
        let error = lifecycle::release().unwrap_err();
        print_error("RELEASE", &error);
        assert_eq!(error.recovery(), Some(Recovery::Retryable));
        assert_eq!(error.stage(), Some("Preflight"));
        assert!(
            error.to_string().contains("the runtime remains usable"),
            "{error}"
        );
        assert!(
            error.to_string().contains("root_ranks=[0, 1, 2]"),
            "{error}"
        );
        assert_eq!(lifecycle::reference_count(), 1);
        lifecycle::guarded("put", |s| s.put(&buffer, &[1u8; 100], 0)).unwrap();
        lifecycle::guarded("free", |s| s.free(buffer)).unwrap();
        lifecycle::release().unwrap();
        assert_eq!(lifecycle::reference_count(), 0);
        return;
    }
    Job::launch(
        "release_with_live_allocations_is_retryable_and_keeps_the_reference",
        3,
    )
    .wait()
    .assert_all_succeeded();
}

/// Three allocations replaced by new shapes, dtypes and alignments on a doubled heap.
fn restart_targets() -> Vec<AllocationSpec> {
    vec![
        AllocationSpec {
            shape: vec![2, 512],
            dtype: Dtype::F32,
            alignment: None,
        },
        AllocationSpec {
            shape: vec![4096],
            dtype: Dtype::BF16,
            alignment: Some(4096),
        },
        AllocationSpec {
            shape: vec![3, 3, 3],
            dtype: Dtype::I64,
            alignment: Some(128),
        },
    ]
}

#[test]
fn restart_replaces_every_allocation_in_request_order() {
    if is_pe() {
        lifecycle::acquire(None, Some(8 * MIB)).unwrap();
        let (a, b, c) = lifecycle::guarded("allocate", |s| {
            Ok((
                s.allocate::<u8>(1000, None)?,
                s.allocate::<u64>(10, Some(256))?,
                s.allocate::<i32>(7, None)?,
            ))
        })
        .unwrap();
        let old_id = a.id();
        // Request order differs from allocation order.
        let replacements = vec![
            Replacement {
                current: c.region(),
                target: restart_targets()[0].clone(),
                preserve: false,
            },
            Replacement {
                current: a.region(),
                target: restart_targets()[1].clone(),
                preserve: false,
            },
            Replacement {
                current: b.region(),
                target: restart_targets()[2].clone(),
                preserve: false,
            },
        ];
        let mut snapshot = || Ok(b"same everywhere".to_vec());
        let result = lifecycle::restart(16 * MIB, &replacements, Some(&mut snapshot)).unwrap();
        let specs: Vec<AllocationSpec> =
            result.allocations.iter().map(|r| r.spec.clone()).collect();
        assert_eq!(specs, restart_targets());
        assert_eq!(result.allocations[1].offset % 4096, 0);
        assert_eq!(result.allocations[2].offset % 128, 0);
        let t = result.timings;
        println!("TIMINGS {t:?}");
        for ms in [
            t.preflight_ms,
            t.quiesce_ms,
            t.release_ms,
            t.finalize_ms,
            t.bootstrap_ms,
            t.initialize_ms,
            t.restore_ms,
        ] {
            assert!(ms > 0.0, "{t:?}");
        }
        // The data plane works on the new allocations; old handles are rejected.
        lifecycle::guarded("data", |s| {
            assert_eq!(s.heap_size(), 16 * MIB);
            let id = result.allocations[2].id;
            let record = s.resolve(id)?;
            assert_eq!(record.bytes, 27 * 8);
            let error = s.resolve(old_id).unwrap_err();
            assert!(
                error.to_string().contains("another runtime lifetime"),
                "{error}"
            );
            let error = s.put(&a, &[0u8; 1000], 0).unwrap_err();
            assert!(
                error.to_string().contains("another runtime lifetime"),
                "{error}"
            );
            s.barrier()?;
            for record in &result.allocations {
                s.free_id(record.id)?;
            }
            Ok(())
        })
        .unwrap();
        drop((a, b, c));
        lifecycle::release().unwrap();
        return;
    }
    Job::launch("restart_replaces_every_allocation_in_request_order", 2)
        .wait()
        .assert_all_succeeded();
}

#[test]
fn restart_arguments_are_checked_and_stay_retryable() {
    if is_pe() {
        let rank = World::global().unwrap().rank();
        lifecycle::acquire(None, Some(8 * MIB)).unwrap();
        let (a, b) = lifecycle::guarded("allocate", |s| {
            Ok((s.allocate::<u8>(64, None)?, s.allocate::<u8>(64, None)?))
        })
        .unwrap();
        let spec = u8_spec(vec![8]);
        let whole = |r| Replacement {
            current: r,
            target: spec.clone(),
            preserve: false,
        };
        let view = a.view(0..32).unwrap().region();
        let foreign = hyper_multicore::shmem::Region {
            id: hyper_multicore::shmem::AllocationId {
                index: 0,
                generation: 12345,
            },
            heap_offset: 0,
            bytes: 64,
        };
        let cases: Vec<(&str, Vec<Replacement>, u64)> = vec![
            ("have no replacement", vec![whole(a.region())], 8 * MIB),
            (
                "replaced twice",
                vec![whole(a.region()), whole(a.region()), whole(b.region())],
                8 * MIB,
            ),
            ("is a view", vec![whole(view), whole(b.region())], 8 * MIB),
            (
                "another runtime lifetime",
                vec![whole(foreign), whole(b.region())],
                8 * MIB,
            ),
            (
                "raise heap_size_bytes",
                vec![
                    whole(a.region()),
                    Replacement {
                        current: b.region(),
                        target: u8_spec(vec![8 << 20]),
                        preserve: false,
                    },
                ],
                8 * MIB,
            ),
            (
                "must be non-empty with positive sizes",
                vec![
                    whole(a.region()),
                    Replacement {
                        current: b.region(),
                        target: u8_spec(vec![]),
                        preserve: false,
                    },
                ],
                8 * MIB,
            ),
            (
                "not a power of two",
                vec![
                    whole(a.region()),
                    Replacement {
                        current: b.region(),
                        target: AllocationSpec {
                            shape: vec![1],
                            dtype: Dtype::U8,
                            alignment: Some(24),
                        },
                        preserve: false,
                    },
                ],
                8 * MIB,
            ),
        ];
        for (needle, replacements, heap) in cases {
            let error = lifecycle::restart(heap, &replacements, None).unwrap_err();
            assert_eq!(error.recovery(), Some(Recovery::Retryable), "{error}");
            assert!(error.to_string().contains(needle), "{needle}: {error}");
            assert!(
                error
                    .to_string()
                    .contains("restart failed during Preflight"),
                "{error}"
            );
        }
        // A target manifest that differs on one rank.
        let mine = u8_spec(vec![8 + rank % 2]);
        let error = lifecycle::restart(
            8 * MIB,
            &[
                whole(a.region()),
                Replacement {
                    current: b.region(),
                    target: mine,
                    preserve: false,
                },
            ],
            None,
        )
        .unwrap_err();
        print_error("MANIFEST", &error);
        assert!(
            error
                .to_string()
                .contains("values differ across root ranks"),
            "{error}"
        );
        // A preflight hook whose snapshot differs on one rank.
        let mut hook = || Ok(vec![rank as u8 / 2]);
        let error = lifecycle::restart(
            8 * MIB,
            &[whole(a.region()), whole(b.region())],
            Some(&mut hook),
        )
        .unwrap_err();
        assert!(
            error
                .to_string()
                .contains("values differ across root ranks"),
            "{error}"
        );
        assert_eq!(error.recovery(), Some(Recovery::Retryable));
        // Still usable: the data plane works and a correct restart succeeds.
        lifecycle::guarded("put", |s| s.put(&a, &[3u8; 64], 0)).unwrap();
        let result =
            lifecycle::restart(8 * MIB, &[whole(a.region()), whole(b.region())], None).unwrap();
        lifecycle::guarded("free", |s| {
            for record in &result.allocations {
                s.free_id(record.id)?;
            }
            Ok(())
        })
        .unwrap();
        lifecycle::release().unwrap();
        return;
    }
    Job::launch("restart_arguments_are_checked_and_stay_retryable", 3)
        .wait()
        .assert_all_succeeded();
}

/// Restarts with one allocation under the fault named in the environment; prints what every
/// rank saw, then tries the lifecycle again.
fn restart_under_fault() {
    lifecycle::acquire(None, Some(4 * MIB)).unwrap();
    let a = lifecycle::guarded("allocate", |s| s.allocate::<u32>(16, None)).unwrap();
    let replacement = Replacement {
        current: a.region(),
        target: AllocationSpec {
            shape: vec![32],
            dtype: Dtype::U32,
            alignment: None,
        },
        preserve: false,
    };
    let error = lifecycle::restart(8 * MIB, &[replacement], None).unwrap_err();
    print_error("ERROR", &error);
    println!("STAGE {}", error.stage().unwrap_or("none"));
    println!("RECOVERY {:?}", error.recovery());
    match error.recovery() {
        Some(Recovery::Retryable) => {
            // Still usable: free and release normally.
            lifecycle::guarded("free", |s| s.free(a)).unwrap();
            lifecycle::release().unwrap();
            println!("AFTER released");
        }
        _ => {
            let again = lifecycle::acquire(None, Some(4 * MIB)).unwrap_err();
            println!("AFTER refused: {again}");
            assert!(again.to_string().contains("restart the process"), "{again}");
        }
    }
}

#[test]
fn an_injected_failure_at_every_restart_stage_is_reported_on_every_rank() {
    if is_pe() {
        return restart_under_fault();
    }
    let name = "an_injected_failure_at_every_restart_stage_is_reported_on_every_rank";
    for stage in Stage::RESTART.iter() {
        for action in ["retryable", "unavailable"] {
            let fault = format!("restart:{}:1:{action}", stage.name());
            let result =
                Job::launch_with(name, 3, Options::default().env(FAULT_VARIABLE, &fault)).wait();
            result.assert_all_succeeded();
            let before_release = stage.before_teardown();
            let expected = match (before_release, action) {
                (true, "retryable") => "Some(Retryable)",
                _ => "Some(Terminal)",
            };
            for pe in &result.pes {
                assert_eq!(
                    pe.lines_with("STAGE "),
                    [stage.name()],
                    "{fault}\n{}",
                    result.describe()
                );
                assert_eq!(
                    pe.lines_with("RECOVERY "),
                    [expected],
                    "{fault}\n{}",
                    result.describe()
                );
                let message = &pe.lines_with("ERROR ")[0];
                assert!(
                    message.contains("root_ranks=[1]") && message.contains("injected failure"),
                    "{fault}: {message}"
                );
                assert!(
                    message.contains(&format!(
                        "restart failed during {} on rank {}",
                        stage.name(),
                        pe.rank
                    )),
                    "{message}"
                );
            }
        }
    }
}

#[test]
fn a_differing_preflight_value_fails_every_rank_and_stays_retryable() {
    if is_pe() {
        return restart_under_fault();
    }
    let result = Job::launch_with(
        "a_differing_preflight_value_fails_every_rank_and_stays_retryable",
        3,
        Options::default().env(FAULT_VARIABLE, "restart:Preflight:2:differ"),
    )
    .wait();
    result.assert_all_succeeded();
    for pe in &result.pes {
        assert!(
            pe.lines_with("ERROR ")[0].contains("values differ across root ranks"),
            "{}",
            result.describe()
        );
        assert_eq!(pe.lines_with("AFTER "), ["released"]);
    }
}

/// Runs release or restart (per `HM_TEST_OPERATION`) while the fault kills one rank.
fn lifecycle_while_a_rank_dies() {
    lifecycle::acquire(None, Some(4 * MIB)).unwrap();
    let error = match std::env::var("HM_TEST_OPERATION").unwrap().as_str() {
        "release" => lifecycle::release().unwrap_err(),
        _ => {
            let a = lifecycle::guarded("allocate", |s| s.allocate::<u8>(64, None)).unwrap();
            let replacement = Replacement {
                current: a.region(),
                target: u8_spec(vec![128]),
                preserve: false,
            };
            lifecycle::restart(8 * MIB, &[replacement], None).unwrap_err()
        }
    };
    print_error("ERROR", &error);
    println!("RECOVERY {:?}", error.recovery());
    println!("KIND {:?}", error.kind());
    let again = lifecycle::acquire(None, None).unwrap_err();
    println!("AFTER {again}");
    println!("QUIET {}", lifecycle::quiet().unwrap_err());
}

#[test]
fn a_rank_killed_at_any_lifecycle_stage_invalidates_the_survivors() {
    if is_pe() {
        return lifecycle_while_a_rank_dies();
    }
    let name = "a_rank_killed_at_any_lifecycle_stage_invalidates_the_survivors";
    let cases = Stage::RELEASE
        .iter()
        .map(|s| ("release", *s))
        .chain(Stage::RESTART.iter().map(|s| ("restart", *s)));
    for (operation, stage) in cases {
        let fault = format!("{operation}:{}:1:abort", stage.name());
        let options = Options::default()
            .env(FAULT_VARIABLE, &fault)
            .env("HM_TEST_OPERATION", operation);
        let result = Job::launch_with(name, 3, options).wait();
        for pe in result.survivors_of(1, &fault) {
            assert_eq!(
                pe.lines_with("KIND "),
                ["PeerLost"],
                "{fault}\n{}",
                result.describe()
            );
            let message = &pe.lines_with("ERROR ")[0];
            assert!(
                message.contains("cannot be managed safely any more; restart the process"),
                "{message}"
            );
            for after in ["AFTER ", "QUIET "] {
                assert!(
                    pe.lines_with(after)[0].contains("invalidated"),
                    "{after}\n{}",
                    result.describe()
                );
            }
        }
    }
}

#[test]
fn threads_racing_a_restart_never_touch_a_torn_down_heap() {
    if is_pe() {
        lifecycle::acquire(None, Some(4 * MIB)).unwrap();
        let first = lifecycle::guarded("allocate", |s| s.allocate::<u64>(64, None)).unwrap();
        let mut current = first.region();
        let rank = World::global().unwrap().rank();
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|scope| {
            let stop = &stop;
            for worker in 0..8u64 {
                scope.spawn(move || {
                    while !stop.load(std::sync::atomic::Ordering::Acquire) {
                        // Half the workers take a reference of their own around the put.
                        let counted = worker % 2 == 0 && lifecycle::acquire(None, None).is_ok();
                        lifecycle::guarded("put", |s| {
                            let live = s.allocations();
                            let record = live.first().expect("one allocation is always live");
                            let region = s.region(record.id, worker * 8, 8)?;
                            s.put_bytes(region, &worker.to_le_bytes(), rank)?;
                            let mut back = [0u8; 8];
                            s.get_bytes(&mut back, region, rank)?;
                            assert_eq!(back, worker.to_le_bytes());
                            Ok(())
                        })
                        .unwrap();
                        if counted {
                            lifecycle::release().unwrap();
                        }
                        // Two cores, sixteen threads: leave room for the restarting thread.
                        std::thread::yield_now();
                    }
                });
            }
            for size in [8 * MIB, 4 * MIB, 8 * MIB, 4 * MIB] {
                let replacement = Replacement {
                    current,
                    target: AllocationSpec {
                        shape: vec![64],
                        dtype: Dtype::U64,
                        alignment: None,
                    },
                    preserve: false,
                };
                // Another thread may hold a second reference at this moment: then the restart is
                // refused (retryable) on some rank and every rank says so.
                loop {
                    match lifecycle::restart(size, std::slice::from_ref(&replacement), None) {
                        Ok(result) => {
                            current = hyper_multicore::shmem::Region {
                                id: result.allocations[0].id,
                                heap_offset: result.allocations[0].offset,
                                bytes: result.allocations[0].bytes,
                            };
                            break;
                        }
                        Err(error) => {
                            assert_eq!(error.recovery(), Some(Recovery::Retryable), "{error}");
                            assert!(
                                error.to_string().contains("exactly one reference"),
                                "{error}"
                            );
                        }
                    }
                }
            }
            stop.store(true, std::sync::atomic::Ordering::Release);
        });
        drop(first);
        lifecycle::guarded("free", |s| s.free_id(current.id)).unwrap();
        lifecycle::release().unwrap();
        return;
    }
    Job::launch("threads_racing_a_restart_never_touch_a_torn_down_heap", 2)
        .wait()
        .assert_all_succeeded();
}

/// A hook whose values are sets: equal as sets, but serialized in a different order per rank
/// (like a Python set of strings, whose iteration order differs per process).
struct SetHook {
    items: Vec<&'static str>,
}

impl lifecycle::PreflightHook for SetHook {
    fn snapshot(&mut self) -> hyper_multicore::Result<Vec<u8>> {
        Ok(self.items.join(",").into_bytes())
    }
    fn same(&self, a: &[u8], b: &[u8]) -> bool {
        let set = |v: &[u8]| {
            let text = String::from_utf8_lossy(v).into_owned();
            let mut items: Vec<String> = text.split(',').map(str::to_owned).collect();
            items.sort();
            items
        };
        set(a) == set(b)
    }
    fn describe(&self, value: &[u8]) -> String {
        format!("set({})", String::from_utf8_lossy(value))
    }
}

#[test]
fn preflight_hook_values_are_compared_as_values_and_described_by_the_hook() {
    if is_pe() {
        let rank = World::global().unwrap().rank();
        lifecycle::acquire(None, Some(4 * MIB)).unwrap();
        let a = lifecycle::guarded("allocate", |s| s.allocate::<u8>(64, None)).unwrap();
        let replacement = |current| Replacement {
            current,
            target: u8_spec(vec![64]),
            preserve: false,
        };
        // Same set, different order per rank: equal as values.
        let mut hook = SetHook {
            items: if rank % 2 == 0 {
                vec!["alpha", "beta"]
            } else {
                vec!["beta", "alpha"]
            },
        };
        let result = lifecycle::restart(
            4 * MIB,
            &[replacement(a.region())],
            Some(&mut hook as &mut dyn lifecycle::PreflightHook),
        )
        .unwrap();
        let current = result.allocations[0].region();
        // A genuinely different set on root rank 2: the error names it and shows the hook's
        // description of each value, never raw bytes.
        let mut hook = SetHook {
            items: if rank == 2 {
                vec!["alpha", "gamma"]
            } else {
                vec!["beta", "alpha"]
            },
        };
        let error =
            lifecycle::restart(4 * MIB, &[replacement(current)], Some(&mut hook)).unwrap_err();
        print_error("HOOK", &error);
        let text = error.to_string();
        assert_eq!(error.recovery(), Some(Recovery::Retryable), "{text}");
        assert!(text.contains("values differ across root ranks"), "{text}");
        assert!(
            text.contains("root_ranks=[0, 1]: set(")
                && text.contains("root_ranks=[2]: set(alpha,gamma)"),
            "{text}"
        );
        // A plain closure gets the default: bytes compared, shown as (cut) hex.
        let mut closure = || Ok(vec![rank as u8 / 2; 100]);
        let error =
            lifecycle::restart(4 * MIB, &[replacement(current)], Some(&mut closure)).unwrap_err();
        let text = error.to_string();
        assert!(text.contains("root_ranks=[2]: 0x0101"), "{text}");
        assert!(text.contains("(100 bytes)"), "{text}");
        lifecycle::guarded("free", |s| s.free_id(current.id)).unwrap();
        drop(a);
        lifecycle::release().unwrap();
        return;
    }
    Job::launch(
        "preflight_hook_values_are_compared_as_values_and_described_by_the_hook",
        3,
    )
    .wait()
    .assert_all_succeeded();
}

#[test]
fn restart_checks_everything_it_can_before_teardown() {
    if is_pe() {
        lifecycle::acquire(None, Some(8 * MIB)).unwrap();
        let a = lifecycle::guarded("allocate", |s| s.allocate::<u8>(64, None)).unwrap();
        let target = |alignment| Replacement {
            current: a.region(),
            target: AllocationSpec {
                shape: vec![64],
                dtype: Dtype::U8,
                alignment,
            },
            preserve: false,
        };
        // An alignment above the new heap's maximum (its size rounded up to a power of two).
        let error = lifecycle::restart(16 * MIB, &[target(Some(32 * MIB))], None).unwrap_err();
        print_error("ALIGNMENT", &error);
        assert_eq!(error.recovery(), Some(Recovery::Retryable), "{error}");
        assert_eq!(error.stage(), Some("Preflight"), "{error}");
        assert!(error.to_string().contains("no larger than"), "{error}");
        // A heap that exceeds this host's memory for the PEs of the root (1 TiB each).
        let error = lifecycle::restart(1 << 40, &[target(None)], None).unwrap_err();
        print_error("HOST MEMORY", &error);
        assert_eq!(error.recovery(), Some(Recovery::Retryable), "{error}");
        assert_eq!(error.stage(), Some("Preflight"), "{error}");
        assert!(error.to_string().contains("of memory"), "{error}");
        // Still usable; a sound restart goes through.
        // An alignment above 2 MiB, the heap's own alignment before OpenSHMEM's any-power-of-two
        // shmem_align: each PE's own heap starts on a multiple of it.
        let result = lifecycle::restart(8 * MIB, &[target(Some(4 * MIB))], None).unwrap();
        let b = result.allocation::<u8>(0).unwrap();
        assert!(result.allocation::<u32>(0).is_err(), "dtype checked");
        lifecycle::guarded("free", |s| s.free(b)).unwrap();
        drop(a);
        lifecycle::release().unwrap();
        return;
    }
    Job::launch("restart_checks_everything_it_can_before_teardown", 2)
        .wait()
        .assert_all_succeeded();
}

#[test]
fn a_failed_shutdown_leaves_no_reference_but_stays_terminal() {
    if is_pe() {
        lifecycle::acquire(None, Some(4 * MIB)).unwrap();
        let error = lifecycle::release().unwrap_err();
        print_error("SHUTDOWN", &error);
        assert_eq!(error.recovery(), Some(Recovery::Terminal), "{error}");
        assert_eq!(error.stage(), Some("Shutdown"), "{error}");
        assert_eq!(lifecycle::reference_count(), 0, "the runtime is gone");
        // One process-wide state: the native runtime's state says it too, and a native
        // initialize is refused like a lifecycle acquire.
        use hyper_multicore::shmem::{runtime_state, RuntimeState};
        assert_eq!(runtime_state(), RuntimeState::Invalidated);
        assert_eq!(lifecycle::debug_state().state, RuntimeState::Invalidated);
        assert_eq!(lifecycle::debug_state().reference_count, Some(0));
        let again = lifecycle::acquire(None, Some(4 * MIB)).unwrap_err();
        assert!(again.to_string().contains("restart the process"), "{again}");
        assert_eq!(lifecycle::reference_count(), 0);
        println!("TERMINAL OK");
        return;
    }
    let result = Job::launch_with(
        "a_failed_shutdown_leaves_no_reference_but_stays_terminal",
        2,
        Options::default().env(FAULT_VARIABLE, "release:Shutdown:1:retryable"),
    )
    .wait();
    result.assert_all_succeeded();
    for pe in &result.pes {
        assert_eq!(pe.lines_with("TERMINAL "), ["OK"], "{}", result.describe());
    }
}

#[test]
fn guarded_calls_are_excluded_from_the_whole_restart_including_preflight() {
    if is_pe() {
        lifecycle::acquire(None, Some(4 * MIB)).unwrap();
        let a = lifecycle::guarded("allocate", |s| s.allocate::<u64>(8, None)).unwrap();
        let replacement = Replacement {
            current: a.region(),
            target: AllocationSpec {
                shape: vec![8],
                dtype: Dtype::U64,
                alignment: None,
            },
            preserve: false,
        };
        // The hook runs inside Preflight, after this rank checked nothing yet is racing; another
        // thread's guarded call made now (a collective allocate, say) would otherwise run
        // alongside the restart and be freed by ReleaseAllocations without a word.
        let mut raced = None;
        let mut hook = || {
            raced = Some(std::thread::scope(|scope| {
                scope
                    .spawn(|| lifecycle::try_guarded("allocate", |s| s.allocate::<u64>(1, None)))
                    .join()
                    .unwrap()
            }));
            Ok(Vec::new())
        };
        let result = lifecycle::restart(4 * MIB, &[replacement], Some(&mut hook)).unwrap();
        let error = raced.unwrap().unwrap_err();
        print_error("RACED", &error);
        assert!(error.to_string().contains("in progress"), "{error}");
        assert_eq!(error.recovery(), Some(Recovery::Retryable), "{error}");
        // The same thread cannot call into the runtime from its own hook either (it would
        // deadlock on the lock the restart holds).
        let mut hook = || {
            let inner = lifecycle::guarded("allocate", |s| s.allocate::<u64>(1, None));
            Ok(format!("{:?}", inner.map(drop).map_err(|e| e.to_string())).into_bytes())
        };
        let b = result.allocation::<u64>(0).unwrap();
        let replacement = Replacement {
            current: b.region(),
            target: AllocationSpec {
                shape: vec![8],
                dtype: Dtype::U64,
                alignment: None,
            },
            preserve: false,
        };
        let result = lifecycle::restart(4 * MIB, &[replacement], Some(&mut hook)).unwrap();
        assert_eq!(
            lifecycle::guarded("count", |s| Ok(s.allocations().len())).unwrap(),
            1
        );
        let c = result.allocation::<u64>(0).unwrap();
        lifecycle::guarded("free", |s| s.free(c)).unwrap();
        drop((a, b));
        lifecycle::release().unwrap();
        return;
    }
    Job::launch(
        "guarded_calls_are_excluded_from_the_whole_restart_including_preflight",
        2,
    )
    .wait()
    .assert_all_succeeded();
}

#[test]
fn a_member_list_root_is_checked_before_any_communication() {
    use hyper_multicore::lifecycle::RootGroup;
    if is_pe() {
        let world = World::global().unwrap();
        let rank = world.rank();
        lifecycle::acquire_root(RootGroup::World, Some(4 * MIB)).unwrap();
        // Only root rank 0 names a subgroup while the world root is active: refused at once,
        // without forming the subgroup (its other member never joins: that would be a wait
        // until the deadline).
        if rank == 0 {
            let error = lifecycle::acquire_root(RootGroup::Members(vec![0, 1]), None).unwrap_err();
            print_error("REFUSED", &error);
            assert_eq!(error.kind(), ErrorKind::InvalidArgument, "{error}");
            assert!(
                error.to_string().contains("[0, 1, 2]") && error.to_string().contains("[0, 1]"),
                "{error}"
            );
        }
        let others: Vec<usize> = (0..3).filter(|&r| r != rank).collect();
        for (list, needle) in [
            (vec![rank, rank], "listed twice"),
            (vec![rank, 9], "outside the world"),
            (others, "not a member"),
        ] {
            let error = lifecycle::acquire_root(RootGroup::Members(list), None).unwrap_err();
            assert!(error.to_string().contains(needle), "{needle}: {error}");
            assert_eq!(error.operation(), "acquire", "{error}");
        }
        assert_eq!(lifecycle::reference_count(), 1);
        assert!(
            world.cached_subgroups().is_empty(),
            "no subgroup was formed"
        );
        lifecycle::release().unwrap();
        // Ranks 0 and 1 start a root over [1, 0] twice: one subgroup, cached by the world.
        if rank < 2 {
            for _ in 0..2 {
                lifecycle::acquire_root(RootGroup::Members(vec![1, 0]), Some(4 * MIB)).unwrap();
                lifecycle::acquire_root(RootGroup::Members(vec![1, 0]), None).unwrap();
                assert_eq!(lifecycle::debug_state().root_size, Some(2));
                assert_eq!(lifecycle::debug_state().root_rank, Some(1 - rank));
                lifecycle::release().unwrap();
                lifecycle::release().unwrap();
            }
            assert_eq!(world.cached_subgroups(), vec![vec![1, 0]]);
        }
        world.control().barrier().unwrap();
        println!("MEMBERS OK");
        return;
    }
    let result = Job::launch_with(
        "a_member_list_root_is_checked_before_any_communication",
        3,
        Options::default().env("HYPER_MULTICORE_SHMEM_TIMEOUT_SEC", "5"),
    )
    .wait();
    result.assert_all_succeeded();
    for pe in &result.pes {
        assert_eq!(pe.lines_with("MEMBERS "), ["OK"], "{}", result.describe());
    }
}

/// A channel over the world whose mode the test switches, as the Python front's torch channel
/// changes when torch.distributed is destroyed.
#[derive(Debug)]
struct SwitchableChannel {
    world: Arc<World>,
    mode: std::sync::Mutex<hyper_multicore::control::ChannelMode>,
}

impl GroupChannel for SwitchableChannel {
    fn rank(&self) -> usize {
        self.world.rank()
    }
    fn size(&self) -> usize {
        self.world.size()
    }
    fn members(&self) -> Vec<usize> {
        (0..self.world.size()).collect()
    }
    fn distributed(&self) -> bool {
        true
    }
    fn mode(&self) -> hyper_multicore::control::ChannelMode {
        *self.mode.lock().unwrap()
    }
    fn allgather(&self, data: &[u8]) -> hyper_multicore::Result<Vec<Vec<u8>>> {
        self.world.control().allgather(data)
    }
}

#[test]
fn a_changed_root_mode_is_refused_by_acquire_and_by_release_preflight() {
    use hyper_multicore::control::ChannelMode;
    if is_pe() {
        let channel = Arc::new(SwitchableChannel {
            world: World::global().unwrap(),
            mode: std::sync::Mutex::new(ChannelMode::Torch),
        });
        let dynamic = || Arc::clone(&channel) as Arc<dyn GroupChannel>;
        lifecycle::acquire(Some(dynamic()), Some(4 * MIB)).unwrap();
        // Same members, but the launcher's world instead of the torch group the root started on.
        let error = lifecycle::acquire(None, None).unwrap_err();
        print_error("WORLD", &error);
        assert!(error.to_string().contains("mode changed"), "{error}");
        assert_eq!(lifecycle::reference_count(), 1);
        // The torch group is destroyed.
        *channel.mode.lock().unwrap() = ChannelMode::Destroyed;
        let error = lifecycle::acquire(Some(dynamic()), None).unwrap_err();
        assert!(error.to_string().contains("mode changed"), "{error}");
        let error = lifecycle::release().unwrap_err();
        print_error("RELEASE", &error);
        assert!(error.to_string().contains("mode changed"), "{error}");
        assert_eq!(error.recovery(), Some(Recovery::Retryable), "{error}");
        assert_eq!(error.stage(), Some("Preflight"), "{error}");
        assert_eq!(lifecycle::reference_count(), 1);
        let error = lifecycle::restart(4 * MIB, &[], None).unwrap_err();
        assert_eq!(error.recovery(), Some(Recovery::Retryable), "{error}");
        // Back in the mode it started in: the release goes through.
        *channel.mode.lock().unwrap() = ChannelMode::Torch;
        lifecycle::release().unwrap();
        assert_eq!(lifecycle::reference_count(), 0);
        println!("MODE OK");
        return;
    }
    let result = Job::launch(
        "a_changed_root_mode_is_refused_by_acquire_and_by_release_preflight",
        2,
    )
    .wait();
    result.assert_all_succeeded();
    for pe in &result.pes {
        assert_eq!(pe.lines_with("MODE "), ["OK"], "{}", result.describe());
    }
}

/// Rank 1 calls `lifecycle::global_exit(9)` while every other rank waits in the runtime's
/// barrier (shared memory, or UCX under `HYPER_MULTICORE_SHMEM_TRANSPORT=ucx`): the others see
/// rank 1 end through the runtime's own control plane, its abort word and its endpoints, and
/// must end with 9 all the same, never report it lost.
fn global_exit_during_a_runtime_barrier() {
    lifecycle::acquire(None, Some(8 * MIB)).unwrap();
    let rank = lifecycle::guarded("barrier", |shmem| {
        shmem.barrier()?;
        Ok(shmem.rank())
    })
    .unwrap();
    if rank == 1 {
        lifecycle::global_exit(9);
    }
    let outcome = lifecycle::guarded("barrier", |shmem| shmem.barrier());
    println!("PAST THE BARRIER: {outcome:?}");
    std::process::exit(99);
}

#[test]
fn a_global_exit_ends_every_pe_waiting_in_the_runtime_s_barrier_with_its_status() {
    if is_pe() {
        return global_exit_during_a_runtime_barrier();
    }
    for transport in ["shm", "ucx"] {
        let options = Options::default()
            .env("HYPER_MULTICORE_SHMEM_TRANSPORT", transport)
            .env("HYPER_MULTICORE_SHMEM_TIMEOUT_SEC", 600);
        let job = Job::launch_with(
            stringify!(
                a_global_exit_ends_every_pe_waiting_in_the_runtime_s_barrier_with_its_status
            ),
            3,
            options,
        )
        .wait();
        for pe in &job.pes {
            assert_eq!(
                pe.status.code(),
                Some(9),
                "{transport}, rank {}: {}",
                pe.rank,
                job.describe()
            );
            assert!(!pe.stdout.contains("PAST THE"), "{}", job.describe());
        }
    }
}
