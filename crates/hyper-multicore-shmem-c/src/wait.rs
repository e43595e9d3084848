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

use std::cell::Cell;
use std::ffi::c_int;

use hyper_multicore::shmem::{AtomicWord, Comparison, Region};

use crate::failure::fail;
use crate::job;

/// A value the C API waits on: a 32- or 64-bit word itself, or a 16-bit half of the naturally
/// aligned 32-bit word containing it.
pub(crate) trait SyncValue: Copy + PartialOrd {
    /// The runtime word read to see the value.
    type Word: AtomicWord;

    /// The value at address `at`, out of `word`, the word containing it.
    fn from_word(word: Self::Word, at: usize) -> Self;

    /// The value as its word, if it is a whole word (not a 16-bit half).
    fn whole(self) -> Option<Self::Word>;
}

macro_rules! whole_words {
    ($($ty:ty),*) => {$(
        impl SyncValue for $ty {
            type Word = $ty;

            fn from_word(word: $ty, _: usize) -> $ty {
                word
            }

            fn whole(self) -> Option<$ty> {
                Some(self)
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

            fn whole(self) -> Option<u32> {
                None
            }
        }
    )*};
}
half_words!(i16, u16);

/// `SHMEM_CMP_EQ` and the other comparison codes, in `shmem.h`'s order.
const COMPARISONS: [Comparison; 6] = [
    Comparison::Eq,
    Comparison::Ne,
    Comparison::Gt,
    Comparison::Ge,
    Comparison::Lt,
    Comparison::Le,
];

/// The comparison `cmp` names (fails if it names none).
fn comparison(call: &str, cmp: c_int) -> Comparison {
    usize::try_from(cmp)
        .ok()
        .and_then(|i| COMPARISONS.get(i).copied())
        .unwrap_or_else(|| {
            fail(
                call,
                format!("comparison {cmp} is not one of SHMEM_CMP_EQ, NE, GT, GE, LT, LE (0..5)"),
            )
        })
}

/// How many of the words must satisfy their comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Quantifier {
    /// Every active word.
    All,
    /// At least one; the index reported first is the lowest at or after the one after the
    /// index this thread's previous `_any` call reported (wrapping), so repeated calls over
    /// words that all hold report each of them in turn (fairness, as programs expect).
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
    let cmp = comparison(call, words.cmp);
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
                        cmp.holds(W::from_word(word, at), words.targets[i])
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
    } else if quantifier == Quantifier::Any {
        let start = NEXT_ANY.with(Cell::get);
        let first = satisfied.partition_point(|&i| i < start) % satisfied.len();
        satisfied.rotate_left(first);
        NEXT_ANY.with(|next| next.set(satisfied[0] + 1));
    }
    satisfied
}

thread_local! {
    /// Where this thread's next `_any` wait or test starts looking (see [`Quantifier::Any`]).
    static NEXT_ANY: Cell<usize> = const { Cell::new(0) };
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

/// Waits until this PE's `ivar` compares `cmp` to `value`; returns its value then. A whole
/// word waits as a signal does ([`Shmem::wait_word`](hyper_multicore::shmem::Shmem::wait_word),
/// the common case, on every ping-pong's path); a 16-bit value is [`wait_words`] on the word
/// containing it.
pub(crate) fn wait_until<W: SyncValue>(call: &str, ivar: usize, cmp: c_int, value: W) -> W {
    let cmp = comparison(call, cmp);
    if let Some(value) = value.whole() {
        let at = job::located(call, ivar, std::mem::size_of::<W>());
        // One reference captured (see `job::run`).
        let args = &(at, value, cmp);
        let seen = job::run(call, move |shmem| {
            let (at, value, cmp) = args;
            shmem.wait_word(call, at, *value, *cmp, None)
        });
        return W::from_word(seen, ivar);
    }
    let region = containing_word::<W>(call, ivar);
    let mut seen = value;
    job::run(call, |shmem| {
        shmem.wait_words::<W::Word>(
            call,
            std::slice::from_ref(&region),
            |values| {
                seen = W::from_word(values[0], ivar);
                cmp.holds(seen, value)
            },
            None,
        )
    });
    seen
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
    wait_until(CALL, sig_addr as usize, cmp, value)
}
