//! The registry's lock (`hyper_multicore.shmem._registry._lock`): a reentrant lock that Python
//! code holds with `with _lock:` and the native registry ([`crate::registry::Registry`]) takes
//! without a Python call (a Python-level `with` on every allocation call would be a visible
//! share of a small `empty` + `free`; bench/findings.md has the measurement).
//!
//! It serialises what one process's threads do to the registry, and their collective
//! allocation calls (every PE must make those in the same order). A thread that has to wait for
//! it lets the GIL go while it waits: the holder may need the GIL to finish (the native calls
//! under it let the GIL go and take it back). It waits in slices of [`SIGNAL_SLICE`], looking
//! for signals between them, so Ctrl-C still interrupts it (before the caller did anything),
//! as it does `threading.RLock`'s wait.
//!
//! Its state is three atomic words and waiters sleep on a futex: no mutex, so a child process
//! forked at any moment can reset it with plain stores (the child has only the forking thread;
//! a lock another thread held there would stay held for good).

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::time::Duration;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use rustix::thread::futex;

/// The longest a waiting thread goes without looking for signals (Ctrl-C).
const SIGNAL_SLICE: Duration = Duration::from_millis(10);

/// [`RegistryLock::state`]: free.
const FREE: u32 = 0;
/// [`RegistryLock::state`]: held, nobody waiting.
const HELD: u32 = 1;
/// [`RegistryLock::state`]: held, and a thread may be waiting (its release wakes one).
const CONTENDED: u32 = 2;

thread_local! {
    /// A byte whose address names the thread (unique among the threads alive, never 0).
    static THREAD_MARK: u8 = const { 0 };
}

/// This thread's name for the lock: the address of its [`THREAD_MARK`].
fn this_thread() -> usize {
    THREAD_MARK.with(|mark| mark as *const u8 as usize)
}

/// A reentrant lock, usable as `with lock:` from Python and by native code through
/// [`RegistryLock::hold`].
#[pyclass(frozen, module = "hyper_multicore._native")]
#[derive(Default)]
pub(crate) struct RegistryLock {
    /// [`FREE`], [`HELD`] or [`CONTENDED`]; the futex word waiters sleep on.
    state: AtomicU32,
    /// The holding thread ([`this_thread`]), 0 if none; written by the holder only.
    owner: AtomicUsize,
    /// How many times the holder took it without releasing it; the holder's alone.
    depth: AtomicUsize,
}

/// The lock held by this thread until dropped.
pub(crate) struct Held<'a> {
    lock: &'a RegistryLock,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        // Held by this thread: `hold` took it.
        let _ = self.lock.release_by(this_thread());
    }
}

impl RegistryLock {
    /// Takes the lock (again, if this thread holds it), letting the GIL go while another
    /// thread holds it; fails without it if a signal handler raises meanwhile (Ctrl-C).
    pub(crate) fn hold(&self, py: Python<'_>) -> PyResult<Held<'_>> {
        let me = this_thread();
        if !self.try_take(me) {
            while !py.detach(|| self.wait_then_take(me)) {
                py.check_signals()?;
            }
        }
        Ok(Held { lock: self })
    }

    /// Takes the lock if `me` holds it or it is free.
    fn try_take(&self, me: usize) -> bool {
        if self.owner.load(Ordering::Relaxed) == me {
            // Only this thread stores its own name: it holds the lock.
            self.depth.fetch_add(1, Ordering::Relaxed);
            return true;
        }
        let took = self
            .state
            .compare_exchange(FREE, HELD, Ordering::Acquire, Ordering::Relaxed)
            .is_ok();
        if took {
            self.became_owner(me);
        }
        took
    }

    /// Marks the lock contended, taking it if it was free meanwhile; else sleeps until a
    /// release wakes this thread or [`SIGNAL_SLICE`] passes (false).
    fn wait_then_take(&self, me: usize) -> bool {
        if self.state.swap(CONTENDED, Ordering::Acquire) == FREE {
            self.became_owner(me);
            return true;
        }
        let slice = futex::Timespec {
            tv_sec: i64::try_from(SIGNAL_SLICE.as_secs()).unwrap_or(i64::MAX),
            tv_nsec: SIGNAL_SLICE.subsec_nanos().into(),
        };
        // Returns at once if the state changed since (a release in between).
        let _ = futex::wait(&self.state, futex::Flags::PRIVATE, CONTENDED, Some(&slice));
        false
    }

    fn became_owner(&self, me: usize) {
        self.owner.store(me, Ordering::Relaxed);
        self.depth.store(1, Ordering::Relaxed);
    }

    /// Undoes one take by `me`; false if `me` does not hold the lock.
    fn release_by(&self, me: usize) -> bool {
        if self.owner.load(Ordering::Relaxed) != me {
            return false;
        }
        if self.depth.fetch_sub(1, Ordering::Relaxed) == 1 {
            self.owner.store(0, Ordering::Relaxed);
            if self.state.swap(FREE, Ordering::Release) == CONTENDED {
                let _ = futex::wake(&self.state, futex::Flags::PRIVATE, 1);
            }
        }
        true
    }
}

#[pymethods]
impl RegistryLock {
    /// A free lock.
    #[new]
    fn new() -> Self {
        Self::default()
    }

    /// Takes the lock, waiting (without the GIL) while another thread holds it.
    fn acquire(&self, py: Python<'_>) -> PyResult<()> {
        std::mem::forget(self.hold(py)?);
        Ok(())
    }

    /// Undoes one `acquire` by this thread.
    fn release(&self) -> PyResult<()> {
        if self.release_by(this_thread()) {
            Ok(())
        } else {
            Err(PyRuntimeError::new_err(
                "cannot release the registry lock: this thread does not hold it",
            ))
        }
    }

    /// `with lock:` takes it ([`RegistryLock::acquire`]).
    fn __enter__(&self, py: Python<'_>) -> PyResult<()> {
        self.acquire(py)
    }

    /// The end of `with lock:` lets it go ([`RegistryLock::release`]).
    #[pyo3(signature = (*_exception))]
    fn __exit__(&self, _exception: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        self.release()?;
        Ok(false)
    }

    /// In a child process just forked (`os.register_at_fork`): frees the lock unless the
    /// forking thread holds it — the child has no other thread to let it go. Plain stores: a
    /// parent thread may have been anywhere in the lock's code at the fork.
    fn after_fork_in_child(&self) {
        if self.owner.load(Ordering::Relaxed) != this_thread() {
            self.owner.store(0, Ordering::Relaxed);
            self.depth.store(0, Ordering::Relaxed);
            self.state.store(FREE, Ordering::Release);
        }
    }
}
