//! Allocation (`hyper_multicore.shmem._allocation`): the collective allocate and free of one
//! allocation by its identity. `shmem.empty` and `shmem.free` themselves, which make and retire
//! the tensors, are the registry's ([`crate::registry`]).

use hyper_multicore::lifecycle;
use hyper_multicore::shmem::{AllocationId, AllocationSpec, Dtype};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;

use crate::errors::py_result;
use crate::heap::{Exported, ExportedTuple};

/// The heap dtype named `name`, or a `TypeError` naming the ones the heap holds.
pub(crate) fn parse_dtype(name: &str) -> PyResult<Dtype> {
    Dtype::from_name(name).ok_or_else(|| {
        let known: Vec<&str> = Dtype::ALL.iter().map(|d| d.name()).collect();
        PyTypeError::new_err(format!(
            "dtype {name:?} cannot live in the symmetric heap; use one of {known:?}"
        ))
    })
}

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

/// Adds this module's functions to the extension module `m`.
pub(crate) fn add_to(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(allocate, m)?)?;
    m.add_function(wrap_pyfunction!(free, m)?)?;
    Ok(())
}
