//! Shared roots across real processes (2 and 4 PEs): declarations compared across ranks,
//! budgets, ownership, refused bare calls, execution leases, close order, and heap growth that
//! keeps every consumer's data — also when it cannot fit, under injected faults, and with a rank
//! killed at every growth stage.

use hm_testkit::{
    heap_mappings, heap_segment_inodes, is_pe, print_error, u8_spec, Job, Options, MIB,
};
use hyper_multicore::lifecycle::{
    self, allocation_budget, Consumer, ConsumerSpec, Lease, Replacement, RootGroup, SharedRoot,
    Stage, FAULT_VARIABLE,
};
use hyper_multicore::shmem::{AllocationRecord, Symmetric};
use hyper_multicore::world::World;
use hyper_multicore::Recovery;

fn rank() -> usize {
    World::global().unwrap().rank()
}

/// Three consumers: two MoE layers (growable dispatch buffers) and a workspace.
fn three_consumers(root: &SharedRoot) -> [Consumer; 3] {
    let spec = |name: &str, kind: &str, budget| ConsumerSpec::new(name, kind, budget, "1 buffer");
    [
        root.reserve(spec("moe0", "moe-dispatch", 4 * MIB)).unwrap(),
        root.reserve(spec("moe1", "moe-dispatch", 4 * MIB)).unwrap(),
        root.reserve(spec("attn", "workspace", 2 * MIB)).unwrap(),
    ]
}

/// Closes every consumer, then the root.
fn close_all(root: &SharedRoot, consumers: &[&Consumer]) {
    for consumer in consumers {
        consumer.close().unwrap();
    }
    root.close().unwrap();
}

/// The pattern allocation `which` holds on `rank`.
fn pattern(rank: usize, which: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i.wrapping_mul(31) ^ (rank * 7 + which * 13)) as u8)
        .collect()
}

fn fill(lease: &Lease, record: &AllocationRecord, which: usize) {
    let bytes = pattern(rank(), which, record.bytes as usize);
    lease
        .run("put", |s| s.put_bytes(record.region(), &bytes, s.rank()))
        .unwrap();
}

fn read(lease: &Lease, record: &AllocationRecord, len: usize) -> Vec<u8> {
    let mut bytes = vec![0u8; len];
    let region = hyper_multicore::shmem::Region {
        bytes: len as u64,
        ..record.region()
    };
    lease
        .run("get", |s| s.get_bytes(&mut bytes, region, s.rank()))
        .unwrap();
    bytes
}

#[test]
fn declarations_that_differ_fail_on_every_rank_naming_the_consumer_and_the_ranks() {
    if is_pe() {
        let root = SharedRoot::new(RootGroup::World, None);
        let budget = if rank() == 2 { 6 * MIB } else { 4 * MIB };
        root.reserve(ConsumerSpec::new("moe0", "moe-dispatch", 4 * MIB, "a"))
            .unwrap();
        root.reserve(ConsumerSpec::new("moe1", "moe-dispatch", budget, "a"))
            .unwrap();
        let error = root.activate().unwrap_err();
        print_error("ERROR", &error);
        assert_eq!(lifecycle::reference_count(), 0, "nothing was taken");
        // A heap that does not cover the budgets: refused before any native work.
        let small = SharedRoot::new(RootGroup::World, Some(2 * MIB));
        small
            .reserve(ConsumerSpec::new("moe0", "moe-dispatch", 3 * MIB, "a"))
            .unwrap();
        let error = small.activate().unwrap_err();
        print_error("SMALL", &error);
        assert_eq!(lifecycle::reference_count(), 0);
        return;
    }
    let result = Job::launch(
        "declarations_that_differ_fail_on_every_rank_naming_the_consumer_and_the_ranks",
        4,
    )
    .wait();
    result.assert_all_succeeded();
    for pe in &result.pes {
        let message = &pe.lines_with("ERROR ")[0];
        assert!(
            message.contains("consumer moe1")
                && message.contains("root_ranks=[0, 1, 3]")
                && message.contains("root_ranks=[2]")
                && message.contains("6291456"),
            "{}",
            result.describe()
        );
        let small = &pe.lines_with("SMALL ")[0];
        assert!(
            small.contains("too small") && small.contains("2097152"),
            "{small}"
        );
    }
}

