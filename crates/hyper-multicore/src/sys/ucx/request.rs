//! Non-blocking requests: a put or get in flight that owns its buffer.

use super::*;

/// A non-blocking put or get in flight; owns its buffer. Dropping it unfinished hands the buffer
/// to the endpoint, which frees it once UCX completes the request (at the next flush or close).
pub struct Request {
    /// None when UCX completed the operation immediately.
    pub(super) request: Option<ffi::ucs_status_ptr_t>,
    pub(super) buffer: Vec<u8>,
    pub(super) operation: &'static str,
    pub(super) endpoint: Arc<EndpointHandle>,
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

/// Non-blocking puts and gets.
impl Endpoint {
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

    pub(super) fn request(
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
}
