//! The native runtime's state machine across real processes: initialize/shutdown, bad input
//! reported on every rank, failed initializes that leave nothing behind, and PEs killed while
//! the others wait.

use std::time::Duration;

use hm_testkit::{
    heap_mappings, initialize_over, is_pe, open_fds, resident_kib, start_runtime, thread_count,
    thread_count_settled, Job, Options,
};
use hyper_multicore::config::{HEAP_SIZE, TRANSPORT};
use hyper_multicore::shmem::{
    debug_state_inactive, runtime_state, AllocationId, Comparison, RuntimeState, Shmem,
    ShutdownError,
};
use hyper_multicore::world::World;
use hyper_multicore::ErrorKind;

const HEAP: Option<u64> = Some(8 << 20);

fn report(label: &str, error: &hyper_multicore::Error) {
    println!("{label} {:?} | {error}", error.kind());
}

#[test]
fn initialize_shutdown_and_again_with_a_new_heap() {
    if is_pe() {
        let world = World::from_env().unwrap();
        assert_eq!(runtime_state(), RuntimeState::Uninitialized);
        for heap in [4u64 << 20, 12 << 20] {
            let shmem = initialize_over(&world, Some(heap)).unwrap();
            assert_eq!(runtime_state(), RuntimeState::Ready);
            let state = shmem.debug_state();
            assert_eq!(
                (state.root_rank, state.root_size),
                (Some(world.rank()), Some(world.size()))
            );
            assert_eq!(state.config.heap_size, heap);
            let a = shmem.allocate::<u8>(1000, Some(256)).unwrap();
            let b = shmem.allocate::<u64>(3, None).unwrap();
            let state = shmem.debug_state();
            let usage = state.heap.unwrap();
            assert_eq!(usage.allocation_count, 2);
            assert_eq!(
                state.allocations.iter().map(|a| a.id).collect::<Vec<_>>(),
                vec![0, 1]
            );
            assert_eq!(state.allocations[0].base_address % 256, 0);
            assert_eq!(usage.allocated_bytes + usage.remaining_bytes, heap);
            // Shutdown is refused while allocations live, and the runtime comes back intact.
            let shmem = match shmem.shutdown() {
                Err(ShutdownError::Refused { runtime, error }) => {
                    assert_eq!(error.kind(), ErrorKind::InvalidState);
                    assert!(error.to_string().contains("still live"), "{error}");
                    runtime
                }
                other => panic!("shutdown with live allocations: {other:?}"),
            };
            shmem.validate_shutdown().unwrap_err();
            shmem.free(b).unwrap();
            shmem.free(a).unwrap();
            shmem.validate_shutdown().unwrap();
            assert_eq!(
                shmem.debug_state().heap.unwrap().peak_allocated_bytes,
                usage.allocated_bytes
            );
            shmem.shutdown().unwrap();
            assert_eq!(runtime_state(), RuntimeState::Uninitialized);
            let after = debug_state_inactive();
            assert!(
                after.allocations.is_empty() && after.heap.is_none() && after.root_rank.is_none()
            );
        }
        return;
    }
    Job::launch("initialize_shutdown_and_again_with_a_new_heap", 3)
        .wait()
        .assert_all_succeeded();
}

#[test]
fn allocating_and_freeing_in_a_loop_keeps_memory_flat() {
    if is_pe() {
        let world = World::from_env().unwrap();
        let shmem = initialize_over(&world, HEAP).unwrap();
        // A long-lived allocation, as a program keeps its buffers while it makes temporaries.
        let kept = shmem.allocate::<u64>(1, None).unwrap();
        let cycles = |n| {
            for i in 0..n {
                let word = shmem.allocate::<u64>(1, None).unwrap();
                shmem.put(&word, &[i], 1 - world.rank()).unwrap();
                shmem.free(word).unwrap();
            }
        };
        // Warm-up: the first chunks of the live-allocation table, the allocator's maps.
        cycles(20_000);
        let before = resident_kib();
        cycles(200_000);
        let grown = resident_kib().saturating_sub(before);
        println!("GROWN {grown} KiB");
        // Each allocation ever made kept 16 bytes before (3125 KiB here).
        assert!(
            grown < 1024,
            "200000 allocate + free cycles grew RSS by {grown} KiB"
        );
        shmem.free(kept).unwrap();
        shmem.shutdown().unwrap();
        return;
    }
    let result = Job::launch("allocating_and_freeing_in_a_loop_keeps_memory_flat", 2).wait();
    result.assert_all_succeeded();
    for pe in &result.pes {
        assert_eq!(pe.lines_with("GROWN ").len(), 1, "{}", result.describe());
    }
}

