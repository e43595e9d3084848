//! A small safe wrapper over OpenUCX's `ucp` API (bindings: the `hm-ucx-sys` crate): the
//! foundation of the UCX transport. Every `unsafe` block of the UCX route lives in this file.
//!
//! # The objects and who owns whom
//!
//! ```text
//! Context (features RMA | AMO32 | AMO64 | AM | WAKEUP)
//!  ├─ MemoryRegion   ucp_mem_map of a range (the heap) + its packed rkey bytes
//!  └─ Worker         thread mode MULTI; address bytes; event fd; progress; AM handlers
//!      ├─ ProgressThread  sleeps on the worker's event fd, progresses it, joins on drop
//!      └─ Endpoint        to one peer (from its worker address bytes); error handler
//!          ├─ RemoteKey   a peer's packed rkey, unpacked for this endpoint
//!          └─ Request     a non-blocking put/get that owns its buffer
//! ```
//!
//! Children hold an `Arc` of their parent's handle, so teardown always runs in UCX's order
//! (requests and rkeys → endpoints → worker → memory handles → context) whatever order the values
//! are dropped in.
//!
//! # Roles
//!
//! ```ignore
//! // every PE: local setup, publish, exchange over the control plane, attach
//! let context = Context::new()?;
//! let worker = Worker::new(&context)?;
//! let _progress = worker.start_progress_thread()?; // serves peers' AM-emulated RMA
//! let region = MemoryRegion::register(&context, heap_mapping.clone(), 0, heap_len)?;
//! let mine = (worker.address()?, region.base(), region.rkey_bytes().to_vec()); // allgather these
//! let peer = worker.connect(&their_address, their_rank)?;
//! let key = peer.unpack_rkey(&their_rkey)?;
//! peer.put(b"hello", their_base + offset, &key, deadline)?;
//! peer.flush(deadline)?;                          // remote completion (shmem_quiet)
//! let old = peer.atomic_fetch_add(their_base + 64, &key, 1u64, deadline)?;
//! ```
//!
//! # Completion, waiting and deadlines
//!
//! Every blocking call takes a deadline. It drives `ucp_worker_progress` itself: a short phase
//! of progress + `yield_now` (about 50 µs; a flush after large puts up to 1 ms more, the time
//! the bytes take to move), then `ucp_worker_arm` and `poll()` on the worker's
//! event fd plus a per-worker eventfd: a progress thread may consume the event that completes
//! our request, so any thread whose `progress` handled events while a caller sleeps writes that
//! eventfd. Sleeps are still capped at 1 ms as a safety net. Nothing spins without yielding.
//!
//! A blocking call whose deadline passes while UCX still references the caller's buffer cannot
//! simply return: the endpoint is force-closed (UCX then completes every outstanding request on it
//! with an error), the call waits for that, and fails with [`ErrorKind::Timeout`]. The endpoint
//! is unusable afterwards — a peer that misses a deadline is treated as gone.
//!
//! # Failures
//!
//! Endpoints use `UCP_ERR_HANDLING_MODE_PEER` with an error handler that records the status;
//! every later call on the endpoint fails at once with [`ErrorKind::PeerLost`] naming the peer
//! rank given to [`Worker::connect`]. Other UCX failures are [`ErrorKind::Backend`] with a hint
//! about `UCX_TLS` / `UCX_NET_DEVICES`.
//!
//! # Progress over TCP and shared memory
//!
//! Over `UCX_TLS=tcp` (and `sm`), UCX emulates RMA and atomics with active messages that the
//! *target* worker must progress: a get from a peer whose threads never call UCX never completes.
//! [`ProgressThread`] is the answer: it sleeps on the worker's event fd and progresses the worker
//! when anything arrives, so the target's main thread may compute. While the PE's own threads
//! progress the worker (they wait for something: [`Worker::begin_serving`], and every blocking
//! call of this module), the progress thread stands down instead of racing them for every
//! event; [`Worker::end_serving`] can give it the worker back at once.

//! # Notes for the transport built on this
//!
//! - **One worker per PE, thread mode MULTI** (checked at creation; the context has
//!   `mt_workers_shared`): the caller and the progress thread call into the same worker, UCX
//!   locks inside. Keep one [`ProgressThread`] per worker for the worker's whole life.
//! - **Arm loop**: `ucp_worker_arm` returns `UCS_ERR_BUSY` while events are pending; the
//!   only correct sleep is `while progress() != 0 {}` → `arm()` → `poll(event_fd)` only when
//!   `arm()` returned true ([`Worker::arm`] maps BUSY to `false`).
//! - **Endpoints are `Send`, not `Sync`** (a blocking call holds the endpoint for its whole
//!   wait): give each thread its own, or wrap one in a mutex. [`RemoteKey`]s and [`Request`]s
//!   keep their endpoint's UCX state alive, so any drop order is safe.
//! - **Peer-failure handling** is asked for on every endpoint; `UCX_TLS=sm,self` cannot provide
//!   it (UCX prints one `no peer failure handler` error line per connection), so such endpoints
//!   run without it ([`Endpoint::detects_peer_failure`]), stage put, get, atomics and active
//!   messages through an owned buffer (with it, UCX works in the caller's memory or the call's
//!   stack frame) and learn about a dead peer only from deadlines — the control plane's
//!   peer-loss notice must close them. With the default `UCX_TLS`, UCX then prefers TCP even
//!   on one host.
//! - **Local vs remote completion**: put, atomics and AM return at local completion; only
//!   [`Endpoint::flush`] / [`Worker::flush`] (quiet) guarantee the target has the data.
//!   [`Worker::fence`] only orders.
//! - **A missed deadline closes the endpoint** (force-close) and fails with Timeout; every later
//!   call on it fails at once. Reconnect with [`Worker::connect`] if the peer is still wanted.
//! - **Active messages** run inside `progress` on whichever thread progresses (usually the
//!   progress thread): never block there and never call blocking UCX operations from a handler;
//!   sends use the eager protocol (small messages; the header is limited to
//!   [`Worker::max_am_header`]).
//! - **The heap** is registered with [`MemoryRegion::register`] from its `Arc<SharedMapping>`,
//!   which it keeps mapped; re-register (and re-exchange keys) after a restart maps a new heap.

use std::ffi::{c_void, CStr};
use std::marker::PhantomData;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicBool, AtomicI8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use hm_ucx_sys as ffi;
use parking_lot::Mutex;
use rustix::event::{eventfd, poll, EventfdFlags, PollFd, PollFlags, Timespec};

use super::copies::count_bounced;
use crate::sys::mapping::{LocalSource, LocalTarget, SharedMapping};
use crate::{Error, ErrorKind, Result};

/// What to check when UCX itself fails; ends every [`ErrorKind::Backend`] message of this module.
const UCX_HINT: &str = "check the UCX transports with UCX_TLS (e.g. UCX_TLS=tcp,self across \
    hosts, UCX_TLS=sm,self on one host) and the network device with UCX_NET_DEVICES (e.g. \
    UCX_NET_DEVICES=eth0); `ucx_info -d` lists what this host offers";

/// How long a blocking call progresses with `yield_now` before it sleeps on the event fd (a
/// flush after large puts longer: [`WorkerHandle::wait_flush`]).
const SPIN_PHASE: Duration = Duration::from_micros(50);
/// The most a flush's spin phase grows for the bytes it waits for.
const TRANSFER_SPIN_CAP: Duration = Duration::from_millis(1);
/// The first sleep on the event fd of a caller waiting for its own request; each next one is
/// twice as long, up to [`CALLER_SLEEP_CAP`].
const CALLER_FIRST_SLEEP: Duration = Duration::from_micros(20);
/// The longest single sleep on the event fd of a caller waiting for its own request.
const CALLER_SLEEP_CAP: Duration = Duration::from_millis(1);
/// The longest single sleep of the progress thread (it re-checks its stop flag after each).
const PROGRESS_SLEEP_CAP: Duration = Duration::from_millis(100);
/// How long a progress thread that stands down sleeps before it looks again, unless a hand-over
/// wakes it first (see [`Worker::start_progress_thread`]): a backstop, as a peer whose request
/// waits for this PE's progress asks for it ([`Worker::on_slow_request`]).
const LOOK_BACKSTOP: Duration = Duration::from_millis(20);
/// How long a request waits without any event (its peer's progress) before the worker's
/// [`Worker::on_slow_request`] hook runs.
pub(crate) const SLOW_REQUEST: Duration = Duration::from_micros(200);
/// A caller that progressed the worker this recently is taken to be progressing still.
const RECENT_CALLER: Duration = Duration::from_micros(50);
/// Callers' progresses per clock read of [`Handover::called`].
const CALLS_PER_CLOCK_READ: u64 = 16;
/// How long a force-close may take to complete the requests it cancels before we give up.
const FORCE_CLOSE_GRACE: Duration = Duration::from_secs(5);

/// UCX's variable choosing the lock of a thread-mode-MULTI worker. Unless the user sets it, the
/// context is made with a mutex (`y`) instead of UCX's default spinlock: the caller and the
/// progress thread share the worker, and on a machine with fewer cores than busy threads a
/// thread preempted while it holds the spinlock leaves the other spinning for a whole scheduler
/// slice (measured: one-way signal ping-pong 1-2 ms with the spinlock, 33-39 µs with the mutex;
/// docs/multinode.md).
const MT_MUTEX_VARIABLE: &str = "UCX_USE_MT_MUTEX";

/// UCX's own name of a status code.
fn status_name(status: ffi::ucs_status_t) -> String {
    // SAFETY: ucs_status_string returns a pointer to a static NUL-terminated string for every
    // value (unknown codes give a static "unknown" text).
    let text = unsafe { CStr::from_ptr(ucp().ucs_status_string(status)) };
    text.to_string_lossy().into_owned()
}

/// The loaded `ucp` functions. Every caller holds a UCX object, and the first of them (a
/// [`Context`]) exists only once [`Context::new`] has loaded the library.
fn ucp() -> &'static ffi::Ucp {
    ffi::ucp().expect("a UCX object exists only once Context::new has loaded libucp")
}

/// A [`ErrorKind::Backend`] error for a failed UCX call.
fn ucx_error(operation: &str, what: &str, status: ffi::ucs_status_t) -> Error {
    Error::new(
        ErrorKind::Backend,
        operation,
        format!(
            "{what}: {} (UCX status {status}); {UCX_HINT}",
            status_name(status)
        ),
    )
}

fn check(operation: &str, what: &str, status: ffi::ucs_status_t) -> Result<()> {
    if status == ffi::UCS_OK {
        Ok(())
    } else {
        Err(ucx_error(operation, what, status))
    }
}

fn deadline_error(operation: &str, started: Instant, what: &str) -> Error {
    Error::timeout(operation, started.elapsed(), what)
}

// ---------------------------------------------------------------------------------------------
// Context
// ---------------------------------------------------------------------------------------------

struct ContextHandle(ffi::ucp_context_h);

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
    handle: Arc<ContextHandle>,
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
    /// callback for every message received, ~0.13 µs here (bench/findings.md, round 29).
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

// ---------------------------------------------------------------------------------------------
// Memory regions
// ---------------------------------------------------------------------------------------------

/// What keeps the registered bytes mapped while UCX may touch them.
enum RegionMemory {
    /// A range of a shared mapping (the symmetric heap).
    Mapping(#[allow(dead_code)] Arc<SharedMapping>),
    /// Memory UCX allocated itself (`UCP_MEM_MAP_ALLOCATE`), freed by `ucp_mem_unmap`.
    Allocated,
}

/// A range of this process's memory registered with UCX (`ucp_mem_map`), which peers may read,
/// write and update atomically once they hold [`MemoryRegion::rkey_bytes`] and its base address.
pub struct MemoryRegion {
    context: Arc<ContextHandle>,
    memh: ffi::ucp_mem_h,
    base: NonNull<u8>,
    len: usize,
    rkey: Vec<u8>,
    memory: RegionMemory,
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

