//! Turns the library's [`Error`] into the Python exceptions of `hyper_multicore.shmem`
//! (defined in `hyper_multicore/shmem/_errors.py`), keeping the cause chain as `__cause__`.
//!
//! | Rust error                                   | Python exception        |
//! |----------------------------------------------|-------------------------|
//! | recovery `Retryable`                         | `RetryableError`        |
//! | recovery `Terminal`                          | `TerminalError`         |
//! | recovery `ConvergenceFailure`                | `ConvergenceError`      |
//! | kind `PeerLost` (outside the lifecycle)      | `PeerLostError`         |
//! | kind `Timeout`                               | `WaitTimeoutError`      |
//! | kind `DoubleFree` (freed allocation)         | `StaleTensorError`      |
//! | kind `InvalidArgument` / `InvalidConfig`     | `InvalidArgumentError`  |
//! | anything else                                | `ShmemError`            |
//!
//! Every exception carries `kind`, `operation`, `rank`, `peer`, `stage` and `recovery`.

use hyper_multicore::{Error, ErrorKind, Recovery};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyModule;

/// The module that defines the exception classes.
const ERRORS_MODULE: &str = "hyper_multicore.shmem._errors";

static ERRORS: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

/// Converts a library error into its Python exception (with the GIL).
pub(crate) fn to_pyerr(py: Python<'_>, error: Error) -> PyErr {
    convert(py, &error)
}

/// `PyResult` from the library's `Result`.
pub(crate) fn py_result<T>(py: Python<'_>, result: hyper_multicore::Result<T>) -> PyResult<T> {
    result.map_err(|error| to_pyerr(py, error))
}

/// The Python class name for `error`.
fn class_name(error: &Error) -> &'static str {
    match error.recovery() {
        Some(Recovery::Retryable) => return "RetryableError",
        Some(Recovery::Terminal) => return "TerminalError",
        Some(Recovery::ConvergenceFailure) => return "ConvergenceError",
        None => {}
    }
    match error.kind() {
        ErrorKind::PeerLost => "PeerLostError",
        ErrorKind::Timeout => "WaitTimeoutError",
        ErrorKind::DoubleFree => "StaleTensorError",
        ErrorKind::InvalidArgument | ErrorKind::InvalidConfig => "InvalidArgumentError",
        _ => "ShmemError",
    }
}

fn recovery_name(recovery: Recovery) -> &'static str {
    match recovery {
        Recovery::Retryable => "retryable",
        Recovery::Terminal => "terminal",
        Recovery::ConvergenceFailure => "convergence failure",
    }
}

/// One link of a cause chain: a library error, a Python exception that crossed into Rust (a
/// failing preflight hook or torch collective), or any other error as a plain `ShmemError`.
fn convert(py: Python<'_>, error: &(dyn std::error::Error + 'static)) -> PyErr {
    if let Some(python) = error.downcast_ref::<PyErr>() {
        return python.clone_ref(py);
    }
    let converted = match error.downcast_ref::<Error>() {
        Some(ours) => build(py, class_name(ours), &ours.to_string(), Some(ours)),
        None => build(py, "ShmemError", &error.to_string(), None),
    };
    if let Some(source) = error.source() {
        converted.set_cause(py, Some(convert(py, source)));
    }
    converted
}

/// Instantiates `class` with `message` and the details of `error`.
fn build(py: Python<'_>, class: &str, message: &str, error: Option<&Error>) -> PyErr {
    let made = (|| -> PyResult<PyErr> {
        let module = ERRORS
            .get_or_try_init(py, || {
                PyModule::import(py, ERRORS_MODULE).map(Bound::unbind)
            })?
            .bind(py);
        let exception = module.getattr(class)?.call1((message,))?;
        if let Some(error) = error {
            exception.setattr("kind", error.kind().name())?;
            exception.setattr("operation", error.operation())?;
            exception.setattr("rank", error.rank())?;
            exception.setattr("peer", error.peer())?;
            exception.setattr("stage", error.stage())?;
            exception.setattr("recovery", error.recovery().map(recovery_name))?;
        }
        Ok(PyErr::from_value(exception))
    })();
    // Without the Python package (the extension imported alone) the message still gets through.
    made.unwrap_or_else(|_| PyRuntimeError::new_err(message.to_string()))
}

/// A `StaleTensorError` saying `message` (a tensor of a freed or released allocation, found
/// before any call into the library).
pub(crate) fn stale(py: Python<'_>, message: &str) -> PyErr {
    build(py, "StaleTensorError", message, None)
}

/// A library error for a Python exception raised inside a callback (hook, torch collective).
pub(crate) fn from_python(
    py: Python<'_>,
    kind: ErrorKind,
    operation: &str,
    what: &str,
    error: PyErr,
) -> Error {
    let described = match error.value(py).repr() {
        Ok(repr) => repr.to_string(),
        Err(_) => error.to_string(),
    };
    Error::new(kind, operation, format!("{what}: {described}")).caused_by(error)
}