/// Runs `attempt` as a failing initialize on every rank, checks the error kind and message,
/// that nothing leaked, and that a correct initialize works afterwards.
fn failed_initialize_then_retry(
    kind: ErrorKind,
    needle: &str,
    attempt: impl FnOnce(&World) -> hyper_multicore::Result<Shmem>,
) {
    let world = World::from_env().unwrap();
    let (fds, threads, maps) = (open_fds(), thread_count(), heap_mappings());
    let error = attempt(&world).unwrap_err();
    report("ERROR", &error);
    assert_eq!(error.kind(), kind, "{error}");
    assert!(error.to_string().contains(needle), "{error}");
    assert_eq!(runtime_state(), RuntimeState::Uninitialized);
    assert_eq!(
        (open_fds(), thread_count_settled(threads), heap_mappings()),
        (fds, threads, maps),
        "a failed initialize leaked"
    );
    assert!(debug_state_inactive().latest_failure.is_some());
    let shmem = initialize_over(&world, HEAP).unwrap();
    shmem.barrier().unwrap();
    shmem.shutdown().unwrap();
}

#[test]
fn heap_sizes_that_differ_across_ranks_fail_on_every_rank() {
    if is_pe() {
        return failed_initialize_then_retry(
            ErrorKind::InvalidArgument,
            "heap sizes differ across root ranks",
            |world| {
                let heap = if world.rank() == 1 { 8 << 20 } else { 4 << 20 };
                initialize_over(world, Some(heap))
            },
        );
    }
    Job::launch("heap_sizes_that_differ_across_ranks_fail_on_every_rank", 3)
        .wait()
        .assert_all_succeeded();
}

#[test]
fn a_zero_heap_fails_on_every_rank() {
    if is_pe() {
        return failed_initialize_then_retry(
            ErrorKind::InvalidArgument,
            "must be positive",
            |world| initialize_over(world, Some(0)),
        );
    }
    Job::launch("a_zero_heap_fails_on_every_rank", 2)
        .wait()
        .assert_all_succeeded();
}

#[test]
fn a_huge_heap_fails_on_every_rank() {
    if is_pe() {
        return failed_initialize_then_retry(
            ErrorKind::InvalidArgument,
            "choose a smaller heap size",
            |world| initialize_over(world, Some(1 << 50)),
        );
    }
    Job::launch("a_huge_heap_fails_on_every_rank", 2)
        .wait()
        .assert_all_succeeded();
}

#[test]
fn a_bad_heap_size_variable_is_named() {
    if is_pe() {
        let error = start_runtime(None).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::InvalidConfig);
        assert!(error.to_string().contains(HEAP_SIZE), "{error}");
        return;
    }
    Job::launch_with(
        "a_bad_heap_size_variable_is_named",
        2,
        Options::default().env(HEAP_SIZE, "lots"),
    )
    .wait()
    .assert_all_succeeded();
}

/// `debug_state()` names the transport mode and each peer's route: every PE is `shm` on one
/// host (the default `auto`); with `HYPER_MULTICORE_SHMEM_TRANSPORT=ucx` every peer but itself is
/// `ucx`, and `ptr` refuses those peers with an error saying why.
#[test]
fn debug_state_shows_each_peers_route() {
    if is_pe() {
        let (_world, shmem) = start_runtime(Some(4 << 20)).unwrap();
        let forced = std::env::var(TRANSPORT).is_ok_and(|v| v == "ucx");
        let state = shmem.debug_state().transport.expect("initialized");
        assert_eq!(state.mode, if forced { "ucx" } else { "auto" });
        let expected: Vec<&str> = (0..shmem.size())
            .map(|pe| {
                if forced && pe != shmem.rank() {
                    "ucx"
                } else {
                    "shm"
                }
            })
            .collect();
        assert_eq!(state.routes, expected);
        let word = shmem.allocate::<u64>(1, None).unwrap();
        let peer = (shmem.rank() + 1) % shmem.size();
        assert!(shmem.ptr(&word, shmem.rank()).is_ok());
        match shmem.ptr(&word, peer) {
            Ok(_) => assert!(!forced),
            Err(error) => {
                assert!(forced, "{error}");
                assert!(
                    error.to_string().contains("not mapped in this process"),
                    "{error}"
                );
            }
        }
        shmem.barrier().unwrap();
        shmem.free(word).unwrap();
        shmem.shutdown().unwrap();
        return;
    }
    Job::launch(stringify!(debug_state_shows_each_peers_route), 3)
        .wait()
        .assert_all_succeeded();
}

