//! The allocations this process holds (`hyper_multicore.shmem._registry`): the one registry,
//! here, and `shmem.empty` and `shmem.free` themselves.
//!
//! Its records are [`Allocation`]s; its maps are [`AllocationMap`]s — `_live` (by `(index,
//! generation)`) and `_by_storage` (by torch storage, or by the [`HeapBuffer`] at the root of a
//! NumPy array's `base` chain), which Python reads as mappings. [`lookup`] finds the allocation
//! a tensor views (the data plane's [`crate::seen`] asks it). [`empty`] and [`free`] do the
//! plain case (for `free`: a live, whole, unowned, non-empty tensor or array) in one native
//! call and hand anything else to the wrapper's full path, which raises the precise error.
//! Every call that changes the registry holds its lock ([`RegistryLock`]).
//!
//! A torch tensor is made from a DLPack capsule of its allocation's bytes
//! ([`heap_capsule`](crate::memory::heap_capsule)), whose owner ([`StorageWatch`]) holds the
//! heap mapping — so the heap stays mapped until the last storage over it is gone, whatever
//! becomes of the registry's records — and drops the memory's entry when torch drops it with
//! the storage. A NumPy array is made over the [`HeapBuffer`]'s `__array_interface__`, so the
//! [`HeapBuffer`] is the root of every derived array's `base` chain and keeps the mapping
//! itself; a weak reference to it drops the entry ([`ForgetStorage`]).

use std::sync::{Arc, OnceLock};

use hyper_multicore::shmem::{AllocationSpec, Dtype};
use parking_lot::Mutex;

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::gc::PyVisit;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyInt, PySlice, PyString, PyTuple, PyType, PyWeakrefReference};
use pyo3::PyTraverseError;

use crate::heap::HeapBuffer;
use crate::lock::RegistryLock;

mod map;

pub(crate) use map::{AllocationMap, Key};

/// One allocation handed to Python (`_registry._Allocation`): its identity, where it lives,
/// and its full tensor.
#[pyclass(weakref, module = "hyper_multicore._native")]
pub(crate) struct Allocation {
    #[pyo3(get)]
    pub(crate) index: u64,
    #[pyo3(get)]
    pub(crate) generation: u64,
    #[pyo3(get)]
    heap_offset: u64,
    #[pyo3(get)]
    pub(crate) nbytes: u64,
    #[pyo3(get)]
    alignment: u64,
    /// The address of its first byte in this process.
    #[pyo3(get)]
    pub(crate) address: usize,
    /// False once freed or released: its tensors are stale.
    #[pyo3(get, set)]
    pub(crate) live: bool,
    /// The full tensor, referenced while the allocation is live (so its storage, and the
    /// storage's key, stay unique); dropped when it is freed or released.
    #[pyo3(get, set)]
    tensor: Option<Py<PyAny>>,
    /// The shared root's consumer that owns it (None outside a shared root): data-plane calls
    /// on it need that consumer's lease (`owner.check_lease(role)`).
    #[pyo3(get, set)]
    pub(crate) owner: Option<Py<PyAny>>,
}

impl Allocation {
    /// A live record of `[index, generation, heap offset, bytes, alignment]` viewed through
    /// `buffer`, with no tensor yet.
    fn fresh(
        [index, generation, heap_offset, nbytes, alignment]: [u64; 5],
        buffer: &HeapBuffer,
    ) -> Self {
        Allocation {
            index,
            generation,
            heap_offset,
            nbytes,
            alignment,
            address: buffer.address,
            live: true,
            tensor: None,
            owner: None,
        }
    }
}

#[pymethods]
impl Allocation {
    /// The record of `exported`: `(index, generation, heap offset, bytes, alignment,
    /// HeapBuffer)`, live, with no tensor yet.
    #[new]
    fn new(exported: (u64, u64, u64, u64, u64, PyRef<'_, HeapBuffer>)) -> Self {
        let (index, generation, heap_offset, nbytes, alignment, buffer) = exported;
        Allocation::fresh([index, generation, heap_offset, nbytes, alignment], &buffer)
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.tensor)?;
        visit.call(&self.owner)?;
        Ok(())
    }

