//! The data plane's fast path for torch tensors the wrapper has inspected before.
//!
//! `hyper_multicore.shmem._registry` inspects a torch tensor once (layout, allocation, native
//! argument) and hands this module a [`Seen`] handle with what a call needs, by the tensor's
//! `id` ([`remember`]; [`forget`] when the tensor dies). A `*_seen` function takes the tensors
//! themselves and does the whole per-call work here, in one native call: it finds each tensor's handle, checks
//! that the tensor still has what the handle was made from (the same object, data pointer,
//! dtype and size in bytes, still contiguous: what `set_`, `resize_`, `as_strided_`, `t_` or an
//! assignment to `.data` would change), that its allocation is still live and owned by no
//! shared-root consumer, and that the other arguments are plain (an `int` PE and value, a known
//! operation name); then it runs the operation. (The wrapper's own check compares shape and
//! strides instead; a tensor that passes one check and not the other — reshaped in place, still
//! contiguous — has the same bytes, so the same native argument.)
//!
//! Anything else — a tensor not seen or changed since, a stale tensor, a consumer's tensor
//! (its lease is checked in Python), a value of another type, an unknown operation name — is a
//! *miss*: the function returns `NotImplemented` without doing anything, and the wrapper takes
//! its full path, which raises the precise error or inspects the tensor anew (and remembers it).
//! So the fast path adds no behaviour of its own: it only skips work whose outcome is known.

use std::collections::BTreeMap;
use std::time::Duration;

use parking_lot::Mutex;

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyFloat, PyInt, PyString, PyWeakrefReference};

use crate::buffer::{Buffer, BufferArg};
use crate::heap::RegionArg;
use hyper_multicore::shmem::{Comparison, SignalOp};

use crate::data_plane::{parse_comparison, parse_signal_op, Atomic};

/// `id(tensor)` → its handle. Only touched with the GIL held, so the lock is never contended
/// (it is there because a static must be `Sync`).
static SEEN: Mutex<BTreeMap<usize, Py<Seen>>> = Mutex::new(BTreeMap::new());

/// Remembers the handle of the tensor whose `id` is `key` (replacing an older one).
#[pyfunction]
pub(crate) fn remember(key: usize, handle: Py<Seen>) {
    let old = SEEN.lock().insert(key, handle);
    // Dropped outside the lock: a handle's fields are Python references.
    drop(old);
}

/// Forgets the handle of a tensor that died, if `weak` (that tensor's weak reference) is the
/// one the handle holds; a newer tensor with the same `id` keeps its handle.
#[pyfunction]
pub(crate) fn forget(key: usize, weak: &Bound<'_, PyAny>) {
    let mut seen = SEEN.lock();
    let gone = match seen.get(&key) {
        Some(handle) if handle.get().tensor.bind(weak.py()).is(weak) => seen.remove(&key),
        _ => None,
    };
    drop(seen);
    drop(gone);
}

/// The number of remembered tensors (for the tests).
#[pyfunction]
pub(crate) fn remembered() -> usize {
    SEEN.lock().len()
}

/// What a data-plane call needs of one torch tensor, found when the registry inspected it.
#[pyclass(frozen, module = "hyper_multicore._native")]
pub(crate) struct Seen {
    /// A weak reference to the tensor.
    tensor: Py<PyWeakrefReference>,
    /// Its `data_ptr()`, `dtype` and `nbytes` when inspected (it was contiguous then).
    address: i64,
    dtype: Py<PyAny>,
    nbytes: usize,
    /// The registry's `_Allocation` it views (None: process-private memory).
    allocation: Option<Py<PyAny>>,
    /// Whether its allocation belongs to a shared root's consumer (whose lease the wrapper
    /// checks on every call: never fast). Set before the tensor reaches the caller, never
    /// changed.
    owned: bool,
    /// The native argument: a region of the allocation, or `(address, nbytes)`.
    arg: BufferArg,
    /// The word type's name, for a one-element int32/uint32/int64/uint64 tensor.
    word: Option<&'static str>,
    /// Whether it may be written (a destination).
    writable: bool,
    /// Whether it holds one element.
    single: bool,
}

#[pymethods]
impl Seen {
    /// Records an inspected tensor (the registry's `_seen` calls this once per tensor).
    #[new]
    #[allow(clippy::too_many_arguments)]
    fn new(
        tensor: Bound<'_, PyWeakrefReference>,
        address: i64,
        dtype: Py<PyAny>,
        nbytes: usize,
        allocation: Option<Py<PyAny>>,
        arg: BufferArg,
        word: Option<&str>,
        writable: bool,
        single: bool,
    ) -> PyResult<Seen> {
        let py = tensor.py();
        let owned = match &allocation {
            Some(allocation) => !allocation.bind(py).getattr(intern!(py, "owner"))?.is_none(),
            None => false,
        };
        let word = match word {
            Some("int32") => Some("int32"),
            Some("uint32") => Some("uint32"),
            Some("int64") => Some("int64"),
            Some("uint64") => Some("uint64"),
            _ => None,
        };
        Ok(Seen {
            tensor: tensor.unbind(),
            address,
            dtype,
            nbytes,
            allocation,
            owned,
            arg,
            word,
            writable,
            single,
        })
    }
}