/// `HYPER_MULTICORE_SHMEM_TRANSPORT` must agree across the root: a rank that differs fails
/// initialize on every rank, with an error naming the variable (and nothing is left behind).
#[test]
fn a_transport_that_differs_across_ranks_fails_on_every_rank() {
    if is_pe() {
        let error = start_runtime(Some(4 << 20)).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::InvalidConfig, "{error}");
        assert!(error.to_string().contains(TRANSPORT), "{error}");
        assert_eq!(heap_mappings(), 0);
        return;
    }
    Job::launch_with(
        stringify!(a_transport_that_differs_across_ranks_fails_on_every_rank),
        3,
        Options::default()
            .rank_env(1, TRANSPORT, "shm")
            .rank_env(2, TRANSPORT, "ucx"),
    )
    .wait()
    .assert_all_succeeded();
}

/// A job on the UCX route whose `ucp` library cannot be loaded fails initialize on every rank,
/// naming the file and how to do without it; nothing is left behind.
#[cfg(feature = "ucx")]
#[test]
fn a_missing_ucx_library_fails_initialize_on_every_rank() {
    const MISSING: &str = "/nonexistent/hyper-multicore-test/libucp.so.0";
    if is_pe() {
        let error = start_runtime(Some(4 << 20)).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Backend, "{error}");
        let message = error.to_string();
        assert!(message.contains(MISSING), "{error}");
        assert!(message.contains(&format!("{TRANSPORT}=shm")), "{error}");
        assert_eq!(heap_mappings(), 0);
        return;
    }
    Job::launch_with(
        stringify!(a_missing_ucx_library_fails_initialize_on_every_rank),
        2,
        Options::default()
            .env(TRANSPORT, "ucx")
            .env(hyper_multicore::config::UCX_LIBRARY, MISSING),
    )
    .wait()
    .assert_all_succeeded();
}

#[test]
fn the_heap_size_variable_is_used_when_no_size_is_given() {
    if is_pe() {
        let world = World::from_env().unwrap();
        let shmem = initialize_over(&world, None).unwrap();
        assert_eq!(shmem.heap_size(), 6 << 20);
        shmem.shutdown().unwrap();
        return;
    }
    Job::launch_with(
        "the_heap_size_variable_is_used_when_no_size_is_given",
        2,
        Options::default().env(HEAP_SIZE, "6M"),
    )
    .wait()
    .assert_all_succeeded();
}