    fn __clear__(&mut self) {
        self.tensor = None;
        self.owner = None;
    }

    fn __repr__(&self) -> String {
        let live = if self.live { "True" } else { "False" };
        format!(
            "Allocation(index={}, generation={}, nbytes={}, live={live})",
            self.index, self.generation, self.nbytes
        )
    }
}

/// The registry's Python state and the tensor library's functions it calls, bound once at
/// import.
#[pyclass(frozen, module = "hyper_multicore._native")]
pub(crate) struct Registry {
    /// Live allocations by `(index, generation)` (`_registry._live`).
    #[pyo3(get)]
    live: Py<AllocationMap>,
    /// Every allocation whose memory may still be viewed, live or stale, by what identifies
    /// that memory ([`Registry::key_of`]; `_registry._by_storage`). An entry goes when the
    /// memory's last storage or array dies.
    #[pyo3(get)]
    by_storage: Py<AllocationMap>,
    /// `_registry._lock`, held by every call that changes the registry.
    lock: Py<RegistryLock>,
    /// `_backend._CHECKED_DTYPES`: the heap dtype name of each dtype argument seen before.
    checked_dtypes: Py<PyDict>,
    /// `_backend.to_dtype`: the backend's dtype of a heap dtype name.
    to_dtype: Py<PyAny>,
    /// `_backend.default_dtype_name`.
    default_dtype_name: Py<PyAny>,
    /// `numpy.dtype`, if NumPy is installed.
    numpy_dtype: Option<Py<PyType>>,
    backend: Backend,
    /// The wrapper's [`empty`] and [`free`] past the plain case ([`Registry::install`]).
    full_paths: Mutex<Option<FullPaths>>,
}

/// The wrapper's functions [`empty`] and [`free`] call past their plain case, which check every
/// argument and raise the precise error: `empty(size, dtype, alignment)` and `free(tensor)`.
struct FullPaths {
    empty: Py<PyAny>,
    free: Py<PyAny>,
}

/// The tensor library: torch, or NumPy where torch is not installed.
enum Backend {
    Torch {
        /// `torch._C._from_dlpack` (or `torch.from_dlpack`).
        from_dlpack: Py<PyAny>,
        /// `torch.Tensor`.
        tensor_type: Py<PyType>,
        /// `torch.dtype`.
        dtype_type: Py<PyType>,
        /// `torch.get_default_dtype`.
        get_default_dtype: Py<PyAny>,
    },
    NumPy {
        /// `numpy.asarray`.
        asarray: Py<PyAny>,
        /// `numpy.ndarray`.
        ndarray: Py<PyType>,
    },
}

#[pymethods]
impl Registry {
    /// An empty registry held by `lock`, with the tensor library and dtype names of the module
    /// `backend` (`shmem._backend`): torch tensors, or NumPy arrays when its `torch` is None.
    #[new]
    fn new(lock: Py<RegistryLock>, backend: &Bound<'_, PyAny>) -> PyResult<Self> {
        let py = backend.py();
        let torch = Some(backend.getattr("torch")?).filter(|torch| !torch.is_none());
        let numpy = Some(backend.getattr("np")?).filter(|numpy| !numpy.is_none());
        let numpy_dtype = match &numpy {
            Some(numpy) => Some(numpy.getattr("dtype")?.cast_into::<PyType>()?.unbind()),
            None => None,
        };
        let checked_dtypes = backend.getattr("_CHECKED_DTYPES")?.cast_into::<PyDict>()?;
        let to_dtype = backend.getattr("to_dtype")?.unbind();
        let default_dtype_name = backend.getattr("default_dtype_name")?.unbind();
        let backend = match (torch, numpy) {
            (Some(torch), _) => Backend::Torch {
                // (what the public `torch.from_dlpack` calls for a capsule, without its
                // Python-level checks; the public one if a torch lacks it)
                from_dlpack: match torch.getattr("_C").and_then(|c| c.getattr("_from_dlpack")) {
                    Ok(private) => private,
                    Err(_) => torch.getattr("from_dlpack")?,
                }
                .unbind(),
                tensor_type: torch.getattr("Tensor")?.cast_into::<PyType>()?.unbind(),
                dtype_type: torch.getattr("dtype")?.cast_into::<PyType>()?.unbind(),
                get_default_dtype: torch.getattr("get_default_dtype")?.unbind(),
            },
            (None, Some(numpy)) => Backend::NumPy {
                asarray: numpy.getattr("asarray")?.unbind(),
                ndarray: numpy.getattr("ndarray")?.cast_into::<PyType>()?.unbind(),
            },
            (None, None) => {
                return Err(PyValueError::new_err(
                    "symmetric tensors need torch or NumPy; install either",
                ))
            }
        };
        Ok(Registry {
            live: Py::new(py, AllocationMap::default())?,
            by_storage: Py::new(py, AllocationMap::default())?,
            lock,
            checked_dtypes: checked_dtypes.unbind(),
            to_dtype,
            default_dtype_name,
            numpy_dtype,
            backend,
            full_paths: Mutex::new(None),
        })
    }

