//! The data plane and collectives of the native runtime across real processes (2, 4 and 8 PEs).

use hm_testkit::{heap_mappings, is_pe, start_runtime, wait_until_stopped, Job, Options};
use hyper_multicore::config::TRANSPORT;
use hyper_multicore::shmem::{
    copy_count, Allocation, Comparison, ReduceOp, Shmem, SignalOp, Symmetric, TEST_HOST_VARIABLE,
};
use hyper_multicore::ErrorKind;

const HEAP: Option<u64> = Some(16 << 20);

fn finish(shmem: Shmem) {
    shmem.barrier().unwrap();
    assert!(
        shmem.allocations().is_empty(),
        "the test leaked allocations"
    );
    shmem.shutdown().unwrap();
}

/// put/get on whole allocations, sub-range views, odd sizes and 0 bytes, to every PE.
fn puts_and_gets() {
    let (_world, shmem) = start_runtime(HEAP).unwrap();
    let (rank, size) = (shmem.rank(), shmem.size());
    // Shared memory only when every PE shares this segment: not across hosts, nor with every
    // pair forced through UCX (though the PEs then still share this host).
    assert_eq!(shmem.shared_memory_only(), shmem.shared_pes().len() == size);
    for len in [0usize, 1, 13, 1000, 65_537] {
        let buffer = shmem.allocate::<u8>(len * size, None).unwrap();
        shmem.barrier().unwrap();
        // Each PE writes its slot of every peer's buffer.
        let mine: Vec<u8> = (0..len).map(|i| (i * 7 + rank) as u8).collect();
        let slot = buffer.view(rank * len..(rank + 1) * len).unwrap();
        for pe in 0..size {
            shmem.put(&slot, &mine, pe).unwrap();
        }
        shmem.barrier().unwrap();
        for pe in 0..size {
            let mut back = vec![0u8; len * size];
            shmem.get(&mut back, &buffer, pe).unwrap();
            for writer in 0..size {
                let expected: Vec<u8> = (0..len).map(|i| (i * 7 + writer) as u8).collect();
                assert_eq!(
                    &back[writer * len..(writer + 1) * len],
                    &expected[..],
                    "len {len}, PE {pe}, writer {writer}"
                );
            }
        }
        shmem.barrier().unwrap();
        shmem.free(buffer).unwrap();
    }
    // Typed elements, non-blocking forms and a nested view.
    let floats = shmem.allocate::<f64>(100, None).unwrap();
    let next = (rank + 1) % size;
    let middle = floats.view(10..90).unwrap().view(5..=6).unwrap();
    assert_eq!(middle.len(), 2);
    shmem.put_nbi(&middle, &[rank as f64, 0.5], next).unwrap();
    shmem.quiet();
    shmem.barrier().unwrap();
    let mut two = [0.0f64; 2];
    shmem.get_nbi(&mut two, &middle, rank).unwrap();
    shmem.quiet();
    assert_eq!(two, [((rank + size - 1) % size) as f64, 0.5]);
    shmem.barrier().unwrap();
    shmem.free(floats).unwrap();
    finish(shmem);
}

/// The bytes `fill` puts at byte `i` of a pattern seeded `seed`.
fn pattern(len: usize, seed: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 31 + seed * 7 + 1) as u8).collect()
}

/// Runs `call` and checks that it moved `bytes` through the data plane and nothing through a
/// private bounce copy (the test-only copy counter of `fault-injection` builds).
fn moves_once<R>(bytes: usize, what: &str, call: impl FnOnce() -> R) -> R {
    let before = copy_count().expect("the test harness builds with fault-injection");
    let result = call();
    let after = copy_count().unwrap();
    assert_eq!(
        (after.moved - before.moved, after.bounced - before.bounced),
        (bytes as u64, 0),
        "{what} of {bytes} bytes: (moved, bounced)"
    );
    result
}

