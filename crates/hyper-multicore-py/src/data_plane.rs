//! The data plane (`hyper_multicore.shmem._data_plane`, whose functions are these): put and
//! get, signals, atomics, quiet and fence, and the collectives over the root.
//!
//! Each call is one native call: it inspects its tensors ([`seen`], which remembers a torch
//! tensor's inspection), checks every argument, raising the precise error ([`seen`] for the
//! tensors, [`arguments`] for the rest), and enters the runtime once, through the lifecycle's
//! guard ([`unless_blocking`]).

use hyper_multicore::lifecycle;
use hyper_multicore::shmem::{AtomicOp, Comparison, ReduceOp, Region, Shmem, SignalOp};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::arguments::{self, choice};
use crate::buffer::{Buffer, BufferArg};
use crate::errors::py_result;
use crate::heap::{RegionArg, Target};
use crate::lifecycle::{guarded_once, unless_blocking};
use crate::seen::{self, Access};

/// The signal operations by name.
const SIGNAL_OPS: [(&str, SignalOp); 2] = [("set", SignalOp::Set), ("add", SignalOp::Add)];

/// The comparisons of a wait by name.
const COMPARISONS: [(&str, Comparison); 6] = [
    ("eq", Comparison::Eq),
    ("ne", Comparison::Ne),
    ("gt", Comparison::Gt),
    ("ge", Comparison::Ge),
    ("lt", Comparison::Lt),
    ("le", Comparison::Le),
];

/// The reductions of `all_reduce` by name.
const REDUCE_OPS: [(&str, ReduceOp); 3] = [
    ("sum", ReduceOp::Sum),
    ("min", ReduceOp::Min),
    ("max", ReduceOp::Max),
];

/// Copies up to this many bytes holding the GIL (about a microsecond on shared memory).
const QUICK_BYTES: usize = 16 << 10;

/// [`unless_blocking`]'s test for a data-plane call moving `bytes` bytes.
fn quick_copy(shmem: &Shmem, bytes: usize) -> bool {
    bytes <= QUICK_BYTES && shmem.shared_memory_only()
}

