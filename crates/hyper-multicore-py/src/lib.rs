//! `hyper_multicore._native`: the PyO3 extension under the Python package `hyper_multicore`.
//!
//! A thin layer: it converts arguments, enters the runtime through the lifecycle's guard
//! ([`lifecycle::unless_blocking`]: holding the GIL only for what cannot wait, releasing it
//! around anything that may — a call waiting for the lifecycle lock with the GIL held would
//! freeze the interpreter, the lock's holder may need it for a preflight hook or a torch
//! all-gather), and maps errors ([`errors`]). Lifecycle logic lives in
//! `hyper_multicore::lifecycle`. The public Python API is `hyper_multicore.shmem`; each of its
//! modules has its native side in the file of the same name:
//!
//! - `_lifecycle` ↔ [`lifecycle`]: acquire, release, restart, introspection;
//! - `_allocation` ↔ [`allocation`]: the collective allocate and free of one allocation;
//! - `_registry` ↔ [`registry`] (the one registry of the allocations this process holds;
//!   `shmem.empty` and `shmem.free`) and [`seen`] (what a call needs of a tensor, inspected
//!   once and checked on every call);
//! - `_data_plane` ↔ [`data_plane`]: put, get, signals, atomics, the collectives — the Python
//!   module's functions are these, each one native call; [`arguments`] checks their plain
//!   arguments;
//! - `_shared_root` ↔ [`shared_root`]; `_errors` ↔ [`errors`];
//!   `hyper_multicore.symm_mem` ↔ [`symm_mem`].
//!
//! The rest serves them: [`buffer`] and [`heap`] (a symmetric tensor is a region
//! `(allocation index, generation, byte offset, bytes)`, a local buffer such a region or
//! `(address, nbytes)` of a contiguous CPU tensor; an allocation comes back with a
//! [`heap::HeapBuffer`] keeping the heap mapped for zero-copy tensors), [`memory`] (the crate's
//! only `unsafe` code), [`lock`], [`channel`] and [`hook`].
//!
//! ```python
//! from hyper_multicore import _native      # private: use hyper_multicore.shmem
//! _native.acquire_world(64 << 20)
//! index, generation, offset, nbytes, alignment, buffer = _native.allocate([4], "int64", None)
//! _native.free_allocation(index, generation)
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

use std::collections::HashMap;

use hyper_multicore::shmem::Dtype;
use pyo3::prelude::*;

use crate::errors::py_result;

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
            other => Err(pyo3::exceptions::PyTypeError::new_err(format!(
                "all_reduce supports int32, uint32, int64, uint64, float32 and float64, not {other}"
            ))),
        }
    };
}

// (The modules from here on use the macros above.)
mod allocation;
mod arguments;
mod data_plane;
mod lifecycle;
mod registry;
mod seen;
mod shared_root;
mod symm_mem;

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
    m.add_class::<heap::HeapBuffer>()?;
    lifecycle::add_to(m)?;
    allocation::add_to(m)?;
    data_plane::add_to(m)?;
    m.add_class::<lock::RegistryLock>()?;
    m.add_class::<registry::Allocation>()?;
    m.add_class::<registry::Registry>()?;
    m.add_class::<registry::AllocationMap>()?;
    m.add_function(wrap_pyfunction!(registry::empty, m)?)?;
    m.add_function(wrap_pyfunction!(registry::free, m)?)?;
    seen::add_to(m)?;
    m.add_class::<shared_root::PySharedRoot>()?;
    m.add_class::<shared_root::PyConsumer>()?;
    m.add_class::<shared_root::PyLease>()?;
    m.add_class::<shared_root::PyGrowable>()?;
    m.add_function(wrap_pyfunction!(shared_root::allocation_budget, m)?)?;
    m.add_function(wrap_pyfunction!(shared_root::warn, m)?)?;
    m.add_function(wrap_pyfunction!(symm_mem::symm_put_signal, m)?)?;
    m.add_function(wrap_pyfunction!(symm_mem::symm_wait_signal, m)?)?;
    m.add_function(wrap_pyfunction!(symm_mem::symm_barrier, m)?)?;
    m.add_function(wrap_pyfunction!(symm_mem::symm_addresses, m)?)?;
    m.add_function(wrap_pyfunction!(symm_mem::symm_peer_capsule, m)?)?;
    symm_mem::register_ops(m)?;
    Ok(())
}
