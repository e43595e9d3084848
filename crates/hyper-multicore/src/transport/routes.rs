//! The router: one [`Route`] per peer, computed once at initialize, and [`Transports`], which
//! sends every data-plane call down its peer's route. A route is `Local` (the peer's heap is
//! mapped here: the shared-memory transport) or `Net` (the network transport, whichever this
//! build has: see `network.rs`); the router never names a network transport.
//!
//! The shared-memory fast path stays one load and a branch: `match routes[pe]`, statically
//! dispatched, no allocation; the network arm of each call is out of line.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::sync::Arc;
use std::time::Instant;

use super::interface::{start_one, Rmw, RmwKind, SignalOp, Start, Transport, Width, WordWrite};
use super::network::{NetLink, NetPeer, Network};
use super::segment::{self, Segment};
use super::shm::{ShmPeer, ShmTransport};
use super::sync::{self, AbortWord, Deadline, Doorbell, WaitError, WaitPolicy};
use crate::config::TransportMode;
use crate::error::{Error, ErrorKind, Result};
use crate::sys::copies;
use crate::sys::mapping::{LocalSource, LocalTarget, Strides};

/// The transport layer of an initialized runtime, as `DebugState` shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TransportState {
    /// `HYPER_MULTICORE_SHMEM_TRANSPORT` in force: `auto`, `shm` or `ucx`.
    pub mode: String,
    /// How this PE reaches each root rank (itself included), in rank order: `shm` (its heap is
    /// mapped here) or the network transport's name (`ucx`).
    pub routes: Vec<String>,
}

/// How a peer is reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Route {
    /// Its heap is mapped here (the shared-memory transport), at this offset of this
    /// process's segment.
    Local(ShmPeer),
    /// Through the network transport.
    Net(NetPeer),
}

/// Every route of this PE and the transports behind them.
#[derive(Debug)]
pub(crate) struct Transports {
    routes: Box<[Route]>,
    local: ShmTransport,
    /// The network transport, when some peers are not mapped here.
    net: Option<NetLink>,
    single_group: bool,
    local_pes: usize,
    /// The PEs that share this PE's segment (its locality group, itself included), ascending.
    group: Box<[usize]>,
    /// The lowest rank of every locality group, ascending: the groups' leaders in a barrier of
    /// a root spanning several groups.
    leaders: Box<[usize]>,
    mode: TransportMode,
}

impl Transports {
    /// Collective: starts the transports this PE's routes need: the shared-memory transport
    /// always, the network transport when the root spans several locality groups.
    pub(crate) fn start(start: &Start<'_>) -> Result<Transports> {
        let local: ShmTransport = start_one(start)?;
        let rank = start.plane.rank();
        let single_group = start.locality.groups.len() == 1;
        // Every rank of a root spanning several groups has peers outside its own, so all ranks
        // make the same decision (the start-up is collective).
        let net = if single_group {
            None
        } else {
            Some(NetLink::start(start, &local)?)
        };
        let routes = (0..start.pids.len())
            .map(|pe| {
                let net_peer = net.as_ref().and_then(|net| net.network.peer(pe));
                match (local.peer(pe), net_peer) {
                    (Some(peer), _) => Ok(Route::Local(peer)),
                    (None, Some(peer)) => Ok(Route::Net(peer)),
                    (None, None) => Err(Error::new(
                        ErrorKind::Protocol,
                        "initialize",
                        format!("no transport reaches root rank {pe}"),
                    )
                    .on_rank(rank)),
                }
            })
            .collect::<Result<Box<[Route]>>>()?;
        Ok(Transports {
            single_group,
            local_pes: start.locality.local_pes(rank),
            group: start.locality.members_of(rank).into(),
            leaders: start.locality.groups.iter().map(|group| group[0]).collect(),
            mode: start.mode,
            routes,
            local,
            net,
        })
    }

    /// This PE's segment (sync words, keep-alive of the mapping).
    pub(crate) fn segment(&self) -> &Arc<Segment> {
        self.local.segment()
    }

    /// True when every PE of the root shares this process's segment (the one-host case: the
    /// shared-memory barrier and argument slots serve the whole root).
    pub(crate) fn single_group(&self) -> bool {
        self.single_group
    }

    /// How many PEs of the root share this host (waiting policy: spin only if each has a core).
    pub(crate) fn local_pes(&self) -> usize {
        self.local_pes
    }

    /// The PEs that share this PE's segment (its locality group, itself included), ascending.
    pub(crate) fn group(&self) -> &[usize] {
        &self.group
    }