/// Heap to heap: `put_from`, `get_into`, their `_nbi` forms and `put_signal_from` move the
/// bytes once (no bounce copy) at every size, to and from every PE; the bytes arrive right,
/// also when source and target overlap on this PE (as `copy_within` leaves them); mismatched
/// lengths and freed allocations are refused.
fn heap_to_heap_transfers_move_the_bytes_once() {
    let (_world, shmem) = start_runtime(HEAP).unwrap();
    let (rank, size) = (shmem.rank(), shmem.size());
    const MAX: usize = 1 << 20;
    let source = shmem.allocate::<u8>(MAX, None).unwrap();
    let inbox = shmem.allocate::<u8>(MAX * size, None).unwrap();
    let fetched = shmem.allocate::<u8>(MAX, None).unwrap();
    let scratch = shmem.allocate::<u8>(MAX + 64, None).unwrap();
    let signal = shmem.allocate::<u64>(1, None).unwrap();
    let read = |view: &dyn Symmetric<u8>, pe: usize| {
        let mut bytes = vec![0u8; view.region().bytes as usize];
        shmem.get_bytes(&mut bytes, view.region(), pe).unwrap();
        bytes
    };
    let mut signals = 0u64;
    for len in [1usize, 8, 13, 4096, 65_537, MAX] {
        let mine = source.view(..len).unwrap();
        shmem.put(&mine, &pattern(len, rank), rank).unwrap();
        shmem.barrier().unwrap();
        // Every PE's slot of every PE's inbox, blocking and non-blocking.
        let slot = inbox.view(rank * len..(rank + 1) * len).unwrap();
        for pe in 0..size {
            moves_once(len, "put_from", || shmem.put_from(&slot, &mine, pe)).unwrap();
        }
        shmem.barrier().unwrap();
        for writer in 0..size {
            let slot = inbox.view(writer * len..(writer + 1) * len).unwrap();
            assert_eq!(
                read(&slot, rank),
                pattern(len, writer),
                "len {len}, from {writer}"
            );
        }
        let into = fetched.view(..len).unwrap();
        for pe in 0..size {
            moves_once(len, "get_into", || shmem.get_into(&into, &mine, pe)).unwrap();
            assert_eq!(
                read(&into, rank),
                pattern(len, pe),
                "len {len}, get from {pe}"
            );
            moves_once(len, "get_into_nbi", || shmem.get_into_nbi(&into, &mine, pe)).unwrap();
            shmem.quiet();
            assert_eq!(
                read(&into, rank),
                pattern(len, pe),
                "len {len}, get_nbi from {pe}"
            );
        }
        shmem.barrier().unwrap();
        let next = (rank + 1) % size;
        let previous = (rank + size - 1) % size;
        shmem.put(&slot, &vec![0u8; len], next).unwrap();
        shmem.barrier().unwrap();
        moves_once(len, "put_from_nbi", || {
            shmem.put_from_nbi(&slot, &mine, next)
        })
        .unwrap();
        shmem.quiet();
        shmem.barrier().unwrap();
        let from_previous = inbox.view(previous * len..(previous + 1) * len).unwrap();
        assert_eq!(
            read(&from_previous, rank),
            pattern(len, previous),
            "len {len}, nbi"
        );
        shmem.barrier().unwrap();
        shmem.put(&slot, &vec![0u8; len], next).unwrap();
        shmem.barrier().unwrap();
        moves_once(len, "put_signal_from", || {
            shmem.put_signal_from(&slot, &mine, &signal, 1u64, SignalOp::Add, next)
        })
        .unwrap();
        signals += 1;
        shmem
            .wait_signal(&signal, signals, Comparison::Eq, None)
            .unwrap();
        assert_eq!(
            read(&from_previous, rank),
            pattern(len, previous),
            "len {len}, signal"
        );
        // Overlapping on this PE, both directions, both calls: as `copy_within` leaves them.
        let whole = scratch.view(..len + 64).unwrap();
        for (from, to, get) in [(0, 16, false), (16, 0, false), (0, 7, true), (7, 0, true)] {
            let start = pattern(len + 64, rank + 3);
            shmem.put(&whole, &start, rank).unwrap();
            let mut expected = start.clone();
            expected.copy_within(from..from + len, to);
            let (source, target) = (
                scratch.view(from..from + len).unwrap(),
                scratch.view(to..to + len).unwrap(),
            );
            moves_once(len, "an overlapping transfer", || match get {
                false => shmem.put_from(&target, &source, rank),
                true => shmem.get_into(&target, &source, rank),
            })
            .unwrap();
            assert_eq!(read(&whole, rank), expected, "len {len}, {from} -> {to}");
        }
        shmem.barrier().unwrap();
    }
    // Lengths must match; a freed source or target is refused.
    let short = source.view(..3).unwrap();
    let error = shmem
        .put_from(&inbox.view(..4).unwrap(), &short, 0)
        .unwrap_err();
    assert!(error.to_string().contains("byte-count mismatch"), "{error}");
    let error = shmem
        .get_into(&short, &inbox.view(..4).unwrap(), 0)
        .unwrap_err();
    assert!(error.to_string().contains("byte-count mismatch"), "{error}");
    shmem.barrier().unwrap();
    let whole_source = source.region();
    shmem.free(source).unwrap();
    let stale = hyper_multicore_test_region(whole_source);
    freed(
        shmem.put_from(&inbox.view(..MAX).unwrap(), &stale, 0),
        "put_from of a freed source",
    );
    freed(
        shmem.get_into(&stale, &inbox.view(..MAX).unwrap(), 0),
        "get_into a freed target",
    );
    shmem.barrier().unwrap();
    for allocation in [inbox, fetched, scratch] {
        shmem.free(allocation).unwrap();
    }
    shmem.free(signal).unwrap();
    finish(shmem);
}

/// A [`Region`](hyper_multicore::shmem::Region) as a symmetric range of bytes (a handle kept
/// past its allocation's free, as a front that tracks regions could).
fn hyper_multicore_test_region(region: hyper_multicore::shmem::Region) -> impl Symmetric<u8> {
    struct Stale(hyper_multicore::shmem::Region);
    impl Symmetric<u8> for Stale {
        fn region(&self) -> hyper_multicore::shmem::Region {
            self.0
        }
    }
    Stale(region)
}

/// The largest allocation that fits the heap, written at both ends.
fn largest_allocation_that_fits() {
    let (_world, shmem) = start_runtime(HEAP).unwrap();
    let all = shmem.allocate::<u8>(16 << 20, Some(16)).unwrap();
    let too_much = shmem.allocate::<u8>(1, None).unwrap_err();
    assert!(too_much.to_string().contains("exhausted"), "{too_much}");
    let next = (shmem.rank() + 1) % shmem.size();
    shmem.put(&all.view(0..1).unwrap(), &[7], next).unwrap();
    shmem
        .put(&all.view((16 << 20) - 1..).unwrap(), &[9], next)
        .unwrap();
    shmem.barrier().unwrap();
    let (mut first, mut last) = ([0u8], [0u8]);
    shmem
        .get(&mut first, &all.view(..1).unwrap(), shmem.rank())
        .unwrap();
    shmem
        .get(
            &mut last,
            &all.view((16 << 20) - 1..).unwrap(),
            shmem.rank(),
        )
        .unwrap();
    assert_eq!((first, last), ([7], [9]));
    shmem.barrier().unwrap();
    shmem.free(all).unwrap();
    finish(shmem);
}

