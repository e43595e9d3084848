//! The registry's maps ([`AllocationMap`]): held here, read from Python as mappings.

use std::collections::HashMap;

use parking_lot::Mutex;
use pyo3::exceptions::PyKeyError;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use super::Allocation;

/// What a registry map is keyed by: an allocation's identity `(index, generation)` (`_live`),
/// or what identifies the memory its tensors view (`_by_storage`: a torch storage's `_cdata`,
/// or the address of a NumPy array's root [`HeapBuffer`]). Python spells them as a tuple of
/// two ints and as an int.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Key {
    Id(u64, u64),
    Storage(usize),
}

impl<'a, 'py> FromPyObject<'a, 'py> for Key {
    type Error = PyErr;

    fn extract(object: Borrowed<'a, 'py, PyAny>) -> PyResult<Key> {
        match object.cast::<PyTuple>() {
            Ok(_) => {
                let (index, generation) = object.extract()?;
                Ok(Key::Id(index, generation))
            }
            Err(_) => Ok(Key::Storage(object.extract()?)),
        }
    }
}

impl<'py> IntoPyObject<'py> for Key {
    type Target = PyAny;
    type Output = Bound<'py, PyAny>;
    type Error = PyErr;

    fn into_pyobject(self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        match self {
            Key::Id(index, generation) => Ok((index, generation).into_pyobject(py)?.into_any()),
            Key::Storage(key) => Ok(key.into_pyobject(py)?.into_any()),
        }
    }
}

/// One of the registry's maps of [`Allocation`]s (`_registry._live`, `_registry._by_storage`):
/// held here, read from Python as a mapping (`in`, `[]`, `get`, `values`, `items`, `len`; `del`
/// for the tests that lose a record on purpose).
#[pyclass(frozen, module = "hyper_multicore._native")]
#[derive(Default)]
pub(crate) struct AllocationMap {
    entries: Mutex<HashMap<Key, Py<Allocation>>>,
}

impl AllocationMap {
    /// Records `allocation` under `key` (replacing an older record).
    pub(super) fn insert(&self, key: Key, allocation: Py<Allocation>) {
        let old = self.entries.lock().insert(key, allocation);
        // Dropped outside the lock: dropping a Python reference may run Python code.
        drop(old);
    }

    /// Forgets `key`'s record, if there is one.
    pub(super) fn remove(&self, key: Key) {
        let old = self.entries.lock().remove(&key);
        drop(old);
    }

    /// `key`'s record.
    pub(super) fn find<'py>(&self, py: Python<'py>, key: Key) -> Option<Bound<'py, Allocation>> {
        let entries = self.entries.lock();
        entries
            .get(&key)
            .map(|found| found.clone_ref(py).into_bound(py))
    }

    /// Every record (in no particular order).
    pub(super) fn values(&self, py: Python<'_>) -> Vec<Py<Allocation>> {
        let entries = self.entries.lock();
        entries.values().map(|found| found.clone_ref(py)).collect()
    }
}

#[pymethods]
impl AllocationMap {
    fn __len__(&self) -> usize {
        self.entries.lock().len()
    }

    fn __contains__(&self, key: Key) -> bool {
        self.entries.lock().contains_key(&key)
    }

    fn __getitem__<'py>(&self, py: Python<'py>, key: Key) -> PyResult<Bound<'py, Allocation>> {
        self.find(py, key)
            .ok_or_else(|| PyKeyError::new_err(key.into_pyobject(py).map(Bound::unbind).ok()))
    }

    fn __delitem__(&self, py: Python<'_>, key: Key) -> PyResult<()> {
        let old = self.entries.lock().remove(&key);
        match old {
            Some(_) => Ok(()),
            None => Err(PyKeyError::new_err(key.into_pyobject(py)?.unbind())),
        }
    }

    /// `key`'s record, or `default`.
    #[pyo3(signature = (key, default=None))]
    fn get(&self, py: Python<'_>, key: Key, default: Option<Py<PyAny>>) -> Option<Py<PyAny>> {
        match self.find(py, key) {
            Some(found) => Some(found.into_any().unbind()),
            None => default,
        }
    }

    /// Every record, as a list.
    #[pyo3(name = "values")]
    fn list_values(&self, py: Python<'_>) -> Vec<Py<Allocation>> {
        self.values(py)
    }

    /// Every `(key, record)` pair, as a list.
    fn items(&self, py: Python<'_>) -> Vec<(Key, Py<Allocation>)> {
        let entries = self.entries.lock();
        entries
            .iter()
            .map(|(key, found)| (*key, found.clone_ref(py)))
            .collect()
    }
}
