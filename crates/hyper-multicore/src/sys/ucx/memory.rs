//! Memory UCX can reach: this PE's heap registered with `ucp_mem_map` (or memory UCX
//! allocates), and a peer's key to its memory, unpacked for one endpoint.

use super::*;

/// What keeps the registered bytes mapped while UCX may touch them.
pub(super) enum RegionMemory {
    /// A range of a shared mapping (the symmetric heap).
    Mapping(#[allow(dead_code)] Arc<SharedMapping>),
    /// Memory UCX allocated itself (`UCP_MEM_MAP_ALLOCATE`), freed by `ucp_mem_unmap`.
    Allocated,
}

/// A range of this process's memory registered with UCX (`ucp_mem_map`), which peers may read,
/// write and update atomically once they hold [`MemoryRegion::rkey_bytes`] and its base address.
pub struct MemoryRegion {
    pub(super) context: Arc<ContextHandle>,
    pub(super) memh: ffi::ucp_mem_h,
    pub(super) base: NonNull<u8>,
    pub(super) len: usize,
    pub(super) rkey: Vec<u8>,
    pub(super) memory: RegionMemory,
}

// SAFETY: the memory handle is only used through the context (thread-safe, see ContextHandle)
// and the bytes are kept mapped by `memory`; this value hands out no references into them.
unsafe impl Send for MemoryRegion {}
// SAFETY: as above.
unsafe impl Sync for MemoryRegion {}

impl std::fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("base", &self.base)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

impl MemoryRegion {
    /// Registers bytes `offset..offset + len` of `mapping` (the heap) for remote access; the
    /// region keeps the mapping alive.
    pub(crate) fn register(
        context: &Context,
        mapping: Arc<SharedMapping>,
        offset: usize,
        len: usize,
    ) -> Result<MemoryRegion> {
        // `address` asserts offset is inside; the end is checked here.
        let start = mapping.address(offset);
        let _ = mapping.address(offset.checked_add(len).ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidArgument,
                "ucx register",
                "range overflows",
            )
        })?);
        let base = NonNull::new(start).expect("a mapping is never at address 0");
        Self::map(context, base, len, 0, RegionMemory::Mapping(mapping))
    }

    /// Lets UCX allocate and register `len` bytes (zero-filled by the kernel on first touch);
    /// freed when the region drops. Useful for bounce buffers and tests.
    pub fn allocate(context: &Context, len: usize) -> Result<MemoryRegion> {
        Self::map(
            context,
            NonNull::dangling(),
            len,
            ffi::UCP_MEM_MAP_ALLOCATE,
            RegionMemory::Allocated,
        )
    }

    pub(super) fn map(
        context: &Context,
        base: NonNull<u8>,
        len: usize,
        flags: u32,
        memory: RegionMemory,
    ) -> Result<MemoryRegion> {
        const OP: &str = "ucx register";
        if len == 0 {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                OP,
                "cannot register an empty range",
            ));
        }
        let allocate = flags & ffi::UCP_MEM_MAP_ALLOCATE != 0;
        let params = ffi::ucp_mem_map_params_t {
            field_mask: u64::from(
                ffi::UCP_MEM_MAP_PARAM_FIELD_ADDRESS
                    | ffi::UCP_MEM_MAP_PARAM_FIELD_LENGTH
                    | ffi::UCP_MEM_MAP_PARAM_FIELD_FLAGS,
            ),
            address: if allocate {
                ptr::null_mut()
            } else {
                base.as_ptr().cast()
            },
            length: len,
            flags,
            ..Default::default()
        };
        let mut memh: ffi::ucp_mem_h = ptr::null_mut();
        // SAFETY: the context is alive (we hold it); for a registration, `memory` keeps the
        // `len` bytes at `base` mapped for as long as the handle exists (it is stored next to it
        // and dropped after ucp_mem_unmap); for ALLOCATE, UCX owns the memory.
        let status = unsafe { ucp().ucp_mem_map(context.handle.0, &params, &mut memh) };
        check(OP, "ucp_mem_map failed", status)?;
        let mut region = MemoryRegion {
            context: context.handle.clone(),
            memh,
            base,
            len,
            rkey: Vec::new(),
            memory,
        };
        if allocate {
            let mut attr = ffi::ucp_mem_attr_t {
                field_mask: u64::from(
                    ffi::UCP_MEM_ATTR_FIELD_ADDRESS | ffi::UCP_MEM_ATTR_FIELD_LENGTH,
                ),
                ..Default::default()
            };
            // SAFETY: memh is the live handle just created; attr is writable.
            let status = unsafe { ucp().ucp_mem_query(memh, &mut attr) };
            check(OP, "ucp_mem_query failed", status)?;
            region.base = NonNull::new(attr.address.cast()).ok_or_else(|| {
                Error::new(ErrorKind::Backend, OP, "UCX allocated memory at address 0")
            })?;
            region.len = attr.length.min(len);
        }
        let mut buffer: *mut c_void = ptr::null_mut();
        let mut size = 0usize;
        // SAFETY: live context and memory handle; out-pointers writable.
        let status =
            unsafe { ucp().ucp_rkey_pack(region.context.0, region.memh, &mut buffer, &mut size) };
        check(OP, "ucp_rkey_pack failed", status)?;
        // SAFETY: on success UCX returns `size` readable bytes at `buffer`, which we copy and then
        // release exactly once with ucp_rkey_buffer_release.
        region.rkey = unsafe {
            let bytes = std::slice::from_raw_parts(buffer.cast::<u8>(), size).to_vec();
            ucp().ucp_rkey_buffer_release(buffer);
            bytes
        };
        Ok(region)
    }

    /// The address of the first registered byte, as peers must name it in put/get/atomics.
    pub fn base(&self) -> u64 {
        self.base.as_ptr() as u64
    }

    /// The registered length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: empty regions are refused.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The packed remote key: send these bytes (with [`MemoryRegion::base`]) to every peer,
    /// which turns them into a [`RemoteKey`] with [`Endpoint::unpack_rkey`].
    pub fn rkey_bytes(&self) -> &[u8] {
        &self.rkey
    }

    /// Copies `source` into the region at `offset` (for memory UCX allocated; the heap has its
    /// own accessors).
    pub fn write(&self, offset: usize, source: &[u8]) {
        let end = offset.checked_add(source.len()).expect("range overflows");
        assert!(
            end <= self.len,
            "write {offset}..{end} outside {}",
            self.len
        );
        // SAFETY: in bounds (checked) of memory that stays mapped while self lives; peers may
        // write the same bytes concurrently, which (as for the heap, see sys::mapping) can only
        // make bytes stale or torn: no reference into the region is ever created.
        unsafe {
            ptr::copy_nonoverlapping(
                source.as_ptr(),
                self.base.as_ptr().add(offset),
                source.len(),
            )
        };
    }

    /// Copies bytes at `offset` out of the region into `destination`.
    pub fn read(&self, offset: usize, destination: &mut [u8]) {
        let end = offset
            .checked_add(destination.len())
            .expect("range overflows");
        assert!(end <= self.len, "read {offset}..{end} outside {}", self.len);
        // SAFETY: as in `write`.
        unsafe {
            ptr::copy_nonoverlapping(
                self.base.as_ptr().add(offset),
                destination.as_mut_ptr(),
                destination.len(),
            )
        };
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // SAFETY: memh came from ucp_mem_map on this (still alive) context and is unmapped once;
        // the bytes stay mapped until `memory` drops after this.
        let status = unsafe { ucp().ucp_mem_unmap(self.context.0, self.memh) };
        if status != ffi::UCS_OK {
            tracing::warn!("ucp_mem_unmap failed: {}", status_name(status));
        }
        if matches!(self.memory, RegionMemory::Allocated) {
            tracing::trace!("freed UCX-allocated region of {} bytes", self.len);
        }
    }
}

/// A peer's memory key unpacked for one [`Endpoint`] (`ucp_ep_rkey_unpack`); pass it with a
/// remote address to that endpoint's put/get/atomics.
pub struct RemoteKey {
    pub(super) handle: ffi::ucp_rkey_h,
    pub(super) endpoint: Arc<EndpointHandle>,
}

// SAFETY: an rkey is immutable after unpacking and only read by operations on its endpoint's
// MULTI-threaded worker; it is destroyed once, in Drop.
unsafe impl Send for RemoteKey {}
// SAFETY: as above.
unsafe impl Sync for RemoteKey {}

impl std::fmt::Debug for RemoteKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteKey")
            .field("peer", &self.endpoint.peer())
            .finish_non_exhaustive()
    }
}

impl Drop for RemoteKey {
    fn drop(&mut self) {
        // SAFETY: unpacked once, destroyed once; the worker (which the rkey refers to) is kept
        // alive through `endpoint`.
        unsafe { ucp().ucp_rkey_destroy(self.handle) };
    }
}
