//! `hyper_multicore._native`: the PyO3 extension under the Python package `hyper_multicore`.
//!
//! A thin layer: it converts arguments, releases the GIL around every call into the library, and
//! maps errors ([`errors`]). Releasing the GIL is a rule without exceptions: a call into the
//! library may wait for the lifecycle lock, whose holder may need the GIL (a preflight hook, a
//! torch all-gather), so waiting with the GIL held would freeze the interpreter. Lifecycle logic lives in `hyper_multicore::lifecycle`; every data-plane
//! and allocation call goes through [`lifecycle::guarded`]. The public Python API is
//! `hyper_multicore.shmem`, which turns tensors into the plain arguments taken here:
//!
//! - a symmetric tensor is a region `(allocation index, generation, byte offset, bytes)`;
//! - a local buffer is either such a region or `(address, nbytes)` of a contiguous CPU tensor
//!   ([`memory`] holds the crate's only `unsafe` code: for the latter, and for the DLPack
//!   capsule a torch tensor of the heap is made from);
//! - an allocation comes back as `(index, generation, heap offset, bytes, alignment,
//!   HeapBuffer)`, the [`heap::HeapBuffer`] keeping the heap mapped for zero-copy tensors; with
//!   torch, [`registry::Registry`] allocates, makes and records the tensor in one call.
//!
//! ```python
//! from hyper_multicore import _native      # private: use hyper_multicore.shmem
//! _native.acquire_world(64 << 20)
//! index, generation, offset, nbytes, alignment, buffer = _native.allocate([4], "int64", None)
//! _native.free(index, generation)
//! _native.release()
//! ```

#![deny(unsafe_code)]
// `hyper_multicore::Error` is the library's (large) error type; boxing it here would only add copies.
#![allow(clippy::result_large_err)]

mod buffer;
mod channel;
mod errors;
mod heap;
mod hook;
mod lock;
mod memory;
mod registry;
mod shared_root;
mod symm_mem;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use hyper_multicore::control::GroupChannel;
use hyper_multicore::lifecycle::{self, Replacement, RootGroup};
use hyper_multicore::shmem::{
    AllocationId, AllocationSpec, AtomicOp, AtomicWord, Comparison, Dtype, ReduceOp, Region, Shmem,
    SignalOp,
};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::BoundObject;

use crate::buffer::{Buffer, BufferArg};
use crate::channel::PythonChannel;
use crate::errors::py_result;
use crate::heap::{Exported, ExportedTuple, HeapBuffer, RegionArg, Target};
use crate::hook::PythonHook;

/// Runs `body` with `W` bound to the signal/atomic word type named `dtype`.
macro_rules! with_word {
    ($dtype:expr, $W:ident => $body:expr) => {
        match $dtype {
            "int32" => {
                type $W = i32;
                $body
            }
            "uint32" => {
                type $W = u32;
                $body
            }
            "int64" => {
                type $W = i64;
                $body
            }
            "uint64" => {
                type $W = u64;
                $body
            }
            other => Err(pyo3::exceptions::PyTypeError::new_err(format!(
                "signals and atomics need an int32, uint32, int64 or uint64 tensor, not {other}"
            ))),
        }
    };
}

/// Runs `body` with `$v` bound to the Python object `$value` converted to the signal/atomic word
/// type named `$dtype` (a `TypeError`/`OverflowError` when it does not convert).
macro_rules! with_word_value {
    ($dtype:expr, $value:expr, $v:ident => $body:expr) => {
        with_word!($dtype, W => {
            let $v: W = $value.extract()?;
            $body
        })
    };
}

/// Runs `body` with `T` bound to the reducible element type named `dtype`.
macro_rules! with_reducible {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            "int32" => {
                type $T = i32;
                $body
            }
            "uint32" => {
                type $T = u32;
                $body
            }
            "int64" => {
                type $T = i64;
                $body
            }
            "uint64" => {
                type $T = u64;
                $body
            }
            "float32" => {
                type $T = f32;
                $body
            }
            "float64" => {
                type $T = f64;
                $body
            }
            other => Err(PyTypeError::new_err(format!(
                "all_reduce supports int32, uint32, int64, uint64, float32 and float64, not {other}"
            ))),
        }
    };
}

mod seen;

