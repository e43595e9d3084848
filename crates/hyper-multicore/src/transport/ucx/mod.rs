//! The UCX transport: peers outside this process's segment, through OpenUCX's `ucp` API (the
//! safe wrapper is `crate::sys::ucx`).
//!
//! One context and one worker per PE; this PE's own heap (in its shm segment) registered with
//! `ucp_mem_map`; a progress thread that sleeps on the worker's event fd, so peers' RMA and
//! atomics — which UCX emulates with active messages over TCP and shared memory — complete while
//! this PE's main thread computes.
//!
//! Start-up: prepare (context, worker, message handlers, progress thread, heap registration) →
//! publish (worker address, heap base address, packed rkey) → exchange → attach (an endpoint and
//! an unpacked rkey per remote peer) → agree. Teardown (`Drop`, at shutdown, restart and
//! invalidation, since each re-initializes): the progress thread stops and joins first, then the
//! endpoints, keys, registration, worker and context go.
//!
//! Puts and signals take one of two paths per peer ([`Path`], from what UCX's lanes to the peer
//! do, read at the first put or signal to it):
//!
//! - **Messages** (TCP: UCX emulates RMA and atomics with active messages on one lane, which
//!   the peer's progress applies in the order sent, and acknowledges every put with a message
//!   back). Puts of up to [`MESSAGE_PUT_MAX`] bytes, signals and non-fetching atomics are this
//!   transport's own active messages, applied by the peer's handlers (the update with the same
//!   CPU atomic as the shared-memory route's) and not acknowledged: one message per operation,
//!   where UCX's emulation costs a request and its acknowledgement.
//!   Each lands behind every earlier operation on the lane, so a signal is ordered after the
//!   puts before it without a fence, and a get or atomic after a put reads what it wrote. A
//!   quiet covers them with a probe: a one-byte get from each peer that was sent some since the
//!   last probe, answered only after the peer applied them (one round trip per quiet, where
//!   acknowledged puts would wait for each).
//!   Where one lane carries every active message, puts of any size go as messages of up to
//!   [`MESSAGE_CHUNK`] (unacknowledged, where UCX's emulated put waits for an acknowledgement
//!   per fragment), and a get above [`MESSAGE_PUT_MAX`]
//!   is a request ([`GET_AM`]) the peer's handler answers with messages from its heap
//!   ([`GET_REPLY_AM`], without waiting), which land in the caller's buffer, lent for the wait
//!   (`ucx::Landings`). The measurements are in the generated tables (docs/benchmarks.md).
//! - **Operations** (a lane does RMA or atomics itself: CMA, shared-memory CPU atomics,
//!   RDMA): UCX's puts; a signal is a *fetching* UCX atomic (swap for set, fetch-add for add),
//!   ordered after earlier puts by a worker fence and returning only once it was applied at the
//!   target, so a later quiet or barrier covers it. Who wakes a waiter asleep on the target's
//!   futex depends on who applied the atomic: the target's progress (atomics emulated, RMA not)
//!   runs the worker's progress hook, which rings the doorbell; device atomics have no target
//!   thread, so an active message then rings the target's doorbell (the op is applied before the
//!   ring is sent, and the handler's check of the sleeper count is sequentially consistent, so
//!   no wake-up is lost).
//!
//! Whichever thread of the target applies a peer's operation — UCX's emulation or a message
//! handler — the progress hook rings the doorbell right after that progress, so a `wait_signal`
//! on a word that only remote peers change wakes at once.
//!
//! Two-rank exchanges (two leaders' barrier, two ranks' allocate/free call words): each side
//! sends one active message (source rank, tag, sequence; the data as payload), whose handler
//! files it in the PE's mailbox and rings its doorbell; the waiting side takes it with
//! [`UcxTransport::take_exchange`], progressing the worker itself while it waits.
//!
//! Progress: a control-plane waiter in its spin phase progresses this worker too
//! ([`ControlPlane::while_spinning`](crate::control::ControlPlane)), so a PE waiting in a
//! collective serves its peers' operations itself; the progress thread stands down meanwhile
//! and gets the worker back before the waiter sleeps.

use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

mod messages;

