//! A restart's preflight hook from Python ([`PythonHook`]): the callable's return value is
//! pickled to cross the ranks, and compared *as a value* (`==` after unpickling) — so a set of
//! strings, whose pickle follows each process's hash order, or dicts built in a different order
//! agree when they are equal. A "values differ" error shows each value's `repr`, never pickle
//! bytes.
//!
//! The same hook carries a rank's argument problem into Preflight: when this rank's own
//! arguments to `restart` are invalid, its snapshot fails with that problem, so every rank
//! reports it (retryable) instead of the others waiting for a rank that never came.

use hyper_multicore::lifecycle::PreflightHook;
use hyper_multicore::{Error, ErrorKind, Result};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::errors::from_python;

const OP: &str = "restart";

/// The Python side of a restart's preflight hook.
pub(crate) struct PythonHook {
    /// `preflight_hook()`, or `None` without a hook.
    hook: Option<Py<PyAny>>,
    /// This rank's argument problem, reported by Preflight on every rank.
    problem: Option<String>,
}

impl PythonHook {
    /// A hook for `restart`; `None` if there is neither a callable nor a problem to report.
    pub(crate) fn new(hook: Option<Py<PyAny>>, problem: Option<String>) -> Option<PythonHook> {
        (hook.is_some() || problem.is_some()).then_some(PythonHook { hook, problem })
    }

    /// The unpickled value of a snapshot (`None` for a snapshot without a hook).
    fn load<'py>(py: Python<'py>, snapshot: &[u8]) -> PyResult<Bound<'py, PyAny>> {
        py.import("pickle")?
            .call_method1("loads", (PyBytes::new(py, snapshot),))
    }
}

impl PreflightHook for PythonHook {
    fn snapshot(&mut self) -> Result<Vec<u8>> {
        if let Some(problem) = &self.problem {
            return Err(Error::new(ErrorKind::InvalidArgument, OP, problem.clone()));
        }
        let Some(hook) = &self.hook else {
            return Ok(Vec::new());
        };
        Python::attach(|py| {
            let value = hook.call0(py).map_err(|e| {
                from_python(
                    py,
                    ErrorKind::InvalidArgument,
                    OP,
                    "the preflight hook raised",
                    e,
                )
            })?;
            py.import("pickle")
                .and_then(|pickle| pickle.call_method1("dumps", (value, 4)))
                .and_then(|pickled| pickled.extract::<Vec<u8>>())
                .map_err(|e| {
                    from_python(
                        py,
                        ErrorKind::InvalidArgument,
                        OP,
                        "the preflight hook's value cannot be pickled (return plain values: \
                         numbers, strings, tuples, lists, dicts, sets)",
                        e,
                    )
                })
        })
    }

    /// Equal as values: `bool(a == b)` of the unpickled snapshots (identical bytes are equal
    /// without unpickling; a value that cannot be unpickled or compared equals nothing else).
    fn same(&self, a: &[u8], b: &[u8]) -> bool {
        if a == b {
            return true;
        }
        Python::attach(|py| {
            let equal = || -> PyResult<bool> {
                let (a, b) = (Self::load(py, a)?, Self::load(py, b)?);
                a.eq(b)
            };
            equal().unwrap_or(false)
        })
    }

    /// The value's `repr` (the lifecycle cuts it short).
    fn describe(&self, value: &[u8]) -> String {
        Python::attach(|py| {
            Self::load(py, value)
                .and_then(|v| v.repr().map(|r| r.to_string()))
                .unwrap_or_else(|e| format!("<a value that cannot be unpickled here: {e}>"))
        })
    }
}
