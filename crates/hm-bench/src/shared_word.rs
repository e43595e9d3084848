//! The raw floor of the data plane: a `u64` in the symmetric heap, seen as an [`AtomicU64`]
//! through [`Shmem::ptr`], so the benchmarks can ping-pong a cache line between two PEs (and
//! load, store and add on a peer's word) with nothing of the runtime on the path.
//!
//! This is the only file of `hm-bench` allowed `unsafe`: the view of a heap word as an atomic.
//!
//! ```ignore
//! let flag = shmem.allocate::<u64>(1, None)?;
//! shmem.barrier()?;
//! let mine = shared_word(&shmem, &flag, shmem.rank())?;
//! let theirs = shared_word(&shmem, &flag, 1 - shmem.rank())?;
//! theirs.store(1, Ordering::Release);
//! ```

#![allow(unsafe_code)]

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Result};
use hyper_multicore::shmem::{Allocation, Element, Shmem, Symmetric};

/// An atomic type viewing a heap element of type [`AtomicView::Plain`].
pub trait AtomicView: Sized {
    /// The element type.
    type Plain: Element;

    /// The atomic at `pointer`.
    ///
    /// # Safety
    /// `pointer` is aligned for `Self`, valid for the returned lifetime, and only ever accessed
    /// atomically.
    unsafe fn view<'a>(pointer: *mut Self::Plain) -> &'a Self;
}

/// `impl AtomicView for $atomic { type Plain = $plain; … }`.
macro_rules! atomic_view {
    ($($atomic:ty => $plain:ty),*) => {$(
        impl AtomicView for $atomic {
            type Plain = $plain;

            unsafe fn view<'a>(pointer: *mut $plain) -> &'a $atomic {
                // SAFETY: the caller's contract.
                unsafe { <$atomic>::from_ptr(pointer) }
            }
        }
    )*};
}

atomic_view!(AtomicU64 => u64, AtomicU32 => u32);

/// PE `pe`'s copy of the one-element allocation `word`, as an atomic.
///
/// The borrow keeps both the runtime (which [`Shmem::shutdown`] consumes) and the allocation
/// (which [`Shmem::free`] consumes) alive, so the reference cannot outlive the mapping.
pub fn shared_word<'a>(
    shmem: &'a Shmem,
    word: &'a Allocation<u64>,
    pe: usize,
) -> Result<&'a AtomicU64> {
    shared_atomic(shmem, word, pe)
}

/// [`shared_word`] of a 32-bit word (a futex).
pub fn shared_word32<'a>(
    shmem: &'a Shmem,
    word: &'a Allocation<u32>,
    pe: usize,
) -> Result<&'a AtomicU32> {
    shared_atomic(shmem, word, pe)
}

/// PE `pe`'s copy of the one-element allocation `word`, as the atomic `A`.
fn shared_atomic<'a, A: AtomicView>(
    shmem: &'a Shmem,
    word: &'a Allocation<A::Plain>,
    pe: usize,
) -> Result<&'a A> {
    ensure!(
        word.len() == 1,
        "a shared word is a one-element allocation, got {} elements",
        word.len()
    );
    let pointer = shmem.ptr(word, pe)?;
    ensure!(
        pointer.as_ptr() as usize % std::mem::align_of::<A>() == 0,
        "the shared word at {pointer:p} is not aligned for {}",
        std::any::type_name::<A>()
    );
    // SAFETY: `Shmem::ptr` returns an in-bounds pointer into the heap mapping, valid until the
    // runtime is shut down or dropped; the borrows of `shmem` and `word` outlive the returned
    // reference, so neither can happen first. The pointer is non-null and aligned (checked).
    // Other PEs change the word concurrently, which an atomic allows as long as every access
    // is atomic: the benchmarks touch these words only through atomics (here, in peers, and in
    // the runtime's own signal and atomic operations).
    Ok(unsafe { A::view(pointer.as_ptr().cast()) })
}

/// Sleeps on the futex `word` until it holds `value`; fails after [`PEER_DEADLINE`] (a peer
/// that died).
pub fn futex_until(word: &AtomicU32, value: u32) -> Result<()> {
    use rustix::thread::futex;
    let slice = rustix::time::Timespec {
        tv_sec: 0,
        tv_nsec: 10_000_000,
    };
    let mut started: Option<Instant> = None;
    loop {
        let now = word.load(Ordering::Acquire);
        if now == value {
            return Ok(());
        }
        // Returns at once if the word changed meanwhile (EAGAIN), on a wake, or after a slice.
        let _ = futex::wait(word, futex::Flags::empty(), now, Some(&slice));
        let since = *started.get_or_insert_with(Instant::now);
        if since.elapsed() > PEER_DEADLINE {
            bail!(
                "raw futex ring: the previous PE never wrote {value} (the word holds {}) in {:?}",
                word.load(Ordering::Acquire),
                PEER_DEADLINE
            );
        }
    }
}

/// Stores `value` into the futex `word` and wakes its sleeper.
pub fn futex_pass(word: &AtomicU32, value: u32) {
    word.store(value, Ordering::Release);
    let _ = rustix::thread::futex::wake(word, rustix::thread::futex::Flags::empty(), 1);
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
