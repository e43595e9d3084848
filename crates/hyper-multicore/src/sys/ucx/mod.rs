//! A small safe wrapper over OpenUCX's `ucp` API (bindings: the `hm-ucx-sys` crate): the
//! foundation of the UCX transport. Every `unsafe` block of the UCX route lives in this module:
//! `context`, `memory` (regions and remote keys), `worker`, `progress` (the progress thread),
//! `am` (active messages), `endpoint` and `request` (non-blocking operations).
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
/// slice, where a mutex puts the waiter to sleep and lets the holder run (docs/multinode.md).
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

mod am;
mod context;
mod endpoint;
mod memory;
mod progress;
mod request;
#[cfg(test)]
mod tests;
mod worker;

pub use am::*;
pub use context::*;
pub use endpoint::*;
pub use memory::*;
pub use progress::*;
pub use worker::*;