#[test]
fn bad_arguments_fail_on_every_rank_and_lose_nothing() {
    if is_pe() {
        let (_world, shmem) = start_runtime(HEAP).unwrap();
        let (rank, size) = (shmem.rank(), shmem.size());
        let keep = shmem.allocate::<u64>(4, None).unwrap();
        shmem.put(&keep, &[rank as u64; 4], rank).unwrap();
        let used = shmem.debug_state().heap.unwrap();

        let error = shmem.allocate::<u8>(10, Some(48)).unwrap_err();
        report("ALIGNMENT", &error);
        assert!(error.to_string().contains("power of two"), "{error}");

        // Arguments that differ across ranks: the same error everywhere, nothing allocated.
        let error = shmem.allocate::<u8>(100 + rank, None).unwrap_err();
        report("MISMATCH", &error);
        assert!(
            error.to_string().contains("arguments differ across ranks"),
            "{error}"
        );
        assert!(
            error
                .to_string()
                .contains("root ranks [0] called allocate(100 bytes of uint8"),
            "{error}"
        );

        let error = shmem.put(&keep, &[0u64; 4], size).unwrap_err();
        assert!(
            error
                .to_string()
                .contains(&format!("PE {size} is out of range")),
            "{error}"
        );
        let error = shmem.put(&keep, &[0u64; 3], 0).unwrap_err();
        assert!(error.to_string().contains("byte-count mismatch"), "{error}");
        let error = keep.view(2..5).unwrap_err();
        assert!(error.to_string().contains("past the end"), "{error}");

        // A freed id is rejected, and freeing it again is a double free on every rank.
        let doomed = shmem.allocate::<u64>(1, None).unwrap();
        let id = doomed.id();
        shmem.free(doomed).unwrap();
        let error = shmem.resolve(id).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::DoubleFree);
        let error = shmem.free_id(id).unwrap_err();
        report("DOUBLE_FREE", &error);
        assert_eq!(error.kind(), ErrorKind::DoubleFree);
        let foreign = AllocationId {
            index: 0,
            generation: shmem.generation() ^ 2,
        };
        let error = shmem.free_id(foreign).unwrap_err();
        assert!(
            error.to_string().contains("another runtime lifetime"),
            "{error}"
        );

        // Nothing was lost: the live allocation and its contents are intact.
        assert_eq!(
            shmem.debug_state().heap.unwrap().allocated_bytes,
            used.allocated_bytes
        );
        let mut back = [0u64; 4];
        shmem.get(&mut back, &keep, rank).unwrap();
        assert_eq!(back, [rank as u64; 4]);
        shmem.barrier().unwrap();
        shmem.free(keep).unwrap();
        shmem.shutdown().unwrap();
        return;
    }
    // Two PEs: each reads the other's words from its barrier flag's cache line (carried with
    // the barrier); three: from the other PEs' argument slots.
    for pes in [2, 3] {
        let result = Job::launch("bad_arguments_fail_on_every_rank_and_lose_nothing", pes).wait();
        result.assert_all_succeeded();
        // The mismatch is described identically on every rank (apart from the rank itself).
        let descriptions: Vec<String> = result
            .pes
            .iter()
            .map(|p| {
                p.lines_with("MISMATCH ")[0]
                    .split(": ")
                    .skip(1)
                    .collect::<Vec<_>>()
                    .join(": ")
            })
            .collect();
        assert!(
            descriptions.windows(2).all(|w| w[0] == w[1]),
            "{pes} PEs: {descriptions:?}"
        );
        assert!(
            descriptions[0].contains(&format!(
                "root ranks [{}] called allocate({} bytes of uint8",
                pes - 1,
                100 + pes - 1
            )),
            "{pes} PEs: {descriptions:?}"
        );
    }
}

#[test]
fn handles_of_an_earlier_lifetime_are_rejected() {
    if is_pe() {
        let world = World::from_env().unwrap();
        let first = initialize_over(&world, HEAP).unwrap();
        let old = first.allocate::<u32>(4, None).unwrap();
        let old_id = old.id();
        first.free(old).unwrap();
        first.shutdown().unwrap();
        let second = initialize_over(&world, HEAP).unwrap();
        let fresh = second.allocate::<u32>(4, None).unwrap();
        assert_eq!(fresh.id().index, old_id.index);
        let error = second.resolve(old_id).unwrap_err();
        assert!(
            error.to_string().contains("another runtime lifetime"),
            "{error}"
        );
        second.barrier().unwrap();
        second.free(fresh).unwrap();
        second.shutdown().unwrap();
        return;
    }
    Job::launch("handles_of_an_earlier_lifetime_are_rejected", 2)
        .wait()
        .assert_all_succeeded();
}

/// A range located in one runtime lifetime is refused by the `_located` entries in the next,
/// even though an allocation of the same index is live there: the generation tells them apart.
#[test]
fn located_ranges_of_an_earlier_lifetime_are_refused() {
    use hyper_multicore::shmem::{AtomicOp, Symmetric};
    if is_pe() {
        let world = World::from_env().unwrap();
        let first = initialize_over(&world, HEAP).unwrap();
        let old = first.allocate::<u64>(1, None).unwrap();
        let stale = first.locate_region("test", old.region()).unwrap();
        first.barrier().unwrap();
        first.free(old).unwrap();
        first.shutdown().unwrap();
        let second = initialize_over(&world, HEAP).unwrap();
        let fresh = second.allocate::<u64>(1, None).unwrap();
        assert_eq!(fresh.id().index, stale.region().id.index);
        let refused = |result: hyper_multicore::Result<()>, what: &str| {
            let error = result.unwrap_err();
            assert!(
                error.to_string().contains("another runtime lifetime"),
                "{what}: {error}"
            );
        };
        for pe in 0..second.size() {
            refused(second.put_located(&stale, &[1u8; 8], pe), "put_located");
            refused(second.get_located(&mut [0u8; 8], &stale, pe), "get_located");
            refused(
                second
                    .atomic_located(&stale, AtomicOp::FetchAdd(1u64), pe)
                    .map(drop),
                "atomic_located",
            );
        }
        let mut back = [9u64];
        second.get(&mut back, &fresh, second.rank()).unwrap();
        assert_eq!(
            back,
            [0],
            "the stale range wrote into the new lifetime's allocation"
        );
        second.barrier().unwrap();
        second.free(fresh).unwrap();
        second.shutdown().unwrap();
        return;
    }
    Job::launch("located_ranges_of_an_earlier_lifetime_are_refused", 2)
        .wait()
        .assert_all_succeeded();
}

