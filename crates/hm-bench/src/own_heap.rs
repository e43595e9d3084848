//! A PE's own copy of a symmetric allocation as a byte slice: the local side of the rows whose
//! source or landing buffer lies in the symmetric heap (`put_heap`, `get_heap`,
//! `put_rate_heap`). The Rust API's `put` takes its source as a slice and `get` its landing
//! buffer, so a program that moves data heap to heap makes one of these.
//!
//! This is the second file of `hm-bench` allowed `unsafe` (after `shared_word.rs`): the slice
//! over the heap mapping. It is sound because an [`OwnHeapBytes`] never hands out its
//! allocation: no safe code of any PE can name it in a put, get or atomic, the runtime touches
//! an allocation only when asked, and so nothing but this PE's slice reads or writes this PE's
//! copy while the slice lives.
//!
//! ```ignore
//! let mut source = OwnHeapBytes::allocate(&shmem, 1 << 20)?;   // collective
//! source.bytes_mut(&shmem)?.fill(7);
//! shmem.put(&target, source.bytes(&shmem)?, 1)?;               // heap to heap
//! source.free(&shmem)?;                                        // collective
//! ```

#![allow(unsafe_code)]

use anyhow::{ensure, Result};
use hyper_multicore::shmem::{Allocation, Shmem, Symmetric};

/// A symmetric byte allocation only ever used through this PE's own copy.
#[derive(Debug)]
pub struct OwnHeapBytes {
    /// The allocation; private to this type, so nothing else can target it.
    allocation: Allocation<u8>,
}

impl OwnHeapBytes {
    /// Allocates `len` bytes on every PE (collective, as `Shmem::allocate`).
    pub fn allocate(shmem: &Shmem, len: usize) -> Result<OwnHeapBytes> {
        Ok(OwnHeapBytes {
            allocation: shmem.allocate::<u8>(len, None)?,
        })
    }

    /// This PE's copy, to read.
    pub fn bytes<'a>(&'a self, shmem: &'a Shmem) -> Result<&'a [u8]> {
        let (pointer, len) = self.own_copy(shmem)?;
        // SAFETY: `Shmem::ptr` returns a pointer to this PE's copy inside its heap mapping,
        // valid for the allocation's `len` bytes until the runtime is shut down (which consumes
        // `shmem`) or the allocation freed (which consumes `self`); both stay borrowed for 'a.
        // Nothing writes that memory meanwhile: the allocation never leaves this type (see the
        // module documentation), and the only mutable access is through `bytes_mut`, which
        // needs `&mut self`.
        Ok(unsafe { std::slice::from_raw_parts(pointer, len) })
    }

    /// This PE's copy, to write (or to land a get in).
    pub fn bytes_mut<'a>(&'a mut self, shmem: &'a Shmem) -> Result<&'a mut [u8]> {
        let (pointer, len) = self.own_copy(shmem)?;
        // SAFETY: as in `bytes`; `&mut self` makes this the only access to the copy from this
        // process, and no other process accesses it (the module documentation).
        Ok(unsafe { std::slice::from_raw_parts_mut(pointer, len) })
    }

    /// Frees the allocation on every PE (collective, as `Shmem::free`).
    pub fn free(self, shmem: &Shmem) -> Result<()> {
        Ok(shmem.free(self.allocation)?)
    }

    /// The start and length of this PE's copy.
    fn own_copy(&self, shmem: &Shmem) -> Result<(*mut u8, usize)> {
        let len = self.allocation.len();
        ensure!(len > 0, "an empty heap block has no bytes to view");
        let pointer = shmem.ptr(&self.allocation, shmem.rank())?;
        Ok((pointer.as_ptr(), len))
    }
}
