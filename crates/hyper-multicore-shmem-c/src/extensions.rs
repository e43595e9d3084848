//! `shmemx.h`: what the standard lacks — the last recorded failure and the runtime's state as
//! JSON.

use std::ffi::{c_char, CString};

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