#[test]
fn data_plane_calls_outside_the_lease_are_refused() {
    if is_pe() {
        let root = SharedRoot::new(RootGroup::World, None);
        let [moe0, moe1, attn] = three_consumers(&root);
        root.activate().unwrap();
        let me = rank();
        // No lease held: a bare data-plane or collective call is refused, naming the shared
        // root; the rank query is not a data-plane call.
        let error = lifecycle::guarded("barrier", |s| s.barrier()).unwrap_err();
        print_error("NOLEASE", &error);
        let error = lifecycle::try_guarded("quiet", |s| {
            s.quiet();
            Ok(())
        })
        .unwrap_err();
        assert!(error.to_string().contains("shared root"), "{error}");
        assert_eq!(lifecycle::guarded("my_pe", |s| Ok(s.rank())).unwrap(), me);
        let lease = moe0.claim().unwrap();
        let buffer = lease.allocate_spec(&u8_spec(vec![8])).unwrap();
        // moe0 holds the lease: a bare call is still refused, on this thread and on another
        // (a consumer's calls go through its lease).
        let put = |s: &hyper_multicore::shmem::Shmem| s.put_bytes(buffer.region(), &[7; 8], me);
        print_error("BARE", &lifecycle::guarded("put", put).unwrap_err());
        std::thread::scope(|scope| {
            let error = scope
                .spawn(|| lifecycle::guarded("put", put).unwrap_err())
                .join()
                .unwrap();
            print_error("OTHER", &error);
        });
        lease.run("put", put).unwrap();
        lease.run("barrier", |s| s.barrier()).unwrap();
        // A thread bound to the lease (the Python front's claim) is admitted while it is held.
        lease.bind_thread();
        lifecycle::guarded("barrier", |s| s.barrier()).unwrap();
        lease.release().unwrap();
        print_error("RELEASED", &lifecycle::guarded("put", put).unwrap_err());
        // Another consumer's lease does not admit a thread bound to an earlier one.
        let other = moe1.claim().unwrap();
        print_error("STALE", &lifecycle::guarded("put", put).unwrap_err());
        other.release().unwrap();
        let lease = moe0.claim().unwrap();
        lease.free(buffer.id).unwrap();
        lease.release().unwrap();
        close_all(&root, &[&moe0, &moe1, &attn]);
        // Nothing manages the heap any more: bare guarded calls work again.
        lifecycle::acquire(None, Some(4 * MIB)).unwrap();
        lifecycle::guarded("barrier", |s| s.barrier()).unwrap();
        lifecycle::release().unwrap();
        return;
    }
    let result = Job::launch("data_plane_calls_outside_the_lease_are_refused", 2).wait();
    result.assert_all_succeeded();
    for pe in &result.pes {
        let no_lease = &pe.lines_with("NOLEASE ")[0];
        assert!(
            no_lease.contains("barrier is refused while the heap is managed by the shared root")
                && no_lease.contains("no consumer holds the lease"),
            "{no_lease}"
        );
        for (label, why) in [
            ("BARE ", "not made under the lease held (generation 1)"),
            ("OTHER ", "not made under the lease held (generation 1)"),
            ("RELEASED ", "no consumer holds the lease"),
            ("STALE ", "not made under the lease held (generation 2)"),
        ] {
            let line = &pe.lines_with(label)[0];
            assert!(
                line.contains("put is refused while the heap is managed by the shared root")
                    && line.contains(why),
                "{line}"
            );
        }
    }
}

