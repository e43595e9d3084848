//! `Shmem::reduce` across real processes (2 to 5 PEs): every operator over every reducible
//! type, on the whole root and on subgroups (the even PEs, the odd ones, a single PE, the
//! reversed root), in place and out of place, at lengths on both sides of the size thresholds
//! (combined whole by every member, in shares, over several chunks), and the refused
//! combinations; and the whole root spanning simulated hosts (`HYPER_MULTICORE_TEST_HOST`),
//! where it combines hierarchically.

use hm_testkit::{is_pe, start_runtime, Job, Options};
use hyper_multicore::config::TRANSPORT;
use hyper_multicore::shmem::{
    ReduceOp, ReduceSet, Reducible, Shmem, Symmetric, HIERARCHICAL_REDUCE_MIN_BYTES,
    REDUCE_LOCAL_MAX_BYTES, TEST_HOST_VARIABLE,
};
use hyper_multicore::world::{Group, World};
use hyper_multicore::ErrorKind;

const LEN: usize = 5;

const EVERY_OP: [ReduceOp; 7] = [
    ReduceOp::Sum,
    ReduceOp::Prod,
    ReduceOp::Min,
    ReduceOp::Max,
    ReduceOp::And,
    ReduceOp::Or,
    ReduceOp::Xor,
];

/// The value PE `pe` contributes at index `i`: 1..=7, so products of up to four PEs' values
/// are exact in a float and the bits differ by PE.
fn sample(pe: usize, i: usize) -> u64 {
    ((pe * 3 + i) % 7 + 1) as u64
}

/// The reduction of `members`' samples at index `i` with `op`, computed in `u64` (an
/// integer type's wrapping result is this one truncated to its width).
fn expected(members: &[usize], i: usize, op: ReduceOp) -> u64 {
    let values = members.iter().map(|&pe| sample(pe, i));
    match op {
        ReduceOp::Sum => values.sum(),
        ReduceOp::Prod => values.product(),
        ReduceOp::Min => values.min().unwrap(),
        ReduceOp::Max => values.max().unwrap(),
        ReduceOp::And => values.fold(u64::MAX, |a, v| a & v),
        ReduceOp::Or => values.fold(0, |a, v| a | v),
        ReduceOp::Xor => values.fold(0, |a, v| a ^ v),
    }
}

/// A scalar test element, made from a sample or result (an integer truncated to its width).
trait Sample: Reducible + PartialEq + std::fmt::Debug + hyper_multicore::shmem::Element {
    fn from_i64(value: i64) -> Self;
}

macro_rules! samples {
    ($($ty:ty),*) => {$(
        impl Sample for $ty {
            fn from_i64(value: i64) -> Self {
                value as $ty
            }
        }
    )*};
}
samples!(i8, u8, i16, u16, i32, u32, i64, u64, f32, f64);

/// Every supported operator over `T` on `members` (this PE among them; `group` is their
/// subgroup, `None` for the whole root): out of place, then in place; an unsupported
/// operator fails with an invalid-argument error and moves nothing.
fn check_type<T: Sample>(shmem: &Shmem, members: &[usize], group: Option<&Group>) {
    let name = std::any::type_name::<T>();
    let set = group.map_or(ReduceSet::Root, ReduceSet::Group);
    let rank = shmem.rank();
    let mine: Vec<T> = (0..LEN)
        .map(|i| T::from_i64(sample(rank, i) as i64))
        .collect();
    let source = shmem.allocate::<T>(LEN, None).unwrap();
    let target = shmem.allocate::<T>(LEN, None).unwrap();
    for op in EVERY_OP {
        shmem.put(&source, &mine, rank).unwrap();
        if !T::supports(op) {
            let error = shmem
                .reduce::<T>(set, target.region(), source.region(), op)
                .unwrap_err();
            assert_eq!(error.kind(), ErrorKind::InvalidArgument, "{name} {op:?}");
            assert!(error.to_string().contains("does not apply"), "{error}");
            continue;
        }
        let want: Vec<T> = (0..LEN)
            .map(|i| T::from_i64(expected(members, i, op) as i64))
            .collect();
        shmem
            .reduce::<T>(set, target.region(), source.region(), op)
            .unwrap();
        let mut out = vec![T::zeroed(); LEN];
        shmem.get(&mut out, &target, rank).unwrap();
        assert_eq!(out, want, "{name} {op:?} over {members:?}");
        shmem
            .reduce::<T>(set, source.region(), source.region(), op)
            .unwrap();
        shmem.get(&mut out, &source, rank).unwrap();
        assert_eq!(out, want, "{name} {op:?} in place over {members:?}");
    }
    shmem.barrier().unwrap();
    shmem.free(target).unwrap();
    shmem.free(source).unwrap();
}

