//! Test-only accounting of the bytes this process's data plane copies (`fault-injection`
//! builds; elsewhere every count is a no-op and [`copy_count`] is `None`): what the transports
//! moved between local memory and a heap, and what went through a private buffer on the way
//! (a front's bounce copy of a local buffer, UCX's staging copy). A put or get whose bytes move
//! once adds its length to `moved` and nothing to `bounced`; tests assert exactly that.
//!
//! ```
//! use hyper_multicore::shmem::copy_count;
//! if let Some(count) = copy_count() {
//!     println!("{} bytes moved, {} bounced", count.moved, count.bounced);
//! }
//! ```

#[cfg(feature = "fault-injection")]
use std::sync::atomic::{AtomicU64, Ordering};

/// The bytes this process's data-plane calls have copied since it started (see
/// [`copy_count`]). Process-wide, across runtime lifetimes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CopyCount {
    /// Bytes the transports moved between local memory and a heap: each put's and get's length
    /// once (on the shared-memory route one raw copy, on the UCX route the bytes handed to UCX).
    pub moved: u64,
    /// Bytes copied through a private buffer on the way to or from the transports: a front's
    /// bounce of a local buffer ([`count_bounced`]), the UCX route's staging copy.
    pub bounced: u64,
}

#[cfg(feature = "fault-injection")]
static MOVED: AtomicU64 = AtomicU64::new(0);
#[cfg(feature = "fault-injection")]
static BOUNCED: AtomicU64 = AtomicU64::new(0);

/// Counts `bytes` moved by a transport (see [`CopyCount::moved`]).
#[inline(always)]
pub(crate) fn moved(bytes: usize) {
    #[cfg(feature = "fault-injection")]
    MOVED.fetch_add(bytes as u64, Ordering::Relaxed);
    #[cfg(not(feature = "fault-injection"))]
    let _ = bytes;
}

/// Counts `bytes` copied through a private buffer on the way to or from the data plane: fronts
/// call it where they stage a local buffer (a test then sees that a transfer did not). A no-op
/// unless built with the `fault-injection` feature.
#[inline(always)]
pub fn count_bounced(bytes: usize) {
    #[cfg(feature = "fault-injection")]
    BOUNCED.fetch_add(bytes as u64, Ordering::Relaxed);
    #[cfg(not(feature = "fault-injection"))]
    let _ = bytes;
}

/// Test-only: what this process's data plane has copied so far; `None` unless built with the
/// `fault-injection` feature (the test harness's builds).
pub fn copy_count() -> Option<CopyCount> {
    #[cfg(feature = "fault-injection")]
    return Some(CopyCount {
        moved: MOVED.load(Ordering::Relaxed),
        bounced: BOUNCED.load(Ordering::Relaxed),
    });
    #[cfg(not(feature = "fault-injection"))]
    None
}