#[test]
fn budgets_owners_bare_calls_and_close_order_are_enforced_on_every_rank() {
    if is_pe() {
        let root = SharedRoot::new(RootGroup::World, None);
        let [moe0, moe1, attn] = three_consumers(&root);
        root.activate().unwrap();
        assert_eq!(lifecycle::reference_count(), 1);
        // Bare lifecycle and heap calls name the shared root.
        for error in [
            lifecycle::acquire(None, None).unwrap_err(),
            lifecycle::release().unwrap_err(),
            lifecycle::restart(16 * MIB, &[], None).unwrap_err(),
            lifecycle::guarded("allocate", |s| s.allocate::<u8>(8, None).map(drop)).unwrap_err(),
        ] {
            assert!(error.to_string().contains("shared root"), "{error}");
        }
        let lease = moe0.claim().unwrap();
        let a = lease.allocate_spec(&u8_spec(vec![2 << 20])).unwrap();
        let billed = allocation_budget(&u8_spec(vec![2 << 20])).unwrap();
        // Over budget on every rank: refused before any collective work, the bill unchanged.
        let error = lease.allocate_spec(&u8_spec(vec![6 << 20])).unwrap_err();
        print_error("BUDGET", &error);
        // Over budget on rank 1 only: the same error on every rank.
        let len = if rank() == 1 { 3 << 20 } else { 1 << 10 };
        let error = lease.allocate_spec(&u8_spec(vec![len])).unwrap_err();
        print_error("ONE", &error);
        let state = root.debug_state();
        assert_eq!(state.consumers[0].used_bytes, billed);
        assert_eq!(state.lease_holder.as_deref(), Some("moe0"));
        lease.release().unwrap();
        // A foreign free is refused, and the owner's bill stays.
        let other = moe1.claim().unwrap();
        let error = other.free(a.id).unwrap_err();
        print_error("FOREIGN", &error);
        assert_eq!(root.debug_state().consumers[0].used_bytes, billed);
        other.release().unwrap();
        // Close order: consumers before the root, their allocations before them.
        let error = root.close().unwrap_err();
        print_error("CLOSE", &error);
        let error = moe0.close().unwrap_err();
        assert!(error.to_string().contains("still owns"), "{error}");
        let lease = moe0.claim().unwrap();
        let error = root.close().unwrap_err();
        assert!(error.to_string().contains("still open"), "{error}");
        lease.free(a.id).unwrap();
        assert_eq!(root.debug_state().consumers[0].used_bytes, 0);
        let error = moe0.close().unwrap_err();
        assert!(error.to_string().contains("holds the lease"), "{error}");
        lease.release().unwrap();
        close_all(&root, &[&moe0, &moe1, &attn]);
        root.close().unwrap();
        assert_eq!(lifecycle::reference_count(), 0);
        // Nothing manages the heap any more: bare calls work again.
        lifecycle::acquire(None, Some(4 * MIB)).unwrap();
        lifecycle::release().unwrap();
        return;
    }
    let result = Job::launch(
        "budgets_owners_bare_calls_and_close_order_are_enforced_on_every_rank",
        2,
    )
    .wait();
    result.assert_all_succeeded();
    for pe in &result.pes {
        let budget = &pe.lines_with("BUDGET ")[0];
        assert!(
            budget.contains("consumer moe0: 6291519 bytes (6.0 MiB) requested, 2097089 bytes (2.0 MiB) of 4 MiB left")
                && budget.contains("root_ranks=[0, 1]"),
            "{budget}"
        );
        let one = &pe.lines_with("ONE ")[0];
        assert!(
            one.contains("root_ranks=[1]") && one.contains("consumer moe0"),
            "{one}"
        );
        let foreign = &pe.lines_with("FOREIGN ")[0];
        assert!(foreign.contains("owned by consumer moe0"), "{foreign}");
        let close = &pe.lines_with("CLOSE ")[0];
        assert!(close.contains("still open"), "{close}");
    }
}

