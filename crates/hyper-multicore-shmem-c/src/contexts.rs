//! Communication contexts: `shmem_ctx_create`, `shmem_team_create_ctx`, `shmem_ctx_destroy`,
//! `shmem_ctx_get_team`, `shmem_ctx_fence`, `shmem_ctx_quiet`, and the handle check of every
//! `shmem_ctx_*` RMA and atomic call. Every context is the default one: its operations are the
//! default context's, and its fence and quiet order and complete all of this PE's operations
//! (stronger than the standard requires, never weaker). The options are accepted and ignored.
//! `SHMEM_CTX_INVALID` gets the standard's answers: nothing done by `shmem_ctx_fence`,
//! `shmem_ctx_quiet` and `shmem_ctx_destroy`, nonzero from `shmem_ctx_get_team` (RMA and atomics
//! on it are undefined in the standard; they end the PE, saying so).

use std::collections::BTreeMap;
use std::ffi::{c_int, c_long};
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;

use crate::failure::fail;
use crate::job;
use crate::teams::{self, TEAM_WORLD};

/// The handle of `SHMEM_CTX_DEFAULT`.
pub const CTX_DEFAULT: usize = 1;
/// `SHMEM_CTX_INVALID`.
const CTX_INVALID: usize = 0;

/// The contexts created and not destroyed, with the team each was created on.
static LIVE: Mutex<BTreeMap<usize, usize>> = Mutex::new(BTreeMap::new());
/// The next handle to give out.
static NEXT: AtomicUsize = AtomicUsize::new(CTX_DEFAULT + 1);

/// Fails unless `ctx` is the default context or a live one.
pub(crate) fn check(call: &str, ctx: usize) {
    if ctx != CTX_DEFAULT && !LIVE.lock().contains_key(&ctx) {
        fail(
            call,
            format!("{ctx:#x} is not SHMEM_CTX_DEFAULT nor a context created and not destroyed"),
        );
    }
}

/// Creates a context on team handle `team`.
///
/// # Safety
/// `ctx` must be null or valid for writing one handle.
unsafe fn create(call: &str, team: usize, ctx: *mut usize) -> c_int {
    job::my_pe(call);
    if ctx.is_null() {
        fail(call, "the context pointer is null");
    }
    let handle = NEXT.fetch_add(1, Ordering::Relaxed);
    LIVE.lock().insert(handle, team);
    // SAFETY: non-null, and writable for one handle (the caller's contract in shmem.h).
    unsafe { ctx.write(handle) };
    0
}

/// Creates a context (0: success); `options` are accepted and ignored.
///
/// # Safety
/// `ctx` must be valid for writing one `shmem_ctx_t`.
#[no_mangle]
pub unsafe extern "C" fn shmem_ctx_create(_options: c_long, ctx: *mut usize) -> c_int {
    // SAFETY: passed on from this function's contract.
    unsafe { create("shmem_ctx_create", TEAM_WORLD, ctx) }
}

/// Creates a context on `team` (0: success); on a handle that names no team, nonzero and
/// `SHMEM_CTX_INVALID`.
///
/// # Safety
/// `ctx` must be valid for writing one `shmem_ctx_t`.
#[no_mangle]
pub unsafe extern "C" fn shmem_team_create_ctx(
    team: usize,
    _options: c_long,
    ctx: *mut usize,
) -> c_int {
    const CALL: &str = "shmem_team_create_ctx";
    if teams::lookup(CALL, team).is_none() {
        if !ctx.is_null() {
            // SAFETY: non-null, and writable for one handle (function contract).
            unsafe { ctx.write(CTX_INVALID) };
        }
        return -1;
    }
    // SAFETY: passed on from this function's contract.
    unsafe { create(CALL, team, ctx) }
}

/// Completes the context's operations and destroys it (`SHMEM_CTX_INVALID`: nothing).
#[no_mangle]
pub extern "C" fn shmem_ctx_destroy(ctx: usize) {
    const CALL: &str = "shmem_ctx_destroy";
    if ctx == CTX_INVALID {
        return;
    }
    if ctx == CTX_DEFAULT {
        fail(CALL, "SHMEM_CTX_DEFAULT cannot be destroyed");
    }
    check(CALL, ctx);
    job::run(CALL, |shmem| shmem.try_quiet());
    LIVE.lock().remove(&ctx);
}

/// The team of a context: `SHMEM_TEAM_WORLD` for the default context and those of
/// `shmem_ctx_create`, the team it was created on for `shmem_team_create_ctx` (0: success);
/// for `SHMEM_CTX_INVALID`, `SHMEM_TEAM_INVALID` and nonzero.
///
/// # Safety
/// `team` must be null or valid for writing one `shmem_team_t`.
#[no_mangle]
pub unsafe extern "C" fn shmem_ctx_get_team(ctx: usize, team: *mut usize) -> c_int {
    let (handle, status) = match ctx {
        CTX_INVALID => (teams::TEAM_INVALID, -1),
        CTX_DEFAULT => (TEAM_WORLD, 0),
        _ => {
            check("shmem_ctx_get_team", ctx);
            (LIVE.lock().get(&ctx).copied().unwrap_or(TEAM_WORLD), 0)
        }
    };
    if !team.is_null() {
        // SAFETY: non-null, and writable for one handle (function contract).
        unsafe { team.write(handle) };
    }
    status
}

/// Orders this PE's puts and atomics to each PE (all contexts'); `SHMEM_CTX_INVALID`: nothing.
#[no_mangle]
pub extern "C" fn shmem_ctx_fence(ctx: usize) {
    if ctx != CTX_INVALID {
        check("shmem_ctx_fence", ctx);
        crate::rma::shmem_fence();
    }
}

/// Completes this PE's outstanding operations (all contexts'); `SHMEM_CTX_INVALID`: nothing.
#[no_mangle]
pub extern "C" fn shmem_ctx_quiet(ctx: usize) {
    if ctx != CTX_INVALID {
        check("shmem_ctx_quiet", ctx);
        crate::rma::shmem_quiet();
    }
}