impl Seen {
    /// Whether `x` is the tensor this handle was made for, unchanged, on memory still usable
    /// without the wrapper's checks (live, and no consumer's lease to check).
    fn matches(&self, x: &Bound<'_, PyAny>) -> PyResult<bool> {
        let py = x.py();
        if self.owned {
            return Ok(false);
        }
        let same_object = self
            .tensor
            .bind(py)
            .upgrade()
            .is_some_and(|tensor| tensor.is(x));
        if !same_object {
            return Ok(false);
        }
        // Integers and a bool: nothing here allocates a tuple (nor feeds the garbage collector).
        let address: i64 = x.call_method0(intern!(py, "data_ptr"))?.extract()?;
        if address != self.address
            || !x.getattr(intern!(py, "dtype"))?.is(&self.dtype)
            || x.getattr(intern!(py, "nbytes"))?.extract::<usize>()? != self.nbytes
        {
            return Ok(false);
        }
        // One element (a signal word) is contiguous whatever its strides.
        if !self.single && !x.call_method0(intern!(py, "is_contiguous"))?.is_truthy()? {
            return Ok(false);
        }
        match &self.allocation {
            None => Ok(true),
            Some(allocation) => allocation
                .bind(py)
                .getattr(intern!(py, "live"))?
                .is_truthy(),
        }
    }

    /// The region, if the tensor is symmetric.
    fn region(&self) -> Option<RegionArg> {
        match self.arg {
            BufferArg::Symmetric(region) => Some(region),
            BufferArg::Local(..) => None,
        }
    }
}

/// `x`'s handle, if `x` was seen and is unchanged (see [`Seen::matches`]).
fn current<'py>(x: &Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, Seen>>> {
    let py = x.py();
    let Some(handle) = SEEN
        .lock()
        .get(&(x.as_ptr() as usize))
        .map(|handle| handle.clone_ref(py).into_bound(py))
    else {
        return Ok(None);
    };
    Ok(handle.get().matches(x)?.then_some(handle))
}

/// `x`'s region and handle, if it is a current symmetric tensor.
fn symmetric<'py>(x: &Bound<'py, PyAny>) -> PyResult<Option<(RegionArg, Bound<'py, Seen>)>> {
    Ok(current(x)?.and_then(|seen| Some((seen.get().region()?, seen))))
}

/// The one-word region and its type, if `x` is a current symmetric one-element word tensor.
fn word(x: &Bound<'_, PyAny>) -> PyResult<Option<(RegionArg, &'static str)>> {
    Ok(symmetric(x)?.and_then(|(region, seen)| Some((region, seen.get().word?))))
}

/// A plain `int` as `T` (None for any other type, or out of range).
fn plain_int<'py, T: for<'a> FromPyObject<'a, 'py>>(x: &Bound<'py, PyAny>) -> Option<T> {
    if x.is_exact_instance_of::<PyInt>() {
        x.extract().ok()
    } else {
        None
    }
}

/// The signal operation a string argument names (None for another type or name).
fn signal_op(x: &Bound<'_, PyAny>) -> Option<SignalOp> {
    parse_signal_op(&x.cast::<PyString>().ok()?.to_cow().ok()?).ok()
}

/// The comparison a string argument names (None for another type or name).
fn comparison_of(x: &Bound<'_, PyAny>) -> Option<Comparison> {
    parse_comparison(&x.cast::<PyString>().ok()?.to_cow().ok()?).ok()
}

/// Runs `$body` with `$v` bound to `$value` as the word type named `$dtype`; a miss when
/// `$value` is not a plain `int` of that type.
macro_rules! with_plain_word {
    ($py:expr, $dtype:expr, $value:expr, $v:ident => $body:expr) => {
        with_word!($dtype, W => {
            let Some($v) = plain_int::<W>($value) else {
                return miss($py);
            };
            $body
        })
    };
}

/// What a miss returns.
fn miss(py: Python<'_>) -> PyResult<Py<PyAny>> {
    Ok(py.NotImplemented())
}

/// `put(remote_dst, local_src, target_pe)` for seen tensors; `NotImplemented` on a miss.
#[pyfunction]
pub(crate) fn put_seen(
    py: Python<'_>,
    dst: &Bound<'_, PyAny>,
    src: &Bound<'_, PyAny>,
    pe: &Bound<'_, PyAny>,
) -> PyResult<Py<PyAny>> {
    let (Some((target, dst)), Some(src), Some(pe)) =
        (symmetric(dst)?, current(src)?, plain_int(pe))
    else {
        return miss(py);
    };
    let (dst, src) = (dst.get(), src.get());
    if !dst.dtype.bind(py).is(&src.dtype) {
        return miss(py);
    }
    crate::data_plane::put_buffer(py, target, Buffer::new(src.arg)?, pe)?;
    Ok(py.None())
}