    fn map(
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

// ---------------------------------------------------------------------------------------------
// Worker
// ---------------------------------------------------------------------------------------------

/// An active-message handler: called with (header, data) from whichever thread progresses the
/// worker.
type AmHandler = dyn Fn(&[u8], &[u8], Option<&Reply>) + Send + Sync + 'static;

struct WorkerHandle {
    handle: ffi::ucp_worker_h,
    /// The worker's event fd: owned by UCX, closed by ucp_worker_destroy.
    event_fd: i32,
    max_am_header: usize,
    /// Callers sleeping in `wait_request`, and the eventfd that wakes them when another thread's
    /// progress handled events (the progress thread may complete their request and consume the
    /// worker event they sleep on).
    sleepers: AtomicUsize,
    completions: OwnedFd,
    /// Whether callers or the progress thread serve the worker's events.
    handover: Handover,
    /// Bytes put through the worker's endpoints since its last flush: how long a flush waits
    /// awake ([`WorkerHandle::wait_flush`]).
    unflushed: AtomicUsize,
    /// Operations issued through the worker's endpoints that only a flush completes at the
    /// peer (puts and posted atomics), counted once issued. A non-blocking get is not: only its
    /// [`Request::wait`] hands its bytes over, and that waits for it.
    issued: AtomicU64,
    /// The most operations ([`WorkerHandle::issued`]) a completed [`Worker::flush`] covered: a
    /// flush with nothing issued since is skipped (a barrier starts with a quiet).
    flushed: AtomicU64,
    /// Every handler ever registered: UCX holds raw pointers to them until the worker dies. The
    /// outer box gives each (fat) handler a stable, thin address that survives the Vec growing.
    #[allow(clippy::vec_box)]
    am_handlers: Mutex<Vec<Box<Box<AmHandler>>>>,
    /// Called after every `progress` that handled events (see [`Worker::on_progress`]).
    on_progress: OnceLock<ProgressHook>,
    /// Called when a request has waited [`SLOW_REQUEST`] (see [`Worker::on_slow_request`]).
    on_slow_request: OnceLock<SlowRequestHook>,
    _context: Arc<ContextHandle>,
}

/// What [`Worker::on_progress`] runs after a progress call that handled events.
type ProgressHook = Box<dyn Fn() + Send + Sync>;

/// See [`Worker::on_slow_request`].
type SlowRequestHook = Box<dyn Fn(Option<usize>) + Send + Sync>;

// SAFETY: the worker is created with UCS_THREAD_MODE_MULTI (checked after creation), so UCX
// serialises concurrent calls on it internally.
unsafe impl Send for WorkerHandle {}
// SAFETY: as above.
unsafe impl Sync for WorkerHandle {}

impl Drop for WorkerHandle {
    fn drop(&mut self) {
        // SAFETY: every endpoint, request, rkey and progress thread holds an Arc of this value,
        // so none is left; the context outlives the worker (field dropped after this).
        unsafe { ucp().ucp_worker_destroy(self.handle) };
    }
}

impl WorkerHandle {
    /// A caller's progress (timed: the progress thread stands down while callers progress).
    fn progress(&self) -> usize {
        self.handover.called();
        self.progress_events()
    }

    fn progress_events(&self) -> usize {
        // SAFETY: live worker, thread mode MULTI.
        let events = unsafe { ucp().ucp_worker_progress(self.handle) as usize };
        if events != 0 {
            if let Some(hook) = self.on_progress.get() {
                hook();
            }
        }
        // Whoever progresses may complete a sleeping caller's request and consume the event
        // that would have woken it: tell the sleepers to look again.
        if events != 0 && self.sleepers.load(Ordering::SeqCst) != 0 {
            let _ = rustix::io::write(&self.completions, &1u64.to_ne_bytes());
        }
        events
    }

    /// `ucp_worker_arm`: Ok(true) when armed (safe to sleep on the event fd), Ok(false) when
    /// events are pending (progress again first).
    fn arm(&self) -> Result<bool> {
        // SAFETY: live worker created with UCP_FEATURE_WAKEUP.
        let status = unsafe { ucp().ucp_worker_arm(self.handle) };
        match status {
            ffi::UCS_OK => Ok(true),
            ffi::UCS_ERR_BUSY => Ok(false),
            other => Err(ucx_error("ucx progress", "ucp_worker_arm failed", other)),
        }
    }

    fn event_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: UCX keeps the fd open until ucp_worker_destroy, which runs only when self
        // drops; the borrow cannot outlive self.
        unsafe { BorrowedFd::borrow_raw(self.event_fd) }
    }

    /// Sleeps until the worker's event fd (or `extra`) is readable or `timeout` passes.
    fn sleep(&self, extra: BorrowedFd<'_>, timeout: Duration) {
        sleep_on([self.event_fd(), extra], timeout);
    }

    /// Drives the worker until `request` completes or `deadline` passes; Ok(status) when UCX
    /// completed it (the request is then freed), Err(()) at the deadline (still in flight).
    /// `peer` is the rank whose progress the request waits for (None: every peer's, a flush):
    /// once the wait has seen no event for [`SLOW_REQUEST`] (a large transfer that is moving
    /// is not slow), the slow-request hook hears of it, and again after each such silence.
    fn wait_request(
        &self,
        request: ffi::ucs_status_ptr_t,
        deadline: Instant,
        peer: Option<usize>,
    ) -> std::result::Result<ffi::ucs_status_t, ()> {
        self.wait_request_spinning(request, deadline, peer, SPIN_PHASE)
    }

    /// [`WorkerHandle::wait_request`] with a spin phase of `spin` before the first sleep.
    fn wait_request_spinning(
        &self,
        request: ffi::ucs_status_ptr_t,
        deadline: Instant,
        peer: Option<usize>,
        spin: Duration,
    ) -> std::result::Result<ffi::ucs_status_t, ()> {
        let started = Instant::now();
        let mut slice = CALLER_FIRST_SLEEP;
        // Since when this wait has seen no event (or last told the slow-request hook).
        let mut silent_since = started;
        // This caller serves the worker until its request completes, asleep on the event fd
        // or not: the progress thread need not wake for the same events.
        let _serving = ServingGuard::begin(&self.handover);
        loop {
            let events = self.progress();
            // SAFETY: request is a live request handle (not yet freed) of this worker.
            let status = unsafe { ucp().ucp_request_check_status(request) };
            if status != ffi::UCS_INPROGRESS {
                // SAFETY: completed and not yet freed; freed exactly once here.
                unsafe { ucp().ucp_request_free(request) };
                return Ok(status);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(());
            }
            if events != 0 {
                silent_since = now;
            } else if now - silent_since >= SLOW_REQUEST {
                silent_since = now;
                if let Some(hook) = self.on_slow_request.get() {
                    hook(peer);
                }
            }
            if now - started < spin {
                std::thread::yield_now();
                continue;
            }
            // Announce the sleep before the last look at the request, so that a completion by
            // another thread after that look writes `completions` (see `progress`).
            self.sleepers.fetch_add(1, Ordering::SeqCst);
            // SAFETY: as above.
            let done = unsafe { ucp().ucp_request_check_status(request) } != ffi::UCS_INPROGRESS;
            if !done {
                match self.arm() {
                    Ok(true) => {
                        // Up to the deadline, and no longer than the silence may last before the
                        // hook runs (on time, not a doubled slice later).
                        let nap = (deadline - now)
                            .min(slice)
                            .min((silent_since + SLOW_REQUEST).saturating_duration_since(now));
                        self.sleep(self.completions.as_fd(), nap);
                        slice = (slice * 2).min(CALLER_SLEEP_CAP);
                    }
                    Ok(false) => {}
                    // An arm failure only loses the sleep: pause briefly and retry.
                    Err(_) => std::thread::sleep(Duration::from_micros(100)),
                }
                drain(self.completions.as_fd());
            }
            self.sleepers.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Waits for a status pointer returned by a `*_nbx` call: NULL is immediate success, an error
    /// pointer its status, a request is waited for (see [`WorkerHandle::wait_request`] for
    /// `peer`). Err(request) at the deadline.
    fn wait_status_ptr(
        &self,
        result: ffi::ucs_status_ptr_t,
        deadline: Instant,
        peer: Option<usize>,
    ) -> std::result::Result<ffi::ucs_status_t, ffi::ucs_status_ptr_t> {
        if !ffi::ucs_ptr_is_ptr(result) {
            return Ok(ffi::ucs_ptr_status(result));
        }
        self.wait_request(result, deadline, peer)
            .map_err(|()| result)
    }

    /// [`WorkerHandle::wait_status_ptr`] for a flush: it waits awake [`SPIN_PHASE`] plus the
    /// time the bytes put since the last flush take at 2 GB/s (TCP on a loopback or a fast
    /// link), up to [`TRANSFER_SPIN_CAP`] more. A quiet after a large put waits for the whole
    /// transfer; asleep, it would leave the worker's incoming traffic meanwhile — the peer's
    /// half of an all-to-all — to the progress thread's wake-ups (bench/findings.md, round 26).
    fn wait_flush(
        &self,
        result: ffi::ucs_status_ptr_t,
        deadline: Instant,
        peer: Option<usize>,
    ) -> std::result::Result<ffi::ucs_status_t, ffi::ucs_status_ptr_t> {
        let bytes = self.unflushed.swap(0, Ordering::Relaxed);
        if !ffi::ucs_ptr_is_ptr(result) {
            return Ok(ffi::ucs_ptr_status(result));
        }
        let moving = Duration::from_nanos((bytes / 2).try_into().unwrap_or(u64::MAX));
        let spin = SPIN_PHASE + moving.min(TRANSFER_SPIN_CAP);
        self.wait_request_spinning(result, deadline, peer, spin)
            .map_err(|()| result)
    }
}

/// A UCP worker (`ucp_worker_create`) in thread mode MULTI: one per PE, shared by the caller and
/// its [`ProgressThread`]. Cloning shares the same worker.
#[derive(Clone)]
pub struct Worker {
    inner: Arc<WorkerHandle>,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("event_fd", &self.inner.event_fd)
            .finish_non_exhaustive()
    }
}

impl Worker {
    /// Creates a worker of `context` in `UCS_THREAD_MODE_MULTI` and fetches its event fd.
    pub fn new(context: &Context) -> Result<Worker> {
        const OP: &str = "ucx worker";
        let params = ffi::ucp_worker_params_t {
            field_mask: u64::from(ffi::UCP_WORKER_PARAM_FIELD_THREAD_MODE),
            thread_mode: ffi::UCS_THREAD_MODE_MULTI,
            ..Default::default()
        };
        let mut handle: ffi::ucp_worker_h = ptr::null_mut();
        // SAFETY: live context; valid params; writable out-pointer.
        let status = unsafe { ucp().ucp_worker_create(context.handle.0, &params, &mut handle) };
        check(OP, "ucp_worker_create failed", status)?;
        // From here the handle is owned by `inner`'s Drop once it exists; until then destroy
        // by hand on every error path.
        let destroy = |error: Error| {
            // SAFETY: the worker was just created and nothing else refers to it.
            unsafe { ucp().ucp_worker_destroy(handle) };
            error
        };
        let mut attr = ffi::ucp_worker_attr_t {
            field_mask: u64::from(
                ffi::UCP_WORKER_ATTR_FIELD_THREAD_MODE | ffi::UCP_WORKER_ATTR_FIELD_MAX_AM_HEADER,
            ),
            ..Default::default()
        };
        // SAFETY: live worker; attr writable.
        let status = unsafe { ucp().ucp_worker_query(handle, &mut attr) };
        check(OP, "ucp_worker_query failed", status).map_err(destroy)?;
        if attr.thread_mode != ffi::UCS_THREAD_MODE_MULTI {
            return Err(destroy(Error::new(
                ErrorKind::Unsupported,
                OP,
                format!(
                    "this UCX ({}) gives thread mode {} instead of MULTI; a UCX built with \
                     multi-thread support (--enable-mt, as Debian's libucx0) is required",
                    Context::version().unwrap_or_default(),
                    attr.thread_mode
                ),
            )));
        }
        let mut event_fd: i32 = -1;
        // SAFETY: live worker created with UCP_FEATURE_WAKEUP; writable out-pointer.
        let status = unsafe { ucp().ucp_worker_get_efd(handle, &mut event_fd) };
        check(OP, "ucp_worker_get_efd failed", status).map_err(destroy)?;
        let completions = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)
            .map_err(|e| destroy(Error::backend(OP, "eventfd failed", e.into())))?;
        let wake = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)
            .map_err(|e| destroy(Error::backend(OP, "eventfd failed", e.into())))?;
        Ok(Worker {
            inner: Arc::new(WorkerHandle {
                handle,
                event_fd,
                max_am_header: attr.max_am_header,
                sleepers: AtomicUsize::new(0),
                completions,
                handover: Handover {
                    epoch: Instant::now(),
                    last_call: AtomicU64::new(0),
                    calls: AtomicU64::new(0),
                    standing_down: AtomicBool::new(false),
                    take_over: AtomicBool::new(false),
                    wake,
                    serving: AtomicUsize::new(0),
                    look_backstop: AtomicU64::new(LOOK_BACKSTOP.as_nanos() as u64),
                },
                unflushed: AtomicUsize::new(0),
                issued: AtomicU64::new(0),
                flushed: AtomicU64::new(0),
                am_handlers: Mutex::new(Vec::new()),
                on_progress: OnceLock::new(),
                on_slow_request: OnceLock::new(),
                _context: context.handle.clone(),
            }),
        })
    }

