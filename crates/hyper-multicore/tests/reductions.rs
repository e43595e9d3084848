//! `Shmem::reduce` across real processes (2 and 4 PEs): every operator over every reducible
//! type, on the whole root and on subgroups (the even PEs, the odd ones, a single PE, the
//! reversed root), in place and out of place, and the refused combinations.

use hm_testkit::{is_pe, start_runtime, Job};
use hyper_multicore::shmem::{ReduceOp, ReduceSet, Reducible, Shmem, Symmetric};
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
    every_pe: every_pe_2_pes = 2, every_pe_4_pes = 4;
    subgroups: subgroups_2_pes = 2, subgroups_4_pes = 4;
);
