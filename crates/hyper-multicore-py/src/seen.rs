//! The data plane's tensors (`hyper_multicore.shmem._registry`'s `_region` and `_local`, and
//! every data-plane call of [`crate::data_plane`]): what a call needs of a tensor, found by
//! inspecting it once, and checked on every call.
//!
//! [`inspect`] reads a torch tensor's or NumPy array's layout (on the CPU, its address, bytes,
//! dtype, contiguity, writability), finds the allocation it views in the registry
//! ([`crate::registry::lookup`]) and makes the native argument: a region `(index, generation,
//! byte offset, bytes)` of the allocation, or `(address, nbytes)` of process-private memory. A
//! plain torch tensor's [`Seen`] is remembered by the tensor's `id` until the tensor dies
//! ([`remembered`] counts them); a later call reuses it while the tensor still has what it was
//! made from — the same object, data pointer, dtype and size in bytes, still contiguous: what
//! `set_`, `resize_`, `as_strided_`, `t_` or an assignment to `.data` would change.
//!
//! What may change between calls is checked on every call, by [`symmetric`] and [`local`]: the
//! allocation still live (a freed or released one's tensors are stale), its shared-root
//! consumer's lease held. Each check raises the error the wrapper's Python code raised before
//! it moved here, with the same type and message.

use std::collections::BTreeMap;
use std::ops::Deref;

use hyper_multicore::shmem::Dtype;
use parking_lot::Mutex;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyType, PyWeakrefReference};

use crate::buffer::BufferArg;
use crate::heap::RegionArg;
use crate::registry::Allocation;

/// `id(tensor)` → its remembered inspection. Only touched with the GIL held, so the lock is
/// never contended (it is there because a static must be `Sync`).
static SEEN: Mutex<BTreeMap<usize, Py<Remembered>>> = Mutex::new(BTreeMap::new());

/// The number of remembered tensors (for the tests).
#[pyfunction]
pub(crate) fn remembered() -> usize {
    SEEN.lock().len()
}

/// What a data-plane call needs of one tensor or array.
pub(crate) struct Seen {
    /// Its address (`data_ptr()`), dtype object and size in bytes when inspected.
    address: usize,
    dtype_object: Py<PyAny>,
    nbytes: usize,
    /// Its heap dtype and number of elements.
    pub(crate) dtype: Dtype,
    pub(crate) numel: usize,
    /// The allocation it views (None: process-private memory).
    allocation: Option<Py<Allocation>>,
    /// The native argument (None: not contiguous).
    arg: Option<BufferArg>,
    /// Whether it may be written (a destination).
    writable: bool,
}

/// A torch tensor's [`Seen`], remembered by its `id`, with a weak reference to it.
#[pyclass(frozen, module = "hyper_multicore._native")]
pub(crate) struct Remembered {
    tensor: Py<PyWeakrefReference>,
    seen: Seen,
}

/// The callback of a remembered tensor's weak reference: forgets it when it dies (unless a
/// newer tensor with the same `id` is remembered already).
#[pyclass(frozen, module = "hyper_multicore._native")]
struct Forget {
    key: usize,
}

#[pymethods]
impl Forget {
    fn __call__(&self, weak: &Bound<'_, PyAny>) {
        let mut seen = SEEN.lock();
        let gone = match seen.get(&self.key) {
            Some(remembered) if remembered.get().tensor.bind(weak.py()).is(weak) => {
                seen.remove(&self.key)
            }
            _ => None,
        };
        drop(seen);
        // Dropped outside the lock: its fields are Python references.
        drop(gone);
    }
}

/// A tensor's [`Seen`]: remembered, or found by this call.
pub(crate) enum Found<'py> {
    Remembered(Bound<'py, Remembered>),
    Fresh(Seen),
}

impl Deref for Found<'_> {
    type Target = Seen;

    fn deref(&self) -> &Seen {
        match self {
            Found::Remembered(remembered) => &remembered.get().seen,
            Found::Fresh(seen) => seen,
        }
    }
}

/// The tensor libraries' types, from `hyper_multicore.shmem._backend` (None where one is not
/// installed).
struct Types {
    /// `torch.Tensor`.
    tensor: Option<Py<PyType>>,
    /// `numpy.ndarray`.
    ndarray: Option<Py<PyType>>,
}

