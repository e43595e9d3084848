//! The byte-level collectives across real processes (2 to 5 PEs): broadcast (pushed by the
//! root and pulled by the members, the root's target written or kept, from private bytes and
//! from a symmetric source), all-gather, collect, all-to-all, the strided all-to-all and the
//! barrier of a set, over the whole root and over subgroups (the even PEs, every PE in reverse
//! order), at odd sizes (0, 1 and 7 bytes, and past the size thresholds), each result compared
//! with a reference computed here. With `HYPER_MULTICORE_SHMEM_TRANSPORT=ucx` the same run
//! takes the routed paths (no peer is mapped).

use hm_testkit::{is_pe, start_runtime, Job};
use hyper_multicore::shmem::{
    Allocation, Contribution, ReduceSet, Region, RootTarget, Shmem, Symmetric,
    BROADCAST_PULL_MIN_BYTES,
};
use hyper_multicore::world::{Group, World};
use hyper_multicore::ErrorKind;

/// The most PEs a test runs on.
const MAX_PES: usize = 5;
/// The largest block a PE contributes: past the pull threshold, not a multiple of 8.
const BIG: usize = BROADCAST_PULL_MIN_BYTES + 7;
const SIZES: [usize; 6] = [0, 1, 7, 8, 1000, BIG];
const SENTINEL: u8 = 0xEE;

/// The byte PE `pe` contributes at index `i` (`salt` tells calls apart).
fn pattern(pe: usize, i: usize, salt: usize) -> u8 {
    (pe * 37 + i * 11 + salt * 5 + 1) as u8
}

/// What one PE needs for the checks of one set.
struct Set<'a> {
    shmem: &'a Shmem,
    set: ReduceSet<'a>,
    /// The members' ranks, in the set's order.
    members: &'a [usize],
    /// This PE's place.
    me: usize,
    source: &'a Allocation<u8>,
    target: &'a Allocation<u8>,
}