#[test]
fn a_mapping_keepalive_outlives_the_runtime() {
    if is_pe() {
        let world = World::from_env().unwrap();
        let shmem = initialize_over(&world, HEAP).unwrap();
        let keepalive = shmem.mapping_keepalive();
        let before = heap_mappings();
        assert!(before >= 1, "no heap mapping while the runtime is up");
        shmem.shutdown().unwrap();
        assert_eq!(runtime_state(), RuntimeState::Uninitialized);
        assert_eq!(
            heap_mappings(),
            before,
            "the keepalive did not keep the heap mapped"
        );
        drop(keepalive);
        assert_eq!(
            heap_mappings(),
            0,
            "the heap stayed mapped after the last keepalive"
        );
        return;
    }
    Job::launch("a_mapping_keepalive_outlives_the_runtime", 2)
        .wait()
        .assert_all_succeeded();
}

#[test]
fn a_second_runtime_in_one_process_is_refused() {
    if is_pe() {
        let world = World::from_env().unwrap();
        let shmem = initialize_over(&world, HEAP).unwrap();
        let (id, listener) = Shmem::get_unique_id(world.config()).unwrap();
        let error = Shmem::initialize(0, 1, &id, Some(listener), HEAP).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::InvalidState);
        assert!(error.to_string().contains("already active"), "{error}");
        shmem.shutdown().unwrap();
        return;
    }
    Job::launch("a_second_runtime_in_one_process_is_refused", 2)
        .wait()
        .assert_all_succeeded();
}

/// `HM_TEST_WAIT` names where the survivors wait when `HM_TEST_VICTIM` SIGKILLs itself.
fn wait_while_a_peer_dies() {
    let world = World::from_env().unwrap();
    let victim: usize = std::env::var("HM_TEST_VICTIM").unwrap().parse().unwrap();
    let how = std::env::var("HM_TEST_WAIT").unwrap();
    let (fds, threads) = (open_fds(), thread_count());
    let shmem = initialize_over(&world, HEAP).unwrap();
    let flag = shmem.allocate::<u64>(1, None).unwrap();
    let gathered = shmem.allocate::<u64>(shmem.size(), None).unwrap();
    shmem.barrier().unwrap();
    if shmem.rank() == victim {
        rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL)
            .unwrap();
    }
    let error = match how.as_str() {
        "barrier" => shmem.barrier().unwrap_err(),
        "wait_signal" => shmem
            .wait_signal(&flag, 1, Comparison::Eq, Some(Duration::from_secs(60)))
            .unwrap_err(),
        "all_gather" => shmem.all_gather(&gathered, &[1]).unwrap_err(),
        // UCX operations to the dead PE (a shared-memory get would keep reading its memory).
        "get_loop" => {
            let deadline = std::time::Instant::now() + Duration::from_secs(60);
            let mut word = [0u64];
            loop {
                if let Err(error) = shmem.get(&mut word, &flag, victim) {
                    break error;
                }
                assert!(std::time::Instant::now() < deadline, "gets never failed");
            }
        }
        other => panic!("unknown wait {other}"),
    };
    report("ERROR", &error);
    assert_eq!(error.kind(), ErrorKind::PeerLost, "{error}");
    assert_eq!(error.peer(), Some(victim), "{error}");
    // Releasing the runtime after the loss leaves nothing behind.
    drop((flag, gathered));
    drop(shmem);
    assert_eq!(heap_mappings(), 0);
    // The world's plane also lost the dead peer (its connection, perhaps its router), so the
    // counts may only shrink.
    assert!(
        open_fds() <= fds,
        "descriptors leaked after a peer loss: {fds} -> {}",
        open_fds()
    );
    let settled = thread_count_settled(threads);
    assert!(
        settled <= threads,
        "threads leaked after a peer loss: {threads} -> {settled}"
    );
}