use super::interface::{Exchange, NetPeer, NetworkTransport, SignalOp, WordWrite};
use super::network::NetStart;
use super::routes::MESSAGE_SPIN_LOOKS;
use super::segment::Segment;
use super::shm::apply_rmw;
use super::sync;
use super::{word_of, words_header, Rmw, Start, Transport, Width};
use crate::control::{LossReport, Progress};
use crate::error::{Error, ErrorKind, Result};
use crate::sys::mapping::{LocalSource, LocalTarget};
use crate::sys::ucx::{
    self, Context, Endpoint, Landings, MemoryRegion, ProgressThread, RemoteKey, Worker,
};
use messages::{
    exchange_key, get_request, put_header, put_offset, update_header, update_of, Mailbox,
    DOORBELL_AM, EXCHANGE_AM, GET_AM, GET_REPLY_AM, PUT_AM, UPDATE_AM,
};

/// How long a UCX endpoint's failure waits for the control plane to report a loss that caused
/// it ([`UcxTransport::checked`]): it hears of a dead rank within milliseconds.
const LOSS_REPORT_GRACE: Duration = Duration::from_millis(250);
/// The largest put sent as one active message on a [`Path::Messages`] path whose peer has more
/// than one lane for active messages: well inside one eager fragment on every transport UCX
/// emulates RMA over (TCP's is 8 KiB), so it travels on the `am` lane in order; larger puts are
/// then UCX's (RMA emulated on that lane too).
const MESSAGE_PUT_MAX: usize = 1024;
/// With one lane for every active message (`Path::Messages { any_size: true }`), puts of any
/// size go as messages of at most this many bytes each (and gets' answers as parts of it): UCX sends each in eager fragments with no
/// acknowledgement per fragment, and reassembles it at the target into a buffer of its size.
const MESSAGE_CHUNK: usize = 256 << 10;

/// What a PE publishes for its peers.
#[derive(Debug, Serialize, Deserialize)]
struct Published {
    address: Vec<u8>,
    base: u64,
    rkey: Vec<u8>,
}

/// What prepare made.
#[derive(Debug)]
pub(crate) struct Prepared {
    progress: ProgressThread,
    region: MemoryRegion,
    worker: Worker,
    context: Context,
    address: Vec<u8>,
    segment: Arc<Segment>,
    /// This PE's slot in `segment` (its doorbell).
    slot: usize,
    mailbox: Arc<Mailbox>,
    landings: Arc<Landings>,
}

/// One remote peer: its endpoint (one user at a time), its heap's base address and key.
#[derive(Debug)]
struct Peer {
    endpoint: Mutex<Endpoint>,
    rkey: RemoteKey,
    base: u64,
    /// How puts and signals reach the peer. Read from UCX at the first put or signal to the
    /// peer (the query formats UCX's lane table: too slow to make for every peer at start-up).
    path: OnceLock<Path>,
    /// Puts and signals sent to the peer as active messages (which no UCX flush covers), and
    /// how many of them a completed probe covers ([`UcxTransport::quiet`]).
    sent: AtomicU64,
    probed: AtomicU64,
}

/// How puts and signals reach a peer, from what its endpoint's lanes do ([`ucx::Lanes`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Path {
    /// UCX emulates RMA and atomics to the peer (TCP): every operation is an active message on
    /// one lane that the peer's progress applies in the order sent, and UCX acknowledges each
    /// put (a message back, before the peer's next event). Small puts and signals go as this
    /// transport's own active messages, unacknowledged; a quiet probes the lane with a one-byte
    /// get, which the peer answers only after applying everything sent before it. With
    /// `any_size`, one lane carries every active message (so a message of many fragments keeps
    /// its place too): puts of any size go as messages of up to [`MESSAGE_CHUNK`] bytes, which
    /// UCX does not acknowledge fragment by fragment as it does an emulated put's.
    Messages { any_size: bool },
    /// Some lane does RMA or atomics without the peer's CPU: UCX's puts, and signals as
    /// fetching atomics; `ring` when the atomics are the device's (no progress of the peer
    /// applies them, so its progress hook does not ring the doorbell).
    Operations { ring: bool },
}

impl Peer {
    fn path(&self, endpoint: &Endpoint) -> Path {
        *self.path.get_or_init(|| {
            let lanes = endpoint.lanes();
            if lanes.all_by_target_progress() {
                Path::Messages {
                    any_size: lanes.one_message_lane,
                }
            } else {
                Path::Operations {
                    ring: lanes.device_atomics,
                }
            }
        })
    }

    /// Records one more put or signal sent as an active message.
    fn sent_message(&self) {
        self.sent.fetch_add(1, Ordering::Release);
    }
}