    /// This worker's address: the bytes a peer passes to [`Worker::connect`].
    pub fn address(&self) -> Result<Vec<u8>> {
        let mut address: *mut ffi::ucp_address_t = ptr::null_mut();
        let mut len = 0usize;
        // SAFETY: live worker; writable out-pointers.
        let status =
            unsafe { ucp().ucp_worker_get_address(self.inner.handle, &mut address, &mut len) };
        check("ucx address", "ucp_worker_get_address failed", status)?;
        // SAFETY: on success UCX returns `len` readable bytes, copied then released once.
        let bytes = unsafe {
            let bytes = std::slice::from_raw_parts(address.cast::<u8>(), len).to_vec();
            ucp().ucp_worker_release_address(self.inner.handle, address);
            bytes
        };
        Ok(bytes)
    }

    /// The worker's event fd (`ucp_worker_get_efd`): readable when there may be work for
    /// [`Worker::progress`]; only meaningful after [`Worker::arm`] returned true.
    pub fn event_fd(&self) -> BorrowedFd<'_> {
        self.inner.event_fd()
    }

    /// `ucp_worker_arm`: true when armed (now sleep on the event fd), false when events are
    /// pending (call [`Worker::progress`] until it returns 0 and arm again).
    pub fn arm(&self) -> Result<bool> {
        self.inner.arm()
    }

    /// `ucp_worker_progress` once; returns how many events it handled (0: nothing to do).
    pub fn progress(&self) -> usize {
        self.inner.progress()
    }

    /// Tells the progress thread that a caller serves the worker's events from now on: a wait
    /// that progresses the worker as it looks. The thread stands down (it does not arm the
    /// event fd; see [`Worker::start_progress_thread`]) until every such caller called
    /// [`Worker::end_serving`] and none progressed within [`RECENT_CALLER`], so that one
    /// thread of the PE, not two, wakes for each event: on a machine with fewer cores than
    /// busy threads a caller descheduled between two looks would otherwise lose the worker to
    /// the progress thread, and every later event would wake both.
    pub fn begin_serving(&self) {
        self.inner.handover.begin_serving();
    }

    /// Ends a [`Worker::begin_serving`]: before the caller sleeps without watching the worker
    /// or goes on computing. With `hand_over`, the progress thread serves again at once if it
    /// stood down (one eventfd write: for a caller about to sleep or compute); without, when a
    /// peer's request asks for it ([`Worker::serve_now`], some [`SLOW_REQUEST`] after the
    /// request began) or at its next look (within [`LOOK_BACKSTOP`]): for a caller that ends a
    /// short wait and goes on calling the runtime — handing over at the end of every barrier
    /// would wake the thread as often.
    pub fn end_serving(&self, hand_over: bool) {
        self.inner.handover.end_serving(hand_over);
    }

    /// The largest active-message header [`Endpoint::am_send`] accepts on this worker.
    pub fn max_am_header(&self) -> usize {
        self.inner.max_am_header
    }

    /// Connects to the peer whose [`Worker::address`] is `address`; `peer` (its rank) names it
    /// in errors.
    ///
    /// Asks for peer-failure handling (`UCP_ERR_HANDLING_MODE_PEER`: an error handler records a
    /// broken connection, so later calls fail at once with PeerLost). UCX 1.13's shared-memory
    /// transports (`posix`, `sysv`) cannot detect peer failure and are excluded in that mode; when
    /// no transport is left (`UCX_TLS=sm,self`) the endpoint is created without failure
    /// handling instead ([`Endpoint::detects_peer_failure`] is then false) and a dead peer shows
    /// up as missed deadlines.
    pub fn connect(&self, address: &[u8], peer: usize) -> Result<Endpoint> {
        match self.connect_with(address, peer, true) {
            Err(error) if error.kind() == ErrorKind::Unsupported => {
                tracing::debug!("{error}; connecting without peer-failure handling");
                self.connect_with(address, peer, false)
            }
            other => other,
        }
    }

    fn connect_with(&self, address: &[u8], peer: usize, handle_failure: bool) -> Result<Endpoint> {
        const OP: &str = "ucx connect";
        if address.is_empty() {
            return Err(
                Error::new(ErrorKind::InvalidArgument, OP, "empty worker address").with_peer(peer),
            );
        }
        let failure = Arc::new(EndpointFailure {
            status: AtomicI8::new(ffi::UCS_OK),
            peer,
        });
        let mut params = ffi::ucp_ep_params_t {
            field_mask: u64::from(ffi::UCP_EP_PARAM_FIELD_REMOTE_ADDRESS),
            address: address.as_ptr().cast(),
            ..Default::default()
        };
        if handle_failure {
            params.field_mask |= u64::from(
                ffi::UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | ffi::UCP_EP_PARAM_FIELD_ERR_HANDLER,
            );
            params.err_mode = ffi::UCP_ERR_HANDLING_MODE_PEER;
            params.err_handler = ffi::ucp_err_handler_t {
                cb: Some(endpoint_error_handler),
                arg: Arc::as_ptr(&failure).cast_mut().cast(),
            };
        }
        let mut handle: ffi::ucp_ep_h = ptr::null_mut();
        // SAFETY: live worker; `address` holds a worker address (UCX validates its header and
        // fails otherwise) and is only read during the call; the error handler's `arg` points at
        // `failure`, which the endpoint keeps alive until UCX has closed the endpoint.
        let status = unsafe { ucp().ucp_ep_create(self.inner.handle, &params, &mut handle) };
        if status == ffi::UCS_ERR_UNREACHABLE && handle_failure {
            return Err(Error::new(
                ErrorKind::Unsupported,
                OP,
                format!("no UCX transport to rank {peer} can detect peer failure"),
            )
            .with_peer(peer));
        }
        if status != ffi::UCS_OK {
            return Err(
                ucx_error(OP, &format!("ucp_ep_create to rank {peer} failed"), status)
                    .with_peer(peer),
            );
        }
        Ok(Endpoint {
            inner: Arc::new(EndpointHandle {
                handle: Mutex::new(handle),
                failure,
                detects_peer_failure: handle_failure,
                orphans: Mutex::new(Vec::new()),
                worker: self.inner.clone(),
            }),
            _not_sync: PhantomData,
        })
    }

    /// Registers `handler` for active messages with id `id` (replacing an earlier one). It runs
    /// inside `progress` on whichever thread progresses the worker (often the progress thread):
    /// keep it short, never block in it and never call blocking UCX operations from it.
    pub fn set_am_handler<F>(&self, id: u16, handler: F) -> Result<()>
    where
        F: Fn(&[u8], &[u8]) + Send + Sync + 'static,
    {
        self.set_am_request_handler(id, move |header, data, _| handler(header, data))
    }

    /// [`Worker::set_am_handler`] for requests ([`Endpoint::am_request`]): the handler also gets
    /// the [`Reply`] to the sender (None for a message sent without asking for one).
    pub fn set_am_request_handler<F>(&self, id: u16, handler: F) -> Result<()>
    where
        F: Fn(&[u8], &[u8], Option<&Reply>) + Send + Sync + 'static,
    {
        let boxed: Box<Box<AmHandler>> = Box::new(Box::new(handler));
        let arg: *const Box<AmHandler> = &*boxed;
        let params = ffi::ucp_am_handler_param_t {
            field_mask: u64::from(
                ffi::UCP_AM_HANDLER_PARAM_FIELD_ID
                    | ffi::UCP_AM_HANDLER_PARAM_FIELD_CB
                    | ffi::UCP_AM_HANDLER_PARAM_FIELD_ARG
                    | ffi::UCP_AM_HANDLER_PARAM_FIELD_FLAGS,
            ),
            id: id.into(),
            flags: ffi::UCP_AM_FLAG_WHOLE_MSG,
            cb: Some(am_trampoline),
            arg: arg.cast_mut().cast(),
        };
        // Keep the box before UCX may call it; it lives until the worker is destroyed.
        self.inner.am_handlers.lock().push(boxed);
        // SAFETY: live worker; `arg` points into a heap box kept in `am_handlers` until the
        // worker is destroyed, and `am_trampoline` treats it as `*const Box<AmHandler>`.
        let status = unsafe { ucp().ucp_worker_set_am_recv_handler(self.inner.handle, &params) };
        check(
            "ucx am handler",
            "ucp_worker_set_am_recv_handler failed",
            status,
        )
    }

    /// Sets `hook` (once per worker) to run after every [`Worker::progress`] call — by any
    /// thread, the progress thread included — that handled events: incoming traffic that UCX
    /// applied to this process's memory (emulated puts and atomics from peers) is visible when
    /// it runs. Like an active-message handler it runs inside progress: keep it short and never
    /// block or call UCX from it.
    pub fn on_progress<F>(&self, hook: F) -> Result<()>
    where
        F: Fn() + Send + Sync + 'static,
    {
        self.inner.on_progress.set(Box::new(hook)).map_err(|_| {
            Error::new(
                ErrorKind::InvalidState,
                "ucx progress hook",
                "this worker already has a progress hook; set it once, before traffic starts",
            )
        })
    }

    /// Sets the hook that runs when a request of this worker has waited [`SLOW_REQUEST`] with
    /// no event (no progress from its peer), with that peer's rank (None for a flush, which
    /// waits for every peer's): the transport asks the peer to serve ([`Worker::serve_now`] on
    /// its side). Again after each such silence; set it once, before traffic starts.
    pub fn on_slow_request<F>(&self, hook: F) -> Result<()>
    where
        F: Fn(Option<usize>) + Send + Sync + 'static,
    {
        self.inner.on_slow_request.set(Box::new(hook)).map_err(|_| {
            Error::new(
                ErrorKind::InvalidState,
                "ucx slow-request hook",
                "this worker already has a slow-request hook; set it once",
            )
        })
    }

    /// Test-only: how long the progress thread stands down between looks (see
    /// [`LOOK_BACKSTOP`]), from its next stand-down on.
    #[cfg(test)]
    pub(crate) fn set_look_backstop(&self, backstop: Duration) {
        let nanos = u64::try_from(backstop.as_nanos()).unwrap_or(u64::MAX);
        self.inner
            .handover
            .look_backstop
            .store(nanos, Ordering::Relaxed);
    }

    /// Has the progress thread serve the worker's events now, even while callers say they serve
    /// them (one eventfd write): a peer's request has waited for this PE's progress
    /// ([`Worker::on_slow_request`] on the peer's side). The thread is woken whether it stands
    /// down or sleeps armed: an armed sleep on the event fd was seen to miss a peer's get (the
    /// thread slept 1.8 ms through it and through the peer's requests, a ring wakes it).
    pub fn serve_now(&self) {
        self.inner.handover.take_over_now();
    }

    /// Orders operations: those issued on this worker before the fence complete at their
    /// targets before any issued after it (`ucp_worker_fence`, the transport's fence). Does
    /// not wait.
    pub fn fence(&self) -> Result<()> {
        // SAFETY: live worker.
        let status = unsafe { ucp().ucp_worker_fence(self.inner.handle) };
        check("ucx fence", "ucp_worker_fence failed", status)
    }