    /// Makes this registry the one [`empty`] and [`free`] work on (one per process), with
    /// the wrapper's full paths `empty(size, dtype, alignment)` and `free(tensor)` for what is
    /// not their plain case. Installing it again replaces the full paths.
    fn install(slf: &Bound<'_, Self>, empty: Py<PyAny>, free: Py<PyAny>) -> PyResult<()> {
        let py = slf.py();
        if !INSTALLED.get_or_init(py, || slf.clone().unbind()).is(slf) {
            return Err(PyRuntimeError::new_err(
                "another registry is installed: hyper_multicore.shmem._allocation installs one",
            ));
        }
        let old = slf
            .get()
            .full_paths
            .lock()
            .replace(FullPaths { empty, free });
        // (dropped past the lock: a finalizer may call back in)
        drop(old);
        Ok(())
    }

    /// Collective: allocates `shape` of heap dtype `name` with `alignment`, and returns its
    /// registered tensor or array (see [`Registry::register`]).
    fn allocate<'py>(
        &self,
        shape: &Bound<'py, PyTuple>,
        name: &str,
        alignment: Option<u64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let dtype = self.to_dtype.bind(shape.py()).call1((name,))?;
        let spec = crate::allocation::allocation_spec(shape.extract()?, name, alignment)?;
        let _held = self.lock.get().hold(shape.py())?;
        self.allocate_shape(spec, shape, &dtype)
    }

    /// Records the allocation `exported` (`(index, generation, heap offset, bytes, alignment,
    /// HeapBuffer)`) as live and returns a tensor (or array) of `shape` and heap dtype `name`
    /// over all of it (a shape whose bytes do not fit the allocation is refused): the
    /// [`Allocation`] holds the tensor, `_live` and `_by_storage` the [`Allocation`].
    fn register<'py>(
        &self,
        exported: &Bound<'py, PyTuple>,
        shape: &Bound<'py, PyTuple>,
        name: &str,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = exported.py();
        let dtype = &self.to_dtype.bind(py).call1((name,))?;
        let _held = self.lock.get().hold(py)?;
        let buffer = exported
            .get_item(5)?
            .cast_into::<HeapBuffer>()?
            .get()
            .clone();
        let allocation = Allocation::new(exported.extract()?);
        let layout = Layout {
            dims: &shape.extract::<Vec<usize>>()?,
            shape,
            heap: crate::allocation::parse_dtype(name)?,
            dtype,
        };
        self.record(Bound::new(py, allocation)?, buffer, layout)
    }

    /// Marks `allocation` freed or released: its tensors become stale, and `_live` forgets it.
    fn retire(&self, allocation: &Bound<'_, Allocation>) -> PyResult<()> {
        let py = allocation.py();
        let _held = self.lock.get().hold(py)?;
        let (tensor, id) = {
            let mut record = allocation.borrow_mut();
            record.live = false;
            (record.tensor.take(), (record.index, record.generation))
        };
        // Dropped outside the borrow: the tensor's death may run Python code (weak references'
        // callbacks).
        drop(tensor);
        self.live.get().remove(Key::Id(id.0, id.1));
        Ok(())
    }

    /// The allocation `x` views (live or stale), or None (`_registry._lookup`).
    fn lookup<'py>(&self, x: &Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, Allocation>>> {
        Ok(match self.key_of(x)? {
            Some(key) => self.by_storage.get().find(x.py(), key),
            None => None,
        })
    }

    /// The live allocation whose tensor `empty` or `restart` returned is `x` itself, wherever
    /// `x`'s storage points now (`share_memory_()` copies it out of the heap), or None
    /// (`_registry._allocation_made_as`).
    fn made_as<'py>(&self, x: &Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, Allocation>>> {
        let py = x.py();
        let _held = self.lock.get().hold(py)?;
        Ok(self
            .live
            .get()
            .values(py)
            .into_iter()
            .find_map(|allocation| {
                let allocation = allocation.into_bound(py);
                let made = allocation.borrow().tensor.as_ref().is_some_and(|t| t.is(x));
                made.then_some(allocation)
            }))
    }
}