/// A ring of put_signal; every comparison of wait_signal; 32- and 64-bit signal words.
fn signals() {
    let (_world, shmem) = start_runtime(HEAP).unwrap();
    let (rank, size) = (shmem.rank(), shmem.size());
    let next = (rank + 1) % size;
    let previous = (rank + size - 1) % size;
    let data = shmem.allocate::<u32>(64, None).unwrap();
    let flag64 = shmem.allocate::<u64>(1, None).unwrap();
    let flag32 = shmem.allocate::<u32>(1, None).unwrap();
    shmem.barrier().unwrap();
    for round in 1..=200u64 {
        let payload = [round as u32 * 1000 + rank as u32; 64];
        shmem
            .put_signal(&data, &payload, &flag64, round, SignalOp::Set, next)
            .unwrap();
        assert_eq!(
            shmem
                .wait_signal(&flag64, round, Comparison::Eq, None)
                .unwrap(),
            round
        );
        let mut got = [0u32; 64];
        shmem.get(&mut got, &data, rank).unwrap();
        assert_eq!(
            got,
            [round as u32 * 1000 + previous as u32; 64],
            "round {round}"
        );
        shmem.barrier().unwrap();
    }
    // Every PE adds 1 to every PE's 32-bit counter.
    for pe in 0..size {
        shmem.signal(&flag32, 1u32, SignalOp::Add, pe).unwrap();
    }
    let total = size as u32;
    assert_eq!(
        shmem
            .wait_signal(&flag32, total, Comparison::Ge, None)
            .unwrap(),
        total
    );
    for (comparison, value) in [
        (Comparison::Eq, total),
        (Comparison::Ne, total + 1),
        (Comparison::Gt, total - 1),
        (Comparison::Ge, total),
        (Comparison::Lt, total + 1),
        (Comparison::Le, total),
    ] {
        assert_eq!(
            shmem.wait_signal(&flag32, value, comparison, None).unwrap(),
            total
        );
    }
    let never = shmem
        .wait_signal(
            &flag32,
            0,
            Comparison::Eq,
            Some(std::time::Duration::from_millis(50)),
        )
        .unwrap_err();
    assert_eq!(never.kind(), hyper_multicore::ErrorKind::Timeout);
    shmem.barrier().unwrap();
    shmem.free(flag32).unwrap();
    shmem.free(flag64).unwrap();
    shmem.free(data).unwrap();
    finish(shmem);
}

/// Atomics of every width and signedness, contended from every PE.
fn atomics() {
    let (_world, shmem) = start_runtime(HEAP).unwrap();
    let (rank, size) = (shmem.rank(), shmem.size());
    let c64 = shmem.allocate::<u64>(1, None).unwrap();
    let c32 = shmem.allocate::<i32>(1, None).unwrap();
    let s64 = shmem.allocate::<i64>(1, None).unwrap();
    let lock = shmem.allocate::<u32>(1, None).unwrap();
    shmem.barrier().unwrap();
    for _ in 0..1000 {
        shmem.atomic_add(&c64, 1u64, 0).unwrap();
        shmem.atomic_fetch_add(&c32, -1i32, 0).unwrap();
    }
    // A spin lock made of compare-swap protecting a non-atomic increment on PE 0.
    for _ in 0..100 {
        while shmem
            .atomic_compare_swap(&lock, 0u32, rank as u32 + 1, 0)
            .unwrap()
            != 0
        {
            std::thread::yield_now();
        }
        let v = shmem.atomic_fetch(&s64, 0).unwrap();
        shmem.atomic_set(&s64, v + 1, 0).unwrap();
        assert_eq!(shmem.atomic_swap(&lock, 0u32, 0).unwrap(), rank as u32 + 1);
    }
    shmem.barrier().unwrap();
    assert_eq!(shmem.atomic_fetch(&c64, 0).unwrap(), 1000 * size as u64);
    assert_eq!(shmem.atomic_fetch(&c32, 0).unwrap(), -1000 * size as i32);
    assert_eq!(shmem.atomic_fetch(&s64, 0).unwrap(), 100 * size as i64);
    let whole = shmem.allocate::<u64>(2, None).unwrap();
    let error = shmem.atomic_fetch(&whole, 0).unwrap_err();
    assert!(error.to_string().contains("exactly one"), "{error}");
    shmem.barrier().unwrap();
    shmem.free(c64).unwrap();
    shmem.free(whole).unwrap();
    shmem.free(lock).unwrap();
    shmem.free(s64).unwrap();
    shmem.free(c32).unwrap();
    finish(shmem);
}

/// all_gather, broadcast, all_to_all, all_reduce (sum/min/max on four types), ptr.
fn collectives() {
    let (_world, shmem) = start_runtime(HEAP).unwrap();
    let (rank, size) = (shmem.rank(), shmem.size());
    let gathered = shmem.allocate::<u16>(3 * size, None).unwrap();
    shmem.all_gather(&gathered, &[rank as u16; 3]).unwrap();
    let mut all = vec![0u16; 3 * size];
    shmem.get(&mut all, &gathered, rank).unwrap();
    let expected: Vec<u16> = (0..size).flat_map(|r| [r as u16; 3]).collect();
    assert_eq!(all, expected);
    let empty = shmem.allocate::<u16>(0, None).unwrap();
    shmem.all_gather(&empty, &[]).unwrap();
    assert!(shmem.all_gather(&gathered, &[1u16; 2]).is_err());

    let broadcast = shmem.allocate::<i64>(5, None).unwrap();
    let root = size - 1;
    shmem
        .broadcast(&broadcast, &[rank as i64 * 10; 5], root)
        .unwrap();
    let mut got = [0i64; 5];
    shmem.get(&mut got, &broadcast, rank).unwrap();
    assert_eq!(got, [root as i64 * 10; 5]);

    let exchanged = shmem.allocate::<u32>(2 * size, None).unwrap();
    let source: Vec<u32> = (0..size)
        .flat_map(|to| [(rank * 100 + to) as u32; 2])
        .collect();
    shmem.all_to_all(&exchanged, &source).unwrap();
    let mut received = vec![0u32; 2 * size];
    shmem.get(&mut received, &exchanged, rank).unwrap();
    let expected: Vec<u32> = (0..size)
        .flat_map(|from| [(from * 100 + rank) as u32; 2])
        .collect();
    assert_eq!(received, expected);

    macro_rules! reduce_check {
        ($ty:ty) => {{
            let source = shmem.allocate::<$ty>(4, None).unwrap();
            let target = shmem.allocate::<$ty>(4, None).unwrap();
            shmem
                .put(&source, &[rank as $ty + 1 as $ty; 4], rank)
                .unwrap();
            let n = size as $ty;
            for (op, expected) in [
                (ReduceOp::Sum, n * (n + 1 as $ty) / 2 as $ty),
                (ReduceOp::Min, 1 as $ty),
                (ReduceOp::Max, n),
            ] {
                shmem.all_reduce(&target, &source, op).unwrap();
                let mut out = [0 as $ty; 4];
                shmem.get(&mut out, &target, rank).unwrap();
                assert_eq!(out, [expected; 4], "{} {:?}", stringify!($ty), op);
            }
            // In place.
            shmem.all_reduce(&source, &source, ReduceOp::Max).unwrap();
            let mut out = [0 as $ty; 4];
            shmem.get(&mut out, &source, rank).unwrap();
            assert_eq!(out, [n; 4]);
            shmem.barrier().unwrap();
            shmem.free(target).unwrap();
            shmem.free(source).unwrap();
        }};
    }
    reduce_check!(i32);
    reduce_check!(i64);
    reduce_check!(f32);
    reduce_check!(f64);

    // A direct pointer to the next PE's copy sees what a put wrote.
    let next = (rank + 1) % size;
    shmem
        .put(&broadcast.view(0..1).unwrap(), &[42], next)
        .unwrap();
    shmem.quiet();
    let route = &shmem.debug_state().transport.expect("initialized").routes[next];
    if route == "shm" {
        let pointer = shmem.ptr(&broadcast, next).unwrap();
        // SAFETY: the pointer addresses a live allocation of this lifetime; the read is volatile
        // and nothing else writes this word now.
        let seen = unsafe { std::ptr::read_volatile(pointer.as_ptr()) };
        assert_eq!(seen, 42);
    } else {
        // Not mapped here (HYPER_MULTICORE_SHMEM_TRANSPORT=ucx): refused, and a get sees it.
        assert!(shmem.ptr(&broadcast, next).is_err());
        let mut seen = [0];
        shmem
            .get(&mut seen, &broadcast.view(0..1).unwrap(), next)
            .unwrap();
        assert_eq!(seen, [42]);
    }
    shmem.barrier().unwrap();
    shmem.free(exchanged).unwrap();
    shmem.free(broadcast).unwrap();
    shmem.free(empty).unwrap();
    shmem.free(gathered).unwrap();
    finish(shmem);
}

