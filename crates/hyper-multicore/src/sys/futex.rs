//! Shared futex wait/wake on a 32-bit word that may live in a `MAP_SHARED` mapping.
//!
//! The futex is *shared* (no `FUTEX_PRIVATE_FLAG`): the kernel keys it by the backing page, so a
//! process can sleep on a word in the symmetric heap's header and be woken by another process
//! that maps the same memfd. Both calls go through `rustix::thread::futex`, whose `wait` and
//! `wake` are safe functions over `&AtomicU32`, so this file needs no `unsafe`.
//!
//! ```ignore
//! // waiter                                       // waker
//! let seen = word.load(SeqCst);                   word.fetch_add(1, SeqCst);
//! if !condition() { futex::wait(&word, seen, Some(slice)); }   futex::wake_all(&word);
//! ```
//!
//! `wait` returns on a wake-up, when the word no longer holds `expected` (`EAGAIN`), on the
//! timeout or on a signal (`EINTR`); callers always re-check their condition in a loop.
//!
//! Under `--cfg loom` the module is a model instead: a waiter blocks on a loom condition variable
//! only if the word still equals `expected` while holding the model's lock (the kernel's
//! hash-bucket lock), and timeouts are ignored, so a lost wake-up shows up as a loom deadlock.

use std::time::Duration;

use crate::primitive::AtomicU32;

#[cfg(not(loom))]
mod imp {
    use std::time::Duration;

    use rustix::io::Errno;
    use rustix::thread::futex::{self, Flags, Timespec};

    use crate::primitive::AtomicU32;

    /// `futex(word, FUTEX_WAIT, expected, timeout)`, shared.
    pub(super) fn wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) {
        let timeout = timeout.map(|t| Timespec {
            // A timeout longer than i64::MAX seconds is as good as none.
            tv_sec: i64::try_from(t.as_secs()).unwrap_or(i64::MAX),
            tv_nsec: t.subsec_nanos().into(),
        });
        match futex::wait(word, Flags::empty(), expected, timeout.as_ref()) {
            Ok(()) | Err(Errno::AGAIN | Errno::TIMEDOUT | Errno::INTR) => {}
            // EFAULT/EINVAL/ENOSYS cannot happen for a valid, aligned word on Linux; the caller
            // re-checks its condition and deadline either way.
            Err(e) => debug_assert!(false, "futex wait failed: {e}"),
        }
    }

    /// `futex(word, FUTEX_WAKE, i32::MAX)`, shared.
    pub(super) fn wake_all(word: &AtomicU32) {
        // The kernel takes the count as an int; i32::MAX means "everyone".
        let everyone = i32::MAX.unsigned_abs();
        if let Err(e) = futex::wake(word, Flags::empty(), everyone) {
            debug_assert!(false, "futex wake failed: {e}");
        }
    }
}

#[cfg(loom)]
mod imp {
    use std::collections::HashMap;
    use std::time::Duration;

    use loom::sync::{Condvar, Mutex};

    use crate::primitive::{AtomicU32, Ordering};

    /// The model of the kernel's futex table: per word address, how many wake-ups happened.
    struct FutexTable {
        wakes: Mutex<HashMap<usize, u64>>,
        woken: Condvar,
    }

    loom::lazy_static! {
        static ref TABLE: FutexTable = FutexTable {
            wakes: Mutex::new(HashMap::new()),
            woken: Condvar::new(),
        };
    }

    fn key(word: &AtomicU32) -> usize {
        std::ptr::from_ref(word) as usize
    }

    pub(super) fn wait(word: &AtomicU32, expected: u32, _timeout: Option<Duration>) {
        let mut wakes = TABLE.wakes.lock().unwrap();
        // The kernel compares the word under its bucket lock; a mismatch returns EAGAIN.
        if word.load(Ordering::SeqCst) != expected {
            return;
        }
        let seen = wakes.get(&key(word)).copied().unwrap_or(0);
        // Only a wake on *this* word ends the wait (the table's one condvar is shared by all
        // words, so other words' wake-ups are filtered out here). Timeouts are not modelled.
        while wakes.get(&key(word)).copied().unwrap_or(0) == seen {
            wakes = TABLE.woken.wait(wakes).unwrap();
        }
    }

    pub(super) fn wake_all(word: &AtomicU32) {
        let mut wakes = TABLE.wakes.lock().unwrap();
        *wakes.entry(key(word)).or_insert(0) += 1;
        TABLE.woken.notify_all();
    }
}

/// Sleeps while `word` holds `expected`, for at most `timeout` (`None`: until woken).
///
/// Returns on a wake-up, a value mismatch, the timeout or a signal; re-check the condition.
pub(crate) fn wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) {
    imp::wait(word, expected, timeout);
}

/// Wakes every process and thread sleeping in [`wait`] on `word`.
pub(crate) fn wake_all(word: &AtomicU32) {
    imp::wake_all(word);
}