impl Registry {
    /// [`empty`] in the plain case (`size` plain ints from 0 to 2^63 − 1; `dtype`
    /// None, for the default, or a dtype named before, see [`Registry::named_dtype`]; the
    /// default alignment), under the registry's lock; None, without doing anything, otherwise.
    fn plain_empty<'py>(
        &self,
        size: &Bound<'py, PyTuple>,
        dtype: &Bound<'py, PyAny>,
        alignment: &Bound<'py, PyAny>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let py = size.py();
        let not_plain = || Ok(None);
        if !alignment.is_none() || size.is_empty() {
            return not_plain();
        }
        let mut shape = Vec::with_capacity(size.len());
        for dimension in size.iter() {
            // (a bool is an int to Python, not here; a torch dimension is an `int64_t`)
            match dimension.is_exact_instance_of::<PyInt>() {
                true => match dimension.extract::<i64>().map(usize::try_from) {
                    Ok(Ok(dimension)) => shape.push(dimension),
                    _ => return not_plain(),
                },
                false => return not_plain(),
            }
        }
        let Some((heap, dtype)) = self.named_dtype(dtype)? else {
            return not_plain();
        };
        if !describable(&shape, heap) {
            return not_plain();
        }
        let spec = AllocationSpec {
            shape,
            dtype: heap,
            alignment: None,
        };
        let _held = self.lock.get().hold(py)?;
        self.allocate_shape(spec, size, &dtype).map(Some)
    }

    /// [`free`] in the plain case — a torch tensor whose storage is a live
    /// allocation's that no shared-root consumer owns, spanning all of its (non-zero) bytes, or
    /// the NumPy array `empty` made for such an allocation: frees and retires it and answers
    /// true; false, without doing anything, otherwise.
    fn plain_free(&self, tensor: &Bound<'_, PyAny>) -> PyResult<bool> {
        let py = tensor.py();
        let not_plain = false;
        let is_tensor = match &self.backend {
            Backend::Torch { tensor_type, .. } => tensor.is_instance(tensor_type.bind(py))?,
            // (the arrays `empty` makes are plain `ndarray`s, so their `base` is no subclass's)
            Backend::NumPy { ndarray, .. } => tensor.is_exact_instance(ndarray.bind(py)),
        };
        if !is_tensor {
            return Ok(not_plain);
        }
        let _held = self.lock.get().hold(py)?;
        let Some(key) = self.key_of(tensor)? else {
            return Ok(not_plain);
        };
        let Some(allocation) = self.by_storage.get().find(py, key) else {
            return Ok(not_plain);
        };
        // Copied out first: the tensor's `nbytes` and `data_ptr` may run Python code (a
        // subclass's `__torch_function__`), which must not find the record borrowed.
        let (live, owned, nbytes, address, index, generation, made) = {
            let record = allocation.borrow();
            let owned = record.owner.is_some();
            let made = record.tensor.as_ref().is_some_and(|made| made.is(tensor));
            (
                record.live,
                owned,
                record.nbytes,
                record.address,
                record.index,
                record.generation,
                made,
            )
        };
        let whole = || -> PyResult<bool> {
            if tensor.getattr(intern!(py, "nbytes"))?.extract::<u64>()? != nbytes {
                return Ok(false);
            }
            match &self.backend {
                Backend::Torch { .. } => Ok(tensor
                    .call_method0(intern!(py, "data_ptr"))?
                    .extract::<usize>()?
                    == address),
                // An array cannot move to other memory in place: the one `empty` made is
                // still over all of it.
                Backend::NumPy { .. } => Ok(made),
            }
        };
        let plain = live && !owned && nbytes > 0 && whole()?;
        if !plain {
            return Ok(not_plain);
        }
        crate::allocation::free(py, index, generation)?;
        self.retire(&allocation)?;
        Ok(true)
    }

    /// The wrapper's full path `which` picks ([`Registry::install`]).
    fn full_path<'py>(
        &self,
        py: Python<'py>,
        which: fn(&FullPaths) -> &Py<PyAny>,
    ) -> Bound<'py, PyAny> {
        let paths = self.full_paths.lock();
        // (the registry [`installed`] finds got its full paths in the same call)
        which(paths.as_ref().expect("installed with its full paths"))
            .bind(py)
            .clone()
    }

    /// The heap dtype and the backend's dtype of `dtype`, if it is None (the default) or
    /// was named before — a key of `_backend._CHECKED_DTYPES`, which only takes dtypes, names
    /// and types (`_backend._cacheable`: a number may equal a key naming another dtype).
    fn named_dtype<'py>(
        &self,
        dtype: &Bound<'py, PyAny>,
    ) -> PyResult<Option<(Dtype, Bound<'py, PyAny>)>> {
        let py = dtype.py();
        if dtype.is_none() {
            return match &self.backend {
                Backend::Torch {
                    get_default_dtype, ..
                } => self.named_dtype(&get_default_dtype.bind(py).call0()?),
                Backend::NumPy { .. } => {
                    let name = self.default_dtype_name.bind(py).call0()?;
                    let dtype = self.to_dtype.bind(py).call1((&name,))?;
                    Ok(Some((
                        crate::allocation::parse_dtype(name.extract()?)?,
                        dtype,
                    )))
                }
            };
        }
        let torch_dtype = match &self.backend {
            Backend::Torch { dtype_type, .. } => dtype.is_exact_instance(dtype_type.bind(py)),
            Backend::NumPy { .. } => false,
        };
        let cacheable = torch_dtype
            || dtype.is_exact_instance_of::<PyString>()
            || dtype.is_exact_instance_of::<PyType>()
            || match &self.numpy_dtype {
                Some(numpy_dtype) => dtype.is_instance(numpy_dtype.bind(py))?,
                None => false,
            };
        if !cacheable {
            return Ok(None);
        }
        let Some(name) = self.checked_dtypes.bind(py).get_item(dtype)? else {
            return Ok(None);
        };
        let heap = crate::allocation::parse_dtype(name.extract()?)?;
        let dtype = match torch_dtype {
            true => dtype.clone(),
            false => self.to_dtype.bind(py).call1((name,))?,
        };
        Ok(Some((heap, dtype)))
    }

    /// What identifies the memory `tensor` views in `_by_storage`: its storage's `_cdata`
    /// (torch), or the address of the [`HeapBuffer`] at the root of its `base` chain (NumPy;
    /// None if the root is something else).
    fn key_of(&self, tensor: &Bound<'_, PyAny>) -> PyResult<Option<Key>> {
        let py = tensor.py();
        let ndarray = match &self.backend {
            Backend::Torch { tensor_type, .. } => {
                return match tensor.is_instance(tensor_type.bind(py))? {
                    true => storage_key(tensor).map(Some),
                    false => Ok(None),
                }
            }
            Backend::NumPy { ndarray, .. } => ndarray,
        };
        let mut root = tensor.clone();
        while root.is_instance(ndarray.bind(py))? {
            let base = root.getattr(intern!(py, "base"))?;
            if base.is_none() {
                return Ok(None);
            }
            root = base;
        }
        Ok(root
            .is_instance_of::<HeapBuffer>()
            .then(|| Key::Storage(root.as_ptr() as usize)))
    }

    /// [`Registry::allocate`] of `shape` (as `dims` and as the tuple `shape`); the caller
    /// holds the lock.
    fn allocate_shape<'py>(
        &self,
        spec: AllocationSpec,
        shape: &Bound<'py, PyTuple>,
        dtype: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = shape.py();
        let exported = crate::allocation::allocate_exported(py, &spec)?;
        let layout = Layout {
            dims: &spec.shape,
            shape,
            heap: spec.dtype,
            dtype,
        };
        let (index, generation, heap_offset, nbytes, alignment, buffer) = exported.into_tuple();
        let allocation =
            Allocation::fresh([index, generation, heap_offset, nbytes, alignment], &buffer);
        let recorded = Bound::new(py, allocation)
            .and_then(|allocation| self.record(allocation, buffer, layout));
        if recorded.is_err() {
            // No tensor, no record: the allocation goes again (every rank failed alike, its
            // shape and dtype being the same), else nothing could ever free it.
            let _ = crate::allocation::free(py, index, generation);
        }
        recorded
    }

    /// Gives `allocation` (live, new) its tensor (or array) of `layout` over all of `buffer`,
    /// records it in `_live` and `_by_storage`, and returns the tensor.
    fn record<'py>(
        &self,
        allocation: Bound<'py, Allocation>,
        buffer: HeapBuffer,
        layout: Layout<'_, 'py>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = allocation.py();
        let Layout {
            dims,
            shape,
            heap,
            dtype,
        } = layout;
        let nbytes = buffer.nbytes;
        // A tensor or array of the allocation's bytes (one byte for an empty allocation, which
        // still owns a granule of the heap) in the dtype and shape (none of that byte).
        let viewed = |bytes: Bound<'py, PyAny>, reshape| {
            let bytes = match nbytes {
                0 => bytes.get_item(PySlice::new(py, 0, 0, 1))?,
                _ => bytes,
            };
            bytes
                .call_method1(intern!(py, "view"), (dtype,))?
                .call_method1(reshape, (shape,))
        };
        let (tensor, key) = match &self.backend {
            Backend::Torch { from_dlpack, .. } => {
                // torch makes the tensor of the shape and dtype at once; the capsule's owner
                // keeps the mapping until the storage dies and then drops the storage's entry.
                let (address, by_storage) = (buffer.address, self.by_storage.clone_ref(py));
                let watch = Arc::new(StorageWatch {
                    _mapping: buffer,
                    key: OnceLock::new(),
                    by_storage: Some(by_storage),
                });
                let made = |dims: &[usize], heap| {
                    let owner = Arc::clone(&watch);
                    let span = nbytes.max(1);
                    let capsule =
                        crate::memory::heap_capsule(py, [address, span], dims, heap, owner)?;
                    from_dlpack.bind(py).call1((capsule,))
                };
                // An empty allocation, or one of a dtype this torch's DLPack does not take
                // (uint16-64 in older versions: a `RuntimeError`), is made as bytes and viewed.
                let wide_unsigned = matches!(heap, Dtype::U16 | Dtype::U32 | Dtype::U64);
                let typed = match nbytes {
                    0 => None,
                    _ => match made(dims, heap) {
                        Err(error)
                            if wide_unsigned && error.is_instance_of::<PyRuntimeError>(py) =>
                        {
                            None
                        }
                        made => Some(made?),
                    },
                };
                let tensor = match typed {
                    Some(tensor) => tensor,
                    None => viewed(made(&[nbytes.max(1)], Dtype::U8)?, intern!(py, "reshape"))?,
                };
                let key = storage_key(&tensor)?;
                let _ = watch.key.set(key);
                (tensor, key)
            }
            Backend::NumPy { asarray, .. } => {
                // The array's `base` is the `HeapBuffer` itself (its `__array_interface__`),
                // which holds the mapping; a weak reference to it drops the entry.
                let buffer = Bound::new(py, buffer)?;
                let bytes = asarray.bind(py).call1((&buffer,))?;
                let key = Key::Storage(buffer.as_ptr() as usize);
                let reshape = intern!(py, "reshape");
                let tensor = if nbytes == 0 {
                    viewed(bytes, reshape)?
                } else {
                    let flat = bytes.call_method1(intern!(py, "view"), (dtype,))?;
                    match shape.len() {
                        1 => flat,
                        _ => flat.call_method1(reshape, (shape,))?,
                    }
                };
                let forget = Bound::new(
                    py,
                    ForgetStorage {
                        key,
                        by_storage: self.by_storage.clone_ref(py),
                        own_ref: Mutex::new(None),
                    },
                )?;
                let weak = PyWeakrefReference::new_with(&buffer, &forget)?;
                *forget.get().own_ref.lock() = Some(weak.into_any().unbind());
                (tensor, key)
            }
        };
        let id = {
            let mut record = allocation.borrow_mut();
            record.tensor = Some(tensor.clone().unbind());
            (record.index, record.generation)
        };
        let allocation = allocation.unbind();
        self.live
            .get()
            .insert(Key::Id(id.0, id.1), allocation.clone_ref(py));
        self.by_storage.get().insert(key, allocation);
        Ok(tensor)
    }
}

