//! The raw floor of the data plane: a `u64` in the symmetric heap, seen as an [`AtomicU64`]
//! through [`Shmem::ptr`], so the benchmarks can ping-pong a cache line between two PEs (and
//! load, store and add on a peer's word) with nothing of the runtime on the path.
//!
//! This is the only file of `hm-bench` allowed `unsafe`: one block in [`shared_word`].
//!
//! ```ignore
//! let flag = shmem.allocate::<u64>(1, None)?;
//! shmem.barrier()?;
//! let mine = shared_word(&shmem, &flag, shmem.rank())?;
//! let theirs = shared_word(&shmem, &flag, 1 - shmem.rank())?;
//! theirs.store(1, Ordering::Release);
//! ```

#![allow(unsafe_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Result};
use hyper_multicore::shmem::{Allocation, Shmem, Symmetric};

/// PE `pe`'s copy of the one-element allocation `word`, as an atomic.
///
/// The borrow keeps both the runtime (which [`Shmem::shutdown`] consumes) and the allocation
/// (which [`Shmem::free`] consumes) alive, so the reference cannot outlive the mapping.
pub fn shared_word<'a>(
    shmem: &'a Shmem,
    word: &'a Allocation<u64>,
    pe: usize,
) -> Result<&'a AtomicU64> {
    ensure!(
        word.len() == 1,
        "a shared word is a one-element allocation, got {} elements",
        word.len()
    );
    let pointer = shmem.ptr(word, pe)?;
    ensure!(
        pointer.as_ptr() as usize % std::mem::align_of::<AtomicU64>() == 0,
        "the shared word at {pointer:p} is not 8-byte aligned"
    );
    // SAFETY: `Shmem::ptr` returns an in-bounds pointer into the heap mapping, valid until the
    // runtime is shut down or dropped; the borrows of `shmem` and `word` outlive the returned
    // reference, so neither can happen first. The pointer is non-null and aligned (checked).
    // Other PEs change the word concurrently, which `AtomicU64` allows as long as every access
    // is atomic: the benchmarks touch these words only through atomics (here, in peers, and in
    // the runtime's own signal and atomic operations).
    Ok(unsafe { AtomicU64::from_ptr(pointer.as_ptr()) })
}

/// How long a raw ping-pong waits for its peer before failing instead of hanging.
const PEER_DEADLINE: Duration = Duration::from_secs(10);

/// Spins until `word` holds `value`; fails after [`PEER_DEADLINE`] (a peer that died).
pub fn spin_until(word: &AtomicU64, value: u64) -> Result<()> {
    let mut spins: u32 = 0;
    let mut started: Option<Instant> = None;
    while word.load(Ordering::Acquire) != value {
        std::hint::spin_loop();
        spins = spins.wrapping_add(1);
        if spins % (1 << 16) == 0 {
            let since = *started.get_or_insert_with(Instant::now);
            if since.elapsed() > PEER_DEADLINE {
                bail!(
                    "raw ping-pong: the peer never wrote {value} (the word holds {}) in {:?}",
                    word.load(Ordering::Acquire),
                    PEER_DEADLINE
                );
            }
        }
    }
    Ok(())
}