    /// Waits until every put and posted atomic issued on the endpoints of this worker has
    /// completed remotely (`ucp_worker_flush_nbx`, the transport's quiet); returns at once when
    /// none was issued since the last flush that completed ([`Worker::has_unflushed`]).
    /// Non-blocking gets complete with their [`Request::wait`], and active messages are the
    /// caller's to confirm (the transport's quiet probes the peers it sent messages to).
    pub fn flush(&self, deadline: Instant) -> Result<()> {
        const OP: &str = "ucx quiet";
        // Every operation counted before this load was issued before the flush below, which
        // completes it; one counted after it is another thread's, which this flush need not
        // cover (its own flush will).
        let issued = self.inner.issued.load(Ordering::Acquire);
        if self.inner.flushed.load(Ordering::Acquire) >= issued {
            return Ok(());
        }
        let started = Instant::now();
        let param = ffi::ucp_request_param_t::default();
        // SAFETY: live worker; param is a valid request description with no callback.
        let result = unsafe { ucp().ucp_worker_flush_nbx(self.inner.handle, &param) };
        match self.inner.wait_flush(result, deadline, None) {
            Ok(ffi::UCS_OK) => {
                self.inner.flushed.fetch_max(issued, Ordering::AcqRel);
                Ok(())
            }
            Ok(status) => Err(ucx_error(OP, "ucp_worker_flush_nbx failed", status)),
            Err(request) => {
                // No caller buffer is involved: let UCX release the request when it completes.
                // SAFETY: live request of this worker, released exactly once.
                unsafe { ucp().ucp_request_free(request) };
                Err(deadline_error(
                    OP,
                    started,
                    "outstanding UCX operations did not complete",
                ))
            }
        }
    }

    /// Whether a put or posted atomic was issued since the last [`Worker::flush`] that
    /// completed (one of another thread's may be counted too: its flush is then not skipped).
    pub fn has_unflushed(&self) -> bool {
        self.inner.flushed.load(Ordering::Acquire) < self.inner.issued.load(Ordering::Acquire)
    }

    /// Starts a thread that sleeps on the worker's event fd and progresses the worker whenever
    /// it fires, so peers' AM-emulated RMA and atomics complete while this PE's threads compute.
    /// Stops and joins when the returned value drops.
    ///
    /// While callers serve the worker themselves (between [`Worker::begin_serving`] and
    /// [`Worker::end_serving`], inside every blocking call of this module, or having called
    /// [`Worker::progress`] within [`RECENT_CALLER`]), the thread stands down: it does not arm
    /// the event fd (each event would wake it, and it would take the worker's lock from the
    /// caller that polls for that very event) and sleeps until a caller hands over
    /// ([`Worker::end_serving`]), a peer asks ([`Worker::serve_now`]: its request has waited
    /// [`SLOW_REQUEST`] for this PE's progress, so the callers stopped serving or stalled), or
    /// [`LOOK_BACKSTOP`] passes. It does not look on a timer while callers serve: each look
    /// preempts a polling caller on a busy core (looks every 800 µs cost a 2-PE ping-pong over
    /// TCP 6-7 % of its rate, every 200 µs a stream of 8-byte gets a fifth). A look
    /// progresses the worker until idle (a caller that says it serves may be descheduled)
    /// unless a caller progressed within [`RECENT_CALLER`]: that caller polls the same events,
    /// and a look would only take the worker's lock from it. It serves events again at the
    /// first look that finds no caller serving, or at once after a hand-over or a request.
    pub fn start_progress_thread(&self) -> Result<ProgressThread> {
        let stop = Arc::new(AtomicBool::new(false));
        let worker = self.inner.clone();
        let thread_stop = stop.clone();
        let thread = std::thread::Builder::new()
            .name("hm-ucx-progress".into())
            .spawn(move || progress_loop(&worker, &thread_stop))
            .map_err(|e| Error::backend("ucx progress thread", "spawning it failed", e))?;
        Ok(ProgressThread {
            stop,
            worker: self.inner.clone(),
            thread: Some(thread),
        })
    }
}

/// Who serves a worker's events: callers that progress it, or its progress thread.
struct Handover {
    /// The origin of `last_call`'s times.
    epoch: Instant,
    /// When a caller last progressed the worker: nanoseconds since `epoch` (0: never), as of
    /// one of its last [`CALLS_PER_CLOCK_READ`] progresses.
    last_call: AtomicU64,
    /// Callers' progresses, counted (not exactly: two callers at once may count one) so that
    /// the clock is read on every [`CALLS_PER_CLOCK_READ`]th.
    calls: AtomicU64,
    /// The progress thread sleeps on `wake` alone, leaving events to the callers.
    standing_down: AtomicBool,
    /// A caller asked the progress thread to serve events again ([`Worker::end_serving`]).
    take_over: AtomicBool,
    /// Ends the progress thread's sleep (a hand-over, or its stop).
    wake: OwnedFd,
    /// Callers between [`Worker::begin_serving`] and [`Worker::end_serving`].
    serving: AtomicUsize,
    /// [`LOOK_BACKSTOP`] in nanoseconds (tests lengthen it, so that only a peer's request can
    /// end a stand-down).
    look_backstop: AtomicU64,
}

/// A caller's [`Worker::begin_serving`] that ends (without a hand-over) when it drops.
struct ServingGuard<'a>(&'a Handover);

impl<'a> ServingGuard<'a> {
    fn begin(handover: &'a Handover) -> ServingGuard<'a> {
        handover.begin_serving();
        ServingGuard(handover)
    }
}

impl Drop for ServingGuard<'_> {
    fn drop(&mut self) {
        self.0.end_serving(false);
    }
}

impl Handover {
    /// Nanoseconds since `epoch`, at least 1.
    fn now(&self) -> u64 {
        super::nanos_since(self.epoch)
    }

    /// Records a caller's progress, reading the clock on the first of every
    /// [`CALLS_PER_CLOCK_READ`] (each read was 3 % of a 2-PE barrier's CPU time over TCP, whose
    /// waiter progresses every few hundred nanoseconds). The time recorded is then that many
    /// progresses old at most: microseconds for a caller that polls, longer for one that
    /// progresses now and then. An older time can only make the progress thread serve where it
    /// could have stood down, never stand down while no caller progresses.
    #[inline]
    fn called(&self) {
        let calls = self.calls.load(Ordering::Relaxed);
        self.calls.store(calls.wrapping_add(1), Ordering::Relaxed);
        if calls % CALLS_PER_CLOCK_READ == 0 {
            self.last_call.store(self.now(), Ordering::Relaxed);
        }
    }

    /// How long ago a caller last progressed the worker (from `epoch` if none ever did).
    fn since_last_call(&self) -> Duration {
        let last = self.last_call.load(Ordering::Relaxed);
        Duration::from_nanos(self.now().saturating_sub(last))
    }

    /// See [`Worker::begin_serving`].
    fn begin_serving(&self) {
        self.serving.fetch_add(1, Ordering::SeqCst);
    }

    /// See [`Worker::end_serving`].
    fn end_serving(&self, hand_over: bool) {
        let before = self.serving.fetch_sub(1, Ordering::SeqCst);
        debug_assert!(before > 0, "end_serving without a begin_serving");
        if hand_over {
            self.hand_over();
        }
    }

    /// Has the progress thread serve events again: at once if it stands down (woken), else at
    /// its next round. The store comes before the look at `standing_down`, and the thread
    /// stores `standing_down` before it looks at `take_over` (both SeqCst): either it sees the
    /// request before it sleeps, or this sees it standing down and wakes it.
    ///
    /// The callers' last progress stops counting as recent (`last_call` back to never): a
    /// waiter that served peers as it looked hands over as it leaves to compute, and the thread
    /// must not take its last looks for a caller still polling and stand down again at the
    /// next event (the release store before `take_over` orders it for the thread's swap). The
    /// next caller's progress records its time at once (`calls` back to 0), so that a caller
    /// that polls again has the thread stand down as before.
    fn hand_over(&self) {
        self.calls.store(0, Ordering::Relaxed);
        self.last_call.store(0, Ordering::Relaxed);
        self.take_over.store(true, Ordering::SeqCst);
        if self.standing_down.load(Ordering::SeqCst) {
            self.ring();
        }
    }

    /// [`Handover::hand_over`] that also wakes the thread when it sleeps armed (see
    /// [`Worker::serve_now`]).
    fn take_over_now(&self) {
        self.take_over.store(true, Ordering::SeqCst);
        self.ring();
    }

    fn ring(&self) {
        // A write of 1 makes the eventfd readable, which ends the thread's poll at once.
        let _ = rustix::io::write(&self.wake, &1u64.to_ne_bytes());
    }
}

