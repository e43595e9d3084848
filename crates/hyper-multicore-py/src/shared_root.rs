//! The shared root's classes (`hyper_multicore::lifecycle::SharedRoot`, its consumers, leases
//! and growable buffers) as the Python wrapper `hyper_multicore.shmem._shared_root` uses them.
//! Every call releases the GIL; allocations come back as the module's exported tuples, each
//! with its `(shape, dtype)` so the wrapper can re-register them after a growth.

use std::sync::Arc;

use hyper_multicore::control::GroupChannel;
use hyper_multicore::lifecycle::{
    self, Consumer, ConsumerSpec, GrowableBuffer, Growth, Lease, RootGroup, SharedRoot,
};
use hyper_multicore::shmem::{AllocationId, AllocationRecord, Shmem};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::allocation::allocation_spec;
use crate::channel::PythonChannel;
use crate::errors::py_result;
use crate::heap::{Exported, ExportedTuple};

/// An allocation as the wrapper receives it: the exported tuple, shape and dtype name.
type Described = (ExportedTuple, Vec<usize>, &'static str);

/// A growth: its record as JSON and `((old index, old generation), new allocation)` of every
/// replaced allocation.
type GrowthTuple = (String, Vec<((u64, u64), Described)>);

fn describe(shmem: &Shmem, record: AllocationRecord) -> hyper_multicore::Result<Described> {
    let shape = record.spec.shape.clone();
    let dtype = record.spec.dtype.name();
    Ok((Exported::new(shmem, record)?.into_tuple(), shape, dtype))
}

/// What a consumer's allocation costs its budget (alignment padding included).
#[pyfunction]
#[pyo3(signature = (shape, dtype, alignment=None))]
pub(crate) fn allocation_budget(
    py: Python<'_>,
    shape: Vec<usize>,
    dtype: &str,
    alignment: Option<u64>,
) -> PyResult<u64> {
    py_result(
        py,
        lifecycle::allocation_budget(&allocation_spec(shape, dtype, alignment)?),
    )
}

/// Logs `message` as the runtime's warning (the Python front's warnings, e.g. a consumer's
/// tensor dropped while its allocation is live).
#[pyfunction]
pub(crate) fn warn(message: &str) {
    tracing::warn!("{message}");
}

/// A shared root (planning, active, closed or failed).
#[pyclass(name = "SharedRoot", module = "hyper_multicore._native")]
pub(crate) struct PySharedRoot {
    root: SharedRoot,
}

#[pymethods]
impl PySharedRoot {
    /// Over the launcher's world.
    #[staticmethod]
    #[pyo3(signature = (heap_size_bytes=None))]
    fn world(heap_size_bytes: Option<u64>) -> Self {
        PySharedRoot {
            root: SharedRoot::new(RootGroup::World, heap_size_bytes),
        }
    }

    /// Over the subgroup `members` of the launcher's world.
    #[staticmethod]
    #[pyo3(signature = (members, heap_size_bytes=None))]
    fn ranks(members: Vec<usize>, heap_size_bytes: Option<u64>) -> Self {
        PySharedRoot {
            root: SharedRoot::new(RootGroup::Members(members), heap_size_bytes),
        }
    }

    /// Over a caller's group (a torch ProcessGroup's all-gather), as `acquire_channel`.
    #[staticmethod]
    #[pyo3(signature = (rank, members, allgather, alive, heap_size_bytes=None))]
    fn channel(
        rank: usize,
        members: Vec<usize>,
        allgather: Py<PyAny>,
        alive: Py<PyAny>,
        heap_size_bytes: Option<u64>,
    ) -> PyResult<Self> {
        let channel =
            PythonChannel::new(rank, members, allgather, alive).map_err(PyValueError::new_err)?;
        let channel: Arc<dyn GroupChannel> = Arc::new(channel);
        Ok(PySharedRoot {
            root: SharedRoot::new(RootGroup::Channel(channel), heap_size_bytes),
        })
    }

    fn set_growth_factor(&self, py: Python<'_>, factor: f64) -> PyResult<()> {
        py_result(py, self.root.set_growth_factor(factor))
    }

    #[pyo3(signature = (name, kind, budget_bytes, layout, max_budget_bytes=None))]
    fn reserve(
        &self,
        py: Python<'_>,
        name: String,
        kind: String,
        budget_bytes: u64,
        layout: String,
        max_budget_bytes: Option<u64>,
    ) -> PyResult<PyConsumer> {
        let spec = ConsumerSpec {
            name,
            kind,
            budget_bytes,
            layout,
            max_budget_bytes,
        };
        py_result(py, self.root.reserve(spec)).map(|consumer| PyConsumer { consumer })
    }

    fn activate(&self, py: Python<'_>) -> PyResult<()> {
        py_result(py, py.detach(|| self.root.activate()))
    }

    fn close(&self, py: Python<'_>) -> PyResult<()> {
        py_result(py, py.detach(|| self.root.close()))
    }

    /// The snapshot, as JSON.
    fn debug_state(&self, py: Python<'_>) -> PyResult<String> {
        let state = py.detach(|| self.root.debug_state());
        serde_json::to_string(&state).map_err(|e| PyValueError::new_err(e.to_string()))
    }
}

/// A consumer of a shared root.
#[pyclass(name = "Consumer", module = "hyper_multicore._native")]
pub(crate) struct PyConsumer {
    consumer: Consumer,
}

#[pymethods]
impl PyConsumer {
    /// Claims the lease: waiting (up to the runtime's timeout) with `wait`, else at once. The
    /// claiming thread acts under it: the data plane's native calls (bare guarded calls) from
    /// this thread are admitted while it is held, any other thread's are refused.
    #[pyo3(signature = (wait=true))]
    fn claim(&self, py: Python<'_>, wait: bool) -> PyResult<PyLease> {
        let lease = py.detach(|| match wait {
            true => self.consumer.claim(),
            false => self.consumer.try_claim(),
        });
        let lease = py_result(py, lease)?;
        lease.bind_thread();
        Ok(PyLease { lease })
    }

    fn close(&self, py: Python<'_>) -> PyResult<()> {
        py_result(py, self.consumer.close())
    }
}

/// A consumer's execution lease.
#[pyclass(name = "Lease", module = "hyper_multicore._native")]
pub(crate) struct PyLease {
    lease: Lease,
}

impl PyLease {
    fn describe(&self, py: Python<'_>, record: AllocationRecord) -> PyResult<Described> {
        let described = py.detach(|| self.lease.run("allocate", |s| describe(s, record)));
        py_result(py, described)
    }

    fn growth(&self, py: Python<'_>, growth: Option<Growth>) -> PyResult<Option<GrowthTuple>> {
        let Some(growth) = growth else {
            return Ok(None);
        };
        let json = serde_json::to_string(&growth.record)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let replaced = py.detach(|| {
            self.lease.run("grow", |shmem| {
                growth
                    .replaced
                    .into_iter()
                    .map(|(old, new)| Ok(((old.index, old.generation), describe(shmem, new)?)))
                    .collect::<hyper_multicore::Result<Vec<_>>>()
            })
        });
        Ok(Some((json, py_result(py, replaced)?)))
    }
}

#[pymethods]
impl PyLease {
    #[getter]
    fn generation(&self) -> u64 {
        self.lease.generation()
    }

    fn release(&self, py: Python<'_>) -> PyResult<()> {
        py_result(py, self.lease.release())
    }

    /// Fails unless the lease is current (its consumer holds it, this generation).
    fn check(&self, py: Python<'_>, operation: &str) -> PyResult<()> {
        py_result(py, self.lease.run(operation, |_| Ok(())))
    }

    /// Allocates for the consumer, a growable buffer with `growable`; `site` (the Python
    /// caller's `file:line`) is logged at debug.
    fn allocate(
        &self,
        py: Python<'_>,
        shape: Vec<usize>,
        dtype: &str,
        alignment: Option<u64>,
        site: &str,
        growable: bool,
    ) -> PyResult<(Option<PyGrowable>, Described)> {
        let spec = allocation_spec(shape, dtype, alignment)?;
        let made = py.detach(|| match growable {
            false => Ok((None, self.lease.allocate_spec_from(&spec, site)?)),
            true => {
                let buffer = self.lease.allocate_growable_from(&spec, site)?;
                let record = buffer.record(&self.lease)?;
                Ok((Some(PyGrowable { buffer }), record))
            }
        });
        let (buffer, record) = py_result(py, made)?;
        Ok((buffer, self.describe(py, record)?))
    }

    fn free(&self, py: Python<'_>, index: u64, generation: u64) -> PyResult<()> {
        let id = AllocationId { index, generation };
        py_result(py, py.detach(|| self.lease.free(id)))
    }

    fn grow(&self, py: Python<'_>, need_budget_bytes: u64) -> PyResult<Option<GrowthTuple>> {
        let growth = py_result(py, py.detach(|| self.lease.grow(need_budget_bytes)))?;
        self.growth(py, growth)
    }

    /// Grows every one of `buffers` (of this consumer) to at least `rows` rows, in one growth.
    fn ensure_capacity(
        &self,
        py: Python<'_>,
        buffers: Vec<PyRef<'_, PyGrowable>>,
        rows: usize,
    ) -> PyResult<Option<GrowthTuple>> {
        let buffers: Vec<&GrowableBuffer> = buffers.iter().map(|b| &b.buffer).collect();
        let growth = py.detach(|| self.lease.ensure_capacity(&buffers, rows));
        let growth = py_result(py, growth)?;
        self.growth(py, growth)
    }
}

/// A growable buffer of a consumer.
#[pyclass(name = "GrowableBuffer", module = "hyper_multicore._native")]
pub(crate) struct PyGrowable {
    buffer: GrowableBuffer,
}