/// Barrier rounds where every PE checks it sees every peer's pre-barrier write.
fn barriers() {
    let (_world, shmem) = start_runtime(HEAP).unwrap();
    let (rank, size) = (shmem.rank(), shmem.size());
    let marks = shmem.allocate::<u64>(size, None).unwrap();
    shmem.barrier().unwrap();
    for round in 1..=300u64 {
        for pe in 0..size {
            shmem
                .put(&marks.view(rank..=rank).unwrap(), &[round], pe)
                .unwrap();
        }
        shmem.barrier().unwrap();
        let mut seen = vec![0u64; size];
        shmem.get(&mut seen, &marks, rank).unwrap();
        assert!(seen.iter().all(|&m| m == round), "round {round}: {seen:?}");
        shmem.barrier().unwrap();
    }
    shmem.free(marks).unwrap();
    finish(shmem);
}

/// A freed allocation, a region copy that outlived it, and a range past an allocation's end are
/// refused by every data-plane operation, on every PE.
fn freed_and_foreign_regions_are_refused() {
    use hyper_multicore::shmem::Region;
    let (_world, shmem) = start_runtime(HEAP).unwrap();
    let size = shmem.size();
    let keep = shmem.allocate::<u64>(4, None).unwrap();
    let doomed = shmem.allocate::<u64>(4, None).unwrap();
    let copy = doomed.region();
    shmem.barrier().unwrap();
    shmem.free_id(doomed.id()).unwrap();
    for pe in 0..size {
        freed(shmem.put_bytes(copy, &[0u8; 32], pe), "put_bytes");
        freed(shmem.get_bytes(&mut [0u8; 32], copy, pe), "get_bytes");
        freed(shmem.put(&doomed, &[1u64; 4], pe), "put");
        freed(shmem.get(&mut [0u64; 4], &doomed, pe), "get");
        freed(
            shmem.atomic_add(&doomed.view(0..1).unwrap(), 1u64, pe),
            "atomic_add",
        );
        freed(shmem.ptr(&doomed, pe).map(drop), "ptr");
    }
    freed(
        shmem
            .wait_signal(&doomed.view(0..1).unwrap(), 0u64, Comparison::Eq, None)
            .map(drop),
        "wait_signal",
    );
    // A region past the end of a live allocation (a hand-made or stale copy).
    let past = Region {
        bytes: keep.region().bytes + 8,
        ..keep.region()
    };
    let error = shmem
        .put_bytes(past, &vec![0u8; past.bytes as usize], 0)
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::InvalidArgument, "{error}");
    assert!(error.to_string().contains("outside allocation"), "{error}");
    // The live allocation still works.
    shmem.put(&keep, &[7u64; 4], 0).unwrap();
    shmem.barrier().unwrap();
    drop(doomed);
    shmem.free(keep).unwrap();
    finish(shmem);
}