/// The UCX transport of one PE. Fields drop in order: the progress thread first (after
/// [`Drop`] closed `serving` to the control plane's router).
#[derive(Debug)]
pub(crate) struct UcxTransport {
    /// The worker as the control plane's waiters and router serve it (see
    /// [`NetworkTransport::plane_work`]).
    serving: Arc<RouterServing>,
    _progress: ProgressThread,
    peers: Box<[Option<Peer>]>,
    _region: MemoryRegion,
    worker: Worker,
    _context: Context,
    /// This PE's segment: its abort word and doorbells are set when an endpoint fails.
    segment: Arc<Segment>,
    /// This PE's slot in `segment` (its doorbell).
    slot: usize,
    timeout: Duration,
    /// This PE's root rank (the source of the exchange messages it sends).
    rank: usize,
    mailbox: Arc<Mailbox>,
    /// The buffers of this PE's gets on the message path, which the answers land in.
    landings: Arc<Landings>,
    /// Whether this PE's waits may spin first (each local PE has a core: `sync::spins`).
    spin: bool,
    /// The control plane's report of a loss, which names the lost host.
    loss_report: LossReport,
}

/// A PE waiting in the control plane progresses its worker while it spins (serving peers'
/// operations itself, its progress thread standing down), and hands the worker back to the
/// progress thread before it sleeps.
struct ServeWhileWaiting(Arc<RouterServing>);

impl Progress for ServeWhileWaiting {
    fn progress(&self) -> usize {
        self.0.worker.progress()
    }

    fn begin_serving(&self) {
        self.0.worker.begin_serving();
    }

    fn end_serving(&self, hand_over: bool) {
        self.0.worker.end_serving(hand_over);
    }

    fn serve_requested(&self) {
        self.0.serve();
    }
}

/// A peer's request that this PE serve its worker (see `control::ServeRequester`), on the
/// router thread: the progress thread takes over, and the router thread itself progresses the
/// worker until idle first. The router runs at once where the progress thread may not: a
/// progress thread woken on the core of its PE's computing main thread can stay queued behind
/// the computation (the scheduler does not move it to an idle core at once) while the peer's get
/// and its requests wait. The router progresses only while the transport
/// is up: the transport closes `open` (waiting for a progress under way) before it tears down
/// the heap's registration and endpoints.
#[derive(Debug)]
struct RouterServing {
    worker: Worker,
    open: Mutex<bool>,
}

impl RouterServing {
    fn serve(&self) {
        self.worker.serve_now();
        let open = self.open.lock();
        if *open {
            while self.worker.progress() != 0 {}
        }
    }
}

impl Drop for UcxTransport {
    fn drop(&mut self) {
        *self.serving.open.lock() = false;
    }
}

/// How an operation reaches one remote peer: its root rank.
pub(crate) type UcxPeer = NetPeer;

/// What the network transports' start-up gets besides [`Start`] (see [`NetStart`]).
fn net_start<'a>(start: &Start<'a>) -> Result<&'a NetStart<'a>> {
    start.net.ok_or_else(|| {
        Error::new(
            ErrorKind::Protocol,
            "initialize",
            "the UCX transport starts after the shared-memory one (it registers that heap)",
        )
    })
}

impl Transport for UcxTransport {
    type Prepared = Prepared;
    type Peer = UcxPeer;

