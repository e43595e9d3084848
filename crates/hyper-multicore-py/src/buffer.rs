//! The local side of an operation (put's source, get's destination, a collective's input): a
//! process-private tensor, or a symmetric tensor of this PE.

use hyper_multicore::shmem::{count_bounced, Shmem};
use hyper_multicore::Result;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::heap::RegionArg;
use crate::memory::LocalBuffer;

/// How the wrapper passes a local buffer: `(index, generation, byte offset, bytes)` for a
/// symmetric tensor, `(address, nbytes)` for any other contiguous CPU tensor or array.
#[derive(Clone, Copy, Debug)]
pub(crate) enum BufferArg {
    /// A symmetric tensor (this PE's copy).
    Symmetric(RegionArg),
    /// Process-private memory.
    Local(usize, usize),
}

impl<'a, 'py> FromPyObject<'a, 'py> for BufferArg {
    type Error = PyErr;

    /// Told apart by the tuple's length, so no failed attempt builds an exception (a derived
    /// enum extraction tries the variants in turn: about a microsecond per call).
    fn extract(object: Borrowed<'a, 'py, PyAny>) -> PyResult<BufferArg> {
        let tuple = object.cast::<PyTuple>()?;
        match tuple.len() {
            2 => Ok(BufferArg::Local(
                tuple.get_borrowed_item(0)?.extract()?,
                tuple.get_borrowed_item(1)?.extract()?,
            )),
            _ => Ok(BufferArg::Symmetric(object.extract()?)),
        }
    }
}

impl<'py> IntoPyObject<'py> for BufferArg {
    type Target = PyTuple;
    type Output = Bound<'py, PyTuple>;
    type Error = PyErr;

    fn into_pyobject(self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        match self {
            BufferArg::Symmetric(region) => region.into_pyobject(py),
            BufferArg::Local(address, len) => (address, len).into_pyobject(py),
        }
    }
}

/// A checked [`BufferArg`].
#[derive(Clone, Copy, Debug)]
pub(crate) enum Buffer {
    Symmetric(RegionArg),
    Local(LocalBuffer),
}

impl Buffer {
    /// Checks the wrapper's argument.
    pub(crate) fn new(arg: BufferArg) -> PyResult<Buffer> {
        Ok(match arg {
            BufferArg::Symmetric(region) => Buffer::Symmetric(region),
            BufferArg::Local(address, len) => Buffer::Local(LocalBuffer::new(address, len)?),
        })
    }

    /// Its length in bytes.
    pub(crate) fn len(&self) -> usize {
        match self {
            Buffer::Symmetric(region) => region.bytes(),
            Buffer::Local(local) => local.len(),
        }
    }

    /// Runs `f` on the buffer's bytes. A symmetric buffer is first copied out of the heap by
    /// the runtime, so no slice ever aliases memory other processes write (puts and gets do not
    /// come here: they move a symmetric buffer heap to heap, `Shmem::put_from`).
    pub(crate) fn read<R>(self, shmem: &Shmem, f: impl FnOnce(&[u8]) -> Result<R>) -> Result<R> {
        match self {
            Buffer::Local(local) => local.with_bytes(f),
            Buffer::Symmetric(region) => {
                let region = region.resolve(shmem)?;
                count_bounced(region.bytes as usize);
                let mut bytes = vec![0u8; region.bytes as usize];
                shmem.get_bytes(&mut bytes, region, shmem.rank())?;
                f(&bytes)
            }
        }
    }
}
