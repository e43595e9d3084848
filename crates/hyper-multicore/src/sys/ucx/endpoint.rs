//! Endpoints: one per remote peer, with its failure handling, blocking put/get/atomics and
//! flush, and the lanes UCX chose for it.

use super::*;

/// What the error handler records about an endpoint.
pub(super) struct EndpointFailure {
    /// UCS_OK while healthy; the first error status otherwise.
    pub(super) status: AtomicI8,
    pub(super) peer: usize,
}

/// Status recorded when *we* force-closed the endpoint after a missed deadline.
pub(super) const CLOSED_AFTER_TIMEOUT: ffi::ucs_status_t = ffi::UCS_ERR_TIMED_OUT;

pub(super) unsafe extern "C" fn endpoint_error_handler(
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
pub(super) struct Orphan {
    pub(super) request: ffi::ucs_status_ptr_t,
    pub(super) _buffer: Box<dyn std::any::Any + Send>,
}

/// Aborts the process if dropped by a panic that began after it was made (see
/// [`EndpointHandle::complete`]); a wait made during an earlier unwind (a destructor's) that
/// returns normally passes.
pub(super) struct AbortOnUnwind<'a> {
    pub(super) operation: &'a str,
    pub(super) unwinding_before: bool,
}

impl<'a> AbortOnUnwind<'a> {
    pub(super) fn new(operation: &'a str) -> Self {
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
pub(super) fn abort_for(why: &str) -> ! {
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
pub(super) struct Staging(pub(super) Vec<u64>);

impl Staging {
    pub(super) fn zeroed(len: usize) -> Staging {
        Staging(vec![0; len.div_ceil(8)])
    }

    /// A staging copy of `source` (counted as bounced: [`count_bounced`]).
    pub(super) fn copy_of(source: LocalSource<'_>) -> Staging {
        let len = source.len();
        let mut staging = Staging::zeroed(len);
        source.copy_into(&mut staging.bytes_mut()[..len]);
        count_bounced(len);
        staging
    }

    pub(super) fn bytes(&self) -> &[u8] {
        bytemuck::cast_slice(&self.0)
    }

    pub(super) fn bytes_mut(&mut self) -> &mut [u8] {
        bytemuck::cast_slice_mut(&mut self.0)
    }

    pub(super) fn as_mut_ptr(&mut self) -> *mut u8 {
        self.0.as_mut_ptr().cast()
    }
}

pub(super) struct EndpointHandle {
    /// NULL once closed.
    pub(super) handle: Mutex<ffi::ucp_ep_h>,
    pub(super) failure: Arc<EndpointFailure>,
    pub(super) detects_peer_failure: bool,
    pub(super) orphans: Mutex<Vec<Orphan>>,
    pub(super) worker: Arc<WorkerHandle>,
}

// SAFETY: the worker is MULTI-threaded, so the endpoint handle may be used from any thread; the
// handle itself is behind a mutex so closing it cannot race a use.
unsafe impl Send for EndpointHandle {}
// SAFETY: as above.
unsafe impl Sync for EndpointHandle {}

impl EndpointHandle {
    pub(super) fn peer(&self) -> usize {
        self.failure.peer
    }

    /// Counts an operation just issued that only a flush completes at the peer, and its
    /// `bytes` put, for the next flush's spin phase ([`WorkerHandle::wait_flush`]).
    pub(super) fn count_unflushed(&self, bytes: usize) {
        self.worker.unflushed.fetch_add(bytes, Ordering::Relaxed);
        self.worker.issued.fetch_add(1, Ordering::Release);
    }

    /// The error for a request or call that failed with `status`: PeerLost when the endpoint is
    /// known to be broken, Backend otherwise.
    pub(super) fn error(&self, operation: &str, what: &str, status: ffi::ucs_status_t) -> Error {
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
    pub(super) fn usable(
        &self,
        operation: &str,
    ) -> Result<parking_lot::MutexGuard<'_, ffi::ucp_ep_h>> {
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
    pub(super) fn close_locked(
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
    pub(super) fn complete(
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
    pub(super) fn release_orphans(&self, finally: bool) {
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
    pub(super) inner: Arc<EndpointHandle>,
    pub(super) _not_sync: PhantomData<std::cell::Cell<()>>,
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

    pub(super) fn check_key(&self, operation: &str, rkey: &RemoteKey) -> Result<()> {
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

    #[allow(clippy::too_many_arguments)]
    pub(super) fn atomic<T: AtomicWord>(
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
    /// Formatting UCX's lane table is slow: read it once per endpoint.
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
    pub(super) fn lane_description(&self) -> std::io::Result<String> {
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
    pub(super) fn listed_in(text: &str) -> Lanes {
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