    fn prepare(start: &Start<'_>) -> Result<Prepared> {
        let net = net_start(start)?;
        let shm = net.local;
        let context = Context::new()?;
        let worker = Worker::new(&context)?;
        let segment = Arc::clone(shm.segment());
        let bell = shm.own_slot();
        let ringing = Arc::clone(&segment);
        worker.set_am_handler(DOORBELL_AM, move |_, _| {
            sync::ring(&ringing.pe_words(bell).doorbell);
        })?;
        // Peers' plain puts and atomics into this heap (emulated: applied by whichever thread
        // progresses this worker) ring the doorbell too, so a `wait_signal` on a word that only
        // remote atomics change wakes at once instead of at its next sleep slice. The fence
        // orders UCX's stores before the sleeper count is read (`sync::ring`'s contract); when
        // nobody sleeps the ring is one load.
        // The same hook sends a control-plane waiter that went to sleep back to serving these
        // events itself (`Nudger`), once the router has made it the plane's spin work.
        let ringing = Arc::clone(&segment);
        let nudge = Arc::clone(&net.nudge);
        worker.on_progress(move || {
            fence(Ordering::SeqCst);
            sync::ring(&ringing.pe_words(bell).doorbell);
            nudge();
        })?;
        let len = usize::try_from(start.heap_size).map_err(|_| {
            Error::new(
                ErrorKind::InvalidArgument,
                "initialize",
                "the heap does not fit in this address space",
            )
        })?;
        // Peers' puts and signals sent as active messages ([`Path::Messages`]): applied to this
        // heap here, by whichever thread progresses the worker; the progress hook above rings
        // the doorbell after them.
        let (mapping, heap) = shm.own_heap();
        let (writing, updating) = (Arc::clone(&mapping), Arc::clone(&mapping));
        worker.set_am_handler(PUT_AM, move |header, data| {
            match put_offset(header, data.len(), len) {
                Some(offset) => writing.write(heap + offset, data),
                None => tracing::warn!(
                    "dropped a put message of {} bytes with a {}-byte header outside the heap",
                    data.len(),
                    header.len()
                ),
            }
        })?;
        worker.set_am_handler(UPDATE_AM, move |header, _| match update_of(header, len) {
            Some((offset, width, rmw)) => {
                apply_rmw(&updating, heap + offset, width, rmw);
            }
            None => tracing::warn!(
                "dropped an update message with a {}-byte header outside the heap",
                header.len()
            ),
        })?;
        // Peers' gets on the message path: answered from this heap, in parts, without waiting;
        // and the answers to this PE's own, landing in the buffers its gets lent.
        let answering = mapping;
        worker.set_am_request_handler(GET_AM, move |header, _, reply| {
            let (Some((offset, len, token)), Some(reply)) = (get_request(header, len), reply)
            else {
                tracing::warn!("dropped a get request with a {}-byte header", header.len());
                return;
            };
            for at in (0..len).step_by(MESSAGE_CHUNK) {
                let part = MESSAGE_CHUNK.min(len - at);
                let header = words_header([token, at as u64]);
                let start = heap + offset + at;
                if let Err(error) =
                    reply.send_mapped(GET_REPLY_AM, &header, &answering, start, part)
                {
                    tracing::warn!("could not answer a get: {error}");
                    return;
                }
            }
        })?;
        let landings = Arc::new(Landings::default());
        let landing = Arc::clone(&landings);
        worker.set_am_handler(GET_REPLY_AM, move |header, data| {
            let filled = <&[u8; 16]>::try_from(header).is_ok_and(|header| {
                let at = usize::try_from(word_of(header, 1)).unwrap_or(usize::MAX);
                landing.fill(word_of(header, 0), at, data)
            });
            if !filled {
                // The get gave up (its deadline passed) before this part came.
                tracing::debug!("dropped a part of a get's answer ({} bytes)", data.len());
            }
        })?;
        let mailbox = Arc::new(Mailbox::default());
        let (posted, ringing) = (Arc::clone(&mailbox), Arc::clone(&segment));
        worker.set_am_handler(EXCHANGE_AM, move |header, data| {
            let Some(key) = exchange_key(header) else {
                tracing::warn!(
                    "dropped an exchange message with a {}-byte header",
                    header.len()
                );
                return;
            };
            posted.post(key, data);
            sync::ring(&ringing.pe_words(bell).doorbell);
        })?;
        // A request that waits long for a peer's progress asks that peer's progress thread to
        // serve (over the control plane: see `ServeRequester`); a flush asks every remote peer.
        // It gives up once the root was aborted: a peer on a host that vanished never answers,
        // and the wait must end within the peer timeout, not the runtime's (see `checked`).
        let ask = net.ask_to_serve.clone();
        let rank = start.plane.rank();
        let group_of = &start.locality.group_of;
        let remote: Vec<usize> = (0..group_of.len())
            .filter(|&pe| group_of[pe] != group_of[rank])
            .collect();
        let aborting = Arc::clone(&segment);
        worker.on_slow_request(move |peer| {
            if sync::aborted(&aborting.control().abort).is_some() {
                return true;
            }
            if let Some(ask) = &ask {
                match peer {
                    Some(peer) => ask(peer, ucx::SLOW_REQUEST),
                    None => remote.iter().for_each(|&peer| ask(peer, ucx::SLOW_REQUEST)),
                }
            }
            false
        })?;
        let progress = worker.start_progress_thread()?;
        let (mapping, offset) = shm.own_heap();
        let region = MemoryRegion::register(&context, mapping, offset, len)?;
        let address = worker.address()?;
        Ok(Prepared {
            progress,
            region,
            worker,
            context,
            address,
            segment,
            slot: bell,
            mailbox,
            landings,
        })
    }

    fn publish(prepared: &Prepared) -> Vec<u8> {
        let published = Published {
            address: prepared.address.clone(),
            base: prepared.region.base(),
            rkey: prepared.region.rkey_bytes().to_vec(),
        };
        postcard::to_allocvec(&published).expect("serializing bytes cannot fail")
    }