#[test]
fn the_lease_is_held_by_one_consumer_at_a_time_and_stale_generations_are_refused() {
    if is_pe() {
        let root = SharedRoot::new(RootGroup::World, None);
        let [moe0, moe1, attn] = three_consumers(&root);
        root.activate().unwrap();
        let held = moe0.claim().unwrap();
        let error = moe1.try_claim().unwrap_err();
        assert!(
            error.to_string().contains("consumer moe0 holds the lease"),
            "{error}"
        );
        // A second thread waits for the lease; it gets it once the first releases it.
        let waiter = {
            let moe1 = moe1.clone();
            std::thread::spawn(move || {
                let lease = moe1.claim().unwrap();
                let generation = lease.generation();
                lease.release().unwrap();
                generation
            })
        };
        let first = held.generation();
        held.run("barrier", |s| s.barrier()).unwrap();
        held.release().unwrap();
        let second = waiter.join().unwrap();
        assert!(second > first);
        // The first lease is of an earlier generation: refused everywhere.
        let error = held.run("barrier", |s| s.barrier()).unwrap_err();
        assert!(error.to_string().contains("stale"), "{error}");
        let error = held.release().unwrap_err();
        assert!(error.to_string().contains("stale"), "{error}");
        let error = held.allocate::<u8>(8, None).unwrap_err();
        assert!(error.to_string().contains("stale"), "{error}");
        // A dropped lease is released.
        drop(attn.claim().unwrap());
        assert_eq!(root.debug_state().lease_holder, None);
        close_all(&root, &[&moe0, &moe1, &attn]);
        println!("LEASES OK");
        return;
    }
    let result = Job::launch(
        "the_lease_is_held_by_one_consumer_at_a_time_and_stale_generations_are_refused",
        2,
    )
    .wait();
    result.assert_all_succeeded();
    for pe in &result.pes {
        assert_eq!(pe.lines_with("LEASES "), ["OK"]);
    }
}

/// Three consumers with data; moe0's dispatch buffer grows (ranks need different rows); every
/// allocation's bytes are checked on every PE afterwards, and the new heap is used remotely.
fn growth_keeps_data() {
    let root = SharedRoot::new(RootGroup::World, None);
    let [moe0, moe1, attn] = three_consumers(&root);
    root.activate().unwrap();
    let me = rank();
    let lease = moe0.claim().unwrap();
    let dispatch = lease.allocate_growable(&u8_spec(vec![3072, 1024])).unwrap();
    let dispatch_first = dispatch.record(&lease).unwrap();
    fill(&lease, &dispatch_first, 0);
    lease.release().unwrap();
    let lease = moe1.claim().unwrap();
    let combine = lease.allocate_spec(&u8_spec(vec![3 << 20])).unwrap();
    fill(&lease, &combine, 1);
    lease.release().unwrap();
    let lease = attn.claim().unwrap();
    let workspace = lease.allocate_spec(&u8_spec(vec![1 << 20])).unwrap();
    fill(&lease, &workspace, 2);
    lease.release().unwrap();

    let lease = moe0.claim().unwrap();
    // Rank r needs 3500 + r rows: the largest need wins, times the factor of 2.
    let growth = dispatch
        .ensure_capacity(&lease, 3500 + me)
        .unwrap()
        .expect("the buffer had to grow");
    let grown = dispatch.record(&lease).unwrap();
    assert_eq!(grown.spec.shape, vec![6144, 1024]);
    assert_eq!(growth.record.from_bytes, 10 * MIB);
    assert!(growth.record.to_bytes > growth.record.from_bytes);
    assert_eq!(growth.replaced.len(), 3);
    assert_eq!(read(&lease, &grown, 3 << 20), pattern(me, 0, 3 << 20));
    let combine = lease.current(combine.id).unwrap();
    let workspace = lease.current(workspace.id).unwrap();
    assert_eq!(read(&lease, &combine, 3 << 20), pattern(me, 1, 3 << 20));
    assert_eq!(read(&lease, &workspace, 1 << 20), pattern(me, 2, 1 << 20));
    // No growth when every rank's need is covered.
    assert!(dispatch.ensure_capacity(&lease, 6000).unwrap().is_none());
    // Covered everywhere, but rank 0 makes another call (its budget, not the buffer): the
    // quick check does not let it pass; Agree refuses it on every rank, nothing changes.
    let differing = if me == 0 {
        lease.grow(1)
    } else {
        dispatch.ensure_capacity(&lease, 6000)
    };
    let error = differing.unwrap_err();
    assert!(
        error
            .to_string()
            .contains("the ranks grow different things"),
        "{error}"
    );
    assert_eq!(error.recovery(), Some(Recovery::Retryable), "{error}");
    assert_eq!(dispatch.record(&lease).unwrap(), grown);
    // The new heap works remotely.
    let peer = (me + 1) % World::global().unwrap().size();
    let word = vec![me as u8 + 1; 64];
    let target = hyper_multicore::shmem::Region {
        bytes: 64,
        ..grown.region()
    };
    lease
        .run("put", |s| {
            s.put_bytes(target, &word, peer)?;
            s.quiet();
            s.barrier()
        })
        .unwrap();
    let size = World::global().unwrap().size();
    let from = (me + size - 1) % size;
    assert_eq!(read(&lease, &grown, 64), vec![from as u8 + 1; 64]);
    let state = root.debug_state();
    assert_eq!(state.epoch, 1);
    assert_eq!(state.growths[0].consumer, "moe0");
    assert_eq!(
        state.growths[0].to_bytes,
        state.runtime.config.heap_size_bytes
    );
    assert!(state.growths[0].timings.preserve_ms > 0.0);
    assert_eq!(state.runtime.active_allocations.len(), 3);
    assert_eq!(state.runtime.reference_count, Some(1));
    lease.free(grown.id).unwrap();
    lease.release().unwrap();
    let lease = moe1.claim().unwrap();
    lease.free(combine.id).unwrap();
    lease.release().unwrap();
    let lease = attn.claim().unwrap();
    lease.free(workspace.id).unwrap();
    lease.release().unwrap();
    close_all(&root, &[&moe0, &moe1, &attn]);
    println!("GROWTH OK {:?}", growth.record.timings);
}

