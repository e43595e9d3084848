//! The symmetric heap: `shmem_malloc`, `shmem_calloc`, `shmem_align`, `shmem_realloc`,
//! `shmem_free`, `shmem_malloc_with_hints` and the legacy `shmalloc`, `shmemalign`, `shrealloc`,
//! `shfree`. Each is
//! collective and synchronises the PEs as the standard's barriers do: the runtime's cross-rank
//! argument check of every allocate and free is itself a barrier (with a quiet before it), taken
//! before anything is allocated or freed. So when `shmem_malloc` returns, every PE has entered it
//! and places the block at the same offset (the call writes no heap byte, so a peer's put into
//! the block cannot be lost), and `shmem_free` frees nothing before every PE has stopped using
//! the block. A request the heap cannot hold returns null on every PE (the reason goes to
//! `shmemx_last_error`), and so does an alignment that is not a power of two or is larger than
//! the heap (the standard's "otherwise, NULL"); sizes that differ across PEs end the PE with the
//! runtime's explanation.

use std::ffi::c_void;

use hyper_multicore::shmem::{AllocationSpec, Dtype};

use crate::failure::record;
use crate::job;

/// Collective: `size` bytes aligned to `alignment` (`None`: the runtime's default, 64), or null
/// for size 0, an alignment the heap cannot give, or when the heap cannot hold it. The block is whole aligned 32-bit words (size
/// rounded up, alignment at least 4), so a 16-bit value waited on lies in a symmetric word
/// (`wait.rs`).
fn allocate(call: &str, size: usize, alignment: Option<u64>) -> *mut c_void {
    if size == 0 {
        return std::ptr::null_mut();
    }
    let spec = AllocationSpec {
        shape: vec![size.next_multiple_of(4)],
        dtype: Dtype::U8,
        alignment: alignment.map(|a| if a.is_power_of_two() { a.max(4) } else { a }),
    };
    let outcome = job::run(call, |shmem| Ok(shmem.allocate_spec(&spec)));
    match outcome {
        Ok(record) => job::add_allocation(&record) as *mut c_void,
        // The heap cannot hold it, or no block of it can have that alignment (the same verdict
        // on every PE, after the cross-rank check): null, as the standard says.
        Err(error)
            if error.message().contains("heap is exhausted")
                || error.message().starts_with("alignment ") =>
        {
            record(call, &error.to_string());
            std::ptr::null_mut()
        }
        // Arguments that differ across PEs, a bad alignment: a bug of the program.
        Err(error) => crate::failure::fail(call, error),
    }
}

/// Collective: frees the block at `address` (null: nothing, but still a barrier).
fn free(call: &str, address: *mut c_void) {
    if address.is_null() {
        // Still collective: peers freeing a block wait for this PE at the barrier.
        job::run(call, |shmem| shmem.barrier());
        return;
    }
    let record = job::remove_allocation(call, address as usize);
    job::run(call, |shmem| shmem.free_id(record.id));
}

/// Collective: `size` bytes of symmetric memory, or null.
#[no_mangle]
pub extern "C" fn shmem_malloc(size: usize) -> *mut c_void {
    allocate("shmem_malloc", size, None)
}

/// Collective: [`shmem_malloc`]; the hints only describe expected use and are ignored.
#[no_mangle]
pub extern "C" fn shmem_malloc_with_hints(size: usize, _hints: std::ffi::c_long) -> *mut c_void {
    allocate("shmem_malloc_with_hints", size, None)
}

/// Legacy form of [`shmem_malloc`].
#[no_mangle]
pub extern "C" fn shmalloc(size: usize) -> *mut c_void {
    allocate("shmalloc", size, None)
}

/// Collective: `count × size` bytes set to zero, or null.
#[no_mangle]
pub extern "C" fn shmem_calloc(count: usize, size: usize) -> *mut c_void {
    const CALL: &str = "shmem_calloc";
    let Some(bytes) = count.checked_mul(size) else {
        record(CALL, &format!("{count} × {size} bytes overflows"));
        return std::ptr::null_mut();
    };
    let address = allocate(CALL, bytes, None);
    if !address.is_null() {
        let region = job::region(CALL, address as usize, bytes);
        job::run(CALL, |shmem| {
            let rank = shmem.rank();
            shmem.put_bytes(region, &vec![0u8; bytes], rank)?;
            shmem.barrier()
        });
    }
    address
}

/// Collective: `size` bytes at an address that is a multiple of `alignment` (any power of two
/// up to the heap's size rounded up to one), or null.
#[no_mangle]
pub extern "C" fn shmem_align(alignment: usize, size: usize) -> *mut c_void {
    allocate("shmem_align", size, Some(alignment as u64))
}

/// Legacy form of [`shmem_align`].
#[no_mangle]
pub extern "C" fn shmemalign(alignment: usize, size: usize) -> *mut c_void {
    allocate("shmemalign", size, Some(alignment as u64))
}

/// Collective: frees a block `shmem_malloc` (or its siblings) returned; null does nothing.
#[no_mangle]
pub extern "C" fn shmem_free(address: *mut c_void) {
    free("shmem_free", address);
}

/// Legacy form of [`shmem_free`].
#[no_mangle]
pub extern "C" fn shfree(address: *mut c_void) {
    free("shfree", address);
}

/// Collective: a block of `size` bytes holding the first bytes of `address`'s block (null:
/// [`shmem_malloc`]; size 0: [`shmem_free`], returning null). On failure the old block stays and
/// null is returned.
#[no_mangle]
pub extern "C" fn shmem_realloc(address: *mut c_void, size: usize) -> *mut c_void {
    reallocate("shmem_realloc", address, size)
}

/// Legacy form of [`shmem_realloc`].
#[no_mangle]
pub extern "C" fn shrealloc(address: *mut c_void, size: usize) -> *mut c_void {
    reallocate("shrealloc", address, size)
}

/// [`shmem_realloc`] as `call`.
fn reallocate(call: &str, address: *mut c_void, size: usize) -> *mut c_void {
    if address.is_null() {
        return allocate(call, size, None);
    }
    if size == 0 {
        free(call, address);
        return std::ptr::null_mut();
    }
    let old = job::allocation_at(call, address as usize);
    let new = allocate(call, size, None);
    if new.is_null() {
        return new;
    }
    let kept = size.min(old.bytes as usize);
    let source = job::region(call, address as usize, kept);
    let target = job::region(call, new as usize, kept);
    job::run(call, |shmem| {
        let rank = shmem.rank();
        let mut bytes = vec![0u8; kept];
        shmem.get_bytes(&mut bytes, source, rank)?;
        shmem.put_bytes(target, &bytes, rank)
    });
    free(call, address);
    new
}