fn progress_loop(worker: &WorkerHandle, stop: &AtomicBool) {
    let handover = &worker.handover;
    let wake = handover.wake.as_fd();
    // Whether the last round served (or woke to serve) rather than stood down.
    let mut served = true;
    while !stop.load(Ordering::Acquire) {
        // A stand-down look that finds a caller progressing just now leaves the events to it:
        // progressing too would only take the worker's lock from that caller (or wait for it,
        // when this thread preempted it holding the lock).
        let caller_polls = !served
            && !handover.take_over.load(Ordering::SeqCst)
            && handover.since_last_call() < RECENT_CALLER;
        if !caller_polls {
            while worker.progress_events() != 0 {}
        }
        let take_over = handover.take_over.swap(false, Ordering::SeqCst);
        let caller_serves = handover.serving.load(Ordering::SeqCst) != 0
            || handover.since_last_call() < RECENT_CALLER;
        if caller_serves && !take_over {
            handover.standing_down.store(true, Ordering::SeqCst);
            if !handover.take_over.load(Ordering::SeqCst) {
                let backstop = handover.look_backstop.load(Ordering::Relaxed);
                sleep_on([wake], Duration::from_nanos(backstop));
            }
            handover.standing_down.store(false, Ordering::SeqCst);
            drain(wake);
            served = false;
            continue;
        }
        served = true;
        match worker.arm() {
            Ok(true) => {
                worker.sleep(wake, PROGRESS_SLEEP_CAP);
                drain(wake);
            }
            Ok(false) => std::thread::yield_now(),
            Err(error) => {
                tracing::warn!("progress thread: {error}");
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
}

/// Sleeps until one of `fds` is readable or `timeout` passes.
fn sleep_on<const N: usize>(fds: [BorrowedFd<'_>; N], timeout: Duration) {
    let mut polled = fds.each_ref().map(|fd| PollFd::new(fd, PollFlags::IN));
    // EINTR and friends: the caller re-checks its state and deadline either way.
    let _ = poll(&mut polled, Some(&timespec(timeout)));
}

/// Empties a nonblocking eventfd (empty already is fine).
fn drain(eventfd: BorrowedFd<'_>) {
    let mut counter = [0u8; 8];
    let _ = rustix::io::read(eventfd, &mut counter);
}

fn timespec(duration: Duration) -> Timespec {
    Timespec {
        tv_sec: i64::try_from(duration.as_secs()).unwrap_or(i64::MAX),
        tv_nsec: duration.subsec_nanos().into(),
    }
}

/// A thread that progresses a [`Worker`] whenever its event fd fires (see
/// [`Worker::start_progress_thread`]); dropping it stops and joins the thread.
pub struct ProgressThread {
    stop: Arc<AtomicBool>,
    worker: Arc<WorkerHandle>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for ProgressThread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProgressThread").finish_non_exhaustive()
    }
}

impl Drop for ProgressThread {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        self.worker.handover.ring();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// UCX's active-message callback: forwards to the Rust handler `arg` points at.
unsafe extern "C" fn am_trampoline(
    arg: *mut c_void,
    header: *const c_void,
    header_length: usize,
    data: *mut c_void,
    length: usize,
    param: *const ffi::ucp_am_recv_param_t,
) -> ffi::ucs_status_t {
    // SAFETY: UCX passes back the `arg` registered in set_am_handler: a `*const Box<AmHandler>`
    // kept alive until the worker is destroyed.
    let handler = unsafe { &*arg.cast::<Box<AmHandler>>() };
    // SAFETY: UCX passes a valid parameter block for the duration of the callback.
    let recv_attr = unsafe { (*param).recv_attr };
    if recv_attr & u64::from(ffi::UCP_AM_RECV_ATTR_FLAG_RNDV) != 0 {
        // Our senders force the eager protocol; a rendezvous message came from elsewhere.
        tracing::warn!("dropped a rendezvous active message ({length} bytes): not supported");
        return ffi::UCS_OK;
    }
    let as_slice = |pointer: *const c_void, len: usize| -> &[u8] {
        if len == 0 || pointer.is_null() {
            &[]
        } else {
            // SAFETY: UCX guarantees `len` readable bytes at `pointer` during the callback
            // (eager data); the slice does not escape the callback.
            unsafe { std::slice::from_raw_parts(pointer.cast::<u8>(), len) }
        }
    };
    let header = as_slice(header, header_length);
    let data = as_slice(data, length);
    // SAFETY: as above; the reply endpoint is UCX's and valid during the callback.
    let reply_ep = unsafe { (*param).reply_ep };
    let reply = (recv_attr & u64::from(ffi::UCP_AM_RECV_ATTR_FIELD_REPLY_EP) != 0
        && !reply_ep.is_null())
    .then_some(Reply { endpoint: reply_ep });
    if catch_unwind(AssertUnwindSafe(|| handler(header, data, reply.as_ref()))).is_err() {
        tracing::error!("an active-message handler panicked; the message was dropped");
    }
    // UCS_OK: we did not keep the data, UCX may release it.
    ffi::UCS_OK
}

/// The sender of a request being handled ([`Worker::set_am_request_handler`]): valid only
/// inside the handler, which may answer it without waiting.
pub struct Reply {
    endpoint: ffi::ucp_ep_h,
}

/// What a reply's send keeps until UCX completes it: its header and the mapping its data lies in.
struct ReplyHeld {
    header: Vec<u8>,
    _mapping: Arc<SharedMapping>,
}

impl ReplyHeld {
    fn new(header: &[u8], mapping: &Arc<SharedMapping>) -> ReplyHeld {
        #[cfg(feature = "fault-injection")]
        REPLIES_HOLDING.fetch_add(1, Ordering::SeqCst);
        ReplyHeld {
            header: header.to_vec(),
            _mapping: Arc::clone(mapping),
        }
    }
}

/// Test-only (`fault-injection` builds): the replies of this process whose send still holds
/// its mapping ([`Reply::send_mapped`]), so a test can see one in flight and see it released.
#[cfg(feature = "fault-injection")]
static REPLIES_HOLDING: AtomicUsize = AtomicUsize::new(0);

#[cfg(feature = "fault-injection")]
impl Drop for ReplyHeld {
    fn drop(&mut self) {
        REPLIES_HOLDING.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Test-only (`fault-injection` builds): how many of this process's replies still hold their
/// mapping (sent with [`Reply::send_mapped`], not yet completed or failed by UCX).
#[cfg(feature = "fault-injection")]
pub fn replies_holding_a_mapping() -> usize {
    REPLIES_HOLDING.load(Ordering::SeqCst)
}

impl Reply {
    /// Sends `len` bytes at `offset` of `mapping` as active message `id` with `header` to the
    /// requester (eager protocol), without waiting: the send holds the mapping and a copy of the
    /// header until UCX completes it (or fails it, as when the endpoint closes).
    pub fn send_mapped(
        &self,
        id: u16,
        header: &[u8],
        mapping: &Arc<SharedMapping>,
        offset: usize,
        len: usize,
    ) -> Result<()> {
        const OP: &str = "ucx reply";
        let data = mapping.range_address(offset, len).ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidArgument,
                OP,
                format!("{len} bytes at {offset} are outside the mapping"),
            )
        })?;
        let held = Box::into_raw(Box::new(ReplyHeld::new(header, mapping)));
        let param = ffi::ucp_request_param_t {
            op_attr_mask: ffi::UCP_OP_ATTR_FIELD_FLAGS
                | ffi::UCP_OP_ATTR_FIELD_CALLBACK
                | ffi::UCP_OP_ATTR_FIELD_USER_DATA,
            flags: ffi::UCP_AM_SEND_FLAG_EAGER,
            cb: ffi::ucp_request_param_t__bindgen_ty_1 {
                send: Some(reply_sent),
            },
            user_data: held.cast(),
            ..Default::default()
        };
        // SAFETY: `self.endpoint` is UCX's reply endpoint, valid during the handler that holds
        // this value; the header and data stay valid until completion (`held` keeps the header
        // and the mapping; `reply_sent` releases them), or until this call fails or completes
        // at once (released below).
        let result = unsafe {
            let header = &(*held).header;
            ucp().ucp_am_send_nbx(
                self.endpoint,
                id.into(),
                header.as_ptr().cast(),
                header.len(),
                data.cast_const().cast(),
                len,
                &param,
            )
        };
        if ffi::ucs_ptr_is_ptr(result) {
            return Ok(());
        }
        // SAFETY: completed at once or failed: UCX will not call `reply_sent`, so `held` is
        // still ours, released once here.
        drop(unsafe { Box::from_raw(held) });
        if ffi::ucs_ptr_is_err(result) {
            return Err(ucx_error(
                OP,
                "ucp_am_send_nbx failed",
                ffi::ucs_ptr_status(result),
            ));
        }
        Ok(())
    }
}

/// UCX's completion callback of a [`Reply::send_mapped`]: releases what the send held and the
/// request.
unsafe extern "C" fn reply_sent(
    request: *mut c_void,
    _status: ffi::ucs_status_t,
    user_data: *mut c_void,
) {
    // SAFETY: `user_data` is the `ReplyHeld` box `send_mapped` leaked for this request, released
    // only here (UCX calls this once); the request is complete and freed once.
    unsafe {
        drop(Box::from_raw(user_data.cast::<ReplyHeld>()));
        ucp().ucp_request_free(request);
    }
}

/// Callers' buffers that active-message handlers fill, by token: a caller lends its buffer for
/// the length of a closure (in which it waits), handlers on any thread copy messages' bytes
/// into it, and when the closure returns (or unwinds) the buffer is taken back — after any copy
/// under way — so no handler touches it again. A message for a token no longer lent is dropped.
#[derive(Default)]
pub struct Landings {
    lent: Mutex<rustc_hash::FxHashMap<u64, Landing>>,
    next: AtomicU64,
}

impl std::fmt::Debug for Landings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Landings")
            .field("lent", &self.lent.lock().len())
            .finish_non_exhaustive()
    }
}

/// One lent buffer: where it starts, its length, and how many bytes have landed in it.
struct Landing {
    start: *mut u8,
    len: usize,
    landed: usize,
}

// SAFETY: the pointer is only written through under `Landings::lent`'s lock, while the lender's
// borrow of the target lasts (`Landings::lend` removes it before returning).
unsafe impl Send for Landing {}

/// A lent buffer, as its lender sees it while it waits.
pub struct Lent<'a> {
    landings: &'a Landings,
    token: u64,
}

impl Lent<'_> {
    /// The token a handler fills this buffer under.
    pub fn token(&self) -> u64 {
        self.token
    }

    /// Whether every byte of the buffer has landed.
    pub fn is_full(&self) -> bool {
        self.landings
            .lent
            .lock()
            .get(&self.token)
            .is_some_and(|landing| landing.landed >= landing.len)
    }
}

impl Landings {
    /// Lends `buffer` to handlers for the length of `wait`, under the token `wait` is given.
    pub fn lend<R>(&self, mut buffer: LocalTarget<'_>, wait: impl FnOnce(&Lent<'_>) -> R) -> R {
        /// Takes the buffer back on return and on unwind.
        struct TakeBack<'a>(Lent<'a>);
        impl Drop for TakeBack<'_> {
            fn drop(&mut self) {
                self.0.landings.lent.lock().remove(&self.0.token);
            }
        }
        let token = self.next.fetch_add(1, Ordering::Relaxed);
        let landing = Landing {
            len: buffer.len(),
            start: buffer.as_mut_ptr(),
            landed: 0,
        };
        self.lent.lock().insert(token, landing);
        let lent = TakeBack(Lent {
            landings: self,
            token,
        });
        wait(&lent.0)
    }

    /// Copies `data` to `at` of the buffer lent under `token`. False (and nothing copied) when
    /// no buffer is lent under it any more or the bytes do not fit.
    pub fn fill(&self, token: u64, at: usize, data: &[u8]) -> bool {
        let mut lent = self.lent.lock();
        let Some(landing) = lent.get_mut(&token) else {
            return false;
        };
        if at
            .checked_add(data.len())
            .map_or(true, |end| end > landing.len)
        {
            return false;
        }
        // SAFETY: in bounds (checked); the buffer is lent (its lender's borrow of the target
        // lasts until it removes the entry, which this lock excludes; a target is writable
        // for its length while borrowed), and `data` is UCX's message memory, not the buffer.
        unsafe {
            ptr::copy_nonoverlapping(data.as_ptr(), landing.start.add(at), data.len());
        }
        landing.landed += data.len();
        true
    }
}

// ---------------------------------------------------------------------------------------------
// Endpoints
// ---------------------------------------------------------------------------------------------

/// What the error handler records about an endpoint.
struct EndpointFailure {
    /// UCS_OK while healthy; the first error status otherwise.
    status: AtomicI8,
    peer: usize,
}

/// Status recorded when *we* force-closed the endpoint after a missed deadline.
const CLOSED_AFTER_TIMEOUT: ffi::ucs_status_t = ffi::UCS_ERR_TIMED_OUT;

unsafe extern "C" fn endpoint_error_handler(
    arg: *mut c_void,
    _ep: ffi::ucp_ep_h,
    status: ffi::ucs_status_t,
) {
    // SAFETY: `arg` is the EndpointFailure registered at ucp_ep_create, kept alive (by the
    // endpoint, or leaked) until UCX has closed the endpoint.
    let failure = unsafe { &*arg.cast::<EndpointFailure>() };
    let _ =
        failure
            .status
            .compare_exchange(ffi::UCS_OK, status, Ordering::AcqRel, Ordering::Acquire);
    tracing::debug!(
        "UCX endpoint to rank {} failed: {}",
        failure.peer,
        status_name(status)
    );
}

/// A request that outlived its owner: freed once UCX completes it (its buffer with it).
struct Orphan {
    request: ffi::ucs_status_ptr_t,
    _buffer: Box<dyn std::any::Any + Send>,
}

/// Aborts the process if dropped by a panic that began after it was made (see
/// [`EndpointHandle::complete`]); a wait made during an earlier unwind (a destructor's) that
/// returns normally passes.
struct AbortOnUnwind<'a> {
    operation: &'a str,
    unwinding_before: bool,
}

impl<'a> AbortOnUnwind<'a> {
    fn new(operation: &'a str) -> Self {
        AbortOnUnwind {
            operation,
            unwinding_before: std::thread::panicking(),
        }
    }
}

impl Drop for AbortOnUnwind<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() && !self.unwinding_before {
            abort_for(&format!(
                "a panic unwound out of the wait for a UCX {} that may still use its memory",
                self.operation
            ));
        }
    }
}

/// Says why on stderr (ignoring a failed write: this must not panic) and aborts the process.
fn abort_for(why: &str) -> ! {
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "hyper_multicore: {why}; aborting rather than risk memory corruption"
    );
    std::process::abort()
}

/// A heap buffer UCX reads or writes during a blocking call instead of the caller's memory, so
/// that a missed deadline can hand it to the endpoint (as an [`Orphan`]) rather than leave UCX
/// pointing into the caller's stack. 8-byte aligned (atomics use it too).
struct Staging(Vec<u64>);

impl Staging {
    fn zeroed(len: usize) -> Staging {
        Staging(vec![0; len.div_ceil(8)])
    }

    /// A staging copy of `source` (counted as bounced: [`count_bounced`]).
    fn copy_of(source: LocalSource<'_>) -> Staging {
        let len = source.len();
        let mut staging = Staging::zeroed(len);
        source.copy_into(&mut staging.bytes_mut()[..len]);
        count_bounced(len);
        staging
    }

    fn bytes(&self) -> &[u8] {
        bytemuck::cast_slice(&self.0)
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        bytemuck::cast_slice_mut(&mut self.0)
    }

    fn as_mut_ptr(&mut self) -> *mut u8 {
        self.0.as_mut_ptr().cast()
    }
}