/// The `_located` entries: a range checked once by `locate_region` (and parts of it) moves
/// data and runs every atomic to every PE; a `LocatedCache` gives back what was stored; and
/// the entries still refuse a freed allocation, a PE out of range, a length or word-size
/// mismatch, with the checked entries' errors.
fn located_ranges() {
    use hyper_multicore::shmem::{AtomicOp, LocatedCache};
    let (_world, shmem) = start_runtime(HEAP).unwrap();
    let (rank, size) = (shmem.rank(), shmem.size());
    let words = shmem.allocate::<u64>(2 * size, None).unwrap();
    let whole = shmem.locate_region("test", words.region()).unwrap();
    assert_eq!(whole.region(), words.region());
    assert!(
        whole.part(0, 16 * size as u64 + 1).is_none(),
        "past the end"
    );
    assert!(whole.part(u64::MAX, 2).is_none(), "overflowing");
    let cache = LocatedCache::new();
    assert!(cache.load().is_none());
    cache.store([1, 2, 3], whole);
    assert_eq!(cache.load(), Some(([1, 2, 3], whole)));
    shmem.barrier().unwrap();
    // Slot `rank` of every PE gets this PE's bytes; slot `size + rank` counts atomically.
    let slot = whole.part(8 * rank as u64, 8).unwrap();
    let counter = whole.part(8 * (size + rank) as u64, 8).unwrap();
    for pe in 0..size {
        shmem
            .put_located(&slot, &(rank as u64 + 100).to_ne_bytes(), pe)
            .unwrap();
        let before: u64 = shmem
            .atomic_located(&counter, AtomicOp::FetchAdd(5), pe)
            .unwrap();
        assert_eq!(before, 0);
        let op = AtomicOp::CompareSwap {
            expected: 5u64,
            desired: 7,
        };
        assert_eq!(shmem.atomic_located(&counter, op, pe).unwrap(), 5);
        assert_eq!(
            shmem
                .atomic_located(&counter, AtomicOp::Swap(9u64), pe)
                .unwrap(),
            7
        );
        shmem
            .atomic_located(&counter, AtomicOp::Set(11u64), pe)
            .unwrap();
        assert_eq!(
            shmem
                .atomic_located::<u64>(&counter, AtomicOp::Fetch, pe)
                .unwrap(),
            11
        );
    }
    shmem.barrier().unwrap();
    for pe in 0..size {
        for writer in 0..size {
            let mut back = [0u8; 8];
            let part = whole.part(8 * writer as u64, 8).unwrap();
            shmem.get_located(&mut back, &part, pe).unwrap();
            assert_eq!(
                u64::from_ne_bytes(back),
                writer as u64 + 100,
                "PE {pe}, writer {writer}"
            );
        }
    }
    // The checks the checked entries make, with their errors.
    let error = shmem.put_located(&slot, &[0u8; 8], size).unwrap_err();
    assert!(
        error
            .to_string()
            .contains(&format!("PE {size} is out of range")),
        "{error}"
    );
    let error = shmem.get_located(&mut [0u8; 4], &slot, 0).unwrap_err();
    assert!(error.to_string().contains("byte-count mismatch"), "{error}");
    let error = shmem
        .atomic_located(&counter, AtomicOp::FetchAdd(1u32), 0)
        .unwrap_err();
    assert!(
        error.to_string().contains("exactly one 4-byte word"),
        "{error}"
    );
    // A freed allocation is refused through a range located while it was live.
    shmem.barrier().unwrap();
    shmem.free(words).unwrap();
    for pe in 0..size {
        freed(shmem.put_located(&slot, &[0u8; 8], pe), "put_located");
        freed(shmem.get_located(&mut [0u8; 8], &slot, pe), "get_located");
        freed(
            shmem
                .atomic_located(&counter, AtomicOp::FetchAdd(1u64), pe)
                .map(drop),
            "atomic_located",
        );
    }
    finish(shmem);
}

/// A get from a PE whose main thread is busy — computing, never calling the runtime — completes:
/// over UCX (forced here) the target's progress thread serves it. PE 1 spins (yielding) on a word
/// of its own heap through a raw pointer until PE 0, after its get, puts the release value there.
fn a_get_from_a_busy_peer_completes() {
    let (_world, shmem) = start_runtime(HEAP).unwrap();
    let data = shmem.allocate::<u64>(4, None).unwrap();
    let release = shmem.allocate::<u64>(1, None).unwrap();
    shmem.put(&data, &[7, 8, 9, 10], shmem.rank()).unwrap();
    shmem.put(&release, &[0], shmem.rank()).unwrap();
    shmem.barrier().unwrap();
    if shmem.rank() == 1 {
        let word = shmem.ptr(&release, 1).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        // SAFETY: the pointer addresses this PE's own live word; the reads are volatile and
        // never form a reference.
        while unsafe { std::ptr::read_volatile(word.as_ptr()) } != 1 {
            assert!(
                std::time::Instant::now() < deadline,
                "PE 0 never released PE 1"
            );
            std::thread::yield_now();
        }
    } else {
        let mut seen = [0u64; 4];
        shmem.get(&mut seen, &data, 1).unwrap();
        assert_eq!(seen, [7, 8, 9, 10]);
        shmem.put(&release, &[1], 1).unwrap();
        shmem.quiet();
    }
    shmem.barrier().unwrap();
    shmem.free(release).unwrap();
    shmem.free(data).unwrap();
    finish(shmem);
}

#[test]
fn a_get_from_a_busy_peer_completes_over_ucx() {
    if is_pe() {
        return a_get_from_a_busy_peer_completes();
    }
    Job::launch_with(
        stringify!(a_get_from_a_busy_peer_completes_over_ucx),
        2,
        Options::default().env(TRANSPORT, "ucx"),
    )
    .wait()
    .assert_all_succeeded();
}

/// Large puts arrive whole and in order: each PE puts 600 KiB + 13 bytes (over UCX's TCP lanes,
/// three active messages of up to 256 KiB) at an odd offset of the next PE's buffer, then
/// another pattern over the second half of the same range; after a barrier each PE checks
/// what it received byte by byte (the later put's bytes where the two overlap), and what it
/// wrote, read back with one large get.
fn large_puts_arrive_whole_and_in_order() {
    let (_world, shmem) = start_runtime(HEAP).unwrap();
    let (rank, size) = (shmem.rank(), shmem.size());
    let len = 600 * 1024 + 13;
    let buffer = shmem.allocate::<u8>(len + 64, None).unwrap();
    let target = buffer.view(7..7 + len).unwrap();
    let tail = target.view(len / 2..len).unwrap();
    // What `writer`'s two puts leave at byte `i`: the first pattern, the second's over the tail.
    let left_by = |writer: usize, i: usize| {
        if i < len / 2 {
            (i * 31 + writer * 7) as u8
        } else {
            (i * 17 + writer * 3 + 1) as u8
        }
    };
    let check = |bytes: &[u8], writer: usize, whose: &str| {
        for (i, &byte) in bytes.iter().enumerate() {
            assert_eq!(byte, left_by(writer, i), "byte {i} of {whose}");
        }
    };
    let next = (rank + 1) % size;
    let first: Vec<u8> = (0..len).map(|i| (i * 31 + rank * 7) as u8).collect();
    shmem.put(&target, &first, next).unwrap();
    let second: Vec<u8> = (len / 2..len).map(|i| left_by(rank, i)).collect();
    shmem.put(&tail, &second, next).unwrap();
    shmem.barrier().unwrap();
    let writer = (rank + size - 1) % size;
    let mut received = vec![0u8; len];
    shmem.get(&mut received, &target, rank).unwrap();
    check(&received, writer, &format!("PE {writer}'s puts"));
    // And read back whole from the next PE (over UCX's TCP lanes: answered in three messages).
    let mut remote = vec![0u8; len];
    shmem.get(&mut remote, &target, next).unwrap();
    check(
        &remote,
        rank,
        &format!("this PE's puts, read back from PE {next}"),
    );
    shmem.barrier().unwrap();
    shmem.free(buffer).unwrap();
    finish(shmem);
}