/// The registry [`empty`] and [`free`] work on ([`Registry::install`]).
static INSTALLED: PyOnceLock<Py<Registry>> = PyOnceLock::new();

/// The installed registry.
fn installed(py: Python<'_>) -> PyResult<&Py<Registry>> {
    INSTALLED.get(py).ok_or_else(|| {
        PyRuntimeError::new_err(
            "no registry is installed: import hyper_multicore.shmem, which installs one",
        )
    })
}

/// Collective: a new symmetric tensor of ``size``, uninitialised, viewing the heap
/// (``shmem.empty``).
///
/// Follows ``torch.empty``'s size conventions: ``empty(2, 3)``, ``empty((2, 3))`` or
/// ``empty([2, 3])``. ``dtype`` defaults to ``torch.get_default_dtype()`` (float32 with NumPy).
/// ``alignment`` (bytes) defaults to 64; otherwise a power of two up to the heap's size rounded
/// up to one (at least 2 MiB). Every PE must
/// make the same call; arguments that differ across ranks raise ``InvalidArgumentError`` on
/// every rank, and nothing is allocated. A rank whose own arguments are invalid raises its own
/// error and still takes part in that check, so the other ranks fail at once.
//
// (Native, as ``shmem.empty`` itself: a Python wrapper's frame cost 0.12 µs of a 1.4 µs call.
// The plain case is done here, anything else by the wrapper's full path, see
// [`Registry::install`].)
#[pyfunction]
#[pyo3(signature = (*size, dtype=None, alignment=None))]
pub(crate) fn empty<'py>(
    size: &Bound<'py, PyTuple>,
    dtype: Option<&Bound<'py, PyAny>>,
    alignment: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let py = size.py();
    let registry = installed(py)?.get();
    let none = py.None().into_bound(py);
    let (dtype, alignment) = (dtype.unwrap_or(&none), alignment.unwrap_or(&none));
    match registry.plain_empty(size, dtype, alignment)? {
        Some(tensor) => Ok(tensor),
        None => registry
            .full_path(py, |paths| &paths.empty)
            .call1((size, dtype, alignment)),
    }
}