/// Every type on `members` (the whole root when `group` is `None`).
fn check_all_types(shmem: &Shmem, members: &[usize], group: Option<&Group>) {
    macro_rules! each {
        ($check:ident: $($ty:ty),*) => {$($check::<$ty>(shmem, members, group);)*};
    }
    each!(check_type: i8, u8, i16, u16, i32, u32, i64, u64, f32, f64);
    each!(check_complex: f32, f64);
    check_lengths(shmem, members, group);
}

/// Element counts on both sides of the size thresholds: none, one, a few, just past the
/// length every member combines whole ([`REDUCE_LOCAL_MAX_BYTES`] for one-byte elements), and
/// several chunks that do not divide among the members.
const LENGTHS: [usize; 6] = [0, 1, 7, REDUCE_LOCAL_MAX_BYTES + 1, 9001, 40_003];

/// Sums, exclusive ors and maxima of `u8`, `i32` and `f64` vectors of every length of
/// [`LENGTHS`] on `members`, out of place and in place, against the values combined here.
fn check_lengths(shmem: &Shmem, members: &[usize], group: Option<&Group>) {
    check_lengths_of::<u8>(shmem, members, group, ReduceOp::Max);
    check_lengths_of::<i32>(shmem, members, group, ReduceOp::Xor);
    check_lengths_of::<f64>(shmem, members, group, ReduceOp::Sum);
}

fn check_lengths_of<T: Sample>(
    shmem: &Shmem,
    members: &[usize],
    group: Option<&Group>,
    op: ReduceOp,
) {
    let set = group.map_or(ReduceSet::Root, ReduceSet::Group);
    let rank = shmem.rank();
    for len in LENGTHS {
        let source = shmem.allocate::<T>(len, None).unwrap();
        let target = shmem.allocate::<T>(len, None).unwrap();
        let mine: Vec<T> = (0..len)
            .map(|i| T::from_i64(sample(rank, i) as i64))
            .collect();
        let want: Vec<T> = (0..len)
            .map(|i| T::from_i64(expected(members, i, op) as i64))
            .collect();
        for into in [&target, &source] {
            shmem.put(&source, &mine, rank).unwrap();
            shmem
                .reduce::<T>(set, into.region(), source.region(), op)
                .unwrap();
            let mut out = vec![T::zeroed(); len];
            shmem.get(&mut out, into, rank).unwrap();
            let what = if std::ptr::eq(into, &source) {
                "in place"
            } else {
                "out of place"
            };
            assert!(
                out == want,
                "{len} {} {op:?} {what} over {members:?}",
                std::any::type_name::<T>()
            );
            shmem.barrier().unwrap();
        }
        shmem.free(target).unwrap();
        shmem.free(source).unwrap();
    }
}

/// PE `pe`'s complex number at index `i`, as `(re, im)`.
fn complex_sample(pe: usize, i: usize) -> (f64, f64) {
    ((pe + i) as f64, (pe % 2) as f64 - i as f64)
}