/// PE 1 writes its process ID into `pid_word` on PE 0 and every PE meets in a barrier; PE 0
/// then reads it (the ID to stop PE 1 by): `Some` on PE 0, `None` on the others.
fn process_id_of_pe_1(shmem: &Shmem, pid_word: &impl Symmetric<u64>) -> Option<i32> {
    if shmem.rank() == 1 {
        shmem
            .put(pid_word, &[u64::from(std::process::id())], 0)
            .unwrap();
    }
    shmem.barrier().unwrap();
    (shmem.rank() == 0).then(|| {
        let mut pid = [0u64];
        shmem.get(&mut pid, pid_word, 0).unwrap();
        i32::try_from(pid[0]).unwrap()
    })
}

/// The call of a PE that was stopped while PE 0 gave up on it: its deadline passed meanwhile,
/// or it finds PE 0 gone.
fn assert_timed_out_or_lost<T: std::fmt::Debug>(outcome: hyper_multicore::Result<T>, what: &str) {
    assert!(
        outcome
            .as_ref()
            .is_err_and(|e| matches!(e.kind(), ErrorKind::PeerLost | ErrorKind::Timeout)),
        "{what}: {outcome:?}"
    );
}

/// What PE 0 does to a stopped PE 1 in [`waits_for_a_stopped_target`]: an operation and a quiet,
/// or a get.
#[derive(Clone, Copy)]
enum WhileStopped {
    PutThenQuiet,
    SignalThenQuiet,
    AtomicAddThenQuiet,
    LargeGet,
}

/// A quiet returns only once the target has applied this PE's puts, signals and non-fetching
/// atomics, and a get only once the target answered it. Over UCX's TCP lanes
/// (`UCX_TLS=tcp,self`: the target's progress applies everything) puts, signals and atomic adds
/// go as active messages that no UCX flush covers (the quiet probes the peer instead), and a
/// large get is a request the target answers with messages into the lent buffer: with PE 1
/// stopped (SIGSTOP) after it told PE 0 its process ID, PE 0's put (or signal, or add) leaves
/// at once and its quiet waits until its deadline (`HYPER_MULTICORE_SHMEM_TIMEOUT_SEC=2`), as
/// does the get; each fails with Timeout naming PE 1. PE 0 then lets PE 1 go on (whose late
/// answer to the get lands nowhere), and PE 1's barrier fails too: its deadline passed while
/// it was stopped, or it sees PE 0 gone.
fn waits_for_a_stopped_target(what: WhileStopped) {
    use rustix::process::{kill_process, Pid, Signal};
    const LARGE: usize = 300_000;
    let (_world, shmem) = start_runtime(HEAP).unwrap();
    let words = shmem.allocate::<u64>(2, None).unwrap();
    let large = shmem.allocate::<u8>(LARGE, None).unwrap();
    let (pid_word, data) = (words.view(0..1).unwrap(), words.view(1..2).unwrap());
    let Some(pid) = process_id_of_pe_1(&shmem, &pid_word) else {
        // Stopped in here by PE 0, continued after its call failed.
        assert_timed_out_or_lost(shmem.barrier(), "PE 1's barrier after PE 0's call failed");
        return;
    };
    let target = Pid::from_raw(pid).expect("PE 1's process ID");
    kill_process(target, Signal::STOP).unwrap();
    wait_until_stopped(pid);
    let outcome = match what {
        WhileStopped::PutThenQuiet => {
            shmem.put(&data, &[7], 1).unwrap();
            shmem.try_quiet()
        }
        WhileStopped::SignalThenQuiet => {
            shmem.signal(&data, 7, SignalOp::Set, 1).unwrap();
            shmem.try_quiet()
        }
        WhileStopped::AtomicAddThenQuiet => {
            shmem.atomic_add(&data, 7, 1).unwrap();
            shmem.try_quiet()
        }
        WhileStopped::LargeGet => shmem.get(&mut vec![0u8; LARGE], &large, 1),
    };
    kill_process(target, Signal::CONT).unwrap();
    let error = outcome.expect_err("the call returned while its target was stopped");
    assert_eq!(error.kind(), ErrorKind::Timeout, "{error}");
    assert_eq!(error.peer(), Some(1), "{error}");
}

fn a_quiet_waits_for_a_stopped_target_after_a_put() {
    waits_for_a_stopped_target(WhileStopped::PutThenQuiet);
}

fn a_quiet_waits_for_a_stopped_target_after_a_signal() {
    waits_for_a_stopped_target(WhileStopped::SignalThenQuiet);
}

fn a_quiet_waits_for_a_stopped_target_after_an_atomic_add() {
    waits_for_a_stopped_target(WhileStopped::AtomicAddThenQuiet);
}

fn a_large_get_waits_for_a_stopped_target() {
    waits_for_a_stopped_target(WhileStopped::LargeGet);
}