    fn attach(prepared: Prepared, published: &[Vec<u8>], start: &Start<'_>) -> Result<Self> {
        let rank = start.plane.rank();
        let own_group = start.locality.group_of[rank];
        let mut peers = Vec::with_capacity(published.len());
        for (pe, bytes) in published.iter().enumerate() {
            if start.locality.group_of[pe] == own_group {
                peers.push(None);
                continue;
            }
            let their: Published = postcard::from_bytes(bytes).map_err(|e| {
                Error::new(
                    ErrorKind::Protocol,
                    "initialize",
                    format!("rank {pe} published unreadable UCX connection data: {e}"),
                )
            })?;
            let endpoint = prepared.worker.connect(&their.address, pe)?;
            // Finish the connection's wire-up now: UCX 1.13 asserts (and aborts the process)
            // when a peer's connection fails while wire-up messages are still pending, as it
            // does when a root is torn down right after it started (a failed Initialize stage).
            endpoint.flush(start.deadline)?;
            let rkey = endpoint.unpack_rkey(&their.rkey)?;
            peers.push(Some(Peer {
                endpoint: Mutex::new(endpoint),
                rkey,
                base: their.base,
                path: OnceLock::new(),
                sent: AtomicU64::new(0),
                probed: AtomicU64::new(0),
            }));
        }
        let serving = Arc::new(RouterServing {
            worker: prepared.worker.clone(),
            open: Mutex::new(true),
        });
        Ok(UcxTransport {
            serving,
            _progress: prepared.progress,
            peers: peers.into(),
            _region: prepared.region,
            worker: prepared.worker,
            _context: prepared.context,
            segment: prepared.segment,
            slot: prepared.slot,
            landings: prepared.landings,
            spin: sync::spins(start.locality.local_pes(rank)),
            timeout: start.plane.timeout(),
            rank,
            mailbox: prepared.mailbox,
            loss_report: start.plane.loss_report(),
        })
    }

    fn peer(&self, pe: usize) -> Option<UcxPeer> {
        self.peers.get(pe)?.as_ref().map(|_| pe)
    }

    fn put(&self, peer: UcxPeer, offset: usize, source: LocalSource<'_>) -> Result<()> {
        self.not_aborted("put")?;
        let (remote, address) = self.remote(peer, offset);
        let endpoint = remote.endpoint.lock();
        let deadline = self.deadline();
        let as_messages = !source.is_empty()
            && match remote.path(&endpoint) {
                Path::Messages { any_size } => any_size || source.len() <= MESSAGE_PUT_MAX,
                Path::Operations { .. } => false,
            };
        let outcome = if as_messages {
            (0..source.len())
                .step_by(MESSAGE_CHUNK)
                .try_for_each(|at| {
                    let chunk = source.part(at, MESSAGE_CHUNK.min(source.len() - at));
                    let header = put_header(offset + at);
                    endpoint.am_send_from(PUT_AM, &header, chunk, deadline)
                })
                .map(|()| remote.sent_message())
        } else {
            endpoint.put(source, address, &remote.rkey, deadline)
        };
        self.checked(outcome)
    }

    fn get(&self, peer: UcxPeer, offset: usize, target: LocalTarget<'_>) -> Result<()> {
        self.not_aborted("get")?;
        #[cfg(feature = "fault-injection")]
        gets_issued::count(target.len());
        let (remote, address) = self.remote(peer, offset);
        let endpoint = remote.endpoint.lock();
        let deadline = self.deadline();
        let by_messages = target.len() > MESSAGE_PUT_MAX
            && remote.path(&endpoint) == Path::Messages { any_size: true };
        let outcome = if by_messages {
            self.get_by_messages(peer, &endpoint, offset, target, deadline)
        } else {
            endpoint.get(target, address, &remote.rkey, deadline)
        };
        self.checked(outcome)
    }

    fn atomic(&self, peer: UcxPeer, offset: usize, width: Width, rmw: Rmw) -> Result<u64> {
        self.not_aborted("atomic")?;
        let (remote, address) = self.remote(peer, offset);
        let endpoint = remote.endpoint.lock();
        let outcome = amo(
            &endpoint,
            address,
            &remote.rkey,
            width,
            rmw,
            self.deadline(),
        );
        self.checked(outcome)
    }

    fn update(
        &self,
        peer: UcxPeer,
        offset: usize,
        width: Width,
        op: SignalOp,
        value: u64,
    ) -> Result<()> {
        self.write_word(peer, offset, width, op, value, WordWrite::Update)
    }

    fn signal(
        &self,
        peer: UcxPeer,
        offset: usize,
        width: Width,
        op: SignalOp,
        value: u64,
    ) -> Result<()> {
        self.write_word(peer, offset, width, op, value, WordWrite::Signal)
    }

