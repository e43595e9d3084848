//! Process-private memory handed in by the Python wrapper, and the heap's memory handed out to
//! it ([`heap_memoryview`]): the one file of this crate with `unsafe` code.
//!
//! # Why raw addresses
//!
//! The extension is built for the stable ABI of Python 3.10 (`abi3-py310`), where the buffer
//! protocol is not part of the limited API (PyO3 offers `PyBuffer` only from 3.11 on). So the
//! Python wrapper (`hyper_multicore.shmem`) hands a *local* CPU tensor or NumPy array to the
//! data plane as `(address, nbytes)` — `tensor.data_ptr()` and `numel × element_size`, after it
//! checked that the tensor is a contiguous CPU tensor — and keeps a reference to the tensor for
//! the whole call. This is the contract every [`LocalBuffer`] relies on; the `_native` functions
//! that take such pairs are private to the package.
//!
//! Symmetric tensors (views of the shared heap) must not come through here: the wrapper passes
//! them as regions `(allocation index, generation, byte offset, bytes)` and the runtime copies
//! them with its own raw copies, so no `&[u8]` ever aliases memory that other processes write
//! (ARCHITECTURE decision 7). The wrapper's detection of symmetric tensors is not trusted for
//! that: a heap tensor seen through another object (`tensor.numpy()`, a `ctypes` array, a
//! foreign array over the same address) looks like any local array to Python. So
//! [`LocalBuffer::new`] asks the library whether the range overlaps a heap mapping alive in
//! this process ([`overlaps_shared_memory`]) and refuses it if so: a slice is only ever formed
//! over process-private memory.

#![allow(unsafe_code)]

use hyper_multicore::shmem::overlaps_shared_memory;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::PyResult;

/// `len` bytes of ordinary process memory at `address`, owned by a Python object that the caller
/// keeps alive (see the module docs).
#[derive(Clone, Copy, Debug)]
pub(crate) struct LocalBuffer {
    address: usize,
    len: usize,
}

impl LocalBuffer {
    /// Checks a pair the wrapper handed in: a non-null address (unless the buffer is empty), a
    /// range that does not wrap around the address space, and memory outside every symmetric
    /// heap mapping of this process.
    pub(crate) fn new(address: usize, len: usize) -> PyResult<LocalBuffer> {
        if len > 0 && address == 0 {
            return Err(PyValueError::new_err(format!(
                "a local buffer of {len} bytes has a null address"
            )));
        }
        if address.checked_add(len).is_none() || len > isize::MAX as usize {
            return Err(PyValueError::new_err(format!(
                "a local buffer of {len} bytes at {address:#x} wraps around the address space"
            )));
        }
        if overlaps_shared_memory(address, len) {
            return Err(PyValueError::new_err(format!(
                "a local buffer of {len} bytes at {address:#x} lies in the symmetric heap: it is \
                 a symmetric tensor seen through another object (e.g. tensor.numpy()); use the \
                 symmetric tensor itself, not a view of it through NumPy"
            )));
        }
        Ok(LocalBuffer { address, len })
    }

    /// Its length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Runs `f` on the buffer's bytes.
    pub(crate) fn with_bytes<R>(self, f: impl FnOnce(&[u8]) -> R) -> R {
        if self.len == 0 {
            return f(&[]);
        }
        // SAFETY: by the module contract `address..address + len` is the memory of a live,
        // contiguous CPU tensor or array of this process that the Python caller keeps referenced
        // for this call; it is process-private (no heap mapping overlaps it), non-null and in
        // range (all checked in `new`), and any `u8` bit pattern is valid.
        let bytes = unsafe { std::slice::from_raw_parts(self.address as *const u8, self.len) };
        f(bytes)
    }

    /// Runs `f` on the buffer's bytes, writable.
    pub(crate) fn with_bytes_mut<R>(self, f: impl FnOnce(&mut [u8]) -> R) -> R {
        if self.len == 0 {
            return f(&mut []);
        }
        // SAFETY: as in `with_bytes`; the wrapper passes a writable tensor or array as the
        // destination, and no other Rust reference to this memory exists during the call.
        let bytes = unsafe { std::slice::from_raw_parts_mut(self.address as *mut u8, self.len) };
        f(bytes)
    }
}

/// `PyBUF_WRITE` of CPython's `memoryobject.h` (part of the stable ABI; PyO3 exports it only
/// outside the limited API): `PyMemoryView_FromMemory` makes a writable view.
const PYBUF_WRITE: std::ffi::c_int = 0x200;

/// A writable `memoryview` of the `len` heap bytes at `address`, for `torch.frombuffer`: one
/// object of one type for any length, where a `ctypes` array needs a type per length (a new
/// length cost ~20 µs to make its type).
///
/// The view does not keep the mapping alive: its caller (`HeapBuffer::view`, for
/// `Registry::record`) has a weak reference hold the `HeapBuffer`, and so the mapping, until
/// the view dies, which is when the last torch storage over it does (Python code cannot reach
/// the view: only the storage's deleter holds it).
pub(crate) fn heap_memoryview(
    py: Python<'_>,
    address: usize,
    len: usize,
) -> PyResult<Bound<'_, PyAny>> {
    let len = isize::try_from(len)
        .map_err(|_| PyValueError::new_err(format!("a view of {len} bytes is too long")))?;
    // SAFETY: `address..address + len` lies in a heap mapping of this process that the
    // `HeapBuffer` calling this keeps mapped, and a weak reference keeps that `HeapBuffer`
    // alive for as long as the view lives (see above). CPython only records the pointer: no
    // Rust reference to the memory is formed, and the bytes are reached through Python's
    // buffer protocol only.
    let view = unsafe {
        pyo3::ffi::PyMemoryView_FromMemory(address as *mut std::ffi::c_char, len, PYBUF_WRITE)
    };
    // SAFETY: a new reference or null with an exception set, as `from_owned_ptr_or_err` takes.
    unsafe { Bound::from_owned_ptr_or_err(py, view) }
}