/// A signal or atomic word type that converts to a Python `int`.
pub(crate) trait PyWord:
    AtomicWord + for<'py> IntoPyObject<'py, Error = std::convert::Infallible>
{
}

impl<W> PyWord for W where
    W: AtomicWord + for<'py> IntoPyObject<'py, Error = std::convert::Infallible>
{
}

pub(crate) fn parse_dtype(name: &str) -> PyResult<Dtype> {
    Dtype::from_name(name).ok_or_else(|| {
        let known: Vec<&str> = Dtype::ALL.iter().map(|d| d.name()).collect();
        PyTypeError::new_err(format!(
            "dtype {name:?} cannot live in the symmetric heap; use one of {known:?}"
        ))
    })
}

pub(crate) fn parse_signal_op(name: &str) -> PyResult<SignalOp> {
    match name {
        "set" => Ok(SignalOp::Set),
        "add" => Ok(SignalOp::Add),
        other => Err(PyValueError::new_err(format!(
            "operation must be \"set\" or \"add\", not {other:?}"
        ))),
    }
}

pub(crate) fn parse_comparison(name: &str) -> PyResult<Comparison> {
    Ok(match name {
        "eq" => Comparison::Eq,
        "ne" => Comparison::Ne,
        "gt" => Comparison::Gt,
        "ge" => Comparison::Ge,
        "lt" => Comparison::Lt,
        "le" => Comparison::Le,
        other => {
            return Err(PyValueError::new_err(format!(
                "comparison must be one of \"eq\", \"ne\", \"gt\", \"ge\", \"lt\", \"le\", not \
                 {other:?}"
            )))
        }
    })
}

fn parse_reduce_op(name: &str) -> PyResult<ReduceOp> {
    match name {
        "sum" => Ok(ReduceOp::Sum),
        "min" => Ok(ReduceOp::Min),
        "max" => Ok(ReduceOp::Max),
        other => Err(PyValueError::new_err(format!(
            "op must be \"sum\", \"min\" or \"max\", not {other:?}"
        ))),
    }
}

// ---------------------------------------------------------------------------------------------
// Lifecycle

/// Takes a reference over the launcher's world (hmrun, torchrun or standalone).
#[pyfunction]
#[pyo3(signature = (heap_size_bytes=None))]
fn acquire_world(py: Python<'_>, heap_size_bytes: Option<u64>) -> PyResult<()> {
    py_result(
        py,
        py.detach(|| lifecycle::acquire_root(RootGroup::World, heap_size_bytes)),
    )
}

/// Takes a reference over the subgroup `members` (world ranks, in order) of the launcher's world.
#[pyfunction]
#[pyo3(signature = (members, heap_size_bytes=None))]
fn acquire_ranks(
    py: Python<'_>,
    members: Vec<usize>,
    heap_size_bytes: Option<u64>,
) -> PyResult<()> {
    py_result(
        py,
        py.detach(|| lifecycle::acquire_root(RootGroup::Members(members), heap_size_bytes)),
    )
}

/// Takes a reference over a group whose exchanges run through `allgather(bytes) -> list[bytes]`
/// (a torch ProcessGroup's `all_gather_object`) and that lives while `alive() -> bool` says so;
/// `members` are its global ranks in group order.
#[pyfunction]
#[pyo3(signature = (rank, members, allgather, alive, heap_size_bytes=None))]
fn acquire_channel(
    py: Python<'_>,
    rank: usize,
    members: Vec<usize>,
    allgather: Py<PyAny>,
    alive: Py<PyAny>,
    heap_size_bytes: Option<u64>,
) -> PyResult<()> {
    let channel =
        PythonChannel::new(rank, members, allgather, alive).map_err(PyValueError::new_err)?;
    let channel: Arc<dyn GroupChannel> = Arc::new(channel);
    py_result(
        py,
        py.detach(|| lifecycle::acquire(Some(channel), heap_size_bytes)),
    )
}

/// Drops a reference; the last one shuts the runtime down collectively.
#[pyfunction]
fn release(py: Python<'_>) -> PyResult<()> {
    py_result(py, py.detach(lifecycle::release))
}