    fn fence(&self) -> Result<()> {
        self.worker.fence()
    }

    fn quiet(&self) -> Result<()> {
        self.not_aborted("quiet")?;
        let outcome = self.flush_and_probe();
        self.checked(outcome)
    }

    fn local_ptr(&self, _: UcxPeer, _: usize) -> Option<std::ptr::NonNull<u8>> {
        None
    }
}

/// Test-only (`fault-injection` builds): the gets this process has issued over UCX, so tests
/// can see which reads of a collective cross hosts. Process-local counters, not shared memory.
#[cfg(feature = "fault-injection")]
mod gets_issued {
    use std::sync::atomic::{AtomicU64, Ordering};

    static GETS: AtomicU64 = AtomicU64::new(0);
    static BYTES: AtomicU64 = AtomicU64::new(0);

    /// Counts one get of `bytes` bytes.
    pub(crate) fn count(bytes: usize) {
        GETS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// The gets counted so far and their bytes.
    pub(crate) fn total() -> (u64, u64) {
        (GETS.load(Ordering::Relaxed), BYTES.load(Ordering::Relaxed))
    }
}

impl Progress for UcxTransport {
    /// A waiter's look: one progress of the worker.
    #[inline]
    fn progress(&self) -> usize {
        self.worker.progress()
    }

    fn begin_serving(&self) {
        self.worker.begin_serving();
    }

    fn end_serving(&self, hand_over: bool) {
        self.worker.end_serving(hand_over);
    }

    fn serve_requested(&self) {
        self.serving.serve();
    }
}

impl NetworkTransport for UcxTransport {
    const NAME: &'static str = "ucx";

    /// Test-only (`fault-injection` builds): how many gets this process has issued over UCX,
    /// and their bytes, since it started.
    #[cfg(feature = "fault-injection")]
    fn gets_issued() -> (u64, u64) {
        gets_issued::total()
    }

    /// Test-only (`fault-injection` builds): this process's answers to peers' gets still in
    /// flight, each holding the heap's mapping until UCX completes or fails its send.
    #[cfg(feature = "fault-injection")]
    fn replies_in_flight() -> usize {
        ucx::replies_holding_a_mapping()
    }

    /// Sends `data` as one active message.
    fn send_exchange(
        &self,
        peer: UcxPeer,
        tag: u64,
        data: &[u8],
        deadline: Instant,
    ) -> Result<Exchange> {
        self.not_aborted("exchange")?;
        let sequence = {
            let mut started = self.mailbox.started.lock();
            let next = started.entry((peer, tag)).or_insert(0);
            *next += 1;
            *next
        };
        // The exchange's key: (source rank, tag, sequence).
        let header = words_header([self.rank as u64, tag, sequence]);
        let (remote, _) = self.remote(peer, 0);
        let outcome = remote
            .endpoint
            .lock()
            .am_send(EXCHANGE_AM, &header, data, deadline);
        self.checked(outcome)?;
        Ok(Exchange((peer as u64, tag, sequence)))
    }

    fn take_exchange(&self, exchange: Exchange) -> Option<Vec<u8>> {
        self.mailbox.take(exchange.0)
    }

    fn plane_work(&self) -> Arc<dyn Progress> {
        Arc::new(ServeWhileWaiting(Arc::clone(&self.serving)))
    }
}

impl UcxTransport {
    /// A get on the message path whose one lane carries every active message: `target` is lent
    /// to the answers' handler, one request goes out, and this thread progresses the worker
    /// (then sleeps on the doorbell, which the progress hook rings) until the answers filled it.
    /// UCX's emulated get moves the bytes in acknowledged fragments; the answer's eager
    /// messages are not acknowledged, so a large get waits for no round trip per fragment.
    fn get_by_messages(
        &self,
        peer: UcxPeer,
        endpoint: &Endpoint,
        offset: usize,
        target: LocalTarget<'_>,
        deadline: Instant,
    ) -> Result<()> {
        const OP: &str = "get";
        let len = target.len();
        self.landings.lend(target, |lent| {
            let header = words_header([offset as u64, len as u64, lent.token()]);
            endpoint.am_request(GET_AM, &header, deadline)?;
            let mut failed = None;
            let ready = || {
                failed = endpoint.failure();
                failed.is_some() || lent.is_full()
            };
            let policy = sync::WaitPolicy {
                spin: self.spin,
                deadline: sync::Deadline::At(deadline),
            };
            let bell = &self.segment.pe_words(self.slot).doorbell;
            let abort = &self.segment.control().abort;
            let spin_looks = MESSAGE_SPIN_LOOKS;
            match sync::wait_progressing(ready, bell, abort, &policy, spin_looks, self) {
                Ok(()) => failed.map_or(Ok(()), Err),
                Err(sync::WaitError::Timeout { waited }) => Err(Error::timeout(
                    OP,
                    waited,
                    &format!("rank {peer} did not answer a get of {len} bytes"),
                )
                .with_peer(peer)),
                Err(sync::WaitError::Aborted { lost_rank }) => Err(Error::peer_lost(
                    OP,
                    lost_rank as usize,
                    "the root was aborted when it was lost",
                )),
            }
        })
    }

