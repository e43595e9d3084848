//! The network transports: how this PE reaches peers whose heaps are not mapped here (other
//! hosts; every peer but itself under `HYPER_MULTICORE_SHMEM_TRANSPORT=ucx`). [`Network`] holds
//! the one the root started, with one arm per network transport of the build; the router
//! ([`super::routes`]) reaches it through a `Route::Net` and never names it.
//!
//! Adding a network transport (libfabric, say):
//! 1. its safe wrapper over the library in `sys/` (the only place for its `unsafe`);
//! 2. its transport in `transport/`, implementing [`Transport`] and [`NetworkTransport`];
//! 3. one arm in [`Network`] and in `on_network!` below, its module and its stand-in alias
//!    ([`super::absent::Absent`]) in `transport/mod.rs`, and where [`NetLink::start`] picks it;
//! 4. one cargo feature in `crates/hyper-multicore/Cargo.toml` naming its `-sys` crate.

use std::ptr::NonNull;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use super::interface::{
    start_one, Exchange, NetworkTransport, Rmw, SignalOp, Start, Transport, Width,
};
use super::shm::ShmTransport;
use super::UcxTransport;
use crate::control::{Nudger, Progress, SpinWork};
use crate::error::Result;
use crate::sys::mapping::{LocalSource, LocalTarget, Strides};

pub(crate) use super::interface::NetPeer;

/// The network transport the root started: one arm per network transport of the build (a
/// transport whose cargo feature is off is the uninhabited [`super::absent::Absent`], whose
/// start-up fails saying which feature to build with).
#[derive(Debug)]
pub(crate) enum Network {
    /// UCX (`sys/ucx/`, `transport/ucx/`; cargo feature `ucx`).
    Ucx(UcxTransport),
}

/// `$body` with `$net` bound to the network transport in `$network` (a `&Network`).
macro_rules! on_network {
    ($network:expr, $net:ident => $body:expr) => {
        match $network {
            Network::Ucx($net) => $body,
        }
    };
}

/// Asks root rank `peer`'s process, over the control plane, to serve its progress now, unless
/// this process asked it within `interval` (the caller's threshold of a slow request; see
/// `ServeRequester`).
pub(crate) type AskToServe = Arc<dyn Fn(usize, Duration) + Send + Sync>;

/// What a network transport's start-up gets besides [`Start`]: made by [`NetLink::start`]
/// for whichever transport it starts. Read only by the network transports this build has.
#[cfg_attr(not(all(feature = "ucx", not(loom))), allow(dead_code))]
pub(crate) struct NetStart<'a> {
    /// The shared-memory transport, started (the network transport registers its heap).
    pub(crate) local: &'a ShmTransport,
    /// Asks a peer's process to serve its progress now (None for a root of one rank).
    pub(crate) ask_to_serve: Option<AskToServe>,
    /// Wakes the control plane's waiters that went to sleep, to serve the events another
    /// thread of the transport handled (nothing until the transport's progress is the plane's
    /// spin work).
    pub(crate) nudge: Nudge,
}

/// See [`NetStart::nudge`].
pub(crate) type Nudge = Arc<dyn Fn() + Send + Sync>;

impl std::fmt::Debug for NetStart<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetStart")
            .field("local", &self.local)
            .finish_non_exhaustive()
    }
}

/// The network transport and the control plane's hold on its progress. Fields drop in order:
/// the plane stops running the progress in new waits before the transport goes.
#[derive(Debug)]
pub(crate) struct NetLink {
    _spin_work: SpinWork,
    /// The transport.
    pub(crate) network: Network,
}

impl NetLink {
    /// Collective: starts the network transport (after the shared-memory one, `local`) and
    /// makes its progress the control plane's spin work, so a PE waiting in a control-plane
    /// collective serves its peers' operations itself.
    pub(crate) fn start(start: &Start<'_>, local: &ShmTransport) -> Result<NetLink> {
        let nudger = Arc::new(OnceLock::<Nudger>::new());
        let hooks = NetStart {
            local,
            ask_to_serve: start.plane.serve_requester().map(|requester| {
                Arc::new(move |peer, interval| requester.request(peer, interval)) as AskToServe
            }),
            nudge: {
                let nudger = Arc::clone(&nudger);
                Arc::new(move || {
                    if let Some(nudger) = nudger.get() {
                        nudger.nudge();
                    }
                })
            },
        };
        let net_start = Start {
            net: Some(&hooks),
            ..*start
        };
        let network = start_one::<UcxTransport>(&net_start).map(Network::Ucx)?;
        let spin_work = start.plane.while_spinning(network.plane_work());
        let _ = nudger.set(spin_work.nudger());
        Ok(NetLink {
            _spin_work: spin_work,
            network,
        })
    }
}