#[test]
fn growth_keeps_every_consumers_data_on_two_pes() {
    if is_pe() {
        return growth_keeps_data();
    }
    let result = Job::launch("growth_keeps_every_consumers_data_on_two_pes", 2).wait();
    result.assert_all_succeeded();
}

#[test]
fn growth_keeps_every_consumers_data_on_four_pes() {
    if is_pe() {
        return growth_keeps_data();
    }
    let result = Job::launch("growth_keeps_every_consumers_data_on_four_pes", 4).wait();
    result.assert_all_succeeded();
}

/// A growth that cannot happen (over the consumer's cap; a heap larger than the host; an
/// injected retryable fault before teardown) changes nothing: old heap, data and lease stay.
fn growth_that_cannot_happen() {
    let root = SharedRoot::new(RootGroup::World, None);
    let moe = root
        .reserve(ConsumerSpec::new("moe0", "moe-dispatch", 4 * MIB, "a").with_max_budget(6 * MIB))
        .unwrap();
    let big = root
        .reserve(ConsumerSpec::new("big", "workspace", 2 * MIB, "b"))
        .unwrap();
    root.activate().unwrap();
    let lease = moe.claim().unwrap();
    let buffer = lease.allocate_growable(&u8_spec(vec![1024, 1024])).unwrap();
    let record = buffer.record(&lease).unwrap();
    fill(&lease, &record, 0);
    let error = buffer.ensure_capacity(&lease, 8192).unwrap_err();
    print_error("CAP", &error);
    assert_eq!(error.recovery(), Some(Recovery::Retryable));
    assert_eq!(error.stage(), Some("Agree"));
    lease.release().unwrap();
    let other = big.claim().unwrap();
    let error = other.grow(1 << 50).unwrap_err();
    print_error("HOST", &error);
    assert_eq!(error.recovery(), Some(Recovery::Retryable));
    other.release().unwrap();
    let lease = moe.claim().unwrap();
    if std::env::var_os(FAULT_VARIABLE).is_some() {
        let error = buffer.ensure_capacity(&lease, 1100).unwrap_err();
        print_error("FAULT", &error);
        println!("STAGE {}", error.stage().unwrap_or("none"));
        println!("RECOVERY {:?}", error.recovery());
        if error.recovery() != Some(Recovery::Retryable) {
            let again = lease.run("barrier", |s| s.barrier()).unwrap_err();
            assert!(again.to_string().contains("restart the process"), "{again}");
            println!("AFTER failed");
            return;
        }
    }
    // Nothing changed: same allocation, same heap, same data, the lease still valid.
    assert_eq!(buffer.record(&lease).unwrap(), record);
    assert_eq!(root.debug_state().epoch, 0);
    assert_eq!(root.debug_state().runtime.config.heap_size_bytes, 6 * MIB);
    assert_eq!(read(&lease, &record, 1 << 20), pattern(rank(), 0, 1 << 20));
    lease.free(record.id).unwrap();
    lease.release().unwrap();
    moe.close().unwrap();
    big.close().unwrap();
    root.close().unwrap();
    println!("AFTER unchanged");
}