/// The sum or product of `members`' complex samples at index `i`.
fn complex_expected(members: &[usize], i: usize, op: ReduceOp) -> (f64, f64) {
    let values = members.iter().map(|&pe| complex_sample(pe, i));
    match op {
        ReduceOp::Sum => values.fold((0.0, 0.0), |(a, b), (c, d)| (a + c, b + d)),
        ReduceOp::Prod => values.fold((1.0, 0.0), |(a, b), (c, d)| (a * c - b * d, a * d + b * c)),
        other => panic!("{other:?} does not apply to complex numbers"),
    }
}

/// Complex numbers `[F; 2]` (reducible, but not an allocation element): they live in an
/// allocation of `2 × LEN` `F`s, reduced through its region; sum and product only.
fn check_complex<F: Sample>(shmem: &Shmem, members: &[usize], group: Option<&Group>)
where
    [F; 2]: Reducible,
{
    let set = group.map_or(ReduceSet::Root, ReduceSet::Group);
    let rank = shmem.rank();
    let as_pairs = |pairs: Vec<(f64, f64)>| -> Vec<F> {
        pairs
            .into_iter()
            .flat_map(|(re, im)| [re, im])
            .map(|x| F::from_i64(x as i64))
            .collect()
    };
    let source = shmem.allocate::<F>(2 * LEN, None).unwrap();
    let target = shmem.allocate::<F>(2 * LEN, None).unwrap();
    let mine = as_pairs((0..LEN).map(|i| complex_sample(rank, i)).collect());
    shmem.put(&source, &mine, rank).unwrap();
    for op in EVERY_OP {
        let result = shmem.reduce::<[F; 2]>(set, target.region(), source.region(), op);
        if !<[F; 2]>::supports(op) {
            assert_eq!(result.unwrap_err().kind(), ErrorKind::InvalidArgument);
            continue;
        }
        result.unwrap();
        let mut out = vec![F::zeroed(); 2 * LEN];
        shmem.get(&mut out, &target, rank).unwrap();
        let want = as_pairs((0..LEN).map(|i| complex_expected(members, i, op)).collect());
        assert_eq!(out, want, "complex {op:?} over {members:?}");
    }
    shmem.barrier().unwrap();
    shmem.free(target).unwrap();
    shmem.free(source).unwrap();
}

fn finish(world: World, shmem: Shmem) {
    shmem.barrier().unwrap();
    assert!(
        shmem.allocations().is_empty(),
        "the test leaked allocations"
    );
    shmem.shutdown().unwrap();
    drop(world);
}

/// The whole root.
fn every_pe() {
    let (world, shmem) = start_runtime(Some(16 << 20)).unwrap();
    let members: Vec<usize> = (0..shmem.size()).collect();
    check_all_types(&shmem, &members, None);
    overlapping_target_and_source(&shmem);
    finish(world, shmem);
}

/// Subgroups: the even PEs and the odd PEs (at once, each its own reduction), this PE alone,
/// and every PE in reverse order (the combination follows the group's order).
fn subgroups() {
    let (world, shmem) = start_runtime(Some(16 << 20)).unwrap();
    let (rank, size) = (shmem.rank(), shmem.size());
    let parity: Vec<usize> = (rank % 2..size).step_by(2).collect();
    let alone = vec![rank];
    let reversed: Vec<usize> = (0..size).rev().collect();
    for members in [parity, alone, reversed] {
        let group = world.subgroup(&members).unwrap();
        check_all_types(&shmem, &members, Some(&group));
    }
    // Source and target of different lengths fail alike on every member.
    let group = world.subgroup(&(0..size).collect::<Vec<_>>()).unwrap();
    let four = shmem.allocate::<u32>(4, None).unwrap();
    let three = shmem.allocate::<u32>(3, None).unwrap();
    let error = shmem
        .reduce::<u32>(
            ReduceSet::Group(&group),
            four.region(),
            three.region(),
            ReduceOp::Sum,
        )
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::InvalidArgument);
    shmem.barrier().unwrap();
    shmem.free(three).unwrap();
    shmem.free(four).unwrap();
    finish(world, shmem);
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
    every_pe: every_pe_2_pes = 2, every_pe_3_pes = 3, every_pe_4_pes = 4, every_pe_5_pes = 5;
    subgroups: subgroups_2_pes = 2, subgroups_3_pes = 3, subgroups_4_pes = 4,
        subgroups_5_pes = 5;
);

