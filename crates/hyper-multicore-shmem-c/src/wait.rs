//! Point-to-point synchronisation: `wait_until` and `test` on one symmetric word of this PE, their
//! `_all`/`_any`/`_some` forms over arrays of words (with an optional status mask) and the
//! `_vector` forms (one comparison value per word), and `shmem_signal_wait_until`. Every wait is
//! the runtime's [`wait_words`](hyper_multicore::shmem::Shmem::wait_words): it sleeps between
//! updates, and ends with an error (this PE exits naming the call) when a peer is lost or the
//! configured timeout passes.
//!
//! The runtime waits on 32- and 64-bit words; a 16-bit value (`short`, `unsigned short`) is
//! read from the naturally aligned 32-bit word containing it ([`SyncValue`]). Its writers'
//! atomics ring the same doorbell, so such a wait wakes like any other; `shmem_malloc` rounds
//! blocks to whole 32-bit words so the containing word is always symmetric.

use std::ffi::c_int;

use hyper_multicore::shmem::{AtomicWord, Region};

use crate::failure::fail;
use crate::job;

/// A value the C API waits on: a 32- or 64-bit word itself, or a 16-bit half of the naturally
/// aligned 32-bit word containing it.
pub(crate) trait SyncValue: Copy + PartialOrd {
    /// The runtime word read to see the value.
    type Word: AtomicWord;

    /// The value at address `at`, out of `word`, the word containing it.
    fn from_word(word: Self::Word, at: usize) -> Self;
}

macro_rules! whole_words {
    ($($ty:ty),*) => {$(
        impl SyncValue for $ty {
            type Word = $ty;

            fn from_word(word: $ty, _: usize) -> $ty {
                word
            }
        }
    )*};
}
whole_words!(i32, u32, i64, u64);

macro_rules! half_words {
    ($($ty:ty),*) => {$(
        impl SyncValue for $ty {
            type Word = u32;

            fn from_word(word: u32, at: usize) -> $ty {
                let byte = at % 4;
                let shift = if cfg!(target_endian = "little") { 8 * byte } else { 8 * (2 - byte) };
                (word >> shift) as u16 as $ty
            }
        }
    )*};
}
half_words!(i16, u16);

/// `SHMEM_CMP_EQ` and the other comparison codes, in `shmem.h`'s order.
const COMPARISONS: [&str; 6] = ["EQ", "NE", "GT", "GE", "LT", "LE"];

/// Does `value` compare `cmp` to `target`?
fn holds<W: PartialOrd>(cmp: c_int, value: W, target: W) -> bool {
    match cmp {
        0 => value == target,
        1 => value != target,
        2 => value > target,
        3 => value >= target,
        4 => value < target,
        _ => value <= target,
    }
}

fn check_comparison(call: &str, cmp: c_int) {
    if !(0..COMPARISONS.len() as c_int).contains(&cmp) {
        fail(
            call,
            format!("comparison {cmp} is not one of SHMEM_CMP_EQ, NE, GT, GE, LT, LE (0..5)"),
        );
    }
}

/// How many of the words must satisfy their comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Quantifier {
    /// Every active word.
    All,
    /// At least one (the lowest index is reported).
    Any,
    /// At least one (every satisfying index is reported).
    Some,
}

/// What a multi-word wait or test is asked.
pub(crate) struct Words<W> {
    /// Address of the first word.
    pub(crate) ivars: usize,
    /// Number of words.
    pub(crate) nelems: usize,
    /// Per word: non-zero excludes it (empty: every word takes part).
    pub(crate) status: Vec<c_int>,
    /// The comparison.
    pub(crate) cmp: c_int,
    /// Per word, the value to compare with.
    pub(crate) targets: Vec<W>,
}

/// Waits (`block`) or tests once whether the words satisfy `quantifier`; returns the indices of
/// the satisfying active words (empty when a test fails, or when no word is active).
pub(crate) fn wait_words<W: SyncValue>(
    call: &str,
    words: &Words<W>,
    quantifier: Quantifier,
    block: bool,
) -> Vec<usize> {
    check_comparison(call, words.cmp);
    let size = std::mem::size_of::<W>();
    let active: Vec<usize> = (0..words.nelems)
        .filter(|&i| words.status.get(i).map_or(true, |&s| s == 0))
        .collect();
    if active.is_empty() {
        return Vec::new();
    }
    let addresses: Vec<usize> = active.iter().map(|&i| words.ivars + i * size).collect();
    let regions: Vec<Region> = addresses
        .iter()
        .map(|&at| containing_word::<W>(call, at))
        .collect();
    let mut satisfied = Vec::new();
    let mut ready = false;
    job::run(call, |shmem| {
        shmem.wait_words::<W::Word>(
            call,
            &regions,
            |values| {
                satisfied = active
                    .iter()
                    .zip(values.iter().zip(&addresses))
                    .filter(|&(&i, (&word, &at))| {
                        holds(words.cmp, W::from_word(word, at), words.targets[i])
                    })
                    .map(|(&i, _)| i)
                    .collect();
                ready = match quantifier {
                    Quantifier::All => satisfied.len() == active.len(),
                    Quantifier::Any | Quantifier::Some => !satisfied.is_empty(),
                };
                ready || !block
            },
            None,
        )
    });
    if !ready {
        satisfied.clear();
    }
    satisfied
}

/// The symmetric word holding the value of type `W` at `address`: the value's own address for a
/// whole word (misaligned, the runtime refuses it), the aligned word around a 16-bit value.
fn containing_word<W: SyncValue>(call: &str, address: usize) -> Region {
    let (size, word_size) = (std::mem::size_of::<W>(), std::mem::size_of::<W::Word>());
    job::region(call, address & !(word_size - size), word_size)
}

/// The one word `ivar`, compared `cmp` to `value`.
fn single<W: SyncValue>(ivar: usize, cmp: c_int, value: W) -> Words<W> {
    Words {
        ivars: ivar,
        nelems: 1,
        status: Vec::new(),
        cmp,
        targets: vec![value],
    }
}

/// Waits until this PE's `ivar` compares `cmp` to `value`: [`wait_words`] for one word, without
/// its lists (the common case, on every ping-pong's path).
pub(crate) fn wait_until<W: SyncValue>(call: &str, ivar: usize, cmp: c_int, value: W) {
    check_comparison(call, cmp);
    let region = containing_word::<W>(call, ivar);
    job::run(call, |shmem| {
        shmem.wait_words::<W::Word>(
            call,
            std::slice::from_ref(&region),
            |values| holds(cmp, W::from_word(values[0], ivar), value),
            None,
        )
    });
}

/// 1 if this PE's `ivar` compares `cmp` to `value` now, else 0.
pub(crate) fn test<W: SyncValue>(call: &str, ivar: usize, cmp: c_int, value: W) -> c_int {
    let met = wait_words(call, &single(ivar, cmp, value), Quantifier::All, false);
    c_int::from(!met.is_empty())
}

/// Waits until this PE's signal word `sig_addr` compares `cmp` to `value`; returns its value.
///
/// # Safety
/// `sig_addr` must be a symmetric address of a `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn shmem_signal_wait_until(
    sig_addr: *mut u64,
    cmp: c_int,
    value: u64,
) -> u64 {
    const CALL: &str = "shmem_signal_wait_until";
    wait_until(CALL, sig_addr as usize, cmp, value);
    crate::rma::signal_fetch(CALL, sig_addr as usize)
}
