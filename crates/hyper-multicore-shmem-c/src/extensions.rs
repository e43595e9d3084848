//! `shmemx.h`: what the standard lacks — the last recorded failure, the runtime's state as
//! JSON, and the lifecycle's heap restart.

use std::ffi::{c_char, c_int, c_void, CString};

use crate::job::Resize;

use parking_lot::Mutex;

/// The last failure this PE recorded (a call that reports failure by its result: a null
/// `shmem_malloc` or `shmem_ptr`, a 0 from `shmem_addr_accessible`), as one line naming the PE,
/// the call and the cause; null if none. Valid until the next failure.
#[no_mangle]
pub extern "C" fn shmemx_last_error() -> *const c_char {
    crate::failure::last_error()
}

/// The latest `shmemx_debug_state` text (kept alive for the caller).
static DEBUG_STATE: Mutex<Option<CString>> = Mutex::new(None);

/// The runtime's state (lifecycle, heap usage, live allocations, transport routes) as one JSON
/// object; safe to call in any state, also before `shmem_init`. Valid until the next call.
#[no_mangle]
pub extern "C" fn shmemx_debug_state() -> *const c_char {
    let state = hyper_multicore::lifecycle::debug_state();
    let json = serde_json::to_string(&state)
        .unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
        .replace('\0', " ");
    let mut kept = DEBUG_STATE.lock();
    kept.insert(CString::new(json).expect("no NUL left"))
        .as_ptr()
}

/// One block of [`shmemx_restart_heap`] (`shmemx_heap_replacement_t` in `shmemx.h`).
#[repr(C)]
#[derive(Debug)]
pub struct HeapReplacement {
    /// In: a live block, as `shmem_malloc` (or a sibling) returned it.
    pub current: *mut c_void,
    /// In: the size of the block that replaces it (positive).
    pub new_bytes: usize,
    /// In: non-zero keeps the first min(old, new) bytes; zero starts the new block zeroed.
    pub preserve: c_int,
    /// Out: the new block (on success).
    pub replaced: *mut c_void,
}

/// Collective: restarts the runtime with a symmetric heap of `new_size` bytes for
/// `shmem_malloc`, replacing each of the `count` live blocks of `replacements` (every live
/// block, once, in the same order on every PE) and writing the new addresses into their
/// `replaced` fields. Global and static variables keep their values and stay symmetric. Returns
/// 0, or -1 when the runtime refused the restart before changing anything (a block left out or
/// named twice, a heap too small, requests that differ across PEs; the same verdict on every
/// PE, the reason in `shmemx_last_error`, every old block still valid). Any other failure ends
/// the PE.
///
/// # Safety
/// `replacements` must point at `count` writable elements (or be null with `count` 0).
#[no_mangle]
pub unsafe extern "C" fn shmemx_restart_heap(
    new_size: usize,
    replacements: *mut HeapReplacement,
    count: usize,
) -> c_int {
    const CALL: &str = "shmemx_restart_heap";
    if replacements.is_null() && count > 0 {
        crate::failure::fail(CALL, format!("replacements is null but count is {count}"));
    }
    let replacements = if count == 0 {
        &mut []
    } else {
        // SAFETY: non-null and valid for `count` elements, read and written only during this
        // call (function contract).
        unsafe { std::slice::from_raw_parts_mut(replacements, count) }
    };
    let resizes: Vec<Resize> = replacements
        .iter()
        .map(|r| Resize {
            address: r.current as usize,
            bytes: r.new_bytes,
            preserve: r.preserve != 0,
        })
        .collect();
    match crate::job::restart_heap(CALL, new_size as u64, &resizes) {
        Ok(addresses) => {
            for (replacement, address) in replacements.iter_mut().zip(addresses) {
                replacement.replaced = address as *mut c_void;
            }
            0
        }
        Err(_) => -1,
    }
}

/// Test-only, not in `shmemx.h`: what this process's data plane has copied so far
/// ([`hyper_multicore::shmem::copy_count`]) — the bytes its puts and gets moved into `*moved`,
/// the bytes that went through a private bounce copy on the way into `*bounced` — and 0; or -1,
/// writing nothing, when the library counts nothing (built without the runtime's
/// `fault-injection` feature, as every build but the test harness's is). The C tests declare
/// it themselves.
///
/// # Safety
/// `moved` and `bounced` must be valid for writing a `uint64_t` each (or null: not written).
#[no_mangle]
pub unsafe extern "C" fn hmshmem_test_copy_count(moved: *mut u64, bounced: *mut u64) -> c_int {
    let Some(count) = hyper_multicore::shmem::copy_count() else {
        return -1;
    };
    for (out, value) in [(moved, count.moved), (bounced, count.bounced)] {
        if !out.is_null() {
            // SAFETY: non-null and writable for one `uint64_t` (function contract).
            unsafe { out.write_unaligned(value) };
        }
    }
    0
}