macro_rules! kill_during {
    ($($name:ident: $wait:literal on $pes:literal killing $victim:literal),* $(,)?) => {$(
        #[test]
        fn $name() {
            if is_pe() {
                return wait_while_a_peer_dies();
            }
            let options = Options::default().env("HM_TEST_VICTIM", $victim).env("HM_TEST_WAIT", $wait);
            let result = Job::launch_with(stringify!($name), $pes, options).wait();
            for pe in result.pes.iter().filter(|p| p.rank != $victim) {
                assert!(pe.status.success(), "{}", result.describe());
            }
        }
    )*};
}

kill_during! {
    killing_a_pe_during_a_barrier_fails_the_others: "barrier" on 4 killing 2,
    killing_the_root_during_a_barrier_fails_the_others: "barrier" on 3 killing 0,
    killing_a_pe_during_wait_signal_fails_the_waiters: "wait_signal" on 3 killing 1,
    killing_a_pe_during_all_gather_fails_the_others: "all_gather" on 4 killing 3,
    killing_a_pe_during_a_barrier_of_8_fails_the_others: "barrier" on 8 killing 5,
}

#[test]
fn overlaps_shared_memory_sees_every_live_heap_mapping() {
    use hyper_multicore::shmem::{overlaps_shared_memory, Symmetric};
    if is_pe() {
        let world = World::from_env().unwrap();
        let shmem = initialize_over(&world, HEAP).unwrap();
        let local = vec![0u8; 4096];
        assert!(!overlaps_shared_memory(
            local.as_ptr() as usize,
            local.len()
        ));
        let buffer = shmem.allocate::<u64>(16, None).unwrap();
        // Every copy mapped here: all PEs' on one host, only this PE's own when every pair
        // goes through UCX (HYPER_MULTICORE_SHMEM_TRANSPORT=ucx).
        let mapped: Vec<usize> = (0..shmem.size())
            .filter(|&pe| shmem.ptr(&buffer, pe).is_ok())
            .collect();
        assert!(mapped.contains(&shmem.rank()), "{mapped:?}");
        for pe in mapped {
            let address = shmem.ptr(&buffer, pe).unwrap().as_ptr() as usize;
            assert!(overlaps_shared_memory(address, 8), "PE {pe}'s copy");
            // A range that only touches the allocation's last byte, and one just ending before it.
            assert!(overlaps_shared_memory(address + 127, 1000));
            assert!(overlaps_shared_memory(address - 8, 9));
            assert!(!overlaps_shared_memory(address, 0));
        }
        let address = shmem.ptr(&buffer, shmem.rank()).unwrap().as_ptr() as usize;
        assert!(buffer.len() == 16);
        shmem.free(buffer).unwrap();
        let keepalive = shmem.mapping_keepalive();
        shmem.shutdown().unwrap();
        assert!(
            overlaps_shared_memory(address, 8),
            "a mapping kept alive after shutdown is still shared memory"
        );
        drop(keepalive);
        assert!(
            !overlaps_shared_memory(address, 8),
            "an unmapped heap is not shared memory any more"
        );
        println!("OVERLAPS OK");
        return;
    }
    let result = Job::launch(
        stringify!(overlaps_shared_memory_sees_every_live_heap_mapping),
        2,
    )
    .wait();
    result.assert_all_succeeded();
    for pe in &result.pes {
        assert_eq!(pe.lines_with("OVERLAPS "), ["OK"], "{}", result.describe());
    }
}

/// The same kills with every pair of PEs on the UCX route (`HYPER_MULTICORE_SHMEM_TRANSPORT=ucx`):
/// a wait on a signal or barrier, and UCX gets from the dead PE, end with peer lost naming it.
macro_rules! kill_during_ucx {
    ($($name:ident: $wait:literal on $pes:literal killing $victim:literal),* $(,)?) => {$(
        #[test]
        fn $name() {
            if is_pe() {
                return wait_while_a_peer_dies();
            }
            let options = Options::default()
                .env(TRANSPORT, "ucx")
                .env("HM_TEST_VICTIM", $victim)
                .env("HM_TEST_WAIT", $wait);
            let result = Job::launch_with(stringify!($name), $pes, options).wait();
            for pe in result.pes.iter().filter(|p| p.rank != $victim) {
                assert!(pe.status.success(), "{}", result.describe());
            }
        }
    )*};
}

kill_during_ucx! {
    killing_a_pe_during_a_ucx_wait_signal_fails_the_waiters: "wait_signal" on 3 killing 1,
    killing_a_pe_during_a_ucx_barrier_fails_the_others: "barrier" on 3 killing 2,
    killing_a_pe_during_ucx_gets_from_it_fails_the_getters: "get_loop" on 3 killing 0,
}
