//! The data plane's plain arguments — PE numbers, signal and atomic values, operation names,
//! timeouts — checked as `hyper_multicore.shmem._backend.check_int` and `check_word` check
//! them: a bool is not an integer, any other integer-like (`__index__`) is; out-of-range and
//! unknown values raise the same exception types and messages.

use std::time::Duration;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyFloat, PyInt, PyString};

/// `operator.index`.
static INDEX: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// `value` as a Python integer (`operator.index(value)`); `what` names it in errors.
fn integer<'py>(value: &Bound<'py, PyAny>, what: &str) -> PyResult<Bound<'py, PyInt>> {
    let py = value.py();
    if value.is_instance_of::<PyBool>() {
        return Err(PyTypeError::new_err(format!(
            "{what} must be an integer, not a bool"
        )));
    }
    let index = INDEX.get_or_try_init(py, || {
        py.import(intern!(py, "operator"))?
            .getattr(intern!(py, "index"))
            .map(Bound::unbind)
    })?;
    match index.bind(py).call1((value,)) {
        Ok(number) => Ok(number.cast_into::<PyInt>()?),
        Err(error) if error.is_instance_of::<PyTypeError>(py) => {
            let given = value.get_type().name()?;
            Err(PyTypeError::new_err(format!(
                "{what} must be an integer, not {given}"
            )))
        }
        Err(error) => Err(error),
    }
}

/// `value` as a PE number (a non-negative integer); `what` names it in errors.
pub(crate) fn pe(value: &Bound<'_, PyAny>, what: &str) -> PyResult<usize> {
    if value.is_exact_instance_of::<PyInt>() {
        if let Ok(pe) = value.extract::<usize>() {
            return Ok(pe);
        }
    }
    let number = integer(value, what)?;
    if number.lt(0)? {
        return Err(PyValueError::new_err(format!(
            "{what} must be non-negative, not {number}"
        )));
    }
    number.extract()
}

/// The values a signal or atomic word of type `dtype` holds, as Python prints them.
fn word_range(dtype: &str) -> (i128, i128) {
    match dtype {
        "int32" => (i32::MIN.into(), i32::MAX.into()),
        "uint32" => (0, u32::MAX.into()),
        "int64" => (i64::MIN.into(), i64::MAX.into()),
        _ => (0, u64::MAX.into()),
    }
}

/// `value` as a word of type `W` (named `dtype`); `what` names it in errors.
pub(crate) fn word_value<'py, W>(value: &Bound<'py, PyAny>, dtype: &str, what: &str) -> PyResult<W>
where
    W: for<'a> FromPyObject<'a, 'py>,
{
    if value.is_exact_instance_of::<PyInt>() {
        if let Ok(word) = value.extract::<W>() {
            return Ok(word);
        }
    }
    let number = integer(value, what)?;
    number.extract::<W>().map_err(|_| {
        let (low, high) = word_range(dtype);
        PyValueError::new_err(format!(
            "{what} {number} does not fit in {dtype} ({low}..{high})"
        ))
    })
}

/// What the string `value` names among `choices` (name, meaning); `what` names it in errors.
pub(crate) fn choice<T: Copy>(
    value: &Bound<'_, PyAny>,
    choices: &[(&str, T)],
    what: &str,
) -> PyResult<T> {
    // (as Python prints the tuple of names)
    let listed = choices
        .iter()
        .map(|(name, _)| format!("'{name}'"))
        .collect::<Vec<_>>()
        .join(", ");
    let Ok(text) = value.cast::<PyString>() else {
        return Err(PyTypeError::new_err(format!(
            "{what} must be a string, one of ({listed})"
        )));
    };
    let text = text.to_cow()?;
    match choices.iter().find(|(name, _)| *name == text) {
        Some((_, meaning)) => Ok(*meaning),
        None => Err(PyValueError::new_err(format!(
            "{what} must be one of ({listed}), not {}",
            value.repr()?
        ))),
    }
}

/// A wait's timeout in seconds (None: the configured default); a bool is not a number.
pub(crate) fn timeout(value: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Duration>> {
    let Some(value) = value.filter(|value| !value.is_none()) else {
        return Ok(None);
    };
    let number = value.is_instance_of::<PyInt>() || value.is_instance_of::<PyFloat>();
    if value.is_instance_of::<PyBool>() || !number {
        return Err(PyTypeError::new_err(
            "timeout must be a number of seconds (or None)",
        ));
    }
    if value.lt(0)? {
        return Err(PyValueError::new_err(format!(
            "timeout must be non-negative, not {value}"
        )));
    }
    let seconds: f64 = value.extract()?;
    Duration::try_from_secs_f64(seconds).map(Some).map_err(|_| {
        PyValueError::new_err(format!(
            "timeout must be a non-negative number of seconds, not {seconds}"
        ))
    })
}