/// The simulated host of every rank of a job spanning hosts, comma-separated (set for every PE
/// by the launching test; each PE also gets its own as `HYPER_MULTICORE_TEST_HOST`).
const HOSTS_VARIABLE: &str = "HM_TEST_REDUCE_HOSTS";

/// The hosts of the job this PE belongs to, in rank order.
fn job_hosts() -> Vec<String> {
    std::env::var(HOSTS_VARIABLE)
        .expect("set by the launching test")
        .split(',')
        .map(str::to_string)
        .collect()
}

/// The locality groups the runtime forms for `hosts`: one per host, ascending, ordered by
/// their lowest rank — or every PE alone when `HYPER_MULTICORE_SHMEM_TRANSPORT=ucx`.
fn locality_groups(hosts: &[String]) -> Vec<Vec<usize>> {
    let forced = std::env::var(TRANSPORT).is_ok_and(|v| v == "ucx");
    let mut names: Vec<&str> = Vec::new();
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for (rank, host) in hosts.iter().enumerate() {
        match names.iter().position(|n| n == host) {
            Some(g) if !forced => groups[g].push(rank),
            _ => {
                names.push(host);
                groups.push(vec![rank]);
            }
        }
    }
    groups
}

/// PE `pe`'s float at index `i`: magnitudes far apart, so the sum depends on the association
/// order (1e16 + 1 rounds back to 1e16).
fn float_sample(pe: usize, i: usize) -> f64 {
    match (pe + i) % 4 {
        0 => 1e16,
        1 => 1.0 + i as f64,
        2 => -1e16,
        _ => 0.25 * (pe + 1) as f64,
    }
}

/// The documented order of a whole-root reduction: within each group in rank order, then the
/// groups' partials in group order.
fn hierarchical_sum<F: std::ops::Add<Output = F> + Copy>(
    groups: &[Vec<usize>],
    value: impl Fn(usize) -> F,
) -> F {
    let partial = |group: &Vec<usize>| {
        group[1..]
            .iter()
            .fold(value(group[0]), |acc, &pe| acc + value(pe))
    };
    groups[1..]
        .iter()
        .fold(partial(&groups[0]), |acc, group| acc + partial(group))
}

/// The documented order for a vector of `bytes`: hierarchical from
/// [`HIERARCHICAL_REDUCE_MIN_BYTES`] on, else rank order (one group of every PE).
fn order_for(groups: &[Vec<usize>], bytes: usize) -> Vec<Vec<usize>> {
    if bytes as u64 >= HIERARCHICAL_REDUCE_MIN_BYTES {
        groups.to_vec()
    } else {
        vec![groups
            .iter()
            .flatten()
            .copied()
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect()]
    }
}

/// Float sums whose result depends on the association order: every PE's target (read back
/// from every PE) holds exactly the documented order's bits, out of place and in place — for
/// a short vector (rank order) and one long enough to be combined hierarchically.
fn float_sums_in_host_order(shmem: &Shmem, groups: &[Vec<usize>]) {
    for n in [37, (HIERARCHICAL_REDUCE_MIN_BYTES / 4) as usize + 3] {
        float_sums_of(shmem, groups, n);
    }
}

