//! The source of a collective as the C caller passed it: a pointer and a length, handed to the
//! runtime as a [`Contribution`] — the symmetric range it is, read in place by the runtime (and,
//! on one host, by the peers straight from this PE's heap), or else the caller's private bytes.
//! OpenSHMEM asks for a symmetric source, so the first is the common case and costs a cached
//! look-up; a private source is read as [`CallerBuffer`] reads one.

use hyper_multicore::shmem::Contribution;

use crate::job;
use crate::sys::caller_memory::CallerBuffer;

/// `len` bytes of the C caller's memory at `address`, the source of a collective.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CollectiveSource {
    address: usize,
    buffer: CallerBuffer,
}

impl CollectiveSource {
    /// # Safety
    /// As [`CallerBuffer::new`]: `address` must be valid for reads of `len` bytes until the
    /// current entry point returns (it may be null or dangling when `len` is 0).
    pub(crate) unsafe fn new(address: *const u8, len: usize) -> CollectiveSource {
        CollectiveSource {
            address: address as usize,
            // SAFETY: this function's contract.
            buffer: unsafe { CallerBuffer::new(address, len) },
        }
    }

    /// Its length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.buffer.len()
    }

    /// Calls `f` with the source as the runtime's contribution: the symmetric range it lies in
    /// (the heap, or the program's data and bss), else its bytes (a private copy if it is
    /// shared memory the runtime does not know as symmetric).
    pub(crate) fn with<R>(&self, f: impl FnOnce(Contribution<'_>) -> R) -> R {
        if self.len() > 0 {
            if let Ok(located) = job::locate(self.address, self.len()) {
                return f(Contribution::Symmetric(located.region()));
            }
        }
        self.buffer
            .with_source(|bytes| f(Contribution::Local(bytes)))
    }
}
