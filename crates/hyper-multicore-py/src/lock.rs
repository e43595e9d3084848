//! The registry's lock (`hyper_multicore.shmem._registry._lock`): a reentrant lock that Python
//! code holds with `with _lock:` and the native registry ([`crate::registry::Registry`]) takes
//! without a Python call (two `with` blocks cost 0.3 µs of a 3 µs `empty` + `free`; see
//! bench/findings.md, round 23).
//!
//! It serialises what one process's threads do to the registry, and their collective
//! allocation calls (every PE must make those in the same order). A thread that has to wait for
//! it lets the GIL go while it waits: the holder may need the GIL to finish (the native calls
//! under it let the GIL go and take it back). It waits in slices of [`SIGNAL_SLICE`], looking
//! for signals between them, so Ctrl-C still interrupts it (before the caller did anything),
//! as it does `threading.RLock`'s wait. A child process starts with it free (unless the thread
//! that forked held it): no other thread is there to let it go.

use std::time::Duration;

use parking_lot::{Condvar, Mutex};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

/// The longest a waiting thread goes without looking for signals (Ctrl-C).
const SIGNAL_SLICE: Duration = Duration::from_millis(10);

thread_local! {
    /// A byte whose address names the thread (unique among the threads alive).
    static THREAD_MARK: u8 = const { 0 };
}

/// This thread's name for the lock: the address of its [`THREAD_MARK`].
fn this_thread() -> usize {
    THREAD_MARK.with(|mark| mark as *const u8 as usize)
}

/// Who holds the lock, and how many times over.
#[derive(Default)]
struct Holder {
    /// The holding thread ([`this_thread`]), if any.
    thread: Option<usize>,
    /// How many times it took the lock without releasing it.
    depth: usize,
}

/// A reentrant lock, usable as `with lock:` from Python and by native code through
/// [`RegistryLock::hold`].
#[pyclass(frozen, module = "hyper_multicore._native")]
#[derive(Default)]
pub(crate) struct RegistryLock {
    holder: Mutex<Holder>,
    /// Notified when the lock becomes free.
    freed: Condvar,
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
        while !self.try_take(me) {
            py.detach(|| {
                let mut holder = self.holder.lock();
                if holder.thread.is_some() {
                    self.freed.wait_for(&mut holder, SIGNAL_SLICE);
                }
            });
            py.check_signals()?;
        }
        Ok(Held { lock: self })
    }

    /// Takes the lock if it is free or `me` holds it.
    fn try_take(&self, me: usize) -> bool {
        let mut holder = self.holder.lock();
        match holder.thread {
            Some(thread) if thread != me => false,
            _ => {
                holder.thread = Some(me);
                holder.depth += 1;
                true
            }
        }
    }

    /// Undoes one take by `me`; false if `me` does not hold the lock.
    fn release_by(&self, me: usize) -> bool {
        let mut holder = self.holder.lock();
        if holder.thread != Some(me) {
            return false;
        }
        holder.depth -= 1;
        if holder.depth == 0 {
            holder.thread = None;
            self.freed.notify_one();
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
    /// forking thread holds it — the child has no other thread to let it go.
    fn after_fork_in_child(&self) {
        let mut holder = self.holder.lock();
        if holder.thread != Some(this_thread()) {
            *holder = Holder::default();
        }
    }
}