/// Replaces the runtime with one of `heap_size_bytes`, each `(current region, (shape, dtype,
/// alignment), preserve)` allocation by a new one (keeping its first min(old, new) bytes with
/// `preserve`). Returns the new allocations and the stage timings (ms).
///
/// `preflight_hook()`'s value is compared across ranks as a value ([`PythonHook`]). `problem`
/// is this rank's own argument problem, found by the wrapper: the rank still takes part, and
/// Preflight reports the problem on every rank (retryable).
#[pyfunction]
#[pyo3(signature = (heap_size_bytes, replacements, preflight_hook=None, problem=None))]
#[allow(clippy::type_complexity)]
fn restart(
    py: Python<'_>,
    heap_size_bytes: u64,
    replacements: Vec<(
        (u64, u64, u64, u64),
        (Vec<usize>, String, Option<u64>),
        bool,
    )>,
    preflight_hook: Option<Py<PyAny>>,
    problem: Option<String>,
) -> PyResult<(Vec<ExportedTuple>, HashMap<&'static str, f64>)> {
    let mut problem = problem;
    let mut requests = Vec::with_capacity(replacements.len());
    for ((index, generation, heap_offset, bytes), (shape, dtype, alignment), preserve) in
        replacements
    {
        let dtype = match parse_dtype(&dtype) {
            Ok(dtype) => dtype,
            Err(error) => {
                // Reported by Preflight on every rank, like any other argument problem.
                problem.get_or_insert_with(|| error.to_string());
                Dtype::U8
            }
        };
        requests.push(Replacement {
            current: Region {
                id: AllocationId { index, generation },
                heap_offset,
                bytes,
            },
            target: AllocationSpec {
                shape,
                dtype,
                alignment,
            },
            preserve,
        });
    }
    let mut hook = PythonHook::new(preflight_hook, problem);
    let outcome = py.detach(|| {
        let hook = hook
            .as_mut()
            .map(|h| h as &mut dyn lifecycle::PreflightHook);
        let result = lifecycle::restart(heap_size_bytes, &requests, hook)?;
        let exported = lifecycle::guarded("restart", |shmem| {
            result
                .allocations
                .iter()
                .map(|record| Exported::new(shmem, record.clone()))
                .collect::<hyper_multicore::Result<Vec<_>>>()
        })?;
        Ok((exported, result.timings))
    });
    let (exported, timings) = py_result(py, outcome)?;
    let stages = HashMap::from(timings.by_key());
    Ok((
        exported.into_iter().map(Exported::into_tuple).collect(),
        stages,
    ))
}

/// The ordered world ranks of the launcher's world (`[0]` for a standalone process).
#[pyfunction]
fn world_members(py: Python<'_>) -> PyResult<Vec<usize>> {
    py_result(py, py.detach(|| lifecycle::root_members(None)))
}

/// References held in this process (0 once the runtime is gone, a failed shutdown included).
/// It waits for the lifecycle lock, so without the GIL: the
/// thread holding the lock may need the GIL (a preflight hook, a torch all-gather).
#[pyfunction]
fn reference_count(py: Python<'_>) -> usize {
    py.detach(lifecycle::reference_count)
}

/// The debug snapshot, as JSON.
#[pyfunction]
fn debug_state(py: Python<'_>) -> PyResult<String> {
    let state = py.detach(lifecycle::debug_state);
    serde_json::to_string(&state).map_err(|e| PyValueError::new_err(e.to_string()))
}

/// Barrier of the active root over its group channel (the control plane).
#[pyfunction]
fn host_barrier(py: Python<'_>) -> PyResult<()> {
    py_result(py, py.detach(lifecycle::host_barrier))
}

/// Runs `f` on the runtime holding the GIL when that cannot block: the runtime is free now (no
/// release or restart in progress, see [`lifecycle::try_guarded`]) and `quick` says `f` will
/// not wait (for a peer, the network, or a long copy). Otherwise, like any call that may wait,
/// with the GIL released, which also reports any refusal. Releasing and retaking the GIL costs
/// more than a query, a fence or a small copy in shared memory.
fn unless_blocking<R: Send>(
    py: Python<'_>,
    operation: &str,
    quick: impl FnOnce(&Shmem) -> bool,
    f: impl Fn(&Shmem) -> hyper_multicore::Result<R> + Send + Sync,
) -> PyResult<R> {
    let now = lifecycle::try_guarded(operation, |shmem| Ok(quick(shmem).then(|| f(shmem))));
    match now {
        Ok(Some(result)) => py_result(py, result),
        _ => py_result(py, py.detach(|| lifecycle::guarded(operation, &f))),
    }
}