/// [`float_sums_in_host_order`] for vectors of `N` elements.
fn float_sums_of(shmem: &Shmem, groups: &[Vec<usize>], n: usize) {
    let (rank, size) = (shmem.rank(), shmem.size());
    let source = shmem.allocate::<f64>(n, None).unwrap();
    let target = shmem.allocate::<f64>(n, None).unwrap();
    let single = shmem.allocate::<f32>(n, None).unwrap();
    let (order, order32) = (order_for(groups, n * 8), order_for(groups, n * 4));
    let want: Vec<u64> = (0..n)
        .map(|i| hierarchical_sum(&order, |pe| float_sample(pe, i)).to_bits())
        .collect();
    let want32: Vec<u32> = (0..n)
        .map(|i| hierarchical_sum(&order32, |pe| float_sample(pe, i) as f32).to_bits())
        .collect();
    let mine: Vec<f64> = (0..n).map(|i| float_sample(rank, i)).collect();
    let mine32: Vec<f32> = mine.iter().map(|&x| x as f32).collect();
    shmem.put(&source, &mine, rank).unwrap();
    shmem.put(&single, &mine32, rank).unwrap();
    shmem.all_reduce(&target, &source, ReduceOp::Sum).unwrap();
    shmem.all_reduce(&source, &source, ReduceOp::Sum).unwrap();
    shmem.all_reduce(&single, &single, ReduceOp::Sum).unwrap();
    // Every PE's copies, read only after every PE wrote its own.
    shmem.barrier().unwrap();
    for pe in 0..size {
        for (what, region) in [("out of place", &target), ("in place", &source)] {
            let mut out = vec![0f64; n];
            shmem.get(&mut out, region, pe).unwrap();
            let bits: Vec<u64> = out.iter().map(|x| x.to_bits()).collect();
            assert_eq!(bits, want, "f64 sum {what} on PE {pe}, groups {groups:?}");
        }
        let mut out = vec![0f32; n];
        shmem.get(&mut out, &single, pe).unwrap();
        let bits: Vec<u32> = out.iter().map(|x| x.to_bits()).collect();
        assert_eq!(
            bits, want32,
            "f32 sum in place on PE {pe}, groups {groups:?}"
        );
    }
    shmem.barrier().unwrap();
    shmem.free(single).unwrap();
    shmem.free(target).unwrap();
    shmem.free(source).unwrap();
}

/// What crosses hosts: the UCX gets this PE issues in one whole-root reduction of `len` u64s.
/// Hierarchical (some group holds several PEs, a vector of at least
/// [`HIERARCHICAL_REDUCE_MIN_BYTES`]): one get per other group, of this PE's share of the
/// elements (none when the share is empty). Otherwise (every PE alone, as with forced UCX, or a
/// shorter vector): one get of the whole vector per PE of another group.
fn cross_host_reads_are_one_per_other_group(shmem: &Shmem, groups: &[Vec<usize>]) {
    let rank = shmem.rank();
    let group = groups.iter().find(|g| g.contains(&rank)).unwrap();
    let index = group.iter().position(|&pe| pe == rank).unwrap();
    let outside = shmem.size() - group.len();
    for len in [1usize, 5, 1000, 8192, 65_536] {
        let source = shmem.allocate::<u64>(len, None).unwrap();
        let target = shmem.allocate::<u64>(len, None).unwrap();
        shmem
            .put(&source, &vec![rank as u64 + 1; len], rank)
            .unwrap();
        for (what, into) in [("out of place", &target), ("in place", &source)] {
            let before = shmem.ucx_gets_issued();
            shmem.all_reduce(into, &source, ReduceOp::Sum).unwrap();
            let after = shmem.ucx_gets_issued();
            let (gets, bytes) = (after.0 - before.0, after.1 - before.1);
            let share = len * (index + 1) / group.len() - len * index / group.len();
            let hierarchical =
                groups.len() < shmem.size() && (len * 8) as u64 >= HIERARCHICAL_REDUCE_MIN_BYTES;
            let (want_gets, want_bytes) = if !hierarchical {
                (outside, outside * len * 8)
            } else if share == 0 {
                (0, 0)
            } else {
                (groups.len() - 1, (groups.len() - 1) * share * 8)
            };
            assert_eq!(
                (gets, bytes),
                (want_gets as u64, want_bytes as u64),
                "UCX gets (count, bytes) of PE {rank}, {len} elements {what}, groups {groups:?}"
            );
            let mut out = vec![0u64; len];
            shmem.get(&mut out, into, rank).unwrap();
            let size = shmem.size() as u64;
            assert_eq!(
                out,
                vec![size * (size + 1) / 2; len],
                "{len} elements {what}"
            );
            // In place next: every PE's source is the sum again, so restore it first.
            shmem.barrier().unwrap();
            shmem
                .put(&source, &vec![rank as u64 + 1; len], rank)
                .unwrap();
        }
        shmem.barrier().unwrap();
        shmem.free(target).unwrap();
        shmem.free(source).unwrap();
    }
}