/// Collective: frees the allocation of ``tensor`` (the whole tensor ``empty`` or ``restart``
/// returned, not a view); the tensor and its views become stale (``shmem.free``).
///
/// A rank whose argument is invalid (a view, a freed or a foreign tensor) still takes part in
/// the collective check, so the other ranks fail at once with ``InvalidArgumentError``
/// ("arguments differ across ranks") while it raises its own error.
//
// (Native as [`empty`] is.)
#[pyfunction]
pub(crate) fn free(tensor: &Bound<'_, PyAny>) -> PyResult<()> {
    let registry = installed(tensor.py())?.get();
    if !registry.plain_free(tensor)? {
        registry
            .full_path(tensor.py(), |paths| &paths.free)
            .call1((tensor,))?;
    }
    Ok(())
}

/// The shape and dtype of a new allocation's tensor: `dims` (as the tuple `shape` too) of heap
/// dtype `heap`, the backend's `dtype`.
struct Layout<'a, 'py> {
    dims: &'a [usize],
    shape: &'a Bound<'py, PyTuple>,
    heap: Dtype,
    dtype: &'a Bound<'py, PyAny>,
}

/// What a torch storage over an allocation owns besides its bytes (through the DLPack
/// capsule's deleter, see [`Registry::record`]): the heap mapping, kept until the storage dies,
/// and the storage's entry in `_by_storage` (its `key`), dropped then.
struct StorageWatch {
    _mapping: HeapBuffer,
    key: OnceLock<Key>,
    /// (Taken when dropped, attached to the interpreter: a reference dropped unattached waits
    /// in PyO3's pool, behind a lock, for the next call into the extension.)
    by_storage: Option<Py<AllocationMap>>,
}