/// Copies up to this many bytes holding the GIL (about a microsecond on shared memory).
const QUICK_BYTES: usize = 16 << 10;

/// [`unless_blocking`]'s test for a data-plane call moving `bytes` bytes.
fn quick_copy(shmem: &Shmem, bytes: usize) -> bool {
    bytes <= QUICK_BYTES && shmem.shared_memory_only()
}

/// This PE's rank in the active root.
#[pyfunction]
fn my_pe(py: Python<'_>) -> PyResult<usize> {
    unless_blocking(py, "my_pe", |_| true, |shmem| Ok(shmem.rank()))
}

/// The number of PEs in the active root.
#[pyfunction]
fn n_pes(py: Python<'_>) -> PyResult<usize> {
    unless_blocking(py, "n_pes", |_| true, |shmem| Ok(shmem.size()))
}

// ---------------------------------------------------------------------------------------------
// Allocation

/// Collective: allocates `shape` of `dtype` (alignment `None` = 64 bytes).
#[pyfunction]
#[pyo3(signature = (shape, dtype, alignment=None))]
fn allocate(
    py: Python<'_>,
    shape: Vec<usize>,
    dtype: &str,
    alignment: Option<u64>,
) -> PyResult<ExportedTuple> {
    allocate_exported(py, &allocation_spec(shape, dtype, alignment)?).map(Exported::into_tuple)
}

/// The library's allocation spec of `shape`, heap dtype name `dtype` and `alignment`.
pub(crate) fn allocation_spec(
    shape: Vec<usize>,
    dtype: &str,
    alignment: Option<u64>,
) -> PyResult<AllocationSpec> {
    Ok(AllocationSpec {
        shape,
        dtype: parse_dtype(dtype)?,
        alignment,
    })
}

/// [`allocate`] of `spec` as the library's record and this process's view of it.
pub(crate) fn allocate_exported(py: Python<'_>, spec: &AllocationSpec) -> PyResult<Exported> {
    let exported = py.detach(|| {
        lifecycle::guarded("allocate", |shmem| {
            let record = shmem.allocate_spec(spec)?;
            Exported::new(shmem, record)
        })
    });
    py_result(py, exported)
}

/// Collective: frees allocation `(index, generation)` (`_native.free_allocation`; `_native.free`
/// is `shmem.free`, [`registry::free`]).
#[pyfunction]
#[pyo3(name = "free_allocation")]
pub(crate) fn free(py: Python<'_>, index: u64, generation: u64) -> PyResult<()> {
    let id = AllocationId { index, generation };
    py_result(
        py,
        py.detach(|| lifecycle::guarded("free", |shmem| shmem.free_id(id))),
    )
}

// ---------------------------------------------------------------------------------------------
// Data plane

/// Copies `source` into PE `pe`'s copy of `target`.
#[pyfunction]
fn put(py: Python<'_>, target: RegionArg, source: BufferArg, pe: usize) -> PyResult<()> {
    put_buffer(py, target, Buffer::new(source)?, pe)
}

/// [`put`] with a checked source.
pub(crate) fn put_buffer(
    py: Python<'_>,
    target: RegionArg,
    source: Buffer,
    pe: usize,
) -> PyResult<()> {
    let bytes = source.len();
    unless_blocking(
        py,
        "put",
        |shmem| quick_copy(shmem, bytes),
        |shmem| put_from_buffer(shmem, target.resolve(shmem)?, source, pe),
    )
}

/// Puts `source` into PE `pe`'s `target`: a symmetric source heap to heap, its bytes moving
/// once ([`Shmem::put_from`]); a private one from its memory.
fn put_from_buffer(
    shmem: &Shmem,
    target: Region,
    source: Buffer,
    pe: usize,
) -> hyper_multicore::Result<()> {
    match source {
        Buffer::Symmetric(source) => {
            let source = source.resolve(shmem)?;
            shmem.put_from(&Target::<u8>::new(target), &Target::<u8>::new(source), pe)
        }
        Buffer::Local(local) => local.with_bytes(|bytes| shmem.put_bytes(target, bytes, pe)),
    }
}