impl Network {
    /// The transport's name, as `debug_state()` shows the routes through it.
    pub(crate) fn name(&self) -> &'static str {
        fn name_of<T: NetworkTransport>(_: &T) -> &'static str {
            T::NAME
        }
        on_network!(self, net => name_of(net))
    }

    /// See [`Transport::peer`].
    pub(crate) fn peer(&self, pe: usize) -> Option<NetPeer> {
        on_network!(self, net => net.peer(pe))
    }

    /// See [`Transport::put`].
    pub(crate) fn put(&self, peer: NetPeer, offset: usize, source: LocalSource<'_>) -> Result<()> {
        on_network!(self, net => net.put(peer, offset, source))
    }

    /// See [`Transport::put_nbi`].
    pub(crate) fn put_nbi(
        &self,
        peer: NetPeer,
        offset: usize,
        source: LocalSource<'_>,
    ) -> Result<()> {
        on_network!(self, net => net.put_nbi(peer, offset, source))
    }

    /// See [`Transport::get`].
    pub(crate) fn get(&self, peer: NetPeer, offset: usize, target: LocalTarget<'_>) -> Result<()> {
        on_network!(self, net => net.get(peer, offset, target))
    }

    /// See [`Transport::get_nbi`].
    pub(crate) fn get_nbi(
        &self,
        peer: NetPeer,
        offset: usize,
        target: LocalTarget<'_>,
    ) -> Result<()> {
        on_network!(self, net => net.get_nbi(peer, offset, target))
    }

    /// See [`Transport::put_strided`].
    pub(crate) fn put_strided(
        &self,
        peer: NetPeer,
        offset: usize,
        source: LocalSource<'_>,
        strides: Strides,
    ) -> Result<()> {
        on_network!(self, net => net.put_strided(peer, offset, source, strides))
    }

    /// See [`Transport::get_strided`].
    pub(crate) fn get_strided(
        &self,
        peer: NetPeer,
        offset: usize,
        target: LocalTarget<'_>,
        strides: Strides,
    ) -> Result<()> {
        on_network!(self, net => net.get_strided(peer, offset, target, strides))
    }

    /// See [`Transport::atomic`].
    pub(crate) fn atomic(
        &self,
        peer: NetPeer,
        offset: usize,
        width: Width,
        rmw: Rmw,
    ) -> Result<u64> {
        on_network!(self, net => net.atomic(peer, offset, width, rmw))
    }

    /// See [`Transport::update`].
    pub(crate) fn update(
        &self,
        peer: NetPeer,
        offset: usize,
        width: Width,
        op: SignalOp,
        value: u64,
    ) -> Result<()> {
        on_network!(self, net => net.update(peer, offset, width, op, value))
    }

    /// See [`Transport::signal`].
    pub(crate) fn signal(
        &self,
        peer: NetPeer,
        offset: usize,
        width: Width,
        op: SignalOp,
        value: u64,
    ) -> Result<()> {
        on_network!(self, net => net.signal(peer, offset, width, op, value))
    }

    /// See [`Transport::fence`].
    pub(crate) fn fence(&self) -> Result<()> {
        on_network!(self, net => net.fence())
    }

    /// See [`Transport::quiet`].
    pub(crate) fn quiet(&self) -> Result<()> {
        on_network!(self, net => net.quiet())
    }

    /// See [`Transport::local_ptr`].
    pub(crate) fn local_ptr(&self, peer: NetPeer, offset: usize) -> Option<NonNull<u8>> {
        on_network!(self, net => net.local_ptr(peer, offset))
    }

    /// See [`NetworkTransport::send_exchange`].
    pub(crate) fn send_exchange(
        &self,
        peer: NetPeer,
        tag: u64,
        data: &[u8],
        deadline: Instant,
    ) -> Result<Exchange> {
        on_network!(self, net => net.send_exchange(peer, tag, data, deadline))
    }

    /// See [`NetworkTransport::take_exchange`].
    pub(crate) fn take_exchange(&self, exchange: Exchange) -> Option<Vec<u8>> {
        on_network!(self, net => net.take_exchange(exchange))
    }

    /// See [`NetworkTransport::plane_work`].
    fn plane_work(&self) -> Arc<dyn Progress> {
        on_network!(self, net => net.plane_work())
    }

    /// Test-only (`fault-injection` builds): the gets this process issued over the build's
    /// network transports, and their bytes, since it started.
    #[cfg(feature = "fault-injection")]
    pub(crate) fn gets_issued() -> (u64, u64) {
        <UcxTransport as NetworkTransport>::gets_issued()
    }

    /// Test-only (`fault-injection` builds): this process's answers to peers' gets still in
    /// flight, each holding the heap's mapping until the transport completes or fails it.
    #[cfg(feature = "fault-injection")]
    pub(crate) fn replies_in_flight() -> usize {
        <UcxTransport as NetworkTransport>::replies_in_flight()
    }
}

impl Progress for Network {
    #[inline]
    fn progress(&self) -> usize {
        on_network!(self, net => net.progress())
    }

    fn begin_serving(&self) {
        on_network!(self, net => net.begin_serving())
    }

    fn end_serving(&self, hand_over: bool) {
        on_network!(self, net => net.end_serving(hand_over))
    }

    fn serve_requested(&self) {
        on_network!(self, net => net.serve_requested())
    }
}

/// Little-endian words as bytes, up to four, on the stack: the UCX route's message headers (an
/// exchange's key, a get's request and answers; one is built for every exchange of a barrier)
/// and the call words two ranks trade (`Shmem::gather_call_words`).
pub(crate) fn words_header<const N: usize>(words: [u64; N]) -> WordsHeader {
    const { assert!(N <= 4, "a words header holds up to four words") };
    let mut bytes = [0u8; 32];
    for (place, word) in bytes.chunks_exact_mut(8).zip(words) {
        place.copy_from_slice(&word.to_le_bytes());
    }
    WordsHeader { bytes, len: 8 * N }
}

/// What [`words_header`] makes: the header's bytes are the first `len`.
pub(crate) struct WordsHeader {
    bytes: [u8; 32],
    len: usize,
}

impl std::ops::Deref for WordsHeader {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

/// Word `i` of little-endian words (what [`words_header`] makes).
pub(crate) fn word_of(header: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(header[8 * i..8 * i + 8].try_into().expect("8 bytes"))
}
