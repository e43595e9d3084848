//! The UCX context (`ucp_init` with the features the transport needs), shared by every object
//! made from it.

use super::*;

pub(super) struct ContextHandle(pub(super) ffi::ucp_context_h);

// SAFETY: the context is created with `mt_workers_shared = 1`, which makes UCX guard its
// context-level state (memory maps, rkey packing) with a lock, so it may be used and dropped from
// any thread.
unsafe impl Send for ContextHandle {}
// SAFETY: as above.
unsafe impl Sync for ContextHandle {}

impl Drop for ContextHandle {
    fn drop(&mut self) {
        // SAFETY: the handle came from ucp_init; every worker and memory handle holds an Arc of
        // this value, so none is left when it drops.
        unsafe { ucp().ucp_cleanup(self.0) };
    }
}

/// A UCP application context (`ucp_init`): RMA, 32/64-bit atomics, active messages and wake-up
/// events, shareable between threads. UCX reads its own `UCX_*` environment variables here.
#[derive(Clone)]
pub struct Context {
    pub(super) handle: Arc<ContextHandle>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").finish_non_exhaustive()
    }
}

impl Context {
    /// `ucp_init` with features RMA | AMO32 | AMO64 | AM | WAKEUP and `mt_workers_shared`, the
    /// worker lock a mutex unless `UCX_USE_MT_MUTEX` is set (see [`MT_MUTEX_VARIABLE`]).
    ///
    /// WAKEUP (the event fd [`ProgressThread`] and sleeping callers wait on) has a price on TCP:
    /// the worker's epoll set watches the transport's own, so the kernel runs one more wake-up
    /// callback for every message received; the transport needs the event fd all the same.
    pub fn new() -> Result<Context> {
        const OP: &str = "ucx context";
        ffi::ucp().map_err(|why| {
            Error::new(
                ErrorKind::Backend,
                OP,
                format!(
                    "{why}; install UCX (Debian: `apt-get install libucx0`), or keep every pair \
                     of PEs on one host with {}=shm",
                    crate::config::TRANSPORT
                ),
            )
        })?;
        let params = ffi::ucp_params_t {
            field_mask: u64::from(
                ffi::UCP_PARAM_FIELD_FEATURES
                    | ffi::UCP_PARAM_FIELD_MT_WORKERS_SHARED
                    | ffi::UCP_PARAM_FIELD_NAME,
            ),
            features: u64::from(
                ffi::UCP_FEATURE_RMA
                    | ffi::UCP_FEATURE_AMO32
                    | ffi::UCP_FEATURE_AMO64
                    | ffi::UCP_FEATURE_AM
                    | ffi::UCP_FEATURE_WAKEUP,
            ),
            mt_workers_shared: 1,
            name: c"hyper_multicore".as_ptr(),
            ..Default::default()
        };
        let mut config: *mut ffi::ucp_config_t = ptr::null_mut();
        // SAFETY: NULL prefix and file: UCX reads its UCX_* environment; writable out-pointer.
        let status = unsafe { ucp().ucp_config_read(ptr::null(), ptr::null(), &mut config) };
        check(OP, "ucp_config_read failed", status)?;
        let mut status = ffi::UCS_OK;
        if std::env::var_os(MT_MUTEX_VARIABLE).is_none() {
            // SAFETY: live config from ucp_config_read; both strings are static and
            // NUL-terminated (UCX copies the value).
            status =
                unsafe { ucp().ucp_config_modify(config, c"USE_MT_MUTEX".as_ptr(), c"y".as_ptr()) };
        }
        let mut handle: ffi::ucp_context_h = ptr::null_mut();
        if status == ffi::UCS_OK {
            // SAFETY: params is a valid, fully initialised ucp_params_t (fields outside
            // field_mask are zero); config is live; handle is a writable out-pointer.
            status = unsafe { ucp().ucp_init(&params, config, &mut handle) };
        }
        // SAFETY: config came from ucp_config_read and is released once; ucp_init copied it.
        unsafe { ucp().ucp_config_release(config) };
        check(OP, "ucp_init (or setting USE_MT_MUTEX) failed", status)?;
        Ok(Context {
            handle: Arc::new(ContextHandle(handle)),
        })
    }

    /// The UCX library version this process runs, e.g. `"1.13.1"` (loading the library), or
    /// why it cannot be loaded.
    pub fn version() -> std::result::Result<String, &'static str> {
        let ucp = ffi::ucp()?;
        // SAFETY: returns a pointer to a static NUL-terminated string.
        let text = unsafe { CStr::from_ptr(ucp.ucp_get_version_string()) };
        Ok(text.to_string_lossy().into_owned())
    }
}