#[test]
fn growth_that_cannot_fit_is_retryable_and_changes_nothing() {
    if is_pe() {
        return growth_that_cannot_happen();
    }
    let result = Job::launch("growth_that_cannot_fit_is_retryable_and_changes_nothing", 2).wait();
    result.assert_all_succeeded();
    for pe in &result.pes {
        let cap = &pe.lines_with("CAP ")[0];
        assert!(
            cap.contains("consumer moe0 needs a budget of")
                && cap.contains("its declared maximum is 6 MiB"),
            "{cap}"
        );
        let host = &pe.lines_with("HOST ")[0];
        assert!(host.contains("during Preflight"), "{host}");
        assert_eq!(pe.lines_with("AFTER "), ["unchanged"]);
    }
}

#[test]
fn an_injected_failure_at_every_growth_stage_keeps_the_lifecycle_classes() {
    if is_pe() {
        return growth_that_cannot_happen();
    }
    let name = "an_injected_failure_at_every_growth_stage_keeps_the_lifecycle_classes";
    for stage in Stage::GROW {
        let fault = format!("grow:{}:1:retryable", stage.name());
        let result =
            Job::launch_with(name, 2, Options::default().env(FAULT_VARIABLE, &fault)).wait();
        result.assert_all_succeeded();
        let (recovery, after) = if stage.before_teardown() {
            ("Some(Retryable)", "unchanged")
        } else {
            ("Some(Terminal)", "failed")
        };
        for pe in &result.pes {
            assert_eq!(pe.lines_with("STAGE "), [stage.name()], "{fault}");
            assert_eq!(pe.lines_with("RECOVERY "), [recovery], "{fault}");
            assert_eq!(pe.lines_with("AFTER "), [after], "{fault}");
        }
    }
    // A rank that grows something else: refused at Agree on every rank, nothing changed.
    let options = Options::default().env(FAULT_VARIABLE, "grow:Agree:1:differ");
    let result = Job::launch_with(name, 2, options).wait();
    result.assert_all_succeeded();
    for pe in &result.pes {
        let fault = &pe.lines_with("FAULT ")[0];
        assert!(
            fault.contains("the ranks grow different things") && fault.contains("root_ranks=[1]"),
            "{fault}"
        );
        assert_eq!(pe.lines_with("RECOVERY "), ["Some(Retryable)"]);
        assert_eq!(pe.lines_with("AFTER "), ["unchanged"]);
    }
}

/// A growth while the fault kills rank 1: the survivors see a convergence failure, the root
/// and its consumers say so, and no heap stays mapped.
fn growth_while_a_rank_dies() {
    let root = SharedRoot::new(RootGroup::World, None);
    let [moe0, _moe1, _attn] = three_consumers(&root);
    root.activate().unwrap();
    let lease = moe0.claim().unwrap();
    let buffer = lease.allocate_growable(&u8_spec(vec![64, 1024])).unwrap();
    let error = buffer.ensure_capacity(&lease, 4096).unwrap_err();
    print_error("ERROR", &error);
    println!("RECOVERY {:?}", error.recovery());
    let after = lease.allocate::<u8>(8, None).unwrap_err();
    println!("AFTER {after}");
    println!("MAPPINGS {}", heap_mappings());
    let bare = lifecycle::acquire(None, None).unwrap_err();
    assert!(bare.to_string().contains("invalidated"), "{bare}");
}

