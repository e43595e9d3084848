//! The worker: one per PE, thread mode MULTI; its address, progress, serving hand-over
//! (`begin_serving`/`end_serving`), active-message handlers, hooks, fence and flush.

use super::*;

/// An active-message handler: called with (header, data) from whichever thread progresses the
/// worker.
pub(super) type AmHandler = dyn Fn(&[u8], &[u8], Option<&Reply>) + Send + Sync + 'static;

pub(super) struct WorkerHandle {
    pub(super) handle: ffi::ucp_worker_h,
    /// The worker's event fd: owned by UCX, closed by ucp_worker_destroy.
    pub(super) event_fd: i32,
    pub(super) max_am_header: usize,
    /// Callers sleeping in `wait_request`, and the eventfd that wakes them when another thread's
    /// progress handled events (the progress thread may complete their request and consume the
    /// worker event they sleep on).
    pub(super) sleepers: AtomicUsize,
    pub(super) completions: OwnedFd,
    /// Whether callers or the progress thread serve the worker's events.
    pub(super) handover: Handover,
    /// Bytes put through the worker's endpoints since its last flush: how long a flush waits
    /// awake ([`WorkerHandle::wait_flush`]).
    pub(super) unflushed: AtomicUsize,
    /// Operations issued through the worker's endpoints that only a flush completes at the
    /// peer (puts and posted atomics), counted once issued. A non-blocking get is not: only its
    /// [`Request::wait`] hands its bytes over, and that waits for it.
    pub(super) issued: AtomicU64,
    /// The most operations ([`WorkerHandle::issued`]) a completed [`Worker::flush`] covered: a
    /// flush with nothing issued since is skipped (a barrier starts with a quiet).
    pub(super) flushed: AtomicU64,
    /// Every handler ever registered: UCX holds raw pointers to them until the worker dies. The
    /// outer box gives each (fat) handler a stable, thin address that survives the Vec growing.
    #[allow(clippy::vec_box)]
    pub(super) am_handlers: Mutex<Vec<Box<Box<AmHandler>>>>,
    /// Called after every `progress` that handled events (see [`Worker::on_progress`]).
    pub(super) on_progress: OnceLock<ProgressHook>,
    /// Called when a request has waited [`SLOW_REQUEST`] (see [`Worker::on_slow_request`]).
    pub(super) on_slow_request: OnceLock<SlowRequestHook>,
    pub(super) _context: Arc<ContextHandle>,
}

/// What [`Worker::on_progress`] runs after a progress call that handled events.
pub(super) type ProgressHook = Box<dyn Fn() + Send + Sync>;

/// See [`Worker::on_slow_request`]: returns whether to give the wait up.
pub(super) type SlowRequestHook = Box<dyn Fn(Option<usize>) -> bool + Send + Sync>;

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
    pub(super) fn progress(&self) -> usize {
        self.handover.called();
        self.progress_events()
    }

    pub(super) fn progress_events(&self) -> usize {
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
    pub(super) fn arm(&self) -> Result<bool> {
        // SAFETY: live worker created with UCP_FEATURE_WAKEUP.
        let status = unsafe { ucp().ucp_worker_arm(self.handle) };
        match status {
            ffi::UCS_OK => Ok(true),
            ffi::UCS_ERR_BUSY => Ok(false),
            other => Err(ucx_error("ucx progress", "ucp_worker_arm failed", other)),
        }
    }

    pub(super) fn event_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: UCX keeps the fd open until ucp_worker_destroy, which runs only when self
        // drops; the borrow cannot outlive self.
        unsafe { BorrowedFd::borrow_raw(self.event_fd) }
    }

    /// Sleeps until the worker's event fd (or `extra`) is readable or `timeout` passes.
    pub(super) fn sleep(&self, extra: BorrowedFd<'_>, timeout: Duration) {
        sleep_on([self.event_fd(), extra], timeout);
    }

    /// Drives the worker until `request` completes or `deadline` passes; Ok(status) when UCX
    /// completed it (the request is then freed), Err(()) at the deadline (still in flight).
    /// `peer` is the rank whose progress the request waits for (None: every peer's, a flush):
    /// once the wait has seen no event for [`SLOW_REQUEST`] (a large transfer that is moving
    /// is not slow), the slow-request hook hears of it, and again after each such silence.
    pub(super) fn wait_request(
        &self,
        request: ffi::ucs_status_ptr_t,
        deadline: Instant,
        peer: Option<usize>,
    ) -> std::result::Result<ffi::ucs_status_t, ()> {
        self.wait_request_spinning(request, deadline, peer, SPIN_PHASE)
    }

    /// [`WorkerHandle::wait_request`] with a spin phase of `spin` before the first sleep.
    pub(super) fn wait_request_spinning(
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
                    if hook(peer) {
                        // Given up as at the deadline: the caller cancels or releases it.
                        return Err(());
                    }
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
    pub(super) fn wait_status_ptr(
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
    /// half of an all-to-all — to the progress thread's wake-ups, one per arriving message.
    pub(super) fn wait_flush(
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
    pub(super) inner: Arc<WorkerHandle>,
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

    pub(super) fn connect_with(
        &self,
        address: &[u8],
        peer: usize,
        handle_failure: bool,
    ) -> Result<Endpoint> {
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
    /// its side). Again after each such silence; set it once, before traffic starts. When it
    /// returns true the wait ends as at its deadline: the transport's root was aborted (a PE
    /// lost, perhaps the very peer, whose host may be gone without a word), and nothing may
    /// wait for it until the runtime's deadline.
    pub fn on_slow_request<F>(&self, hook: F) -> Result<()>
    where
        F: Fn(Option<usize>) -> bool + Send + Sync + 'static,
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
    /// down or sleeps armed: an armed sleep on the event fd was seen to miss a peer's get and
    /// the peer's requests after it, which a ring of the eventfd does not.
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
    /// preempts a polling caller on a busy core, and the more often it looks, the more of the
    /// caller's rate it takes. A look
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
