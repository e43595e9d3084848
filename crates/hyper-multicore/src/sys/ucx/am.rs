//! Active messages: the trampoline UCX calls handlers through, replies sent from a handler,
//! the landings that a get's answers fill, and an endpoint's sends.

use super::*;

/// UCX's active-message callback: forwards to the Rust handler `arg` points at.
pub(super) unsafe extern "C" fn am_trampoline(
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
    pub(super) endpoint: ffi::ucp_ep_h,
}

/// What a reply's send keeps until UCX completes it: its header and the mapping its data lies in.
pub(super) struct ReplyHeld {
    pub(super) header: Vec<u8>,
    pub(super) _mapping: Arc<SharedMapping>,
}

impl ReplyHeld {
    pub(super) fn new(header: &[u8], mapping: &Arc<SharedMapping>) -> ReplyHeld {
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
pub(super) static REPLIES_HOLDING: AtomicUsize = AtomicUsize::new(0);

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
pub(super) unsafe extern "C" fn reply_sent(
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
    pub(super) lent: Mutex<rustc_hash::FxHashMap<u64, Landing>>,
    pub(super) next: AtomicU64,
}

impl std::fmt::Debug for Landings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Landings")
            .field("lent", &self.lent.lock().len())
            .finish_non_exhaustive()
    }
}

/// One lent buffer: where it starts, its length, and how many bytes have landed in it.
pub(super) struct Landing {
    pub(super) start: *mut u8,
    pub(super) len: usize,
    pub(super) landed: usize,
}

// SAFETY: the pointer is only written through under `Landings::lent`'s lock, while the lender's
// borrow of the target lasts (`Landings::lend` removes it before returning).
unsafe impl Send for Landing {}

/// A lent buffer, as its lender sees it while it waits.
pub struct Lent<'a> {
    pub(super) landings: &'a Landings,
    pub(super) token: u64,
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

/// Active-message sends.
impl Endpoint {
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

    pub(super) fn am_send_flagged(
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
}