struct EndpointHandle {
    /// NULL once closed.
    handle: Mutex<ffi::ucp_ep_h>,
    failure: Arc<EndpointFailure>,
    detects_peer_failure: bool,
    orphans: Mutex<Vec<Orphan>>,
    worker: Arc<WorkerHandle>,
}

// SAFETY: the worker is MULTI-threaded, so the endpoint handle may be used from any thread; the
// handle itself is behind a mutex so closing it cannot race a use.
unsafe impl Send for EndpointHandle {}
// SAFETY: as above.
unsafe impl Sync for EndpointHandle {}

impl EndpointHandle {
    fn peer(&self) -> usize {
        self.failure.peer
    }

    /// Counts an operation just issued that only a flush completes at the peer, and its
    /// `bytes` put, for the next flush's spin phase ([`WorkerHandle::wait_flush`]).
    fn count_unflushed(&self, bytes: usize) {
        self.worker.unflushed.fetch_add(bytes, Ordering::Relaxed);
        self.worker.issued.fetch_add(1, Ordering::Release);
    }

    /// The error for a request or call that failed with `status`: PeerLost when the endpoint is
    /// known to be broken, Backend otherwise.
    fn error(&self, operation: &str, what: &str, status: ffi::ucs_status_t) -> Error {
        match self.failure.status.load(Ordering::Acquire) {
            ffi::UCS_OK => {
                let is_peer_failure = matches!(
                    status,
                    ffi::UCS_ERR_CONNECTION_RESET
                        | ffi::UCS_ERR_ENDPOINT_TIMEOUT
                        | ffi::UCS_ERR_UNREACHABLE
                        | ffi::UCS_ERR_CANCELED
                ) || (ffi::UCS_ERR_LAST_ENDPOINT_FAILURE
                    ..=ffi::UCS_ERR_FIRST_ENDPOINT_FAILURE)
                    .contains(&status)
                    || (ffi::UCS_ERR_LAST_LINK_FAILURE..=ffi::UCS_ERR_FIRST_LINK_FAILURE)
                        .contains(&status);
                if is_peer_failure {
                    Error::peer_lost(
                        operation,
                        self.peer(),
                        &format!("{what}: UCX reports {}", status_name(status)),
                    )
                } else {
                    ucx_error(operation, what, status).with_peer(self.peer())
                }
            }
            CLOSED_AFTER_TIMEOUT => Error::new(
                ErrorKind::Timeout,
                operation,
                format!(
                    "the UCX endpoint to rank {} was closed after an earlier operation missed its \
                     deadline; the peer is treated as gone",
                    self.peer()
                ),
            )
            .with_peer(self.peer()),
            failed => Error::peer_lost(
                operation,
                self.peer(),
                &format!("UCX endpoint error: {}", status_name(failed)),
            ),
        }
    }

    /// The live handle, or the error every operation on a failed/closed endpoint returns.
    fn usable(&self, operation: &str) -> Result<parking_lot::MutexGuard<'_, ffi::ucp_ep_h>> {
        let status = self.failure.status.load(Ordering::Acquire);
        if status != ffi::UCS_OK {
            return Err(self.error(operation, "the endpoint failed earlier", status));
        }
        let guard = self.handle.lock();
        if guard.is_null() {
            return Err(Error::new(
                ErrorKind::InvalidState,
                operation,
                format!("the UCX endpoint to rank {} is closed", self.peer()),
            )
            .with_peer(self.peer()));
        }
        Ok(guard)
    }

    /// Closes the endpoint handle in `guard` (force or flush) and waits until `deadline`; on
    /// success frees every orphan. Err(status or timeout) leaves what UCX may still touch leaked.
    fn close_locked(
        &self,
        guard: &mut ffi::ucp_ep_h,
        force: bool,
        deadline: Instant,
    ) -> std::result::Result<(), Option<ffi::ucs_status_t>> {
        let handle = std::mem::replace(guard, ptr::null_mut());
        if handle.is_null() {
            return Ok(());
        }
        let param = ffi::ucp_request_param_t {
            op_attr_mask: ffi::UCP_OP_ATTR_FIELD_FLAGS,
            flags: if force {
                ffi::UCP_EP_CLOSE_FLAG_FORCE
            } else {
                0
            },
            ..Default::default()
        };
        // SAFETY: `handle` is the live endpoint, taken out of the mutex so it is closed once.
        let result = unsafe { ucp().ucp_ep_close_nbx(handle, &param) };
        let outcome = match self
            .worker
            .wait_status_ptr(result, deadline, Some(self.peer()))
        {
            Ok(ffi::UCS_OK) => Ok(()),
            // The peer may be gone already (flush close of a failed endpoint); the endpoint is
            // released anyway.
            Ok(status) => Err(Some(status)),
            Err(request) => {
                // SAFETY: live request; UCX finishes the close and releases it later.
                unsafe { ucp().ucp_request_free(request) };
                // The error handler may still run: its argument must outlive UCX's endpoint.
                std::mem::forget(self.failure.clone());
                Err(None)
            }
        };
        // Requests the close completed are freed; any other (UCX does not cancel requests of an
        // endpoint without peer-failure handling) keeps its buffer leaked.
        self.release_orphans(true);
        outcome
    }

    /// Blocking completion of a request. UCX reads or writes either `staging` (owned here) or,
    /// when `staging` is None, the caller's memory, which must not be touched after we return.
    ///
    /// At the deadline the endpoint is force-closed and the call fails with Timeout. A staged
    /// request becomes an orphan. An unstaged one must finish first: on an endpoint with
    /// peer-failure handling the force-close completes it (cancelled); callers stage on the
    /// others. Should UCX not complete it anyway, the process aborts rather than let UCX write
    /// into memory the caller has reused.
    #[allow(clippy::too_many_arguments)]
    fn complete(
        &self,
        mut guard: parking_lot::MutexGuard<'_, ffi::ucp_ep_h>,
        operation: &str,
        result: ffi::ucs_status_ptr_t,
        deadline: Instant,
        staging: Option<Staging>,
    ) -> Result<Option<Staging>> {
        // Done at once (most sends, posted atomics): no clock read on this path.
        if !ffi::ucs_ptr_is_ptr(result) {
            return match ffi::ucs_ptr_status(result) {
                ffi::UCS_OK => Ok(staging),
                status => Err(self.error(operation, "the operation failed", status)),
            };
        }
        let started = Instant::now();
        // UCX may use the memory until this returns: a panic unwinding out of the wait (a
        // progress hook's) would hand it back to the caller, or free the staging buffer.
        let _unwinding = AbortOnUnwind::new(operation);
        let request = match self
            .worker
            .wait_status_ptr(result, deadline, Some(self.peer()))
        {
            Ok(ffi::UCS_OK) => return Ok(staging),
            Ok(status) => return Err(self.error(operation, "the operation failed", status)),
            Err(request) => request,
        };
        // Missed the deadline with the request in flight.
        let _ = self.failure.status.compare_exchange(
            ffi::UCS_OK,
            CLOSED_AFTER_TIMEOUT,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
        let grace = Instant::now() + FORCE_CLOSE_GRACE;
        match staging {
            Some(staging) => {
                self.orphans.lock().push(Orphan {
                    request,
                    _buffer: Box::new(staging),
                });
                let _ = self.close_locked(&mut guard, true, grace);
            }
            None => {
                let _ = self.close_locked(&mut guard, true, grace);
                if self
                    .worker
                    .wait_request(request, grace, Some(self.peer()))
                    .is_err()
                {
                    // UCX still holds a pointer into the caller's memory and we cannot take it
                    // back: returning would let it write into memory the caller reuses.
                    abort_for(&format!(
                        "a UCX {operation} to rank {} neither completed nor was cancelled by a \
                         force-close",
                        self.peer()
                    ));
                }
            }
        }
        drop(guard);
        Err(deadline_error(
            operation,
            started,
            &format!(
                "UCX did not complete it; rank {} may be busy without a progress thread, hung or \
                 unreachable, so its endpoint was closed",
                self.peer()
            ),
        )
        .with_peer(self.peer()))
    }

    /// Frees orphans UCX has completed; with `finally` (the endpoint is closed) the rest are
    /// released to UCX with their buffers leaked, since UCX may still write into them.
    fn release_orphans(&self, finally: bool) {
        let mut orphans = self.orphans.lock();
        for orphan in std::mem::take(&mut *orphans) {
            // SAFETY: orphans are live requests not yet freed.
            let status = unsafe { ucp().ucp_request_check_status(orphan.request) };
            if status != ffi::UCS_INPROGRESS || finally {
                // SAFETY: freed exactly once (not put back); UCX releases an unfinished request
                // itself when it completes.
                unsafe { ucp().ucp_request_free(orphan.request) };
                if status == ffi::UCS_INPROGRESS {
                    std::mem::forget(orphan._buffer);
                }
            } else {
                orphans.push(orphan);
            }
        }
    }
}

impl Drop for EndpointHandle {
    fn drop(&mut self) {
        let mut guard = self.handle.lock();
        if !guard.is_null() {
            let deadline = Instant::now() + Duration::from_secs(1);
            if let Err(None) = self.close_locked(&mut guard, true, deadline) {
                tracing::warn!(
                    "the UCX endpoint to rank {} did not close within 1 s",
                    self.peer()
                );
            }
        }
        self.release_orphans(true);
    }
}

/// A connection to one peer's worker (`ucp_ep_create` with peer error handling).
///
/// `Send` but not `Sync`: one thread uses it at a time (wrap it in a mutex to share). Dropping it
/// force-closes the connection; [`Endpoint::close`] flushes first. Every blocking call takes a
/// deadline; see the module docs for what a missed deadline does to the endpoint.
pub struct Endpoint {
    inner: Arc<EndpointHandle>,
    _not_sync: PhantomData<std::cell::Cell<()>>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("peer", &self.inner.peer())
            .finish_non_exhaustive()
    }
}

/// 32- and 64-bit words UCX can update atomically.
pub trait AtomicWord: bytemuck::Pod + Default + Send + private::Sealed {}
impl AtomicWord for u32 {}
impl AtomicWord for u64 {}
mod private {
    pub trait Sealed {}
    impl Sealed for u32 {}
    impl Sealed for u64 {}
}

impl Endpoint {
    /// The peer rank this endpoint was connected to.
    pub fn peer(&self) -> usize {
        self.inner.peer()
    }

    /// Whether UCX reports a broken connection to this peer (see [`Worker::connect`]); when
    /// false, a dead peer shows up only as missed deadlines.
    pub fn detects_peer_failure(&self) -> bool {
        self.inner.detects_peer_failure
    }

    /// The first error UCX reported on this endpoint, if any (for diagnostics; every operation
    /// returns it as an error anyway).
    pub fn failure(&self) -> Option<Error> {
        let status = self.inner.failure.status.load(Ordering::Acquire);
        (status != ffi::UCS_OK).then(|| self.inner.error("ucx endpoint", "failed", status))
    }