/// Target and source overlapping without being the same region (one element apart in one
/// allocation): the result is the reduction of the sources as they were at the call.
fn overlapping_target_and_source(shmem: &Shmem) {
    // Short (combined whole by every member) and long (combined in shares).
    overlapping_of(shmem, 300);
    overlapping_of(shmem, 3001);
}

fn overlapping_of(shmem: &Shmem, n: usize) {
    let (rank, size) = (shmem.rank(), shmem.size());
    let both = shmem.allocate::<u64>(n + 1, None).unwrap();
    let value = |pe: usize, i: usize| (pe as u64 + 1) * 1_000_000 + i as u64;
    for (source, target) in [(0..n, 1..n + 1), (1..n + 1, 0..n)] {
        let mine: Vec<u64> = (0..n + 1).map(|i| value(rank, i)).collect();
        shmem.put(&both, &mine, rank).unwrap();
        let (from, into) = (
            both.view(source.clone()).unwrap(),
            both.view(target.clone()).unwrap(),
        );
        shmem.all_reduce(&into, &from, ReduceOp::Sum).unwrap();
        let mut out = vec![0u64; n];
        shmem.get(&mut out, &into, rank).unwrap();
        let want: Vec<u64> = source
            .clone()
            .map(|i| (0..size).map(|pe| value(pe, i)).sum())
            .collect();
        assert_eq!(out, want, "source {source:?}, target {target:?}");
        shmem.barrier().unwrap();
    }
    shmem.free(both).unwrap();
}

/// The whole root across the simulated hosts of `HM_TEST_REDUCE_HOSTS`: every operator over
/// every type (exact, in place and out of place), overlapping regions, the float order, and
/// the cross-host reads.
fn across_hosts() {
    let hosts = job_hosts();
    let (world, shmem) = start_runtime(Some(16 << 20)).unwrap();
    assert_eq!(hosts.len(), shmem.size());
    let groups = locality_groups(&hosts);
    let members: Vec<usize> = (0..shmem.size()).collect();
    check_all_types(&shmem, &members, None);
    overlapping_target_and_source(&shmem);
    float_sums_in_host_order(&shmem, &groups);
    cross_host_reads_are_one_per_other_group(&shmem, &groups);
    finish(world, shmem);
}

/// Runs `body` on one PE per entry of `hosts`, each on its simulated host.
fn launch_on_hosts(test: &str, hosts: &[&str]) {
    let mut options = Options::default().env(HOSTS_VARIABLE, hosts.join(","));
    for (rank, host) in hosts.iter().enumerate() {
        options = options.rank_env(rank, TEST_HOST_VARIABLE, host);
    }
    Job::launch_with(test, hosts.len(), options)
        .wait()
        .assert_all_succeeded();
}

macro_rules! on_hosts {
    ($($body:ident: $($name:ident = $hosts:expr),*;)*) => {$($(
        #[test]
        fn $name() {
            if is_pe() {
                return $body();
            }
            launch_on_hosts(stringify!($name), &$hosts);
        }
    )*)*};
}

