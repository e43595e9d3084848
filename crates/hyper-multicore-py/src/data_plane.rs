//! The data plane (`hyper_multicore.shmem._data_plane`): put and get, signals, atomics, quiet
//! and fence, and the collectives over the root.

use std::time::Duration;

use hyper_multicore::lifecycle;
use hyper_multicore::shmem::{AtomicOp, AtomicWord, Comparison, ReduceOp, Region, Shmem, SignalOp};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::BoundObject;

use crate::buffer::{Buffer, BufferArg};
use crate::errors::py_result;
use crate::heap::{RegionArg, Target};
use crate::lifecycle::unless_blocking;

/// A signal or atomic word type that converts to a Python `int`.
pub(crate) trait PyWord:
    AtomicWord + for<'py> IntoPyObject<'py, Error = std::convert::Infallible>
{
}

impl<W> PyWord for W where
    W: AtomicWord + for<'py> IntoPyObject<'py, Error = std::convert::Infallible>
{
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
/// Copies up to this many bytes holding the GIL (about a microsecond on shared memory).
const QUICK_BYTES: usize = 16 << 10;

/// [`unless_blocking`]'s test for a data-plane call moving `bytes` bytes.
fn quick_copy(shmem: &Shmem, bytes: usize) -> bool {
    bytes <= QUICK_BYTES && shmem.shared_memory_only()
}

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

/// Adds this module's functions to the extension module `m`.
pub(crate) fn add_to(m: &Bound<'_, PyModule>) -> PyResult<()> {
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
    Ok(())
}