/// Copies ``local_src`` into PE ``target_pe``'s copy of the symmetric ``remote_dst`` (same
/// dtype and number of elements; either may be a view).
#[pyfunction]
fn put(
    remote_dst: &Bound<'_, PyAny>,
    local_src: &Bound<'_, PyAny>,
    target_pe: &Bound<'_, PyAny>,
) -> PyResult<()> {
    let (target, dst) = seen::symmetric(remote_dst, "remote_dst")?;
    let (source, src) = seen::local(local_src, "local_src", Access::Read)?;
    seen::same_dtype(&dst, &src, "put")?;
    let pe = arguments::pe(target_pe, "target_pe")?;
    let source = Buffer::new(source)?;
    unless_blocking(
        remote_dst.py(),
        "put",
        |shmem| quick_copy(shmem, source.len()),
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

/// Copies PE ``source_pe``'s copy of the symmetric ``remote_src`` into ``local_dst``.
#[pyfunction]
fn get(
    local_dst: &Bound<'_, PyAny>,
    remote_src: &Bound<'_, PyAny>,
    source_pe: &Bound<'_, PyAny>,
) -> PyResult<()> {
    let (source, src) = seen::symmetric(remote_src, "remote_src")?;
    let (target, dst) = seen::local(local_dst, "local_dst", Access::Write)?;
    seen::same_dtype(&dst, &src, "get")?;
    let pe = arguments::pe(source_pe, "source_pe")?;
    get_buffer(local_dst.py(), Buffer::new(target)?, source, pe)
}

/// Copies PE `pe`'s copy of the region `source` into `target` (`_native.get_region`: the
/// torch symmetric-memory API's get, whose arguments its own module checks).
#[pyfunction]
fn get_region(py: Python<'_>, target: BufferArg, source: RegionArg, pe: usize) -> PyResult<()> {
    get_buffer(py, Buffer::new(target)?, source, pe)
}

/// Copies PE `pe`'s copy of `source` into `target`.
fn get_buffer(py: Python<'_>, target: Buffer, source: RegionArg, pe: usize) -> PyResult<()> {
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

/// :func:`put`, then :func:`signal` on the same PE: a waiter that sees the signal sees the
/// data.
#[pyfunction]
#[pyo3(signature = (remote_dst, local_src, remote_signal, value, target_pe, *, operation=None))]
fn put_signal(
    remote_dst: &Bound<'_, PyAny>,
    local_src: &Bound<'_, PyAny>,
    remote_signal: &Bound<'_, PyAny>,
    value: &Bound<'_, PyAny>,
    target_pe: &Bound<'_, PyAny>,
    operation: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    let py = remote_dst.py();
    let (target, dst) = seen::symmetric(remote_dst, "remote_dst")?;
    let (source, src) = seen::local(local_src, "local_src", Access::Read)?;
    seen::same_dtype(&dst, &src, "put_signal")?;
    let (signal, dtype) = seen::word(remote_signal, "remote_signal")?;
    with_word!(dtype, W => {
        let value: W = arguments::word_value(value, dtype, "value")?;
        let op = signal_op(operation)?;
        let pe = arguments::pe(target_pe, "target_pe")?;
        let source = Buffer::new(source)?;
        unless_blocking(
            py,
            "put_signal",
            |shmem| quick_copy(shmem, source.len()),
            |shmem| {
                let region = target.resolve(shmem)?;
                let signal = signal.typed::<W>(shmem)?;
                put_from_buffer(shmem, region, source, pe)?;
                shmem.signal(&signal, value, op, pe)
            },
        )
    })
}

/// The signal operation `operation` names (None: ``"set"``).
fn signal_op(operation: Option<&Bound<'_, PyAny>>) -> PyResult<SignalOp> {
    match operation {
        None => Ok(SignalOp::Set),
        Some(operation) => choice(operation, &SIGNAL_OPS, "operation"),
    }
}

/// Sets (``operation="set"``) or adds to (``"add"``, wrapping) PE ``target_pe``'s copy of the
/// one-element signal word ``remote_signal``, and wakes its waiters.
#[pyfunction]
#[pyo3(signature = (remote_signal, value, target_pe, *, operation=None))]
fn signal(
    remote_signal: &Bound<'_, PyAny>,
    value: &Bound<'_, PyAny>,
    target_pe: &Bound<'_, PyAny>,
    operation: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    let (signal, dtype) = seen::word(remote_signal, "remote_signal")?;
    with_word!(dtype, W => {
        let value: W = arguments::word_value(value, dtype, "value")?;
        let op = signal_op(operation)?;
        let pe = arguments::pe(target_pe, "target_pe")?;
        unless_blocking(remote_signal.py(), "signal", Shmem::shared_memory_only, |shmem| {
            shmem.signal(&signal.typed::<W>(shmem)?, value, op, pe)
        })
    })
}

/// Waits until this PE's copy of the signal word compares ``comparison`` (``"eq"``, ``"ne"``,
/// ``"gt"``, ``"ge"``, ``"lt"``, ``"le"``) to ``value``; returns the word then.
///
/// ``timeout`` (seconds) defaults to ``HYPER_MULTICORE_SHMEM_TIMEOUT_SEC``; it raises
/// :class:`WaitTimeoutError` then, and :class:`PeerLostError` as soon as a PE of the root dies.
#[pyfunction]
#[pyo3(signature = (signal, value, *, comparison=None, timeout=None))]
fn wait_signal(
    signal: &Bound<'_, PyAny>,
    value: &Bound<'_, PyAny>,
    comparison: Option<&Bound<'_, PyAny>>,
    timeout: Option<&Bound<'_, PyAny>>,
) -> PyResult<Py<PyAny>> {
    let py = signal.py();
    let (signal, dtype) = seen::word(signal, "signal")?;
    let timeout = arguments::timeout(timeout)?;
    with_word!(dtype, W => {
        let value: W = arguments::word_value(value, dtype, "value")?;
        let comparison = match comparison {
            None => Comparison::Eq,
            Some(comparison) => choice(comparison, &COMPARISONS, "comparison")?,
        };
        // Already satisfied (a look at this PE's own word, which never blocks): no wait.
        let satisfied = |shmem: &Shmem| {
            let seen = shmem.atomic_fetch(&signal.typed::<W>(shmem)?, shmem.rank())?;
            Ok(comparison.holds(seen, value).then_some(seen))
        };
        let wait = |shmem: &Shmem| {
            shmem.wait_signal(&signal.typed::<W>(shmem)?, value, comparison, timeout)
        };
        let seen = guarded_once(py, "wait_signal", satisfied, wait)?;
        Ok(seen.into_pyobject(py)?.into_any().unbind())
    })
}

/// An atomic operation as Python calls it.
#[derive(Clone, Copy)]
enum Atomic {
    Fetch,
    Set,
    Swap,
    CompareSwap,
    FetchAdd,
    Add,
}

/// Runs the atomic operation `kind` on PE `pe`'s copy of the one-element word `target`, with
/// the operands `value` and `expected` (as `kind` takes them: a compare-and-swap's desired
/// value is its `value`). Returns the previous value, or None for a set or an add.
fn atomic(
    kind: Atomic,
    target: &Bound<'_, PyAny>,
    pe: &Bound<'_, PyAny>,
    value: Option<&Bound<'_, PyAny>>,
    expected: Option<&Bound<'_, PyAny>>,
) -> PyResult<Option<Py<PyAny>>> {
    let py = target.py();
    let (region, dtype) = seen::word(target, "target")?;
    with_word!(dtype, W => {
        let operand = |x: Option<&Bound<'_, PyAny>>, what| {
            x.map(|x| arguments::word_value::<W>(x, dtype, what)).transpose()
        };
        let (value, expected) = (operand(value, "value")?, operand(expected, "expected")?);
        let pe = arguments::pe(pe, "pe")?;
        // (each function below passes what its kind needs)
        let (op, returns) = match (kind, value, expected) {
            (Atomic::Fetch, _, _) => (AtomicOp::Fetch, true),
            (Atomic::Set, Some(value), _) => (AtomicOp::Set(value), false),
            (Atomic::Swap, Some(value), _) => (AtomicOp::Swap(value), true),
            (Atomic::CompareSwap, Some(desired), Some(expected)) => {
                (AtomicOp::CompareSwap { expected, desired }, true)
            }
            (Atomic::FetchAdd, Some(value), _) => (AtomicOp::FetchAdd(value), true),
            (Atomic::Add, Some(value), _) => (AtomicOp::Add(value), false),
            _ => return Err(PyValueError::new_err("an atomic operation misses an operand")),
        };
        let previous = unless_blocking(py, op.name(), Shmem::shared_memory_only, |shmem| {
            let target = shmem.locate_region(op.name(), region.resolve(shmem)?)?;
            shmem.atomic_located(&target, op, pe)
        })?;
        Ok(returns.then(|| previous.into_pyobject(py).map(|old| old.into_any().unbind())).transpose()?)
    })
}

/// Atomically reads PE ``pe``'s copy of the one-element integer tensor ``source``.
#[pyfunction]
fn atomic_fetch(source: &Bound<'_, PyAny>, pe: &Bound<'_, PyAny>) -> PyResult<Option<Py<PyAny>>> {
    atomic(Atomic::Fetch, source, pe, None, None)
}

/// Atomically stores ``value`` into PE ``pe``'s copy of ``target``.
#[pyfunction]
fn atomic_set(
    target: &Bound<'_, PyAny>,
    value: &Bound<'_, PyAny>,
    pe: &Bound<'_, PyAny>,
) -> PyResult<Option<Py<PyAny>>> {
    atomic(Atomic::Set, target, pe, Some(value), None)
}

/// Atomically replaces PE ``pe``'s copy of ``target`` with ``value``; returns the old value.
#[pyfunction]
fn atomic_swap(
    target: &Bound<'_, PyAny>,
    value: &Bound<'_, PyAny>,
    pe: &Bound<'_, PyAny>,
) -> PyResult<Option<Py<PyAny>>> {
    atomic(Atomic::Swap, target, pe, Some(value), None)
}

/// Atomically sets PE ``pe``'s copy of ``target`` to ``desired`` if it equals ``expected``;
/// returns the previous value (equal to ``expected`` on success).
#[pyfunction]
fn atomic_compare_swap(
    target: &Bound<'_, PyAny>,
    expected: &Bound<'_, PyAny>,
    desired: &Bound<'_, PyAny>,
    pe: &Bound<'_, PyAny>,
) -> PyResult<Option<Py<PyAny>>> {
    atomic(
        Atomic::CompareSwap,
        target,
        pe,
        Some(desired),
        Some(expected),
    )
}

/// Atomically adds ``value`` (wrapping) to PE ``pe``'s copy of ``target``; returns the old
/// value.
#[pyfunction]
fn atomic_fetch_add(
    target: &Bound<'_, PyAny>,
    value: &Bound<'_, PyAny>,
    pe: &Bound<'_, PyAny>,
) -> PyResult<Option<Py<PyAny>>> {
    atomic(Atomic::FetchAdd, target, pe, Some(value), None)
}

/// Atomically adds ``value`` (wrapping) to PE ``pe``'s copy of ``target``.
#[pyfunction]
fn atomic_add(
    target: &Bound<'_, PyAny>,
    value: &Bound<'_, PyAny>,
    pe: &Bound<'_, PyAny>,
) -> PyResult<Option<Py<PyAny>>> {
    atomic(Atomic::Add, target, pe, Some(value), None)
}

/// Collective: waits until every PE of the root has called it; every put made before it is
/// visible after it.
#[pyfunction]
fn barrier(py: Python<'_>) -> PyResult<()> {
    py_result(
        py,
        py.detach(|| lifecycle::guarded("barrier", |shmem| shmem.barrier())),
    )
}

/// Completes every outstanding operation of this PE (its puts are visible to everyone).
#[pyfunction]
fn quiet(py: Python<'_>) -> PyResult<()> {
    unless_blocking(py, "quiet", Shmem::shared_memory_only, |shmem| {
        shmem.quiet();
        Ok(())
    })
}

/// Orders this PE's earlier puts before its later ones, per target PE.
#[pyfunction]
fn fence(py: Python<'_>) -> PyResult<()> {
    unless_blocking(py, "fence", Shmem::shared_memory_only, |shmem| {
        shmem.fence();
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------------
// Collectives

/// Collective: gathers every PE's ``input`` into every PE's symmetric ``output``, in root-rank
/// order (``output`` holds ``n_pes() * input.numel()`` elements of the same dtype). A
/// zero-element input is a validated no-op.
#[pyfunction]
fn all_gather(output: &Bound<'_, PyAny>, input: &Bound<'_, PyAny>) -> PyResult<()> {
    let py = output.py();
    let (output, out) = seen::symmetric(output, "output")?;
    let (input, src) = seen::local(input, "input", Access::Read)?;
    seen::same_dtype(&out, &src, "all_gather")?;
    let pes = crate::lifecycle::n_pes(py)?;
    if out.numel != pes * src.numel {
        return Err(PyValueError::new_err(format!(
            "all_gather: output holds {} elements but {pes} PEs x {} input elements need {}",
            out.numel,
            src.numel,
            pes * src.numel
        )));
    }
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

/// Collective: copies PE ``root``'s ``input`` into every PE's symmetric ``output``. ``input``
/// is only read on ``root`` (it may be ``None`` elsewhere).
#[pyfunction]
fn broadcast(
    output: &Bound<'_, PyAny>,
    input: &Bound<'_, PyAny>,
    root: &Bound<'_, PyAny>,
) -> PyResult<()> {
    let py = output.py();
    let (output, out) = seen::symmetric(output, "output")?;
    let root = arguments::pe(root, "root")?;
    let mut source = None;
    if !input.is_none() && crate::lifecycle::my_pe(py)? == root {
        let (input, src) = seen::local(input, "input", Access::Read)?;
        seen::same_dtype(&out, &src, "broadcast")?;
        if out.numel != src.numel {
            return Err(PyValueError::new_err(format!(
                "broadcast: output holds {} elements, input {}",
                out.numel, src.numel
            )));
        }
        source = Some(Buffer::new(input)?);
    }
    py_result(
        py,
        py.detach(|| {
            lifecycle::guarded("broadcast", |shmem| {
                let output = output.typed::<u8>(shmem)?;
                match source {
                    Some(input) => input.read(shmem, |bytes| shmem.broadcast(&output, bytes, root)),
                    None => shmem.broadcast(&output, &[], root),
                }
            })
        }),
    )
}

/// Collective: sends block ``j`` of ``input`` to PE ``j``, which stores it as block
/// ``my_pe()`` of its symmetric ``output``. Both hold ``n_pes() * block`` elements.
#[pyfunction]
fn all_to_all(output: &Bound<'_, PyAny>, input: &Bound<'_, PyAny>) -> PyResult<()> {
    let py = output.py();
    let (output, out) = seen::symmetric(output, "output")?;
    let (input, src) = seen::local(input, "input", Access::Read)?;
    seen::same_dtype(&out, &src, "all_to_all")?;
    let pes = crate::lifecycle::n_pes(py)?;
    if out.numel != src.numel || src.numel % pes != 0 {
        return Err(PyValueError::new_err(format!(
            "all_to_all: input ({}) and output ({}) must hold the same number of elements, a \
             multiple of the {pes} PEs",
            src.numel, out.numel
        )));
    }
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

/// Collective: combines every PE's symmetric ``input`` element-wise with ``op`` (``"sum"``,
/// ``"min"``, ``"max"``) into every PE's symmetric ``output``; they may be the same tensor.
/// Dtypes: int32, uint32, int64, uint64, float32, float64.
#[pyfunction]
#[pyo3(signature = (output, input, op=None))]
fn all_reduce(
    output: &Bound<'_, PyAny>,
    input: &Bound<'_, PyAny>,
    op: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    let py = output.py();
    let (output, out) = seen::symmetric(output, "output")?;
    let (input, src) = seen::symmetric(input, "input")?;
    seen::same_dtype(&out, &src, "all_reduce")?;
    if out.numel != src.numel {
        return Err(PyValueError::new_err(format!(
            "all_reduce: output ({}) and input ({}) lengths differ",
            out.numel, src.numel
        )));
    }
    let op = match op {
        None => ReduceOp::Sum,
        Some(op) => choice(op, &REDUCE_OPS, "op")?,
    };
    with_reducible!(out.dtype.name(), T => {
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
    m.add_function(wrap_pyfunction!(put, m)?)?;
    m.add_function(wrap_pyfunction!(get, m)?)?;
    m.add_function(wrap_pyfunction!(get_region, m)?)?;
    m.add_function(wrap_pyfunction!(put_signal, m)?)?;
    m.add_function(wrap_pyfunction!(signal, m)?)?;
    m.add_function(wrap_pyfunction!(wait_signal, m)?)?;
    m.add_function(wrap_pyfunction!(atomic_fetch, m)?)?;
    m.add_function(wrap_pyfunction!(atomic_set, m)?)?;
    m.add_function(wrap_pyfunction!(atomic_swap, m)?)?;
    m.add_function(wrap_pyfunction!(atomic_compare_swap, m)?)?;
    m.add_function(wrap_pyfunction!(atomic_fetch_add, m)?)?;
    m.add_function(wrap_pyfunction!(atomic_add, m)?)?;
    m.add_function(wrap_pyfunction!(barrier, m)?)?;
    m.add_function(wrap_pyfunction!(quiet, m)?)?;
    m.add_function(wrap_pyfunction!(fence, m)?)?;
    m.add_function(wrap_pyfunction!(all_gather, m)?)?;
    m.add_function(wrap_pyfunction!(broadcast, m)?)?;
    m.add_function(wrap_pyfunction!(all_to_all, m)?)?;
    m.add_function(wrap_pyfunction!(all_reduce, m)?)?;
    m.add_function(wrap_pyfunction!(copy_count, m)?)?;
    Ok(())
}