/// Copies PE `pe`'s copy of `source` into `target`.
#[pyfunction]
fn get(py: Python<'_>, target: BufferArg, source: RegionArg, pe: usize) -> PyResult<()> {
    get_buffer(py, Buffer::new(target)?, source, pe)
}

/// [`get`] with a checked target.
pub(crate) fn get_buffer(
    py: Python<'_>,
    target: Buffer,
    source: RegionArg,
    pe: usize,
) -> PyResult<()> {
    let bytes = target.len();
    unless_blocking(
        py,
        "get",
        |shmem| quick_copy(shmem, bytes),
        |shmem| {
            let source = source.resolve(shmem)?;
            match target {
                // Heap to heap: the bytes move once (`Shmem::get_into`).
                Buffer::Symmetric(target) => {
                    let target = target.resolve(shmem)?;
                    shmem.get_into(&Target::<u8>::new(target), &Target::<u8>::new(source), pe)
                }
                Buffer::Local(local) => {
                    local.with_bytes_mut(|bytes| shmem.get_bytes(bytes, source, pe))
                }
            }
        },
    )
}

/// Puts `source` into PE `pe`'s `target`, then updates its signal word.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn put_signal(
    py: Python<'_>,
    target: RegionArg,
    source: BufferArg,
    signal: RegionArg,
    dtype: &str,
    value: &Bound<'_, PyAny>,
    operation: &str,
    pe: usize,
) -> PyResult<()> {
    let source = Buffer::new(source)?;
    let op = parse_signal_op(operation)?;
    with_word_value!(dtype, value, value => {
        put_signal_word(py, target, source, signal, value, op, pe)
    })
}

/// [`put_signal`] with checked arguments.
pub(crate) fn put_signal_word<W: AtomicWord>(
    py: Python<'_>,
    target: RegionArg,
    source: Buffer,
    signal: RegionArg,
    value: W,
    op: SignalOp,
    pe: usize,
) -> PyResult<()> {
    let bytes = source.len();
    unless_blocking(
        py,
        "put_signal",
        |shmem| quick_copy(shmem, bytes),
        |shmem| {
            let region = target.resolve(shmem)?;
            let signal = signal.typed::<W>(shmem)?;
            put_from_buffer(shmem, region, source, pe)?;
            shmem.signal(&signal, value, op, pe)
        },
    )
}

/// Updates PE `pe`'s copy of a one-word signal (set or add) and wakes its waiters.
#[pyfunction]
fn signal(
    py: Python<'_>,
    signal: RegionArg,
    dtype: &str,
    value: &Bound<'_, PyAny>,
    operation: &str,
    pe: usize,
) -> PyResult<()> {
    let op = parse_signal_op(operation)?;
    with_word_value!(dtype, value, value => {
        signal_word(py, signal, value, op, pe)
    })
}

/// [`signal`] with checked arguments.
pub(crate) fn signal_word<W: AtomicWord>(
    py: Python<'_>,
    signal: RegionArg,
    value: W,
    op: SignalOp,
    pe: usize,
) -> PyResult<()> {
    unless_blocking(py, "signal", Shmem::shared_memory_only, |shmem| {
        shmem.signal(&signal.typed::<W>(shmem)?, value, op, pe)
    })
}

/// Waits until this PE's copy of a signal compares `comparison` to `value`; returns the word.
#[pyfunction]
#[pyo3(signature = (signal, dtype, value, comparison, timeout=None))]
fn wait_signal(
    py: Python<'_>,
    signal: RegionArg,
    dtype: &str,
    value: &Bound<'_, PyAny>,
    comparison: &str,
    timeout: Option<f64>,
) -> PyResult<Py<PyAny>> {
    let comparison = parse_comparison(comparison)?;
    let timeout = timeout
        .map(|seconds| {
            Duration::try_from_secs_f64(seconds).map_err(|_| {
                PyValueError::new_err(format!(
                    "timeout must be a non-negative number of seconds, not {seconds}"
                ))
            })
        })
        .transpose()?;
    with_word_value!(dtype, value, value => {
        wait_signal_word(py, signal, value, comparison, timeout)
    })
}