/// `get(local_dst, remote_src, source_pe)` for seen tensors; `NotImplemented` on a miss.
#[pyfunction]
pub(crate) fn get_seen(
    py: Python<'_>,
    dst: &Bound<'_, PyAny>,
    src: &Bound<'_, PyAny>,
    pe: &Bound<'_, PyAny>,
) -> PyResult<Py<PyAny>> {
    let (Some(dst), Some((source, src)), Some(pe)) =
        (current(dst)?, symmetric(src)?, plain_int(pe))
    else {
        return miss(py);
    };
    let (dst, src) = (dst.get(), src.get());
    if !dst.writable || !dst.dtype.bind(py).is(&src.dtype) {
        return miss(py);
    }
    crate::data_plane::get_buffer(py, Buffer::new(dst.arg)?, source, pe)?;
    Ok(py.None())
}

/// `signal(remote_signal, value, target_pe, operation=...)` for a seen word; `NotImplemented`
/// on a miss.
#[pyfunction]
pub(crate) fn signal_seen(
    py: Python<'_>,
    signal: &Bound<'_, PyAny>,
    value: &Bound<'_, PyAny>,
    pe: &Bound<'_, PyAny>,
    operation: &Bound<'_, PyAny>,
) -> PyResult<Py<PyAny>> {
    let (Some((signal, dtype)), Some(pe), Some(op)) =
        (word(signal)?, plain_int(pe), signal_op(operation))
    else {
        return miss(py);
    };
    with_plain_word!(py, dtype, value, value => {
        crate::data_plane::signal_word(py, signal, value, op, pe)?;
        Ok(py.None())
    })
}

/// `put_signal(remote_dst, local_src, remote_signal, value, target_pe, operation=...)` for seen
/// tensors; `NotImplemented` on a miss.
#[pyfunction]
pub(crate) fn put_signal_seen(
    py: Python<'_>,
    dst: &Bound<'_, PyAny>,
    src: &Bound<'_, PyAny>,
    signal: &Bound<'_, PyAny>,
    value: &Bound<'_, PyAny>,
    pe: &Bound<'_, PyAny>,
    operation: &Bound<'_, PyAny>,
) -> PyResult<Py<PyAny>> {
    let (Some((target, dst)), Some(src), Some((signal, dtype))) =
        (symmetric(dst)?, current(src)?, word(signal)?)
    else {
        return miss(py);
    };
    let (Some(pe), Some(op)) = (plain_int(pe), signal_op(operation)) else {
        return miss(py);
    };
    let (dst, src) = (dst.get(), src.get());
    if !dst.dtype.bind(py).is(&src.dtype) {
        return miss(py);
    }
    with_plain_word!(py, dtype, value, value => {
        crate::data_plane::put_signal_word(py, target, Buffer::new(src.arg)?, signal, value, op, pe)?;
        Ok(py.None())
    })
}

/// `wait_signal(signal, value, comparison=..., timeout=...)` for a seen word; returns the word,
/// or `NotImplemented` on a miss.
#[pyfunction]
pub(crate) fn wait_signal_seen(
    py: Python<'_>,
    signal: &Bound<'_, PyAny>,
    value: &Bound<'_, PyAny>,
    comparison: &Bound<'_, PyAny>,
    timeout: &Bound<'_, PyAny>,
) -> PyResult<Py<PyAny>> {
    let (Some((signal, dtype)), Some(comparison)) = (word(signal)?, comparison_of(comparison))
    else {
        return miss(py);
    };
    let timeout = if timeout.is_none() {
        None
    } else {
        let seconds = if timeout.is_exact_instance_of::<PyFloat>() {
            timeout.extract::<f64>().ok()
        } else {
            plain_int::<u64>(timeout).map(|s| s as f64)
        };
        match seconds.and_then(|s| Duration::try_from_secs_f64(s).ok()) {
            Some(timeout) => Some(timeout),
            None => return miss(py),
        }
    };
    with_plain_word!(py, dtype, value, value => {
        crate::data_plane::wait_signal_word(py, signal, value, comparison, timeout)
    })
}

/// An atomic operation (`fetch`, `set`, `swap`, `compare_swap`, `fetch_add`, `add`) on a seen
/// word; returns the previous value (None for set and add), or `NotImplemented` on a miss.
#[pyfunction]
#[pyo3(signature = (operation, target, pe, value=None, expected=None))]
pub(crate) fn atomic_seen(
    py: Python<'_>,
    operation: &str,
    target: &Bound<'_, PyAny>,
    pe: &Bound<'_, PyAny>,
    value: Option<&Bound<'_, PyAny>>,
    expected: Option<&Bound<'_, PyAny>>,
) -> PyResult<Py<PyAny>> {
    let (Some((target, dtype)), Some(pe)) = (word(target)?, plain_int(pe)) else {
        return miss(py);
    };
    with_word!(dtype, W => {
        let operand = |x: Option<&Bound<'_, PyAny>>| match x {
            None => Some(None),
            Some(x) => plain_int::<W>(x).map(Some),
        };
        let (Some(value), Some(expected)) = (operand(value), operand(expected)) else {
            return miss(py);
        };
        let Ok(atomic) = Atomic::new(operation, value, expected) else {
            return miss(py);
        };
        Ok(crate::data_plane::atomic_word(py, atomic, target, pe)?.unwrap_or_else(|| py.None()))
    })
}