    /// Unpacks a peer's [`MemoryRegion::rkey_bytes`] for use on this endpoint.
    pub fn unpack_rkey(&self, packed: &[u8]) -> Result<RemoteKey> {
        const OP: &str = "ucx unpack rkey";
        let guard = self.inner.usable(OP)?;
        if packed.is_empty() {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                OP,
                "empty remote key",
            ));
        }
        let mut rkey: ffi::ucp_rkey_h = ptr::null_mut();
        // SAFETY: live endpoint (guard held); `packed` is readable for the call (UCX parses
        // and validates it); writable out-pointer.
        let status = unsafe { ucp().ucp_ep_rkey_unpack(*guard, packed.as_ptr().cast(), &mut rkey) };
        if status != ffi::UCS_OK {
            return Err(self.inner.error(OP, "ucp_ep_rkey_unpack failed", status));
        }
        Ok(RemoteKey {
            handle: rkey,
            endpoint: self.inner.clone(),
        })
    }

    fn check_key(&self, operation: &str, rkey: &RemoteKey) -> Result<()> {
        if Arc::ptr_eq(&rkey.endpoint, &self.inner) {
            Ok(())
        } else {
            Err(Error::new(
                ErrorKind::InvalidArgument,
                operation,
                format!(
                    "the remote key was unpacked for the endpoint to rank {}, not rank {}",
                    rkey.endpoint.peer(),
                    self.peer()
                ),
            ))
        }
    }

    /// Writes `source` to `remote_addr` in the peer's region of `rkey`; returns when `source` may
    /// be reused (local completion). Remote visibility: [`Endpoint::flush`] / [`Worker::flush`].
    /// UCX reads `source` in place (it may be shared memory: UCX never forms a Rust reference).
    pub fn put<'a>(
        &self,
        source: impl Into<LocalSource<'a>>,
        remote_addr: u64,
        rkey: &RemoteKey,
        deadline: Instant,
    ) -> Result<()> {
        const OP: &str = "ucx put";
        let source = source.into();
        self.check_key(OP, rkey)?;
        let guard = self.inner.usable(OP)?;
        if source.is_empty() {
            return Ok(());
        }
        // Without peer-failure handling a missed deadline cannot cancel the request: stage.
        let mut staging = (!self.inner.detects_peer_failure).then(|| Staging::copy_of(source));
        let pointer = match staging.as_mut() {
            Some(staging) => staging.as_mut_ptr().cast_const(),
            None => source.as_ptr(),
        };
        let param = ffi::ucp_request_param_t::default();
        // SAFETY: live endpoint and rkey of it; `pointer` is `source` (readable for its length
        // while borrowed, until `complete` returns, which guarantees UCX no longer references
        // it) or the staging buffer that `complete` keeps or orphans.
        let result = unsafe {
            ucp().ucp_put_nbx(
                *guard,
                pointer.cast(),
                source.len(),
                remote_addr,
                rkey.handle,
                &param,
            )
        };
        self.inner.count_unflushed(source.len());
        self.inner
            .complete(guard, OP, result, deadline, staging)
            .map(drop)
    }

    /// Reads `destination.len()` bytes at `remote_addr` in the peer's region into `destination`
    /// (in place: it may be shared memory).
    pub fn get<'a>(
        &self,
        destination: impl Into<LocalTarget<'a>>,
        remote_addr: u64,
        rkey: &RemoteKey,
        deadline: Instant,
    ) -> Result<()> {
        const OP: &str = "ucx get";
        let mut destination = destination.into();
        self.check_key(OP, rkey)?;
        let guard = self.inner.usable(OP)?;
        if destination.is_empty() {
            return Ok(());
        }
        let len = destination.len();
        let mut staging = (!self.inner.detects_peer_failure).then(|| Staging::zeroed(len));
        let pointer = match staging.as_mut() {
            Some(staging) => staging.as_mut_ptr(),
            None => destination.as_mut_ptr(),
        };
        let param = ffi::ucp_request_param_t::default();
        // SAFETY: live endpoint and rkey; `pointer` is `destination` (writable for its length
        // while borrowed, until `complete` returns, which guarantees UCX no longer writes to it)
        // or the staging buffer that `complete` returns or orphans.
        let result = unsafe {
            ucp().ucp_get_nbx(
                *guard,
                pointer.cast(),
                len,
                remote_addr,
                rkey.handle,
                &param,
            )
        };
        if let Some(staging) = self.inner.complete(guard, OP, result, deadline, staging)? {
            destination.copy_from(&staging.bytes()[..len]);
            count_bounced(len);
        }
        Ok(())
    }

    /// Starts a put of `source` (owned until completion) without waiting; complete it with
    /// [`Request::wait`] or a flush.
    pub fn put_nb(&self, source: Vec<u8>, remote_addr: u64, rkey: &RemoteKey) -> Result<Request> {
        const OP: &str = "ucx put_nb";
        self.check_key(OP, rkey)?;
        let guard = self.inner.usable(OP)?;
        let param = ffi::ucp_request_param_t::default();
        // SAFETY: live endpoint and rkey; `source`'s heap buffer moves into the Request (or an
        // orphan) and is not freed before UCX completes the request.
        let result = unsafe {
            ucp().ucp_put_nbx(
                *guard,
                source.as_ptr().cast(),
                source.len(),
                remote_addr,
                rkey.handle,
                &param,
            )
        };
        drop(guard);
        self.inner.count_unflushed(source.len());
        self.request(OP, result, source)
    }

    /// Starts a get of `len` bytes at `remote_addr` into a buffer the [`Request`] owns and
    /// [`Request::wait`] returns.
    pub fn get_nb(&self, len: usize, remote_addr: u64, rkey: &RemoteKey) -> Result<Request> {
        const OP: &str = "ucx get_nb";
        self.check_key(OP, rkey)?;
        let guard = self.inner.usable(OP)?;
        let mut buffer = vec![0u8; len];
        let param = ffi::ucp_request_param_t::default();
        // SAFETY: as in put_nb; the buffer is written by UCX until the request completes.
        let result = unsafe {
            ucp().ucp_get_nbx(
                *guard,
                buffer.as_mut_ptr().cast(),
                len,
                remote_addr,
                rkey.handle,
                &param,
            )
        };
        drop(guard);
        self.request(OP, result, buffer)
    }

    fn request(
        &self,
        operation: &'static str,
        result: ffi::ucs_status_ptr_t,
        buffer: Vec<u8>,
    ) -> Result<Request> {
        self.inner.release_orphans(false);
        if ffi::ucs_ptr_is_err(result) {
            return Err(self.inner.error(
                operation,
                "the operation failed",
                ffi::ucs_ptr_status(result),
            ));
        }
        Ok(Request {
            request: ffi::ucs_ptr_is_ptr(result).then_some(result),
            buffer,
            operation,
            endpoint: self.inner.clone(),
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn atomic<T: AtomicWord>(
        &self,
        operation: &str,
        opcode: ffi::ucp_atomic_op_t,
        remote_addr: u64,
        rkey: &RemoteKey,
        operand: T,
        reply: Option<T>,
        deadline: Instant,
    ) -> Result<T> {
        self.check_key(operation, rkey)?;
        let size = std::mem::size_of::<T>();
        if remote_addr % size as u64 != 0 {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                operation,
                format!("remote address {remote_addr:#x} is not aligned to {size} bytes"),
            ));
        }
        let guard = self.inner.usable(operation)?;
        // Operand in word 0, reply in word 1 of 16 aligned bytes: on this stack frame when a
        // missed deadline can cancel the request (`complete` returns only once UCX is done
        // with them), else in a staging buffer that `complete` returns or orphans.
        let mut words = [0u64; 2];
        let mut staging = (!self.inner.detects_peer_failure).then(|| Staging::zeroed(16));
        let bytes = match staging.as_mut() {
            Some(staging) => staging.bytes_mut(),
            None => bytemuck::bytes_of_mut(&mut words),
        };
        bytes[..size].copy_from_slice(bytemuck::bytes_of(&operand));
        bytes[8..8 + size].copy_from_slice(bytemuck::bytes_of(&reply.unwrap_or_default()));
        let base = bytes.as_mut_ptr();
        let mut param = ffi::ucp_request_param_t {
            op_attr_mask: ffi::UCP_OP_ATTR_FIELD_DATATYPE,
            datatype: ffi::ucp_dt_make_contig(size),
            ..Default::default()
        };
        if reply.is_some() {
            param.op_attr_mask |= ffi::UCP_OP_ATTR_FIELD_REPLY_BUFFER;
            param.reply_buffer = base.wrapping_add(8).cast();
        }
        // SAFETY: live endpoint and rkey; operand and reply live in `words` (not touched again
        // before `complete` returns, which guarantees UCX no longer uses them) or in the
        // staging buffer, whose heap allocation `complete` returns or orphans (never frees
        // while UCX may use it); datatype matches T's size.
        let result = unsafe {
            ucp().ucp_atomic_op_nbx(
                *guard,
                opcode,
                base.cast_const().cast(),
                1,
                remote_addr,
                rkey.handle,
                &param,
            )
        };
        if reply.is_none() {
            // Posted: complete here, applied at the peer by the next flush.
            self.inner.count_unflushed(0);
        }
        let staging = self
            .inner
            .complete(guard, operation, result, deadline, staging)?;
        let bytes = match &staging {
            Some(staging) => staging.bytes(),
            None => bytemuck::bytes_of(&words),
        };
        Ok(bytemuck::pod_read_unaligned(&bytes[8..8 + size]))
    }

    /// Atomically reads the word at `remote_addr` (a fetch-add of 0).
    pub fn atomic_fetch<T: AtomicWord + From<u8>>(
        &self,
        remote_addr: u64,
        rkey: &RemoteKey,
        deadline: Instant,
    ) -> Result<T> {
        let zero = T::from(0);
        self.atomic(
            "ucx atomic fetch",
            ffi::UCP_ATOMIC_OP_ADD,
            remote_addr,
            rkey,
            zero,
            Some(zero),
            deadline,
        )
    }

    /// Atomically stores `value` at `remote_addr`.
    pub fn atomic_set<T: AtomicWord>(
        &self,
        remote_addr: u64,
        rkey: &RemoteKey,
        value: T,
        deadline: Instant,
    ) -> Result<()> {
        self.atomic(
            "ucx atomic set",
            ffi::UCP_ATOMIC_OP_SWAP,
            remote_addr,
            rkey,
            value,
            Some(T::default()),
            deadline,
        )
        .map(drop)
    }

    /// Atomically stores `value` at `remote_addr` and returns the previous value.
    pub fn atomic_swap<T: AtomicWord>(
        &self,
        remote_addr: u64,
        rkey: &RemoteKey,
        value: T,
        deadline: Instant,
    ) -> Result<T> {
        self.atomic(
            "ucx atomic swap",
            ffi::UCP_ATOMIC_OP_SWAP,
            remote_addr,
            rkey,
            value,
            Some(T::default()),
            deadline,
        )
    }

    /// Atomically stores `desired` at `remote_addr` if it holds `expected`; returns the value
    /// found (equal to `expected` when the swap happened).
    pub fn atomic_compare_swap<T: AtomicWord>(
        &self,
        remote_addr: u64,
        rkey: &RemoteKey,
        expected: T,
        desired: T,
        deadline: Instant,
    ) -> Result<T> {
        // UCX: buffer = compare value, reply buffer = new value in, old value out.
        self.atomic(
            "ucx atomic compare-swap",
            ffi::UCP_ATOMIC_OP_CSWAP,
            remote_addr,
            rkey,
            expected,
            Some(desired),
            deadline,
        )
    }

    /// Atomically adds `value` (wrapping) at `remote_addr`; returns the previous value.
    pub fn atomic_fetch_add<T: AtomicWord>(
        &self,
        remote_addr: u64,
        rkey: &RemoteKey,
        value: T,
        deadline: Instant,
    ) -> Result<T> {
        self.atomic(
            "ucx atomic fetch-add",
            ffi::UCP_ATOMIC_OP_ADD,
            remote_addr,
            rkey,
            value,
            Some(T::default()),
            deadline,
        )
    }

    /// Atomically adds `value` at `remote_addr` without fetching (remote completion at flush).
    pub fn atomic_add<T: AtomicWord>(
        &self,
        remote_addr: u64,
        rkey: &RemoteKey,
        value: T,
        deadline: Instant,
    ) -> Result<()> {
        self.atomic(
            "ucx atomic add",
            ffi::UCP_ATOMIC_OP_ADD,
            remote_addr,
            rkey,
            value,
            None,
            deadline,
        )
        .map(drop)
    }

    /// Sends an active message `id` with `header` and `data` (eager protocol) to the peer's
    /// handler; returns once the buffers may be reused.
    pub fn am_send(&self, id: u16, header: &[u8], data: &[u8], deadline: Instant) -> Result<()> {
        self.am_send_flagged(id, header, data.into(), deadline, 0)
    }

    /// [`Endpoint::am_send`] of bytes UCX reads in place (they may be shared memory).
    pub fn am_send_from(
        &self,
        id: u16,
        header: &[u8],
        data: LocalSource<'_>,
        deadline: Instant,
    ) -> Result<()> {
        self.am_send_flagged(id, header, data, deadline, 0)
    }

    /// [`Endpoint::am_send`] of a request: the peer's handler (set with
    /// [`Worker::set_am_request_handler`]) gets a [`Reply`] to answer it with.
    pub fn am_request(&self, id: u16, header: &[u8], deadline: Instant) -> Result<()> {
        let nothing: &[u8] = &[];
        self.am_send_flagged(
            id,
            header,
            nothing.into(),
            deadline,
            ffi::UCP_AM_SEND_FLAG_REPLY,
        )
    }

    fn am_send_flagged(
        &self,
        id: u16,
        header: &[u8],
        data: LocalSource<'_>,
        deadline: Instant,
        flags: u32,
    ) -> Result<()> {
        const OP: &str = "ucx am send";
        if header.len() > self.inner.worker.max_am_header {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                OP,
                format!(
                    "an active-message header of {} bytes exceeds UCX's limit of {}",
                    header.len(),
                    self.inner.worker.max_am_header
                ),
            ));
        }
        let guard = self.inner.usable(OP)?;
        // Without peer-failure handling a missed deadline cannot cancel the request: header and
        // data are copied into one staging buffer (AMs are small).
        let mut staging = (!self.inner.detects_peer_failure).then(|| {
            let mut staging = Staging::zeroed(header.len() + data.len());
            staging.bytes_mut()[..header.len()].copy_from_slice(header);
            data.copy_into(&mut staging.bytes_mut()[header.len()..header.len() + data.len()]);
            count_bounced(data.len());
            staging
        });
        let (header_at, data_at) = match staging.as_mut() {
            Some(staging) => {
                let base = staging.as_mut_ptr().cast_const();
                (base, base.wrapping_add(header.len()))
            }
            None => (header.as_ptr(), data.as_ptr()),
        };
        let param = ffi::ucp_request_param_t {
            op_attr_mask: ffi::UCP_OP_ATTR_FIELD_FLAGS,
            flags: ffi::UCP_AM_SEND_FLAG_EAGER | flags,
            ..Default::default()
        };
        // SAFETY: live endpoint; header and data are the caller's (borrowed, readable for their
        // lengths, until `complete` returns, which guarantees UCX no longer reads them) or live
        // in the staging buffer, which `complete` returns or orphans (never frees while UCX may
        // read it).
        let result = unsafe {
            ucp().ucp_am_send_nbx(
                *guard,
                id.into(),
                header_at.cast(),
                header.len(),
                data_at.cast(),
                data.len(),
                &param,
            )
        };
        self.inner
            .complete(guard, OP, result, deadline, staging)
            .map(drop)
    }

    /// Waits until every operation issued on this endpoint has completed at the peer
    /// (`ucp_ep_flush_nbx`); frees completed non-blocking requests that were dropped.
    pub fn flush(&self, deadline: Instant) -> Result<()> {
        const OP: &str = "ucx flush";
        let started = Instant::now();
        let guard = self.inner.usable(OP)?;
        let param = ffi::ucp_request_param_t::default();
        // SAFETY: live endpoint; no caller buffer is involved.
        let result = unsafe { ucp().ucp_ep_flush_nbx(*guard, &param) };
        drop(guard);
        match self
            .inner
            .worker
            .wait_flush(result, deadline, Some(self.inner.peer()))
        {
            Ok(ffi::UCS_OK) => {
                self.inner.release_orphans(false);
                Ok(())
            }
            Ok(status) => Err(self.inner.error(OP, "ucp_ep_flush_nbx failed", status)),
            Err(request) => {
                // SAFETY: live request, released once; UCX frees it when it completes.
                unsafe { ucp().ucp_request_free(request) };
                let failed = self.inner.failure.status.load(Ordering::Acquire);
                if failed != ffi::UCS_OK {
                    return Err(self.inner.error(OP, "flush", failed));
                }
                Err(deadline_error(
                    OP,
                    started,
                    &format!("operations to rank {} did not complete", self.peer()),
                )
                .with_peer(self.peer()))
            }
        }
    }

    /// What this endpoint's lanes do without the target's CPU: RMA, atomics. Over TCP neither:
    /// UCX emulates both with active messages on the endpoint's one active-message lane, and
    /// whichever target thread progresses its worker applies them, in the order sent — and runs
    /// the worker's [`Worker::on_progress`] hook right after. Shared-memory lanes do atomics
    /// (and, with CMA, RMA) with the CPU; RDMA devices do both in hardware. When UCX's
    /// description of the lanes cannot be read the answer is both (the safe one for a caller
    /// that must tell the target, or that relies on the emulation's order).
    ///
    /// Read from `ucp_ep_print_info` (UCX 1.13 has no query for an endpoint's lanes): a lane
    /// used for RMA is listed with an `rma` or `rma_bw` usage, one used for atomics with `amo`,
    /// one for active messages with `am` or `am_bw`.
    /// 50-190 µs: read it once per endpoint.
    pub fn lanes(&self) -> Lanes {
        match self.lane_description() {
            Ok(text) => Lanes::listed_in(&text),
            Err(error) => {
                tracing::debug!("cannot read the UCX endpoint's lanes: {error}");
                Lanes {
                    device_rma: true,
                    device_atomics: true,
                    one_message_lane: false,
                }
            }
        }
    }

    /// `ucp_ep_print_info` of this endpoint as text (written to a memfd through a stdio stream).
    fn lane_description(&self) -> std::io::Result<String> {
        use std::io::{Read, Seek, SeekFrom};
        use std::os::fd::{AsRawFd, IntoRawFd};

        let guard = self
            .inner
            .usable("ucx endpoint info")
            .map_err(std::io::Error::other)?;
        let memfd =
            rustix::fs::memfd_create("hm-ucx-endpoint-info", rustix::fs::MemfdFlags::CLOEXEC)?;
        // The stream gets a descriptor of its own (fclose closes it); both share one offset.
        let stream_fd = rustix::io::fcntl_dupfd_cloexec(&memfd, 0)?;
        // SAFETY: `stream_fd` is an open descriptor; on success the stream owns it (released
        // below), on failure it is still ours and dropping it closes it.
        let stream = unsafe { ucp().fdopen(stream_fd.as_raw_fd(), c"w".as_ptr()) };
        if stream.is_null() {
            return Err(std::io::Error::last_os_error());
        }
        let _owned_by_the_stream = stream_fd.into_raw_fd();
        // SAFETY: live endpoint (its lock held); `stream` is a writable stream, closed once
        // right after (which flushes it and closes its descriptor).
        unsafe {
            ucp().ucp_ep_print_info(*guard, stream);
            ucp().fclose(stream);
        }
        drop(guard);
        let mut file = std::fs::File::from(memfd);
        file.seek(SeekFrom::Start(0))?;
        let mut text = String::new();
        file.read_to_string(&mut text)?;
        Ok(text)
    }

    /// Closes the endpoint in order: flush, then disconnect (`ucp_ep_close_nbx`); a failed
    /// endpoint is force-closed instead. The peer must progress for the flush to finish.
    pub fn close(self, deadline: Instant) -> Result<()> {
        const OP: &str = "ucx close";
        let started = Instant::now();
        let failed = self.inner.failure.status.load(Ordering::Acquire) != ffi::UCS_OK;
        let mut guard = self.inner.handle.lock();
        match self.inner.close_locked(&mut guard, failed, deadline) {
            Ok(()) => Ok(()),
            Err(Some(status)) => Err(self.inner.error(OP, "ucp_ep_close_nbx failed", status)),
            Err(None) => Err(deadline_error(
                OP,
                started,
                &format!("the endpoint to rank {} did not close", self.peer()),
            )
            .with_peer(self.peer())),
        }
    }
}

