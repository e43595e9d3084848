//! The lifecycle (`hyper_multicore.shmem._lifecycle`): acquire over a root group, release,
//! restart, introspection; and [`unless_blocking`], the one way every other call here enters
//! the runtime through [`lifecycle::guarded`].

use std::collections::HashMap;
use std::sync::Arc;

use hyper_multicore::control::GroupChannel;
use hyper_multicore::lifecycle::{self, Replacement, RootGroup};
use hyper_multicore::shmem::{AllocationId, AllocationSpec, Dtype, Region, Shmem};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::allocation::parse_dtype;
use crate::channel::PythonChannel;
use crate::errors::py_result;
use crate::heap::{Exported, ExportedTuple};
use crate::hook::PythonHook;

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

/// Collective: a barrier of the root over its group channel (torch.distributed or the control
/// plane) instead of shared memory.
#[pyfunction]
fn host_barrier(py: Python<'_>) -> PyResult<()> {
    py_result(py, py.detach(lifecycle::host_barrier))
}

/// Runs a call on the runtime, passing the lifecycle's guard once. While the runtime admits
/// calls at once ([`lifecycle::try_guarded`]: no release or restart in progress), `now` runs
/// holding the GIL and answers `Some` when it completed the call without blocking, or `None`
/// when the call may wait (for a peer, the network, or a long copy): `later` then runs in the
/// same pass with the GIL released. A call not admitted at once runs `later` through
/// [`lifecycle::guarded`] with the GIL released, which waits for the release or restart to end,
/// or reports the refusal: waiting for the lifecycle lock with the GIL held could freeze the
/// interpreter, as the lock's holder may need the GIL (a preflight hook, a torch all-gather).
/// Releasing and retaking the GIL costs more than a query, a fence or a small copy in shared
/// memory.
pub(crate) fn guarded_once<R: Send>(
    py: Python<'_>,
    operation: &str,
    now: impl FnOnce(&Shmem) -> hyper_multicore::Result<Option<R>>,
    later: impl Fn(&Shmem) -> hyper_multicore::Result<R> + Send + Sync,
) -> PyResult<R> {
    let mut admitted = false;
    let result = lifecycle::try_guarded(operation, |shmem| {
        admitted = true;
        match now(shmem)? {
            Some(done) => Ok(done),
            None => py.detach(|| later(shmem)),
        }
    });
    let result = match admitted {
        true => result,
        false => py.detach(|| lifecycle::guarded(operation, &later)),
    };
    py_result(py, result)
}

/// [`guarded_once`] of `f`, which completes without blocking where `quick` says so.
pub(crate) fn unless_blocking<R: Send>(
    py: Python<'_>,
    operation: &str,
    quick: impl FnOnce(&Shmem) -> bool,
    f: impl Fn(&Shmem) -> hyper_multicore::Result<R> + Send + Sync,
) -> PyResult<R> {
    guarded_once(
        py,
        operation,
        |shmem| quick(shmem).then(|| f(shmem)).transpose(),
        &f,
    )
}

/// This PE's rank in the active root.
#[pyfunction]
pub(crate) fn my_pe(py: Python<'_>) -> PyResult<usize> {
    unless_blocking(py, "my_pe", |_| true, |shmem| Ok(shmem.rank()))
}

/// The number of PEs in the active root.
#[pyfunction]
pub(crate) fn n_pes(py: Python<'_>) -> PyResult<usize> {
    unless_blocking(py, "n_pes", |_| true, |shmem| Ok(shmem.size()))
}

/// Adds this module's functions to the extension module `m`.
pub(crate) fn add_to(m: &Bound<'_, PyModule>) -> PyResult<()> {
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
    Ok(())
}