impl Set<'_> {
    fn rank(&self) -> usize {
        self.shmem.rank()
    }

    /// `bytes` of this PE's source as a region.
    fn source(&self, bytes: usize) -> Region {
        self.source.view(0..bytes).unwrap().region()
    }

    fn target(&self, bytes: usize) -> Region {
        self.target.view(0..bytes).unwrap().region()
    }

    /// Writes `bytes` into this PE's source.
    fn fill_source(&self, bytes: &[u8]) {
        let view = self.source.view(0..bytes.len()).unwrap();
        self.shmem.put(&view, bytes, self.rank()).unwrap();
    }

    /// The sentinel in this PE's whole target, then the set meets.
    fn prepare(&self) {
        let sentinel = vec![SENTINEL; self.target.len()];
        self.shmem.put(self.target, &sentinel, self.rank()).unwrap();
        self.shmem.barrier_set(self.set).unwrap();
    }

    /// This PE's target's first `bytes` bytes, checked to be followed by the sentinel.
    fn result(&self, bytes: usize) -> Vec<u8> {
        let mut out = vec![0u8; (bytes + 16).min(self.target.len())];
        let view = self.target.view(0..out.len()).unwrap();
        self.shmem.get(&mut out, &view, self.rank()).unwrap();
        assert!(
            out[bytes..].iter().all(|&b| b == SENTINEL),
            "bytes past the {bytes} of the result were written"
        );
        out.truncate(bytes);
        out
    }

    /// The set meets after the checks (no member refills a target another still reads).
    fn done(&self) {
        self.shmem.barrier_set(self.set).unwrap();
    }

    fn broadcasts(&self, bytes: usize, salt: usize) {
        for (round, root_at) in [0, self.members.len() - 1].into_iter().enumerate() {
            let root = self.members[root_at];
            for (kind, symmetric) in [(RootTarget::Receives, false), (RootTarget::Keeps, true)] {
                let salt = salt + round * 2 + usize::from(symmetric);
                let mine: Vec<u8> = (0..bytes).map(|i| pattern(self.rank(), i, salt)).collect();
                self.fill_source(&mine);
                self.prepare();
                let source = match symmetric {
                    true => Contribution::Symmetric(self.source(bytes)),
                    false => Contribution::Local(&mine),
                };
                self.shmem
                    .broadcast_bytes(self.set, self.target(bytes), source, root, kind)
                    .unwrap();
                let want: Vec<u8> = match (self.rank() == root, kind) {
                    (true, RootTarget::Keeps) => vec![SENTINEL; bytes],
                    _ => (0..bytes).map(|i| pattern(root, i, salt)).collect(),
                };
                assert_eq!(
                    self.result(bytes),
                    want,
                    "broadcast of {bytes} from {root} {kind:?}"
                );
                self.done();
            }
        }
    }

    /// The root's source is its target itself (a symmetric source that overlaps the target).
    fn broadcast_in_place(&self, bytes: usize, salt: usize) {
        let root = self.members[self.members.len() / 2];
        let mine: Vec<u8> = (0..bytes).map(|i| pattern(self.rank(), i, salt)).collect();
        self.prepare();
        let view = self.target.view(0..bytes).unwrap();
        self.shmem.put(&view, &mine, self.rank()).unwrap();
        self.shmem.barrier_set(self.set).unwrap();
        let source = Contribution::Symmetric(self.target(bytes));
        self.shmem
            .broadcast_bytes(
                self.set,
                self.target(bytes),
                source,
                root,
                RootTarget::Receives,
            )
            .unwrap();
        let want: Vec<u8> = (0..bytes).map(|i| pattern(root, i, salt)).collect();
        assert_eq!(
            self.result(bytes),
            want,
            "in-place broadcast of {bytes} from {root}"
        );
        self.done();
    }

    fn all_gathers(&self, bytes: usize, salt: usize) {
        let mine: Vec<u8> = (0..bytes).map(|i| pattern(self.rank(), i, salt)).collect();
        self.fill_source(&mine);
        self.prepare();
        let total = bytes * self.members.len();
        let source = match bytes % 2 {
            0 => Contribution::Symmetric(self.source(bytes)),
            _ => Contribution::Local(&mine),
        };
        self.shmem
            .all_gather_bytes(self.set, self.target(total), source)
            .unwrap();
        let want: Vec<u8> = (self.members.iter())
            .flat_map(|&pe| (0..bytes).map(move |i| pattern(pe, i, salt)))
            .collect();
        assert_eq!(self.result(total), want, "all_gather of {bytes}");
        self.done();
        // A target of another length fails on every member before anything moves.
        let error = self
            .shmem
            .all_gather_bytes(self.set, self.target(total + 1), source)
            .unwrap_err();
        assert_eq!(error.kind(), ErrorKind::InvalidArgument, "{error}");
    }

    /// Member `k` contributes `bytes + k` bytes.
    fn collects(&self, bytes: usize, salt: usize) {
        let mine: Vec<u8> = (0..bytes + self.me)
            .map(|i| pattern(self.rank(), i, salt))
            .collect();
        self.fill_source(&mine);
        self.prepare();
        let source = match self.me % 2 {
            0 => Contribution::Symmetric(self.source(mine.len())),
            _ => Contribution::Local(&mine),
        };
        let whole = self.target.region();
        let total = self.shmem.collect_bytes(self.set, whole, source).unwrap();
        let want: Vec<u8> = (self.members.iter().enumerate())
            .flat_map(|(k, &pe)| (0..bytes + k).map(move |i| pattern(pe, i, salt)))
            .collect();
        assert_eq!(total, want.len() as u64);
        assert_eq!(self.result(want.len()), want, "collect of {bytes} + k");
        self.done();
    }

    /// Block `k` of this PE's source goes to member `k`.
    fn all_to_alls(&self, bytes: usize, salt: usize) {
        let n = self.members.len();
        let mine: Vec<u8> = (0..n * bytes)
            .map(|i| pattern(self.rank(), i, salt))
            .collect();
        self.fill_source(&mine);
        self.prepare();
        let source = match bytes % 2 {
            0 => Contribution::Local(&mine),
            _ => Contribution::Symmetric(self.source(n * bytes)),
        };
        self.shmem
            .all_to_all_bytes(self.set, self.target(n * bytes), source)
            .unwrap();
        let want: Vec<u8> = (self.members.iter())
            .flat_map(|&pe| (0..bytes).map(move |i| pattern(pe, self.me * bytes + i, salt)))
            .collect();
        assert_eq!(
            self.result(n * bytes),
            want,
            "all_to_all of {bytes} per member"
        );
        self.done();
    }

    /// `count` 4-byte elements per member, 3 apart in the source, 2 apart in the target.
    fn strided_all_to_alls(&self, count: usize, salt: usize) {
        let n = self.members.len();
        let element = 4;
        let extent = |stride: usize| ((n * count).max(1) - 1) * stride * element + element;
        let mine: Vec<u8> = (0..extent(3))
            .map(|i| pattern(self.rank(), i, salt))
            .collect();
        self.fill_source(&mine);
        self.prepare();
        let source = Contribution::Symmetric(self.source(mine.len()));
        self.shmem
            .all_to_all_strided(
                self.set,
                self.target(extent(2)),
                source,
                [2, 3],
                element,
                count,
            )
            .unwrap();
        let got = self.result(if count == 0 { 0 } else { extent(2) });
        for (k, &pe) in self.members.iter().enumerate() {
            for e in 0..count {
                let to = (k * count + e) * 2 * element;
                let from = (self.me * count + e) * 3 * element;
                let want: Vec<u8> = (from..from + element)
                    .map(|i| pattern(pe, i, salt))
                    .collect();
                assert_eq!(
                    got[to..to + element],
                    want[..],
                    "element {e} from member {k}"
                );
                if to + element < got.len() {
                    assert_eq!(got[to + element..to + 2 * element], [SENTINEL; 4]);
                }
            }
        }
        self.done();
    }

    /// Every put made before the set's barrier is seen after it.
    fn barriers(&self) {
        let n = self.members.len();
        for round in 0..20u8 {
            let slot = self.target.view(self.me..self.me + 1).unwrap();
            for &pe in self.members {
                self.shmem.put(&slot, &[round], pe).unwrap();
            }
            self.shmem.barrier_set(self.set).unwrap();
            let mut seen = vec![0u8; n];
            let view = self.target.view(0..n).unwrap();
            self.shmem.get(&mut seen, &view, self.rank()).unwrap();
            assert_eq!(seen, vec![round; n], "round {round}");
            self.shmem.barrier_set(self.set).unwrap();
        }
    }

    fn every_collective(&self) {
        self.barriers();
        let mut salt = 0;
        for bytes in SIZES {
            self.broadcasts(bytes, salt);
            self.broadcast_in_place(bytes, salt + 3);
            self.all_gathers(bytes, salt + 4);
            self.collects(bytes, salt + 5);
            self.all_to_alls(bytes.min(BIG / MAX_PES), salt + 6);
            self.strided_all_to_alls(bytes.min(20), salt + 7);
            salt += 8;
        }
    }
}

