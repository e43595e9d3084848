//! The one crate-local gateway to atomics, spin hints and yielding (crossbeam's `primitive`
//! pattern): every atomic of the synchronisation protocols (barrier, doorbells, abort word) is
//! declared through this module (the allocate/free argument slots too), so that a `--cfg loom` build swaps in loom's model-checked
//! versions and those protocols can be explored exhaustively. (Header words written once and the
//! user's own signal words are plain `std` atomics: they take part in no protocol of ours.)
//!
//! ```ignore
//! use crate::primitive::{AtomicU32, Ordering};
//! let word = AtomicU32::new(0);
//! word.fetch_add(1, Ordering::AcqRel);
//! ```

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

/// Processor hint for a busy-wait loop (`PAUSE` on x86).
#[cfg(not(loom))]
pub(crate) use std::hint::spin_loop;

/// Processor hint for a busy-wait loop (a scheduling point under loom).
#[cfg(loom)]
pub(crate) use loom::hint::spin_loop;

/// Gives the processor to another runnable thread (`sched_yield`).
#[cfg(not(loom))]
pub(crate) use std::thread::yield_now;

/// Gives the processor to another runnable thread (a scheduling point under loom).
#[cfg(loom)]
pub(crate) use loom::thread::yield_now;