    /// An update (`signal` false) or a signal of the word at `offset` of `peer`'s heap: a store
    /// of `value`, or an add with `add`. On the message path both are one update message, which
    /// lands behind every earlier put to the peer on the same lane (a signal needs no fence
    /// there). Otherwise an update is UCX's atomic, and a signal a fence, a *fetching* atomic
    /// (applied at the target when it returns) and, where the device applies atomics, a
    /// doorbell message.
    fn write_word(
        &self,
        peer: UcxPeer,
        offset: usize,
        width: Width,
        op: SignalOp,
        value: u64,
        write: WordWrite,
    ) -> Result<()> {
        let signal = write == WordWrite::Signal;
        self.not_aborted(if signal { "signal" } else { "atomic" })?;
        let (remote, address) = self.remote(peer, offset);
        let endpoint = remote.endpoint.lock();
        let deadline = self.deadline();
        let (key, update) = (&remote.rkey, Rmw::update(op, value));
        let outcome = match remote.path(&endpoint) {
            Path::Messages { .. } => {
                let header = update_header(offset, width, op, value);
                endpoint
                    .am_send(UPDATE_AM, &header, &[], deadline)
                    .map(|()| remote.sent_message())
            }
            Path::Operations { ring } if signal => {
                let fetching = match op {
                    SignalOp::Add => update,
                    SignalOp::Set => Rmw::Swap(value),
                };
                self.worker
                    .fence()
                    .and_then(|()| amo(&endpoint, address, key, width, fetching, deadline))
                    .and_then(|_| match ring {
                        true => endpoint.am_send(DOORBELL_AM, &[], &[], deadline),
                        false => Ok(()),
                    })
            }
            Path::Operations { .. } => {
                amo(&endpoint, address, key, width, update, deadline).map(drop)
            }
        };
        self.checked(outcome)
    }

    /// The quiet: every UCX operation completes at its target (a worker flush), and so does
    /// every put and signal sent as an active message, which no flush covers — a one-byte get
    /// from each peer that has some since the last probe, answered by the peer only after it
    /// applied them (they precede the get on the same lane, [`Path::Messages`]). The probes
    /// travel together. With nothing to probe or flush it returns without reading the clock (a
    /// barrier starts with a quiet).
    fn flush_and_probe(&self) -> Result<()> {
        let mut probes = Vec::new();
        for remote in self.peers.iter().flatten() {
            let sent = remote.sent.load(Ordering::Acquire);
            if remote.probed.load(Ordering::Acquire) < sent {
                let probe = remote
                    .endpoint
                    .lock()
                    .get_nb(1, remote.base, &remote.rkey)?;
                probes.push((remote, sent, probe));
            }
        }
        if probes.is_empty() && !self.worker.has_unflushed() {
            return Ok(());
        }
        let deadline = self.deadline();
        for (remote, sent, probe) in probes {
            probe.wait(deadline)?;
            remote.probed.fetch_max(sent, Ordering::AcqRel);
        }
        self.worker.flush(deadline)
    }

    fn deadline(&self) -> Instant {
        Instant::now() + self.timeout
    }

    /// Fails at once with peer lost when this root was aborted (a PE lost, seen by the control
    /// plane or another endpoint), instead of starting an operation that may wait for the dead;
    /// with the control plane's report of the loss when one comes within its grace.
    fn not_aborted(&self, operation: &str) -> Result<()> {
        let Some(lost) = sync::aborted(&self.segment.control().abort) else {
            return Ok(());
        };
        // The control plane's own report names the lost host; the abort word may come first
        // (another PE's router set it), and the report follows within moments.
        if let Some(cause) = self.loss_report.within(crate::control::VERDICT_GRACE) {
            return Err(cause.restated_as(operation));
        }
        let lost = lost as usize;
        Err(if lost < self.peers.len() {
            Error::peer_lost(operation, lost, "the root was aborted when it was lost")
        } else {
            Error::new(
                ErrorKind::PeerLost,
                operation,
                "the root's control plane broke; the root cannot continue",
            )
        })
    }