static TYPES: PyOnceLock<Types> = PyOnceLock::new();

fn types(py: Python<'_>) -> PyResult<&Types> {
    TYPES.get_or_try_init(py, || {
        let backend = py.import("hyper_multicore.shmem._backend")?;
        let type_of = |module: &str, name: &str| -> PyResult<Option<Py<PyType>>> {
            let module = backend.getattr(module)?;
            if module.is_none() {
                return Ok(None);
            }
            Ok(Some(module.getattr(name)?.cast_into::<PyType>()?.unbind()))
        };
        Ok(Types {
            tensor: type_of("torch", "Tensor")?,
            ndarray: type_of("np", "ndarray")?,
        })
    })
}

/// `x` inspected (remembered, if a plain torch tensor seen before and unchanged since); `role`
/// names it in errors.
pub(crate) fn inspect<'py>(x: &Bound<'py, PyAny>, role: &str) -> PyResult<Found<'py>> {
    let py = x.py();
    let types = types(py)?;
    let plain_tensor = types
        .tensor
        .as_ref()
        .is_some_and(|tensor| x.is_exact_instance(tensor.bind(py)));
    if plain_tensor {
        if let Some(remembered) = remembered_as(x)? {
            return Ok(Found::Remembered(remembered));
        }
    }
    let seen = look_at(x, role, types)?;
    if !plain_tensor || seen.arg.is_none() {
        return Ok(Found::Fresh(seen));
    }
    let key = x.as_ptr() as usize;
    let forget = Bound::new(py, Forget { key })?;
    let tensor = PyWeakrefReference::new_with(x, &forget)?.unbind();
    let remembered = Bound::new(py, Remembered { tensor, seen })?;
    let old = SEEN.lock().insert(key, remembered.clone().unbind());
    // Dropped outside the lock: its fields are Python references.
    drop(old);
    Ok(Found::Remembered(remembered))
}

/// `x`'s remembered inspection, if it was remembered and `x` is unchanged since.
fn remembered_as<'py>(x: &Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, Remembered>>> {
    let py = x.py();
    let Some(remembered) = SEEN
        .lock()
        .get(&(x.as_ptr() as usize))
        .map(|remembered| remembered.clone_ref(py).into_bound(py))
    else {
        return Ok(None);
    };
    let (tensor, seen) = (&remembered.get().tensor, &remembered.get().seen);
    let same_object = tensor.bind(py).upgrade().is_some_and(|tensor| tensor.is(x));
    // Integers and a bool: nothing here allocates a tuple (nor feeds the garbage collector).
    let unchanged = same_object
        && x.call_method0(intern!(py, "data_ptr"))?.extract::<usize>()? == seen.address
        && x.getattr(intern!(py, "dtype"))?.is(&seen.dtype_object)
        && x.getattr(intern!(py, "nbytes"))?.extract::<usize>()? == seen.nbytes
        // (one element is contiguous whatever its strides)
        && (seen.numel == 1 || x.call_method0(intern!(py, "is_contiguous"))?.is_truthy()?);
    Ok(unchanged.then_some(remembered))
}

