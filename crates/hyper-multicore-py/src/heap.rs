//! The heap as Python sees it: [`HeapBuffer`], one per exported allocation, and the typed
//! [`Target`] regions the library's generic operations take.

use std::any::Any;
use std::marker::PhantomData;
use std::sync::Arc;

use hyper_multicore::shmem::{AllocationId, AllocationRecord, Element, Region, Shmem, Symmetric};
use hyper_multicore::Result;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

/// The memory of one symmetric allocation in this process: its address and length, and a
/// handle that keeps the runtime's shared mapping alive as long as this object lives.
///
/// It becomes a zero-copy torch tensor or NumPy array ([`Registry`](crate::registry::Registry)):
/// `torch._C._from_dlpack` over a capsule of its bytes ([`heap_capsule`]), or `numpy.asarray`
/// over this object's `__array_interface__`. The memory stays mapped as long as any tensor or
/// view of it exists — after `free`, `restart` or `release` too (ARCHITECTURE decision 8): a
/// NumPy array's `base` is this object; a torch storage owns a copy of it (its mapping handle)
/// until the storage dies. A stale tensor then reads stale bytes; every operation rejects it.
///
/// [`heap_capsule`]: crate::memory::heap_capsule
#[pyclass(frozen, weakref, module = "hyper_multicore._native")]
#[derive(Clone)]
pub(crate) struct HeapBuffer {
    /// The address of the allocation's first byte in this process.
    pub(crate) address: usize,
    /// The allocation's length in bytes.
    pub(crate) nbytes: usize,
    _mapping: Arc<dyn Any + Send + Sync>,
}

#[pymethods]
impl HeapBuffer {
    /// The address of the allocation's first byte in this process.
    #[getter]
    fn address(&self) -> usize {
        self.address
    }

    /// The allocation's length in bytes.
    #[getter]
    fn nbytes(&self) -> usize {
        self.nbytes
    }

    /// NumPy's array interface: the allocation's bytes (one byte for an empty allocation),
    /// writable. An array NumPy makes over it has this object as its `base`, which keeps the
    /// mapping; so does any array or memoryview derived from the array or from its `base`
    /// (this object has no buffer protocol whose buffer could outlive it).
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let interface = PyDict::new(py);
        interface.set_item("data", (self.address, false))?;
        interface.set_item("shape", (self.nbytes.max(1),))?;
        interface.set_item("typestr", "|u1")?;
        interface.set_item("version", 3)?;
        Ok(interface)
    }

    fn __repr__(&self) -> String {
        format!(
            "HeapBuffer(address={:#x}, nbytes={})",
            self.address, self.nbytes
        )
    }
}

/// An allocation record with this process's view of it, ready to hand to Python as
/// `(index, generation, heap_offset, nbytes, alignment, HeapBuffer)`.
pub(crate) struct Exported {
    record: AllocationRecord,
    buffer: HeapBuffer,
}

/// What Python receives for one allocation.
pub(crate) type ExportedTuple = (u64, u64, u64, u64, u64, HeapBuffer);

impl Exported {
    /// Exports `record`, an allocation of `shmem`.
    pub(crate) fn new(shmem: &Shmem, record: AllocationRecord) -> Result<Exported> {
        let whole = Region {
            id: record.id,
            heap_offset: record.offset,
            bytes: record.bytes,
        };
        let address = shmem.ptr(&Target::<u8>::new(whole), shmem.rank())?;
        Ok(Exported {
            buffer: HeapBuffer {
                address: address.as_ptr() as usize,
                nbytes: record.bytes as usize,
                _mapping: shmem.mapping_keepalive(),
            },
            record,
        })
    }

    /// The tuple Python receives.
    pub(crate) fn into_tuple(self) -> ExportedTuple {
        let r = self.record;
        (
            r.id.index,
            r.id.generation,
            r.offset,
            r.bytes,
            r.alignment,
            self.buffer,
        )
    }
}

/// A symmetric region typed as elements of `T`, for the library's typed operations.
pub(crate) struct Target<T>(Region, PhantomData<fn() -> T>);

impl<T> Target<T> {
    pub(crate) fn new(region: Region) -> Self {
        Target(region, PhantomData)
    }
}

impl<T: Element> Symmetric<T> for Target<T> {
    fn region(&self) -> Region {
        self.0
    }
}

/// A symmetric tensor as the wrapper passes it:
/// `(allocation index, generation, byte offset in the allocation, bytes)`.
#[derive(Clone, Copy, Debug, FromPyObject)]
pub(crate) struct RegionArg(u64, u64, u64, u64);

impl<'py> IntoPyObject<'py> for RegionArg {
    type Target = PyTuple;
    type Output = Bound<'py, PyTuple>;
    type Error = PyErr;

    fn into_pyobject(self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        (self.0, self.1, self.2, self.3).into_pyobject(py)
    }
}

impl RegionArg {
    /// `bytes` bytes at byte `offset` of allocation `(index, generation)`.
    pub(crate) fn new(index: u64, generation: u64, offset: u64, bytes: u64) -> Self {
        RegionArg(index, generation, offset, bytes)
    }

    /// Its length in bytes.
    pub(crate) fn bytes(&self) -> usize {
        self.3 as usize
    }

    /// The region, after checking that the allocation is live and the range inside it.
    pub(crate) fn resolve(self, shmem: &Shmem) -> Result<Region> {
        let id = AllocationId {
            index: self.0,
            generation: self.1,
        };
        shmem.region(id, self.2, self.3)
    }

    /// The region typed as `T` elements.
    pub(crate) fn typed<T: Element>(self, shmem: &Shmem) -> Result<Target<T>> {
        self.resolve(shmem).map(Target::new)
    }
}
