//! Process-private memory handed in by the Python wrapper, and the heap's memory handed out to
//! torch ([`heap_capsule`]): the one file of this crate with `unsafe` code.
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

use std::ffi::{c_void, CStr};
use std::sync::Arc;

use hyper_multicore::shmem::{overlaps_shared_memory, Dtype};
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

/// The heap bytes of a torch tensor, handed to torch as a DLPack capsule (`dltensor`): the
/// address, shape, contiguous strides and dtype, so that `torch._C._from_dlpack` makes the
/// tensor of the allocation's shape and dtype in one call (0.32 µs, where `torch.frombuffer`
/// over a `memoryview` took 0.46 and a multi-dimensional shape another 0.37 to apply), and an
/// owner that torch drops — through the capsule's deleter — when the last storage over the
/// bytes dies.
///
/// The tensor views the `span` bytes at `address`, of a heap mapping the owner keeps
/// (`Registry::record` gives it the [`HeapBuffer`]'s mapping); a capsule torch did not take
/// drops the owner when the capsule dies. `dims` are the tensor's dimensions (none: a scalar);
/// their elements must fit in `span` (checked: a larger shape would let torch write past it).
///
/// [`HeapBuffer`]: crate::heap::HeapBuffer
pub(crate) fn heap_capsule<'py>(
    py: Python<'py>,
    [address, span]: [usize; 2],
    dims: &[usize],
    dtype: Dtype,
    owner: Arc<dyn Send + Sync>,
) -> PyResult<Bound<'py, PyAny>> {
    let elements = dims
        .iter()
        .try_fold(1usize, |elements, &dim| elements.checked_mul(dim));
    let bytes = elements.and_then(|elements| elements.checked_mul(dtype.size()));
    if bytes.is_none_or(|bytes| bytes > span) {
        return Err(PyValueError::new_err(format!(
            "a tensor of shape {dims:?} and dtype {} does not fit in the {span} bytes of its \
             allocation",
            dtype.name()
        )));
    }
    let (code, bits) = dlpack_type(dtype)?;
    let too_large = || PyValueError::new_err(format!("a tensor of shape {dims:?} is too large"));
    let ndim = i32::try_from(dims.len()).map_err(|_| too_large())?;
    // The shape, then the strides in elements (row-major; a dimension of 0 counts as 1).
    let mut shape_and_strides = vec![0i64; 2 * dims.len()];
    let mut stride: i64 = 1;
    for (axis, &dim) in dims.iter().enumerate().rev() {
        let dim = i64::try_from(dim).map_err(|_| too_large())?;
        shape_and_strides[axis] = dim;
        shape_and_strides[dims.len() + axis] = stride;
        stride = stride.checked_mul(dim.max(1)).ok_or_else(too_large)?;
    }
    // A raw pointer from here on (freed with the `Managed`): torch reads through the pointers
    // into it, which moving a `Box` would invalidate.
    let len = shape_and_strides.len();
    let shape = Box::into_raw(shape_and_strides.into_boxed_slice()).cast::<i64>();
    // SAFETY: `dims.len() <= len`, so the offset stays inside the allocation.
    let strides = unsafe { shape.add(dims.len()) };
    let managed = Box::new(Managed {
        tensor: DlManagedTensor {
            dl_tensor: DlTensor {
                data: address as *mut c_void,
                device: DlDevice {
                    device_type: DL_CPU,
                    device_id: 0,
                },
                ndim,
                dtype: DlDataType {
                    code,
                    bits,
                    lanes: 1,
                },
                shape,
                strides,
                byte_offset: 0,
            },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete_managed),
        },
        shape_and_strides_len: len,
        _owner: owner,
    });
    let tensor = Box::into_raw(managed).cast::<DlManagedTensor>();
    // SAFETY: `tensor` points to a live `Managed` (whose first field it is) until its deleter
    // runs: torch calls it once it owns the capsule's tensor, else the capsule's destructor does
    // (`release_unused`); the name is a static C string.
    let capsule =
        unsafe { pyo3::ffi::PyCapsule_New(tensor.cast(), DLTENSOR.as_ptr(), Some(release_unused)) };
    if capsule.is_null() {
        // SAFETY: the capsule was not made, so nothing else will run the deleter.
        unsafe { delete_managed(tensor) };
    }
    // SAFETY: a new reference or null with an exception set, as `from_owned_ptr_or_err` takes.
    unsafe { Bound::from_owned_ptr_or_err(py, capsule) }
}