/// `x` inspected anew.
fn look_at(x: &Bound<'_, PyAny>, role: &str, types: &Types) -> PyResult<Seen> {
    let py = x.py();
    let is = |kind: &Option<Py<PyType>>| -> PyResult<bool> {
        match kind {
            Some(kind) => x.is_instance(kind.bind(py)),
            None => Ok(false),
        }
    };
    let (address, numel, nbytes, dtype_object, name, contiguous, writable);
    if is(&types.tensor)? {
        let device = x.getattr(intern!(py, "device"))?;
        if device.getattr(intern!(py, "type"))?.ne("cpu")? {
            return Err(PyValueError::new_err(format!(
                "{role} must be a CPU tensor, not on {device}"
            )));
        }
        address = x
            .call_method0(intern!(py, "data_ptr"))?
            .extract::<usize>()?;
        numel = x.call_method0(intern!(py, "numel"))?.extract::<usize>()?;
        nbytes = numel
            * x.call_method0(intern!(py, "element_size"))?
                .extract::<usize>()?;
        dtype_object = x.getattr(intern!(py, "dtype"))?;
        let spelled = dtype_object.str()?.to_string();
        name = spelled
            .strip_prefix("torch.")
            .unwrap_or(&spelled)
            .to_string();
        contiguous = x.call_method0(intern!(py, "is_contiguous"))?.is_truthy()?;
        writable = true;
    } else if is(&types.ndarray)? {
        let interface = x.getattr(intern!(py, "__array_interface__"))?;
        address = interface
            .get_item(intern!(py, "data"))?
            .get_item(0)?
            .extract()?;
        numel = x.getattr(intern!(py, "size"))?.extract()?;
        nbytes = x.getattr(intern!(py, "nbytes"))?.extract()?;
        dtype_object = x.getattr(intern!(py, "dtype"))?;
        name = dtype_object.getattr(intern!(py, "name"))?.extract()?;
        let flags = x.getattr(intern!(py, "flags"))?;
        contiguous = flags.getattr(intern!(py, "c_contiguous"))?.is_truthy()?;
        writable = flags.getattr(intern!(py, "writeable"))?.is_truthy()?;
    } else {
        let kind = match types.tensor {
            Some(_) => "a torch tensor",
            None => "a NumPy array",
        };
        let given = x.get_type().name()?;
        return Err(PyTypeError::new_err(format!(
            "{role} must be {kind}, not {given}"
        )));
    }
    let Some(dtype) = Dtype::from_name(&name) else {
        return Err(PyTypeError::new_err(format!(
            "{role} has dtype {name}, which the heap cannot hold"
        )));
    };
    let allocation = crate::registry::lookup(x)?;
    let arg = match (&allocation, contiguous) {
        (_, false) => None,
        (None, true) => Some(BufferArg::Local(address, nbytes)),
        (Some(allocation), true) => {
            let allocation = allocation.borrow();
            // torch reports address 0 for a tensor without elements: any offset will do then.
            let offset = match nbytes {
                0 => Some(0),
                _ => address.checked_sub(allocation.address),
            };
            let inside = offset.filter(|offset| {
                (*offset as u64)
                    .checked_add(nbytes as u64)
                    .is_some_and(|end| end <= allocation.nbytes)
            });
            let Some(offset) = inside else {
                return Err(PyValueError::new_err(format!(
                    "{role} lies outside its allocation"
                )));
            };
            Some(BufferArg::Symmetric(RegionArg::new(
                allocation.index,
                allocation.generation,
                offset as u64,
                nbytes as u64,
            )))
        }
    };
    Ok(Seen {
        address,
        dtype_object: dtype_object.unbind(),
        nbytes,
        dtype,
        numel,
        allocation: allocation.map(Bound::unbind),
        arg,
        writable,
    })
}

/// A symmetric tensor (or a view of one), checked — it views an allocation, which is live,
/// whose consumer's lease (in a shared root) is held, and it is contiguous — as its region and
/// inspection.
pub(crate) fn symmetric<'py>(
    x: &Bound<'py, PyAny>,
    role: &str,
) -> PyResult<(RegionArg, Found<'py>)> {
    let seen = inspect(x, role)?;
    let Some(allocation) = &seen.allocation else {
        return Err(PyValueError::new_err(format!(
            "{role} must be a symmetric tensor (made by hyper_multicore.shmem.empty or \
             restart) or a view of one"
        )));
    };
    usable(allocation.bind(x.py()), role)?;
    match seen.arg {
        Some(BufferArg::Symmetric(region)) => Ok((region, seen)),
        _ => Err(not_contiguous(role)),
    }
}

/// Refuses a stale allocation, or one whose consumer's lease is not held.
fn usable(allocation: &Bound<'_, Allocation>, role: &str) -> PyResult<()> {
    let owner = {
        let record = allocation.borrow();
        if !record.live {
            return Err(crate::errors::stale(
                allocation.py(),
                &format!(
                    "{role} views allocation {}, which was freed or released by a restart or \
                     release; allocate a new tensor",
                    record.index
                ),
            ));
        }
        record
            .owner
            .as_ref()
            .map(|owner| owner.clone_ref(allocation.py()))
    };
    // (called outside the borrow: Python code)
    if let Some(owner) = owner {
        owner
            .bind(allocation.py())
            .call_method1(intern!(allocation.py(), "check_lease"), (role,))?;
    }
    Ok(())
}