    /// The lowest rank of every locality group, ascending (rank 0's group first).
    pub(crate) fn leaders(&self) -> &[usize] {
        &self.leaders
    }

    /// What `debug_state()` shows of the transport layer.
    pub(crate) fn state(&self) -> TransportState {
        TransportState {
            mode: self.mode.name().to_string(),
            routes: (0..self.routes.len())
                .map(|pe| self.route_name(pe).to_string())
                .collect(),
        }
    }

    /// The name of PE `pe`'s route: `shm`, or the network transport's name.
    pub(crate) fn route_name(&self, pe: usize) -> &'static str {
        match self.routes[pe] {
            Route::Local(_) => "shm",
            Route::Net(_) => self.net.as_ref().map_or("net", |net| net.network.name()),
        }
    }

    /// Each peer's route, in rank order.
    pub(crate) fn routes(&self) -> &[Route] {
        &self.routes
    }

    /// Waits until `ready()`, a look at this PE's own memory that becomes true through a write
    /// followed by a ring of this PE's doorbell (see [`sync::wait_until`]), or the abort or the
    /// deadline. With a network transport every look also progresses it from this thread, so
    /// a waiter in its spin and yield phases applies peers' operations itself instead of
    /// waiting for the transport's progress thread to be scheduled, and sees them as they land;
    /// its spin phase is [`OWN_SPIN_LOOKS`] looks (a progress costs a system call). Before it
    /// sleeps it hands the progress back to the transport's own thread.
    pub(crate) fn wait_own(
        &self,
        ready: impl FnMut() -> bool,
        policy: &WaitPolicy,
    ) -> std::result::Result<(), WaitError> {
        self.wait_progressing(ready, policy, OWN_SPIN_LOOKS)
    }

    /// Waits until `ready()` becomes true through a network peer's message (see
    /// [`Network::send_exchange`]), or the abort or `deadline`, progressing the network
    /// transport on every look. With `spin` (each local PE has a core) it first takes
    /// [`MESSAGE_SPIN_LOOKS`] looks back to back, some ten network round trips: a message that
    /// is already on its way is taken as it lands, not after a yield (which would add a
    /// scheduler round to every barrier of two hosts). The spin stays that short because a
    /// waiter spinning for long would keep the sender from running whenever the scheduler put
    /// both on one core — which it does, as each wakes the other. It then yields, looking, and
    /// sleeps.
    pub(crate) fn wait_message(
        &self,
        ready: impl FnMut() -> bool,
        spin: bool,
        deadline: Instant,
    ) -> std::result::Result<(), WaitError> {
        let policy = WaitPolicy {
            spin,
            deadline: Deadline::At(deadline),
        };
        self.wait_progressing(ready, &policy, MESSAGE_SPIN_LOOKS)
    }

    /// [`Transports::wait_own`] progressing the network transport (if any) on every look,
    /// with at most `spin_looks` looks in its spin phase.
    fn wait_progressing(
        &self,
        ready: impl FnMut() -> bool,
        policy: &WaitPolicy,
        spin_looks: u32,
    ) -> std::result::Result<(), WaitError> {
        let (bell, abort) = (self.own_doorbell(), self.abort_word());
        match &self.net {
            Some(net) => {
                sync::wait_progressing(ready, bell, abort, policy, spin_looks, &net.network)
            }
            // Without a network transport (a one-host root): the look alone.
            None => sync::wait_until(ready, bell, abort, policy),
        }
    }

    /// The network transport and its peer data when PE `pe` is on the network route (its
    /// two-rank exchanges: [`Network::send_exchange`]); None when `pe` is mapped here.
    pub(crate) fn network_to(&self, pe: usize) -> Option<Result<(&Network, NetPeer)>> {
        match self.routes[pe] {
            Route::Local(_) => None,
            Route::Net(peer) => Some(self.network().map(|network| (network, peer))),
        }
    }

    /// See [`Transport::put`].
    #[inline(always)]
    pub(crate) fn put(&self, pe: usize, offset: usize, source: LocalSource<'_>) -> Result<()> {
        copies::moved(source.len());
        match self.routes[pe] {
            Route::Local(peer) => self.local.put(peer, offset, source),
            Route::Net(peer) => self.network()?.put(peer, offset, source),
        }
    }

    /// See [`Transport::put_nbi`].
    #[inline]
    pub(crate) fn put_nbi(&self, pe: usize, offset: usize, source: LocalSource<'_>) -> Result<()> {
        copies::moved(source.len());
        match self.routes[pe] {
            Route::Local(peer) => self.local.put_nbi(peer, offset, source),
            Route::Net(peer) => self.network()?.put_nbi(peer, offset, source),
        }
    }

    /// See [`Transport::get`].
    #[inline(always)]
    pub(crate) fn get(&self, pe: usize, offset: usize, target: LocalTarget<'_>) -> Result<()> {
        copies::moved(target.len());
        match self.routes[pe] {
            Route::Local(peer) => self.local.get(peer, offset, target),
            Route::Net(peer) => self.network()?.get(peer, offset, target),
        }
    }

    /// See [`Transport::get_nbi`].
    #[inline]
    pub(crate) fn get_nbi(&self, pe: usize, offset: usize, target: LocalTarget<'_>) -> Result<()> {
        copies::moved(target.len());
        match self.routes[pe] {
            Route::Local(peer) => self.local.get_nbi(peer, offset, target),
            Route::Net(peer) => self.network()?.get_nbi(peer, offset, target),
        }
    }

    /// See [`Transport::put_strided`].
    pub(crate) fn put_strided(
        &self,
        pe: usize,
        offset: usize,
        source: LocalSource<'_>,
        strides: Strides,
    ) -> Result<()> {
        copies::moved(strides.count * strides.size);
        match self.routes[pe] {
            Route::Local(peer) => self.local.put_strided(peer, offset, source, strides),
            Route::Net(peer) => self.network()?.put_strided(peer, offset, source, strides),
        }
    }

    /// See [`Transport::get_strided`].
    pub(crate) fn get_strided(
        &self,
        pe: usize,
        offset: usize,
        target: LocalTarget<'_>,
        strides: Strides,
    ) -> Result<()> {
        copies::moved(strides.count * strides.size);
        match self.routes[pe] {
            Route::Local(peer) => self.local.get_strided(peer, offset, target, strides),
            Route::Net(peer) => self.network()?.get_strided(peer, offset, target, strides),
        }
    }

    /// This PE's own heap's `len` bytes at `offset`, as the source of a put: read in place.
    #[inline]
    pub(crate) fn own_source(&self, offset: usize, len: usize) -> LocalSource<'_> {
        self.local.own_source(offset, len)
    }

    /// This PE's own heap's `len` bytes at `offset`, as the target of a get: written in place.
    #[inline]
    pub(crate) fn own_target(&self, offset: usize, len: usize) -> LocalTarget<'_> {
        self.local.own_target(offset, len)
    }

    /// See [`Transport::atomic`].
    #[inline(always)]
    pub(crate) fn atomic(&self, pe: usize, offset: usize, width: Width, rmw: Rmw) -> Result<u64> {
        match self.routes[pe] {
            Route::Local(peer) => self.local.atomic(peer, offset, width, rmw),
            Route::Net(peer) => {
                let (kind, operands) = rmw.split();
                self.net_atomic(peer, offset, width, kind, operands)
            }
        }
    }

    /// [`Transports::atomic`] on the network route, out of line, with `rmw` split into registers
    /// ([`Rmw::split`]): passed whole (24 bytes) it would go by reference, so the caller would
    /// keep it in memory on the shared-memory route too, and read its constant kind back from
    /// there (a jump table) instead of folding it.
    #[inline(never)]
    fn net_atomic(
        &self,
        peer: NetPeer,
        offset: usize,
        width: Width,
        kind: RmwKind,
        operands: [u64; 2],
    ) -> Result<u64> {
        let rmw = Rmw::join(kind, operands);
        self.network()?.atomic(peer, offset, width, rmw)
    }

    /// See [`Transport::update`].
    #[inline(always)]
    pub(crate) fn update(
        &self,
        pe: usize,
        offset: usize,
        width: Width,
        op: SignalOp,
        value: u64,
    ) -> Result<()> {
        self.write_word(pe, offset, width, op, value, WordWrite::Update)
    }

    /// See [`Transport::signal`].
    #[inline(always)]
    pub(crate) fn signal(
        &self,
        pe: usize,
        offset: usize,
        width: Width,
        op: SignalOp,
        value: u64,
    ) -> Result<()> {
        self.write_word(pe, offset, width, op, value, WordWrite::Signal)
    }

    /// An update or a signal (`write`): in shared memory both are the same store or add.
    #[inline(always)]
    fn write_word(
        &self,
        pe: usize,
        offset: usize,
        width: Width,
        op: SignalOp,
        value: u64,
        write: WordWrite,
    ) -> Result<()> {
        match self.routes[pe] {
            Route::Local(peer) => self.local.update(peer, offset, width, op, value),
            Route::Net(peer) => self.net_write_word(peer, offset, width, op, value, write),
        }
    }

    /// [`Transports::write_word`] on the network route, out of line.
    #[inline(never)]
    fn net_write_word(
        &self,
        peer: NetPeer,
        offset: usize,
        width: Width,
        op: SignalOp,
        value: u64,
        write: WordWrite,
    ) -> Result<()> {
        let network = self.network()?;
        match write {
            WordWrite::Signal => network.signal(peer, offset, width, op, value),
            WordWrite::Update => network.update(peer, offset, width, op, value),
        }
    }

    /// See [`Transport::fence`]: every transport in use.
    #[inline]
    pub(crate) fn fence(&self) -> Result<()> {
        self.local.fence()?;
        match &self.net {
            Some(net) => net.network.fence(),
            None => Ok(()),
        }
    }

    /// See [`Transport::quiet`]: every transport in use.
    #[inline]
    pub(crate) fn quiet(&self) -> Result<()> {
        self.local.quiet()?;
        match &self.net {
            Some(net) => net.network.quiet(),
            None => Ok(()),
        }
    }

    /// The network transport (a route says `Net` only when it exists).
    #[cold]
    fn network(&self) -> Result<&Network> {
        self.net.as_ref().map(|net| &net.network).ok_or_else(|| {
            Error::new(
                ErrorKind::Protocol,
                "transport",
                "a peer is routed through the network but no network transport was started",
            )
        })
    }

    /// See [`Transport::local_ptr`].
    #[inline]
    pub(crate) fn local_ptr(&self, pe: usize, offset: usize) -> Option<NonNull<u8>> {
        match self.routes[pe] {
            Route::Local(peer) => self.local.local_ptr(peer, offset),
            Route::Net(peer) => self
                .net
                .as_ref()
                .and_then(|net| net.network.local_ptr(peer, offset)),
        }
    }

    /// The 32-bit word at `offset` of this PE's own heap (signal waits).
    #[inline]
    pub(crate) fn own_word32(&self, offset: usize) -> &AtomicU32 {
        self.local.own_words(offset)
    }

    /// The 64-bit word at `offset` of this PE's own heap (signal waits).
    #[inline]
    pub(crate) fn own_word64(&self, offset: usize) -> &AtomicU64 {
        self.local.own_words(offset)
    }

    /// This PE's own words in the segment (doorbell, allocation-argument slots).
    pub(crate) fn own_pe_words(&self) -> &segment::PeWords {
        self.local.own_pe_words()
    }

    /// This PE's doorbell: writers of its signal words ring it.
    #[inline]
    pub(crate) fn own_doorbell(&self) -> &Doorbell {
        self.local.own_doorbell()
    }

    /// This PE's next barrier with the PEs of its segment (see [`ShmTransport::barrier`]).
    #[inline]
    pub(crate) fn segment_barrier(
        &self,
        policy: &WaitPolicy,
        carry: Option<&[u64; 4]>,
    ) -> std::result::Result<(), WaitError> {
        self.local.barrier(policy, carry)
    }

    /// The other PE of a 2-PE segment and the words tagged `tag` it carried with the last
    /// segment barrier (see [`ShmTransport::carried`]), if still there whole.
    #[inline]
    pub(crate) fn carried(&self, tag: u64) -> Option<(usize, [u64; 4])> {
        self.local.carried(tag)
    }

    /// The abort word this PE's waits watch.
    #[inline]
    pub(crate) fn abort_word(&self) -> &AbortWord {
        &self.local.segment().control().abort
    }
}

/// The looks of a wait's spin phase when a network transport progresses on each
/// ([`Transports::wait_own`]): a look is then a system call, so these last about as long as
/// the `PAUSE`s of a shared-memory wait's spin phase. Progressing on every look rather than on
/// every 16th answered the 2-PE ping-pongs over TCP sooner (bench/findings.md).
const OWN_SPIN_LOOKS: u32 = 1024;
/// The looks of a message wait's spin phase ([`Transports::wait_message`]): some ten network
/// round trips. In 2-PE barriers over TCP fewer looks (or none) were slower and more gained
/// nothing (bench/findings.md).
pub(crate) const MESSAGE_SPIN_LOOKS: u32 = 256;