    fn remote(&self, peer: UcxPeer, offset: usize) -> (&Peer, u64) {
        let remote = self.peers[peer]
            .as_ref()
            .expect("the route table holds only connected UCX peers");
        (remote, remote.base + offset as u64)
    }

    /// A lost peer also aborts this PE's waits (the abort word and every doorbell of its
    /// segment), as the control plane does when it sees the loss; a wait that ended past its
    /// deadline, or was given up, once the root was aborted fails with that loss.
    ///
    /// An endpoint also fails when its peer is alive but gave up after *another* rank's loss and
    /// closed it (a survivor's teardown), and a quiet's probe, sent late, meets that more often
    /// than an early acknowledgement did. The control plane hears of every loss at once and
    /// names the first: the error names the rank it reports within [`LOSS_REPORT_GRACE`] (the
    /// failed peer itself, when that one died), and this peer only if it reports none.
    fn checked<T>(&self, outcome: Result<T>) -> Result<T> {
        let Err(error) = outcome else {
            return outcome;
        };
        if error.kind() == ErrorKind::Timeout {
            // A wait given up because the root was aborted ends like one past its deadline;
            // the loss is its cause.
            self.not_aborted(error.operation())?;
        }
        if error.kind() != ErrorKind::PeerLost {
            return Err(error);
        }
        let failed = error.peer().unwrap_or(usize::MAX - 1);
        match self.loss_reported_within(LOSS_REPORT_GRACE) {
            Some(first) if first != failed && first < self.peers.len() => Err(Error::peer_lost(
                error.operation(),
                first,
                &format!(
                    "the root was aborted when it was lost; rank {failed}'s UCX endpoint \
                         failed after that"
                ),
            )),
            _ => {
                self.segment.abort(failed as u32);
                Err(error)
            }
        }
    }

    /// The rank whose loss aborted this PE's root, waiting up to `grace` (asleep on the
    /// doorbell, which an abort rings) for the control plane to report one.
    fn loss_reported_within(&self, grace: Duration) -> Option<usize> {
        let abort = &self.segment.control().abort;
        let policy = sync::WaitPolicy {
            spin: false,
            deadline: sync::Deadline::At(Instant::now() + grace),
        };
        let bell = &self.segment.pe_words(self.slot).doorbell;
        let _ = sync::wait_until(|| false, bell, abort, &policy);
        sync::aborted(abort).map(|lost| lost as usize)
    }
}

/// One atomic on the `width` word at `address`; returns the previous value, zero-extended.
fn amo(
    endpoint: &Endpoint,
    address: u64,
    rkey: &RemoteKey,
    width: Width,
    rmw: Rmw,
    deadline: Instant,
) -> Result<u64> {
    match width {
        Width::W32 => amo_of::<u32>(endpoint, address, rkey, rmw, deadline),
        Width::W64 => amo_of::<u64>(endpoint, address, rkey, rmw, deadline),
    }
}

/// One atomic of width `T` on an endpoint; returns the previous value, zero-extended.
fn amo_of<T>(
    endpoint: &Endpoint,
    address: u64,
    rkey: &RemoteKey,
    rmw: Rmw,
    deadline: Instant,
) -> Result<u64>
where
    T: ucx::AtomicWord + From<u8> + Into<u64> + TryFrom<u64>,
{
    let narrow = |value: u64| -> T {
        // Truncation to the word's width is the documented meaning of a 32-bit operation.
        T::try_from(value & mask::<T>()).unwrap_or_default()
    };
    let previous: T = match rmw {
        Rmw::Load => endpoint.atomic_fetch::<T>(address, rkey, deadline)?,
        Rmw::Store(value) => {
            endpoint.atomic_set(address, rkey, narrow(value), deadline)?;
            T::default()
        }
        Rmw::Swap(value) => endpoint.atomic_swap(address, rkey, narrow(value), deadline)?,
        Rmw::CompareSwap { expected, desired } => endpoint.atomic_compare_swap(
            address,
            rkey,
            narrow(expected),
            narrow(desired),
            deadline,
        )?,
        Rmw::Add(value) => endpoint.atomic_fetch_add(address, rkey, narrow(value), deadline)?,
    };
    Ok(previous.into())
}

fn mask<T>() -> u64 {
    if std::mem::size_of::<T>() == 4 {
        u64::from(u32::MAX)
    } else {
        u64::MAX
    }
}