/// [`wait_signal`] with checked arguments.
pub(crate) fn wait_signal_word<W: PyWord>(
    py: Python<'_>,
    signal: RegionArg,
    value: W,
    comparison: Comparison,
    timeout: Option<Duration>,
) -> PyResult<Py<PyAny>> {
    // Already satisfied (a look at this PE's own word, which never blocks): no wait at all.
    let satisfied = lifecycle::try_guarded("wait_signal", |shmem| {
        let seen = shmem.atomic_fetch(&signal.typed::<W>(shmem)?, shmem.rank())?;
        Ok(comparison.holds(seen, value).then_some(seen))
    });
    let seen = match satisfied {
        Ok(Some(seen)) => seen,
        _ => py_result(
            py,
            py.detach(|| {
                lifecycle::guarded("wait_signal", |shmem| {
                    shmem.wait_signal(&signal.typed::<W>(shmem)?, value, comparison, timeout)
                })
            }),
        )?,
    };
    Ok(seen.into_pyobject(py)?.into_any().unbind())
}

/// An atomic operation as Python names it (`fetch`, `set`, `swap`, `compare_swap`, `fetch_add`,
/// `add`): the library's operation, and whether the caller gets the previous value (`add` is a
/// `fetch_add` whose result is dropped, `set` a store that returns nothing).
#[derive(Clone, Copy)]
pub(crate) struct Atomic<W> {
    op: AtomicOp<W>,
    returns: bool,
}

impl<W: AtomicWord> Atomic<W> {
    /// The operation named `name`, with the operands it needs.
    pub(crate) fn new(name: &str, value: Option<W>, expected: Option<W>) -> PyResult<Self> {
        let needed = |v: Option<W>, what: &str| {
            v.ok_or_else(|| PyValueError::new_err(format!("atomic_{name} needs {what}")))
        };
        let (op, returns) = match name {
            "fetch" => (AtomicOp::Fetch, true),
            "set" => (AtomicOp::Set(needed(value, "a value")?), false),
            "swap" => (AtomicOp::Swap(needed(value, "a value")?), true),
            "compare_swap" => (
                AtomicOp::CompareSwap {
                    expected: needed(expected, "an expected value")?,
                    desired: needed(value, "a desired value")?,
                },
                true,
            ),
            "fetch_add" => (AtomicOp::FetchAdd(needed(value, "a value")?), true),
            "add" => (AtomicOp::Add(needed(value, "a value")?), false),
            other => {
                return Err(PyValueError::new_err(format!(
                    "unknown atomic operation {other:?}"
                )))
            }
        };
        Ok(Atomic { op, returns })
    }
}

/// An atomic operation on PE `pe`'s copy of a one-word target: `fetch`, `set`, `swap`,
/// `compare_swap`, `fetch_add` or `add`. Returns the previous value (None for set and add).
#[pyfunction]
#[pyo3(signature = (operation, target, dtype, pe, value=None, expected=None))]
fn atomic(
    py: Python<'_>,
    operation: &str,
    target: RegionArg,
    dtype: &str,
    pe: usize,
    value: Option<&Bound<'_, PyAny>>,
    expected: Option<&Bound<'_, PyAny>>,
) -> PyResult<Option<Py<PyAny>>> {
    with_word!(dtype, W => {
        let value: Option<W> = value.map(|v| v.extract()).transpose()?;
        let expected: Option<W> = expected.map(|v| v.extract()).transpose()?;
        atomic_word(py, Atomic::new(operation, value, expected)?, target, pe)
    })
}

/// [`atomic`] with checked arguments.
pub(crate) fn atomic_word<W: PyWord>(
    py: Python<'_>,
    atomic: Atomic<W>,
    target: RegionArg,
    pe: usize,
) -> PyResult<Option<Py<PyAny>>> {
    let Atomic { op, returns } = atomic;
    let previous = unless_blocking(py, op.name(), Shmem::shared_memory_only, |shmem| {
        let target = shmem.locate_region(op.name(), target.resolve(shmem)?)?;
        shmem.atomic_located(&target, op, pe)
    })?;
    returns
        .then(|| Ok(previous.into_pyobject(py)?.into_any().unbind()))
        .transpose()
}