impl Drop for StorageWatch {
    fn drop(&mut self) {
        let (key, by_storage) = (self.key.take(), self.by_storage.take());
        // torch drops a storage on the thread that let go of it last, with the GIL or without
        // (an autograd thread); at the interpreter's exit the entry stays.
        Python::try_attach(|_| {
            if let (Some(key), Some(by_storage)) = (key, by_storage) {
                by_storage.get().remove(key);
            }
        });
    }
}

/// Whether a tensor of `shape` and heap dtype `dtype` can be described: its contiguous strides
/// in bytes (the product of its dimensions, a 0 counted as 1, times the element size) fit an
/// int64 (`_backend.check_extent`, which raises where this answers false).
fn describable(shape: &[usize], dtype: Dtype) -> bool {
    let size = dtype.size();
    shape
        .iter()
        .try_fold(size, |extent, dimension| {
            extent.checked_mul((*dimension).max(1))
        })
        .is_some_and(|extent| i64::try_from(extent).is_ok())
}

/// What identifies the memory a torch tensor views: `tensor.untyped_storage()._cdata`.
fn storage_key(tensor: &Bound<'_, PyAny>) -> PyResult<Key> {
    let py = tensor.py();
    let cdata = tensor
        .call_method0(intern!(py, "untyped_storage"))?
        .getattr(intern!(py, "_cdata"))?;
    Ok(Key::Storage(cdata.extract()?))
}

/// The callback of the weak reference that watches an allocation's NumPy arrays (the
/// [`HeapBuffer`] at the root of their `base` chains, see [`Registry::record`]): drops their
/// entry from `_by_storage`.
#[pyclass(frozen, module = "hyper_multicore._native")]
struct ForgetStorage {
    key: Key,
    by_storage: Py<AllocationMap>,
    /// The weak reference this is the callback of, until it runs: nothing else holds it. (Let
    /// go when it runs: the collector, calling it for a watched object in cyclic garbage,
    /// leaves it attached to the weak reference.)
    own_ref: Mutex<Option<Py<PyAny>>>,
}

#[pymethods]
impl ForgetStorage {
    fn __call__(&self, _dead: &Bound<'_, PyAny>) {
        self.by_storage.get().remove(self.key);
        let own_ref = self.own_ref.lock().take();
        drop(own_ref);
    }
}

/// The allocation `x` (a tensor or array, or anything else) views, live or stale, in the
/// installed registry; None if it views none.
pub(crate) fn lookup<'py>(x: &Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, Allocation>>> {
    installed(x.py())?.get().lookup(x)
}