/// The name of a DLPack capsule not yet taken (a consumer renames it `used_dltensor`).
const DLTENSOR: &CStr = c"dltensor";

/// DLPack's `kDLCPU`.
const DL_CPU: i32 = 1;

/// DLPack's type code and bits of `dtype`.
fn dlpack_type(dtype: Dtype) -> PyResult<(u8, u8)> {
    // kDLInt 0, kDLUInt 1, kDLFloat 2, kDLBfloat 4, kDLBool 6
    let code = match dtype {
        Dtype::I8 | Dtype::I16 | Dtype::I32 | Dtype::I64 => 0,
        Dtype::U8 | Dtype::U16 | Dtype::U32 | Dtype::U64 => 1,
        Dtype::F16 | Dtype::F32 | Dtype::F64 => 2,
        Dtype::BF16 => 4,
        Dtype::Bool => 6,
        other => {
            return Err(PyValueError::new_err(format!(
                "dtype {} has no DLPack code here",
                other.name()
            )))
        }
    };
    Ok((code, (dtype.size() * 8) as u8))
}

/// DLPack's `DLDevice`.
#[repr(C)]
struct DlDevice {
    device_type: i32,
    device_id: i32,
}

/// DLPack's `DLDataType`.
#[repr(C)]
struct DlDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

/// DLPack's `DLTensor`.
#[repr(C)]
struct DlTensor {
    data: *mut c_void,
    device: DlDevice,
    ndim: i32,
    dtype: DlDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

/// DLPack's `DLManagedTensor`.
#[repr(C)]
struct DlManagedTensor {
    dl_tensor: DlTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DlManagedTensor)>,
}

/// A [`DlManagedTensor`] (first, so that a pointer to it is one to this), owning the memory its
/// shape and strides point into, and the owner dropped with it.
#[repr(C)]
struct Managed {
    tensor: DlManagedTensor,
    /// The length of the slice `tensor.dl_tensor.shape` starts (strides follow the shape).
    shape_and_strides_len: usize,
    _owner: Arc<dyn Send + Sync>,
}

impl Drop for Managed {
    fn drop(&mut self) {
        let slice = std::ptr::slice_from_raw_parts_mut(
            self.tensor.dl_tensor.shape,
            self.shape_and_strides_len,
        );
        // SAFETY: `heap_capsule` made `shape` with `Box::into_raw` of a slice of that length,
        // and only this drop frees it.
        drop(unsafe { Box::from_raw(slice) });
    }
}

/// The deleter of every tensor [`heap_capsule`] makes: drops its [`Managed`].
///
/// # Safety
/// `tensor` is the pointer `heap_capsule` boxed, and this is its only deleter call.
unsafe extern "C" fn delete_managed(tensor: *mut DlManagedTensor) {
    // SAFETY: by the contract above, `tensor` is the first field of a boxed `Managed` not yet
    // dropped.
    drop(unsafe { Box::from_raw(tensor.cast::<Managed>()) });
}

/// The destructor of [`heap_capsule`]'s capsules: runs the tensor's deleter if no consumer
/// took the capsule (one that did renamed it and owns the tensor).
unsafe extern "C" fn release_unused(capsule: *mut pyo3::ffi::PyObject) {
    // SAFETY: CPython calls this with the capsule being destroyed, the GIL held; a capsule
    // still named `dltensor` holds the pointer `heap_capsule` made, whose deleter has not run.
    unsafe {
        if pyo3::ffi::PyCapsule_IsValid(capsule, DLTENSOR.as_ptr()) == 1 {
            let tensor = pyo3::ffi::PyCapsule_GetPointer(capsule, DLTENSOR.as_ptr());
            delete_managed(tensor.cast());
        }
    }
}