on_hosts!(
    // 2 + 2; 2 + 1 + 1 with the first host's PEs interleaved (groups {0, 2}, {1}, {3}: the
    // host order is not the rank order); 3 + 1.
    across_hosts: whole_root_across_two_hosts = ["a", "a", "b", "b"],
        whole_root_across_three_unequal_hosts = ["a", "b", "a", "c"],
        whole_root_across_three_plus_one_hosts = ["a", "a", "a", "b"];
    subgroups: subgroups_across_two_hosts = ["a", "a", "b", "b"];
);

/// A whole-root `all_reduce` (u64 sum, separate target) on 4 PEs over two simulated hosts
/// (2 + 2, or the hosts of `HM_REPORT_HOSTS`), at 8 B to 8 MiB, round after round: the sum is
/// checked on every PE after each size's last round, and each size timed. Not a test of speed (nothing is asserted
/// about time): with `HM_REPORT_ITERS` set it runs more rounds and prints the times for
/// docs/multinode.md: `HM_REPORT_ITERS=200 cargo test -p hyper-multicore --test reductions
/// all_reduce_across_hosts_report -- --nocapture`.
#[test]
fn all_reduce_across_hosts_report() {
    if is_pe() {
        return all_reduce_latencies();
    }
    // `HM_REPORT_HOSTS=a,a,a,a` measures the one-host root instead.
    let hosts = std::env::var("HM_REPORT_HOSTS").unwrap_or_else(|_| "a,a,b,b".to_string());
    let hosts: Vec<&str> = hosts.split(',').collect();
    let mut options = Options::default().env(HOSTS_VARIABLE, hosts.join(","));
    for (rank, host) in hosts.iter().enumerate() {
        options = options.rank_env(rank, TEST_HOST_VARIABLE, host);
    }
    let result = Job::launch_with(
        stringify!(all_reduce_across_hosts_report),
        hosts.len(),
        options,
    )
    .wait();
    result.assert_all_succeeded();
    let lines = result.pe(0).lines_with("REPORT");
    assert_eq!(lines.len(), 4, "PE 0 timed every size: {lines:?}");
    if std::env::var_os("HM_REPORT_ITERS").is_some() {
        for line in lines {
            println!("all_reduce, hosts {hosts:?}:{line}");
        }
    }
}

fn all_reduce_latencies() {
    use std::time::{Duration, Instant};
    let iters: usize = std::env::var("HM_REPORT_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20)
        .max(1);
    let (world, shmem) = start_runtime(Some(64 << 20)).unwrap();
    let size = shmem.size() as u64;
    let sum = size * (size - 1) / 2;
    for bytes in [8usize, 64 << 10, 1 << 20, 8 << 20] {
        let len = bytes / 8;
        let source = shmem.allocate::<u64>(len, None).unwrap();
        let target = shmem.allocate::<u64>(len, None).unwrap();
        shmem
            .put(&source, &vec![shmem.rank() as u64; len], shmem.rank())
            .unwrap();
        // Fewer rounds for the large vectors, at least 5.
        let rounds = (iters * 8192 / bytes.max(8192)).max(5);
        let mut samples: Vec<Duration> = Vec::with_capacity(rounds);
        shmem.barrier().unwrap();
        for _ in 0..rounds {
            let started = Instant::now();
            shmem.all_reduce(&target, &source, ReduceOp::Sum).unwrap();
            samples.push(started.elapsed());
        }
        // The last round's target (no later round of this size writes it).
        let mut reduced = vec![0u64; len];
        shmem.get(&mut reduced, &target, shmem.rank()).unwrap();
        assert!(
            reduced.iter().all(|&value| value == sum),
            "{bytes} B after {rounds} rounds: the sum of the ranks, {sum}, in every element"
        );
        samples.sort();
        println!(
            "REPORT {bytes} B: median {:.3} ms, min {:.3} ms ({rounds} rounds)",
            samples[rounds / 2].as_secs_f64() * 1e3,
            samples[0].as_secs_f64() * 1e3
        );
        shmem.barrier().unwrap();
        shmem.free(target).unwrap();
        shmem.free(source).unwrap();
    }
    finish(world, shmem);
}