fn not_contiguous(role: &str) -> PyErr {
    PyValueError::new_err(format!("{role} must be contiguous"))
}

/// Whether a local buffer is written (a destination) or only read.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    Read,
    Write,
}

/// A local buffer, checked: a symmetric tensor (as [`symmetric`] checks it), or any other
/// contiguous CPU tensor or array (writable for [`Access::Write`]); as its native argument and
/// inspection.
pub(crate) fn local<'py>(
    x: &Bound<'py, PyAny>,
    role: &str,
    access: Access,
) -> PyResult<(BufferArg, Found<'py>)> {
    let seen = inspect(x, role)?;
    if let Some(allocation) = &seen.allocation {
        usable(allocation.bind(x.py()), role)?;
    }
    let Some(arg) = seen.arg else {
        return Err(not_contiguous(role));
    };
    // (a symmetric tensor is written through the heap, whatever its own flags say)
    if access == Access::Write && seen.allocation.is_none() && !seen.writable {
        return Err(PyValueError::new_err(format!("{role} is read-only")));
    }
    Ok((arg, seen))
}

/// Refuses two tensors of different dtypes for the operation `what`.
pub(crate) fn same_dtype(a: &Seen, b: &Seen, what: &str) -> PyResult<()> {
    if a.dtype == b.dtype {
        return Ok(());
    }
    Err(PyTypeError::new_err(format!(
        "{what}: dtypes differ ({} and {})",
        a.dtype.name(),
        b.dtype.name()
    )))
}

/// A symmetric one-element signal word (int32, uint32, int64 or uint64), checked as
/// [`symmetric`] checks it: its region and type name.
pub(crate) fn word(x: &Bound<'_, PyAny>, role: &str) -> PyResult<(RegionArg, &'static str)> {
    let (region, seen) = symmetric(x, role)?;
    let name = seen.dtype.name();
    if !matches!(
        seen.dtype,
        Dtype::I32 | Dtype::U32 | Dtype::I64 | Dtype::U64
    ) {
        return Err(PyTypeError::new_err(format!(
            "{role} must be an int32, uint32, int64 or uint64 tensor, not {name}"
        )));
    }
    if seen.numel != 1 {
        return Err(PyValueError::new_err(format!(
            "{role} must hold exactly one element (a signal word), not {}",
            seen.numel
        )));
    }
    Ok((region, name))
}

/// A symmetric tensor (or view) as its region `(index, generation, byte offset, bytes)`
/// (`_registry._region`).
#[pyfunction]
pub(crate) fn region(x: &Bound<'_, PyAny>, role: &str) -> PyResult<RegionArg> {
    symmetric(x, role).map(|(region, _)| region)
}

/// A local buffer as its native argument: a region of a symmetric tensor, or `(address,
/// nbytes)` (`_registry._local`; writable for a destination).
#[pyfunction]
#[pyo3(signature = (x, role, *, writable=false))]
pub(crate) fn local_buffer(
    x: &Bound<'_, PyAny>,
    role: &str,
    writable: bool,
) -> PyResult<BufferArg> {
    let access = if writable {
        Access::Write
    } else {
        Access::Read
    };
    local(x, role, access).map(|(arg, _)| arg)
}

/// The heap dtype name of a CPU tensor or array (`AllocationSpec.like`); `role` names it in
/// errors.
#[pyfunction]
pub(crate) fn tensor_dtype(x: &Bound<'_, PyAny>, role: &str) -> PyResult<&'static str> {
    Ok(inspect(x, role)?.dtype.name())
}

/// Adds this module's functions to the extension module `m`.
pub(crate) fn add_to(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(region, m)?)?;
    m.add_function(wrap_pyfunction!(local_buffer, m)?)?;
    m.add_function(wrap_pyfunction!(remembered, m)?)?;
    m.add_function(wrap_pyfunction!(tensor_dtype, m)?)?;
    Ok(())
}