/// Waits until every PE of the root has called it; earlier puts are visible after it.
#[pyfunction]
fn barrier(py: Python<'_>) -> PyResult<()> {
    py_result(
        py,
        py.detach(|| lifecycle::guarded("barrier", |shmem| shmem.barrier())),
    )
}

/// Completes every outstanding operation of this PE.
#[pyfunction]
fn quiet(py: Python<'_>) -> PyResult<()> {
    unless_blocking(py, "quiet", Shmem::shared_memory_only, |shmem| {
        shmem.quiet();
        Ok(())
    })
}

/// Orders this PE's earlier puts before its later ones.
#[pyfunction]
fn fence(py: Python<'_>) -> PyResult<()> {
    unless_blocking(py, "fence", Shmem::shared_memory_only, |shmem| {
        shmem.fence();
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------------
// Collectives

/// Gathers every PE's `input` into every PE's `output`, in root-rank order.
#[pyfunction]
fn all_gather(py: Python<'_>, output: RegionArg, input: BufferArg) -> PyResult<()> {
    let input = Buffer::new(input)?;
    py_result(
        py,
        py.detach(|| {
            lifecycle::guarded("all_gather", |shmem| {
                let output = output.typed::<u8>(shmem)?;
                input.read(shmem, |bytes| shmem.all_gather(&output, bytes))
            })
        }),
    )
}

/// Copies `input` of PE `root` into every PE's `output` (`input` is ignored elsewhere).
#[pyfunction]
#[pyo3(signature = (output, input, root))]
fn broadcast(
    py: Python<'_>,
    output: RegionArg,
    input: Option<BufferArg>,
    root: usize,
) -> PyResult<()> {
    let input = input.map(Buffer::new).transpose()?;
    py_result(
        py,
        py.detach(|| {
            lifecycle::guarded("broadcast", |shmem| {
                let output = output.typed::<u8>(shmem)?;
                match input {
                    Some(input) => input.read(shmem, |bytes| shmem.broadcast(&output, bytes, root)),
                    None => shmem.broadcast(&output, &[], root),
                }
            })
        }),
    )
}

/// Sends block `j` of `input` to PE `j`, which stores it as block `my_pe` of its `output`.
#[pyfunction]
fn all_to_all(py: Python<'_>, output: RegionArg, input: BufferArg) -> PyResult<()> {
    let input = Buffer::new(input)?;
    py_result(
        py,
        py.detach(|| {
            lifecycle::guarded("all_to_all", |shmem| {
                let output = output.typed::<u8>(shmem)?;
                input.read(shmem, |bytes| shmem.all_to_all(&output, bytes))
            })
        }),
    )
}

/// Combines every PE's symmetric `input` element-wise into every PE's `output`.
#[pyfunction]
fn all_reduce(
    py: Python<'_>,
    output: RegionArg,
    input: RegionArg,
    dtype: &str,
    op: &str,
) -> PyResult<()> {
    let op = parse_reduce_op(op)?;
    with_reducible!(dtype, T => {
        py_result(py, py.detach(|| {
            lifecycle::guarded("all_reduce", |shmem| {
                let output = output.typed::<T>(shmem)?;
                let input = input.typed::<T>(shmem)?;
                shmem.all_reduce(&output, &input, op)
            })
        }))
    })
}

/// Test-only: `(moved, bounced)`, the bytes this process's data plane has moved and copied
/// through private buffers on the way (`hyper_multicore::shmem::copy_count`); `None` unless
/// built with the `fault-injection` feature.
#[pyfunction]
fn copy_count() -> Option<(u64, u64)> {
    hyper_multicore::shmem::copy_count().map(|count| (count.moved, count.bounced))
}

/// The extension module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // The runtime's log lines (level from HYPER_MULTICORE_SHMEM_LOG_LEVEL, rank on every line)
    // go to stderr from the first import on; a bad level fails the import with the variable named.
    py_result(m.py(), hyper_multicore::logging::install())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("FAULT_INJECTION", cfg!(feature = "fault-injection"))?;
    m.add(
        "DTYPES",
        Dtype::ALL.iter().map(|d| d.name()).collect::<Vec<_>>(),
    )?;
    m.add(
        "DTYPE_SIZES",
        Dtype::ALL
            .iter()
            .map(|d| (d.name(), d.size()))
            .collect::<HashMap<_, _>>(),
    )?;
    m.add_class::<HeapBuffer>()?;
    m.add_class::<lock::RegistryLock>()?;
    m.add_class::<registry::Allocation>()?;
    m.add_class::<registry::Registry>()?;
    m.add_function(wrap_pyfunction!(registry::empty, m)?)?;
    m.add_function(wrap_pyfunction!(registry::free, m)?)?;
    m.add_class::<seen::Seen>()?;
    m.add_function(wrap_pyfunction!(seen::remember, m)?)?;
    m.add_function(wrap_pyfunction!(seen::forget, m)?)?;
    m.add_function(wrap_pyfunction!(seen::remembered, m)?)?;
    m.add_function(wrap_pyfunction!(seen::put_seen, m)?)?;
    m.add_function(wrap_pyfunction!(seen::get_seen, m)?)?;
    m.add_function(wrap_pyfunction!(seen::signal_seen, m)?)?;
    m.add_function(wrap_pyfunction!(seen::put_signal_seen, m)?)?;
    m.add_function(wrap_pyfunction!(seen::wait_signal_seen, m)?)?;
    m.add_function(wrap_pyfunction!(seen::atomic_seen, m)?)?;
    m.add_class::<shared_root::PySharedRoot>()?;
    m.add_class::<shared_root::PyConsumer>()?;
    m.add_class::<shared_root::PyLease>()?;
    m.add_class::<shared_root::PyGrowable>()?;
    m.add_function(wrap_pyfunction!(shared_root::allocation_budget, m)?)?;
    m.add_function(wrap_pyfunction!(shared_root::warn, m)?)?;
    m.add_function(wrap_pyfunction!(acquire_world, m)?)?;
    m.add_function(wrap_pyfunction!(acquire_ranks, m)?)?;
    m.add_function(wrap_pyfunction!(acquire_channel, m)?)?;
    m.add_function(wrap_pyfunction!(release, m)?)?;
    m.add_function(wrap_pyfunction!(restart, m)?)?;
    m.add_function(wrap_pyfunction!(world_members, m)?)?;
    m.add_function(wrap_pyfunction!(reference_count, m)?)?;
    m.add_function(wrap_pyfunction!(debug_state, m)?)?;
    m.add_function(wrap_pyfunction!(host_barrier, m)?)?;
    m.add_function(wrap_pyfunction!(my_pe, m)?)?;
    m.add_function(wrap_pyfunction!(n_pes, m)?)?;
    m.add_function(wrap_pyfunction!(allocate, m)?)?;
    m.add_function(wrap_pyfunction!(free, m)?)?;
    m.add_function(wrap_pyfunction!(copy_count, m)?)?;
    m.add_function(wrap_pyfunction!(put, m)?)?;
    m.add_function(wrap_pyfunction!(get, m)?)?;
    m.add_function(wrap_pyfunction!(put_signal, m)?)?;
    m.add_function(wrap_pyfunction!(signal, m)?)?;
    m.add_function(wrap_pyfunction!(wait_signal, m)?)?;
    m.add_function(wrap_pyfunction!(atomic, m)?)?;
    m.add_function(wrap_pyfunction!(barrier, m)?)?;
    m.add_function(wrap_pyfunction!(quiet, m)?)?;
    m.add_function(wrap_pyfunction!(fence, m)?)?;
    m.add_function(wrap_pyfunction!(all_gather, m)?)?;
    m.add_function(wrap_pyfunction!(broadcast, m)?)?;
    m.add_function(wrap_pyfunction!(all_to_all, m)?)?;
    m.add_function(wrap_pyfunction!(all_reduce, m)?)?;
    m.add_function(wrap_pyfunction!(symm_mem::symm_put_signal, m)?)?;
    m.add_function(wrap_pyfunction!(symm_mem::symm_wait_signal, m)?)?;
    m.add_function(wrap_pyfunction!(symm_mem::symm_barrier, m)?)?;
    m.add_function(wrap_pyfunction!(symm_mem::symm_addresses, m)?)?;
    m.add_function(wrap_pyfunction!(symm_mem::symm_peer_capsule, m)?)?;
    m.add_function(wrap_pyfunction!(symm_mem::symm_get_many, m)?)?;
    Ok(())
}