/// A PE that tears its runtime down while its answer to a peer's get is still in flight (the
/// peer stopped reading) releases its heap: UCX completes or fails the answer's send as the
/// endpoints and the worker go, and the send's hold on the heap mapping ends with it. Over UCX's
/// TCP lanes a large get is a request that the target's handler answers with messages sent
/// from its heap without waiting (each holds the mapping until UCX is done with it). PE 1 asks
/// PE 0 for 32 MiB — more than the sockets' buffers take — again and again; PE 0 stops it
/// (SIGSTOP) while an answer is on its way and checks that it still is once PE 1 stopped (on a
/// busy machine PE 1 may have taken the whole answer first: PE 0 then lets it go on to its next
/// get and tries again). PE 0 then drops its runtime and must be left with no answer holding the
/// heap and no mapping of it. PE 1, continued, sees its get fail (its deadline passed while it
/// was stopped, or PE 0 is gone).
fn a_reply_in_flight_at_teardown_releases_the_heap() {
    use rustix::process::{kill_process, Pid, Signal};
    use std::time::{Duration, Instant};
    const LARGE: usize = 32 << 20;
    let (world, shmem) = start_runtime(Some(2 * LARGE as u64)).unwrap();
    let pid_word = shmem.allocate::<u64>(1, None).unwrap();
    let large = shmem.allocate::<u8>(LARGE, None).unwrap();
    let Some(pid) = process_id_of_pe_1(&shmem, &pid_word) else {
        // Stopped in one of these by PE 0, continued after PE 0 dropped its runtime.
        let mut landing = vec![0u8; LARGE];
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            let outcome = shmem.get(&mut landing, &large, 0);
            if outcome.is_err() {
                assert_timed_out_or_lost(
                    outcome,
                    "PE 1's get from PE 0, which dropped its runtime",
                );
                return;
            }
        }
        panic!("PE 1's gets kept succeeding for 60 s: PE 0 never dropped its runtime");
    };
    let peer = Pid::from_raw(pid).expect("PE 1's process ID");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        while Shmem::ucx_replies_in_flight() == 0 {
            assert!(
                Instant::now() < deadline,
                "no answer to PE 1's gets was seen in flight within 30 s"
            );
            std::thread::yield_now();
        }
        kill_process(peer, Signal::STOP).unwrap();
        wait_until_stopped(pid);
        if Shmem::ucx_replies_in_flight() > 0 {
            break;
        }
        // PE 1 took the whole answer before it stopped: on to its next get.
        kill_process(peer, Signal::CONT).unwrap();
    }
    assert!(
        heap_mappings() > 0,
        "PE 0's heap is not mapped while it answers"
    );
    drop(shmem);
    drop(world);
    let (answers, maps) = (Shmem::ucx_replies_in_flight(), heap_mappings());
    kill_process(peer, Signal::CONT).unwrap();
    assert_eq!(answers, 0, "answers still hold the heap after the teardown");
    assert_eq!(maps, 0, "the heap is still mapped after the teardown");
}

macro_rules! over_ucx_with_a_short_timeout {
    ($($body:ident: $name:ident),* $(,)?) => {$(
        #[test]
        fn $name() {
            if is_pe() {
                return $body();
            }
            let options = Options::default()
                .env(TRANSPORT, "ucx")
                .env("UCX_TLS", "tcp,self")
                .env(hyper_multicore::config::TIMEOUT_SEC, "2");
            Job::launch_with(stringify!($name), 2, options)
                .wait()
                .assert_all_succeeded();
        }
    )*};
}

over_ucx_with_a_short_timeout!(
    a_quiet_waits_for_a_stopped_target_after_a_put: a_quiet_waits_for_a_stopped_target_after_a_put_over_ucx,
    a_quiet_waits_for_a_stopped_target_after_a_signal: a_quiet_waits_for_a_stopped_target_after_a_signal_over_ucx,
    a_quiet_waits_for_a_stopped_target_after_an_atomic_add: a_quiet_waits_for_a_stopped_target_after_an_atomic_add_over_ucx,
    a_large_get_waits_for_a_stopped_target: a_large_get_waits_for_a_stopped_target_over_ucx,
    a_reply_in_flight_at_teardown_releases_the_heap: a_reply_in_flight_at_teardown_releases_the_heap_over_ucx,
);

macro_rules! on_pes {
    ($body:ident: $($name:ident = $pes:expr),* $(,)?) => {$(
        #[test]
        fn $name() {
            if is_pe() {
                return $body();
            }
            Job::launch(stringify!($name), $pes).wait().assert_all_succeeded();
        }
    )*};
}

on_pes!(puts_and_gets: puts_and_gets_2_pes = 2, puts_and_gets_4_pes = 4);
on_pes!(heap_to_heap_transfers_move_the_bytes_once: heap_to_heap_once_2_pes = 2, heap_to_heap_once_3_pes = 3);
on_pes!(large_puts_arrive_whole_and_in_order: large_puts_arrive_whole_and_in_order_2_pes = 2, large_puts_arrive_whole_and_in_order_4_pes = 4);
on_pes!(largest_allocation_that_fits: largest_allocation_2_pes = 2);
on_pes!(signals: signals_2_pes = 2, signals_4_pes = 4, signals_8_pes = 8);
on_pes!(atomics: atomics_2_pes = 2, atomics_4_pes = 4);
on_pes!(collectives: collectives_2_pes = 2, collectives_4_pes = 4);
on_pes!(barriers: barriers_2_pes = 2, barriers_4_pes = 4, barriers_8_pes = 8);
on_pes!(freed_and_foreign_regions_are_refused: freed_and_foreign_regions_are_refused_2_pes = 2);
on_pes!(located_ranges: located_ranges_2_pes = 2, located_ranges_4_pes = 4);

/// A root spanning two simulated hosts (`HYPER_MULTICORE_TEST_HOST`: ranks 0–1 on "a", 2–3 on
/// "b"): shared memory within each host's segment, UCX between them, barriers and the allocate
/// argument check over the control plane. Every data-plane body runs unchanged.
macro_rules! on_two_hosts {
    ($body:ident: $($name:ident),* $(,)?) => {$(
        #[test]
        fn $name() {
            if is_pe() {
                return $body();
            }
            let mut options = Options::default();
            for rank in 0..4 {
                options = options.rank_env(rank, TEST_HOST_VARIABLE, if rank < 2 { "a" } else { "b" });
            }
            Job::launch_with(stringify!($name), 4, options)
                .wait()
                .assert_all_succeeded();
        }
    )*};
}

on_two_hosts!(puts_and_gets: puts_and_gets_across_two_hosts);
on_two_hosts!(heap_to_heap_transfers_move_the_bytes_once: heap_to_heap_once_across_two_hosts);
on_two_hosts!(signals: signals_across_two_hosts);
on_two_hosts!(atomics: atomics_across_two_hosts);
on_two_hosts!(collectives: collectives_across_two_hosts);
on_two_hosts!(barriers: barriers_across_two_hosts);
on_two_hosts!(routes_follow_the_hosts: routes_follow_the_simulated_hosts);