/// Every collective over the whole root, the even PEs and every PE in reverse order.
fn every_set() {
    let (world, shmem): (World, Shmem) = start_runtime(Some(16 << 20)).unwrap();
    let (rank, size) = (shmem.rank(), shmem.size());
    assert!(size <= MAX_PES);
    let source = shmem.allocate::<u8>(MAX_PES * BIG + 64, None).unwrap();
    let target = shmem
        .allocate::<u8>(MAX_PES * (BIG + MAX_PES) + 64, None)
        .unwrap();
    let everyone: Vec<usize> = (0..size).collect();
    let evens: Vec<usize> = (0..size).step_by(2).collect();
    let reversed: Vec<usize> = (0..size).rev().collect();
    let run = |members: &[usize], group: Option<&Group>| {
        let set = group.map_or(ReduceSet::Root, ReduceSet::Group);
        let me = members.iter().position(|&pe| pe == rank).unwrap();
        Set {
            shmem: &shmem,
            set,
            members,
            me,
            source: &source,
            target: &target,
        }
        .every_collective();
    };
    run(&everyone, None);
    shmem.barrier().unwrap();
    if rank % 2 == 0 {
        let group = world.subgroup(&evens).unwrap();
        run(&evens, Some(&group));
    }
    shmem.barrier().unwrap();
    let group = world.subgroup(&reversed).unwrap();
    run(&reversed, Some(&group));
    // A root that is not a member, and a set this PE is not in, fail before anything moves.
    let alone = world.subgroup(&[rank]).unwrap();
    let error = shmem
        .broadcast_bytes(
            ReduceSet::Group(&alone),
            target.view(0..1).unwrap().region(),
            Contribution::Local(&[1]),
            (rank + 1) % size,
            RootTarget::Receives,
        )
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::InvalidArgument, "{error}");
    shmem.barrier().unwrap();
    shmem.free(target).unwrap();
    shmem.free(source).unwrap();
    shmem.barrier().unwrap();
    shmem.shutdown().unwrap();
    drop(world);
}

macro_rules! on_pes {
    ($($body:ident: $($name:ident = $pes:expr),*;)*) => {$($(
        #[test]
        fn $name() {
            if is_pe() {
                return $body();
            }
            Job::launch(stringify!($name), $pes).wait().assert_all_succeeded();
        }
    )*)*};
}

on_pes!(
    every_set: every_collective_on_2_pes = 2, every_collective_on_3_pes = 3,
        every_collective_on_4_pes = 4, every_collective_on_5_pes = 5;
);