/// A peer's memory key unpacked for one [`Endpoint`] (`ucp_ep_rkey_unpack`); pass it with a
/// remote address to that endpoint's put/get/atomics.
pub struct RemoteKey {
    handle: ffi::ucp_rkey_h,
    endpoint: Arc<EndpointHandle>,
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

/// A non-blocking put or get in flight; owns its buffer. Dropping it unfinished hands the buffer
/// to the endpoint, which frees it once UCX completes the request (at the next flush or close).
pub struct Request {
    /// None when UCX completed the operation immediately.
    request: Option<ffi::ucs_status_ptr_t>,
    buffer: Vec<u8>,
    operation: &'static str,
    endpoint: Arc<EndpointHandle>,
}

// SAFETY: requests of a MULTI-threaded worker may be checked and freed from any thread.
unsafe impl Send for Request {}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request")
            .field("operation", &self.operation)
            .field("in_flight", &self.request.is_some())
            .finish_non_exhaustive()
    }
}

impl Request {
    /// Progresses the worker once and tells whether the operation has completed.
    pub fn is_complete(&self) -> bool {
        match self.request {
            None => true,
            Some(request) => {
                self.endpoint.worker.progress();
                // SAFETY: live request, not freed until this value is dropped or waited.
                unsafe { ucp().ucp_request_check_status(request) != ffi::UCS_INPROGRESS }
            }
        }
    }

    /// Waits for completion; returns the buffer (the data read, for a get). At the deadline the
    /// request is handed to the endpoint (see the type docs) and a Timeout error returned.
    pub fn wait(mut self, deadline: Instant) -> Result<Vec<u8>> {
        let started = Instant::now();
        // The request stays in `self` until UCX has completed it (and `wait_request` freed
        // it): a panic unwinding out of the wait (from a progress or slow-request hook, which
        // run before that) drops `self` with it, and the drop orphans the buffer UCX still uses.
        let Some(request) = self.request else {
            return Ok(std::mem::take(&mut self.buffer));
        };
        let peer = Some(self.endpoint.peer());
        let outcome = self.endpoint.worker.wait_request(request, deadline, peer);
        if outcome.is_ok() {
            self.request = None;
        }
        match outcome {
            Ok(ffi::UCS_OK) => Ok(std::mem::take(&mut self.buffer)),
            Ok(status) => Err(self
                .endpoint
                .error(self.operation, "the operation failed", status)),
            Err(()) => Err(deadline_error(
                self.operation,
                started,
                &format!(
                    "the non-blocking operation to rank {} did not complete",
                    self.endpoint.peer()
                ),
            )
            .with_peer(self.endpoint.peer())),
        }
    }
}

impl Drop for Request {
    fn drop(&mut self) {
        let Some(request) = self.request.take() else {
            return;
        };
        // SAFETY: live request of this endpoint's worker.
        let status = unsafe { ucp().ucp_request_check_status(request) };
        if status != ffi::UCS_INPROGRESS {
            // SAFETY: completed; freed once.
            unsafe { ucp().ucp_request_free(request) };
            return;
        }
        self.endpoint.orphans.lock().push(Orphan {
            request,
            _buffer: Box::new(std::mem::take(&mut self.buffer)),
        });
    }
}

/// What an endpoint's lanes do without the target's CPU ([`Endpoint::lanes`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lanes {
    /// Some lane puts and gets without the target's progress (CMA, RDMA).
    pub device_rma: bool,
    /// Some lane does atomics without the target's progress (shared-memory CPU atomics, RDMA).
    pub device_atomics: bool,
    /// Exactly one lane carries active messages (`am` and `am_bw` usages on one lane): every
    /// active message, however many fragments, then arrives in the order sent.
    pub one_message_lane: bool,
}

impl Lanes {
    /// Whether every put, get and atomic to the peer is an active message on one lane that the
    /// peer's progress applies in the order sent (TCP): then a message of the caller's own on
    /// that lane is applied after every earlier operation and before every later one.
    pub fn all_by_target_progress(&self) -> bool {
        !self.device_rma && !self.device_atomics
    }

    /// The lanes `ucp_ep_print_info` text lists: `lane[…]` lines with a usage `rma`, `rma#n`,
    /// `rma_bw` or `rma_bw#n` (RMA), `amo` or `amo#n` (atomics).
    fn listed_in(text: &str) -> Lanes {
        let usages = || {
            text.lines()
                .filter(|line| line.contains("lane["))
                .flat_map(str::split_whitespace)
        };
        let named = |usage: &str, name: &str| {
            usage == name
                || usage
                    .strip_prefix(name)
                    .is_some_and(|rest| rest.starts_with('#'))
        };
        let message_lanes = text
            .lines()
            .filter(|line| line.contains("lane["))
            .filter(|line| {
                line.split_whitespace()
                    .any(|u| named(u, "am") || named(u, "am_bw"))
            })
            .count();
        Lanes {
            device_rma: usages().any(|u| named(u, "rma") || named(u, "rma_bw")),
            device_atomics: usages().any(|u| named(u, "amo")),
            one_message_lane: message_lanes == 1,
        }
    }
}

#[cfg(test)]
mod tests;