#[test]
fn a_rank_killed_at_any_growth_stage_leaves_a_convergence_failure_and_nothing_mapped() {
    if is_pe() {
        return growth_while_a_rank_dies();
    }
    let name = "a_rank_killed_at_any_growth_stage_leaves_a_convergence_failure_and_nothing_mapped";
    for stage in Stage::GROW {
        let fault = format!("grow:{}:1:abort", stage.name());
        let result =
            Job::launch_with(name, 3, Options::default().env(FAULT_VARIABLE, &fault)).wait();
        for pe in result.survivors_of(1, &fault) {
            let after = &pe.lines_with("AFTER ")[0];
            assert!(
                after.contains("the shared root failed") && after.contains("restart the process"),
                "{fault}\n{}",
                result.describe()
            );
            assert_eq!(pe.lines_with("MAPPINGS "), ["0"], "{fault}");
        }
    }
}

#[test]
fn a_preserving_restart_keeps_the_first_bytes_of_each_allocation() {
    if is_pe() {
        lifecycle::acquire(None, Some(4 * MIB)).unwrap();
        let me = rank();
        let (a, b) = lifecycle::guarded("allocate", |s| {
            Ok((s.allocate::<u8>(1000, None)?, s.allocate::<u8>(64, None)?))
        })
        .unwrap();
        let bytes = pattern(me, 0, 1000);
        lifecycle::guarded("put", |s| s.put_bytes(a.region(), &bytes, me)).unwrap();
        let ones = vec![1u8; 64];
        lifecycle::guarded("put", |s| s.put_bytes(b.region(), &ones, me)).unwrap();
        let first_memfd = heap_segment_inodes();
        assert_eq!(first_memfd.len(), 1);
        // 4 → 8 MiB: within the heap's room, so in place (the same memfd); b moves to a's old
        // place and a behind it, so the bytes move inside the heap.
        let result = lifecycle::restart(
            8 * MIB,
            &[
                // Not preserved: zero-filled, though b's old bytes were written here.
                Replacement {
                    current: b.region(),
                    target: u8_spec(vec![128]),
                    preserve: false,
                },
                // Shrunk to 600 bytes: the first 600 survive.
                Replacement {
                    current: a.region(),
                    target: u8_spec(vec![600]),
                    preserve: true,
                },
            ],
            None,
        )
        .unwrap();
        assert_eq!(heap_segment_inodes(), first_memfd, "grown in place");
        let (b, a) = (&result.allocations[0], &result.allocations[1]);
        let mut got = vec![0u8; 600];
        lifecycle::guarded("get", |s| s.get_bytes(&mut got, a.region(), me)).unwrap();
        assert_eq!(got, bytes[..600]);
        let mut zero = vec![9u8; 128];
        lifecycle::guarded("get", |s| s.get_bytes(&mut zero, b.region(), me)).unwrap();
        assert_eq!(zero, vec![0u8; 128]);
        // 8 → 32 MiB: beyond the room, so a new memfd and a copy; a grows (its tail zero).
        let result = lifecycle::restart(
            32 * MIB,
            &[
                Replacement {
                    current: a.region(),
                    target: u8_spec(vec![5000]),
                    preserve: true,
                },
                Replacement {
                    current: b.region(),
                    target: u8_spec(vec![128]),
                    preserve: false,
                },
            ],
            None,
        )
        .unwrap();
        let second_memfd = heap_segment_inodes();
        assert_eq!(second_memfd.len(), 1);
        assert_ne!(second_memfd, first_memfd, "a new segment");
        let (a, b) = (&result.allocations[0], &result.allocations[1]);
        let mut got = vec![9u8; 5000];
        lifecycle::guarded("get", |s| s.get_bytes(&mut got, a.region(), me)).unwrap();
        assert_eq!(got[..600], bytes[..600]);
        assert_eq!(got[600..], vec![0u8; 4400]);
        lifecycle::guarded("free", |s| {
            s.free_id(a.id)?;
            s.free_id(b.id)
        })
        .unwrap();
        lifecycle::release().unwrap();
        return;
    }
    Job::launch(
        "a_preserving_restart_keeps_the_first_bytes_of_each_allocation",
        2,
    )
    .wait()
    .assert_all_succeeded();
}
