//! Atomic memory operations on symmetric words: fetch, set, swap, compare-and-swap, fetch-add
//! (inc, add) and the bitwise and/or/xor, each as the runtime's atomic on one 32- or 64-bit word
//! (floats travel as their bits). The typed entry points (`shmem_int_atomic_fetch_add`, …) are
//! generated in `typed.rs`.
//!
//! The runtime has no native and/or/xor yet: they are a compare-and-swap loop over the runtime's
//! atomics (still atomic; one round trip more per retry on a remote route).

use std::ffi::c_int;

use hyper_multicore::shmem::{AtomicOp, AtomicWord, Located, Shmem};
use hyper_multicore::Result;

use crate::job::{self, At};
use crate::sys::caller_memory::CallerBuffer;

/// A C value that an atomic moves as one 32- or 64-bit word.
pub(crate) trait AmoValue: Copy + bytemuck::Pod {
    /// The word type.
    type Word: AtomicWord;
    /// The word holding this value's bits.
    fn to_word(self) -> Self::Word;
    /// The value whose bits `word` holds.
    fn from_word(word: Self::Word) -> Self;
}

macro_rules! integer_words {
    ($($ty:ty),*) => {$(
        impl AmoValue for $ty {
            type Word = $ty;
            fn to_word(self) -> $ty { self }
            fn from_word(word: $ty) -> $ty { word }
        }
    )*};
}
integer_words!(i32, u32, i64, u64);

macro_rules! float_words {
    ($($ty:ty => $word:ty),*) => {$(
        impl AmoValue for $ty {
            type Word = $word;
            fn to_word(self) -> $word { self.to_bits() }
            fn from_word(word: $word) -> $ty { <$ty>::from_bits(word) }
        }
    )*};
}
float_words!(f32 => u32, f64 => u64);

/// The bitwise operations.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Bitwise {
    /// `&`
    And,
    /// `|`
    Or,
    /// `^`
    Xor,
}

#[inline(always)]
fn word<T: AmoValue>(call: &str, address: usize) -> Located {
    job::located(call, address, std::mem::size_of::<T>())
}

/// The atomic operation `op` makes on PE `pe`'s copy of the symmetric word `address` (of a
/// `T`); returns the previous value. Each operation passes its own `op`, so the compiler
/// specialises the data-plane code for that operation (no dispatch on its kind, no copy of it
/// through memory).
#[inline(always)]
fn apply<T: AmoValue>(
    call: &str,
    address: usize,
    pe: c_int,
    op: impl FnOnce() -> AtomicOp<T::Word>,
) -> T {
    let pe = job::target_pe(call, pe);
    let at = word::<T>(call, address);
    // One reference captured besides `op` (see `job::run`).
    let args = &(at, pe);
    T::from_word(job::run(call, move |shmem| {
        let (at, pe) = args;
        shmem.atomic_located(at, op(), *pe)
    }))
}

/// PE `pe`'s copy of the symmetric `source`, read atomically.
pub(crate) fn fetch<T: AmoValue>(call: &str, source: usize, pe: c_int) -> T {
    apply(call, source, pe, || AtomicOp::Fetch)
}

/// Stores `value` into PE `pe`'s copy of `dest` atomically.
pub(crate) fn set<T: AmoValue>(call: &str, dest: usize, value: T, pe: c_int) {
    apply::<T>(call, dest, pe, || AtomicOp::Set(value.to_word()));
}

/// Replaces PE `pe`'s copy of `dest` by `value`; returns the previous value.
pub(crate) fn swap<T: AmoValue>(call: &str, dest: usize, value: T, pe: c_int) -> T {
    apply(call, dest, pe, || AtomicOp::Swap(value.to_word()))
}

/// Sets PE `pe`'s copy of `dest` to `value` if it equals `cond`; returns the previous value.
pub(crate) fn compare_swap<T: AmoValue>(
    call: &str,
    dest: usize,
    cond: T,
    value: T,
    pe: c_int,
) -> T {
    apply(call, dest, pe, || AtomicOp::CompareSwap {
        expected: cond.to_word(),
        desired: value.to_word(),
    })
}

/// Adds `value` (wrapping) to PE `pe`'s copy of `dest`; returns the previous value.
pub(crate) fn fetch_add<T: AmoValue>(call: &str, dest: usize, value: T, pe: c_int) -> T {
    apply(call, dest, pe, || AtomicOp::FetchAdd(value.to_word()))
}

/// Adds `value` (wrapping) to PE `pe`'s copy of `dest`, reading nothing back (complete at the
/// next quiet).
pub(crate) fn add<T: AmoValue>(call: &str, dest: usize, value: T, pe: c_int) {
    apply::<T>(call, dest, pe, || AtomicOp::Add(value.to_word()));
}

/// `add` of one.
pub(crate) fn inc<T: AmoValue>(call: &str, dest: usize, pe: c_int) {
    add(call, dest, T::from_word(T::Word::from_bits(1)), pe);
}

/// `fetch_add` of one.
pub(crate) fn fetch_inc<T: AmoValue>(call: &str, dest: usize, pe: c_int) -> T {
    fetch_add(call, dest, T::from_word(T::Word::from_bits(1)), pe)
}

/// Applies `op` with `value` to PE `pe`'s copy of `dest` atomically; returns the previous value.
pub(crate) fn fetch_bitwise<T: AmoValue>(
    call: &str,
    dest: usize,
    value: T,
    op: Bitwise,
    pe: c_int,
) -> T {
    let pe = job::target_pe(call, pe);
    let at = At(word::<T>(call, dest).region());
    let operand = value.to_word().to_bits();
    T::from_word(job::run(call, |shmem| bitwise(shmem, &at, operand, op, pe)))
}

/// Applies `op` with `operand` to PE `pe`'s copy of the word `at` (a compare-and-swap loop over
/// the runtime's atomics); returns the previous value.
pub(crate) fn bitwise<W: AtomicWord>(
    shmem: &Shmem,
    at: &At,
    operand: u64,
    op: Bitwise,
    pe: usize,
) -> Result<W> {
    let mut seen = shmem.atomic_fetch::<W>(at, pe)?;
    loop {
        let bits = seen.to_bits();
        let wanted = match op {
            Bitwise::And => bits & operand,
            Bitwise::Or => bits | operand,
            Bitwise::Xor => bits ^ operand,
        };
        let previous = shmem.atomic_compare_swap(at, seen, W::from_bits(wanted), pe)?;
        if previous.to_bits() == bits {
            return Ok(previous);
        }
        seen = previous;
    }
}

/// Stores the result of a non-blocking fetching atomic into the caller's `fetch` location.
pub(crate) fn deliver<T: AmoValue>(fetch: CallerBuffer, value: T) {
    fetch.with_target(|bytes| bytes.copy_from_slice(bytemuck::bytes_of(&value)));
}