/// Each PE's routes: `shm` to the PEs of its own simulated host, `ucx` to the others (unless
/// `HYPER_MULTICORE_SHMEM_TRANSPORT=ucx` forces every peer through UCX).
fn routes_follow_the_hosts() {
    let (_world, shmem) = start_runtime(HEAP).unwrap();
    let forced = std::env::var(TRANSPORT).is_ok_and(|v| v == "ucx");
    let routes = shmem.debug_state().transport.expect("initialized").routes;
    let expected: Vec<&str> = (0..4)
        .map(|pe| {
            let same_host = pe / 2 == shmem.rank() / 2;
            if pe == shmem.rank() || (same_host && !forced) {
                "shm"
            } else {
                "ucx"
            }
        })
        .collect();
    assert_eq!(routes, expected);
    finish(shmem);
}

/// The word operations in a row over the UCX route, 2 PEs with every pair on UCX: one-way signal
/// and put_signal ping-pong, get 8 B, fetch-add and put 8 B + quiet, each checked (the data and
/// signal values that arrive, the fetched values, the words left behind) and each timed. Not a
/// test of speed (nothing is asserted about time): with `HM_REPORT_ITERS` set it runs that many
/// rounds and prints the latencies for docs/multinode.md: `HM_REPORT_ITERS=2000 cargo test -p
/// hyper-multicore --test data_plane ucx_route_latency_report -- --nocapture`.
#[test]
fn ucx_route_latency_report() {
    if is_pe() {
        return ucx_route_latencies();
    }
    let result = Job::launch_with(
        stringify!(ucx_route_latency_report),
        2,
        Options::default().env(TRANSPORT, "ucx"),
    )
    .wait();
    result.assert_all_succeeded();
    let lines = result.pe(0).lines_with("REPORT");
    assert_eq!(lines.len(), 5, "PE 0 timed every operation: {lines:?}");
    if std::env::var_os("HM_REPORT_ITERS").is_some() {
        for line in lines {
            println!("UCX route:{line}");
        }
    }
}

/// The value each PE's `word` holds before the gets and fetch-adds of [`ucx_route_latencies`].
const FIRST_WORD: u64 = 41;

fn ucx_route_latencies() {
    use std::time::{Duration, Instant};
    let iters: usize = std::env::var("HM_REPORT_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50)
        .max(1);
    let (_world, shmem) = start_runtime(HEAP).unwrap();
    let (rank, peer) = (shmem.rank(), 1 - shmem.rank());
    let word = shmem.allocate::<u64>(1, None).unwrap();
    let flag = shmem.allocate::<u64>(1, None).unwrap();
    let data = shmem.allocate::<u64>(1, None).unwrap();
    shmem.put(&flag, &[0], rank).unwrap();
    shmem.put(&word, &[FIRST_WORD], rank).unwrap();
    shmem.barrier().unwrap();
    let own = |allocation: &Allocation<u64>| {
        let mut value = [0u64];
        shmem.get(&mut value, allocation, rank).unwrap();
        value[0]
    };
    let median = |mut samples: Vec<Duration>| {
        samples.sort();
        samples[samples.len() / 2]
    };
    let report = |what: &str, value: Duration| {
        println!("REPORT {what}: median {:.1} us", value.as_secs_f64() * 1e6);
    };
    // Ping-pong: rank 0 signals 2k+1, rank 1 answers 2k+2; half a round trip is one way.
    for (name, with_data) in [("signal one-way", false), ("put_signal one-way", true)] {
        let mut rounds = Vec::with_capacity(iters);
        shmem.put(&flag, &[0], rank).unwrap();
        shmem.barrier().unwrap();
        for k in 0..iters as u64 {
            let started = Instant::now();
            let (send, expect) = if rank == 0 {
                (2 * k + 1, 2 * k + 2)
            } else {
                (2 * k + 2, 2 * k + 1)
            };
            if rank == 1 {
                shmem
                    .wait_signal(&flag, expect, Comparison::Eq, None)
                    .unwrap();
                if with_data {
                    assert_eq!(own(&data), k, "PE 1's data with signal {expect}");
                }
            }
            if with_data {
                shmem
                    .put_signal(&data, &[k], &flag, send, SignalOp::Set, peer)
                    .unwrap();
            } else {
                shmem.signal(&flag, send, SignalOp::Set, peer).unwrap();
            }
            if rank == 0 {
                shmem
                    .wait_signal(&flag, expect, Comparison::Eq, None)
                    .unwrap();
                rounds.push(started.elapsed() / 2);
                if with_data {
                    assert_eq!(own(&data), k, "PE 0's data with signal {expect}");
                }
            }
        }
        shmem.barrier().unwrap();
        if rank == 0 {
            report(name, median(rounds));
        }
    }
    if rank == 0 {
        let mut value = [0u64];
        let gets: Vec<Duration> = (0..iters)
            .map(|_| {
                let started = Instant::now();
                shmem.get(&mut value, &word, peer).unwrap();
                let took = started.elapsed();
                assert_eq!(value[0], FIRST_WORD, "PE 1's word, got");
                took
            })
            .collect();
        report("get 8 B (peer idle in a barrier)", median(gets));
        let adds: Vec<Duration> = (0..iters as u64)
            .map(|i| {
                let started = Instant::now();
                let fetched = shmem.atomic_fetch_add(&word, 1, peer).unwrap();
                let took = started.elapsed();
                assert_eq!(fetched, FIRST_WORD + i, "fetch-add {i} on PE 1's word");
                took
            })
            .collect();
        report("fetch-add u64", median(adds));
        let puts: Vec<Duration> = (0..iters)
            .map(|_| {
                let started = Instant::now();
                shmem.put(&data, &[1], peer).unwrap();
                shmem.try_quiet().unwrap();
                started.elapsed()
            })
            .collect();
        report("put 8 B + quiet", median(puts));
    }
    shmem.barrier().unwrap();
    if rank == 1 {
        assert_eq!(
            own(&word),
            FIRST_WORD + iters as u64,
            "PE 1's word after the adds"
        );
        assert_eq!(own(&data), 1, "PE 1's data after the puts");
    }
    shmem.barrier().unwrap();
    for allocation in [data, flag, word] {
        shmem.free(allocation).unwrap();
    }
    finish(shmem);
}

/// Asserts that `result` is the refusal of an allocation that has been freed.
fn freed(result: hyper_multicore::Result<()>, what: &str) {
    let error = result.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::DoubleFree, "{what}: {error}");
    assert!(
        error.to_string().contains("has been freed"),
        "{what}: {error}"
    );
}
