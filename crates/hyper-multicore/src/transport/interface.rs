//! The transport interface: [`Transport`], which every transport implements (Sandia
//! OpenSHMEM's init/startup/fini shape), and [`NetworkTransport`], what a network transport
//! adds to it (two-rank exchanges, progress that waiters drive).
//!
//! ```text
//! prepare (local setup) → publish (bytes for peers) → exchange (control plane) → attach → agree
//! teardown: Drop (local only, never collective)
//! ```

use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Instant;

use super::locality::Locality;
use super::network::NetStart;
use super::segment::Segment;
use crate::config::TransportMode;
use crate::control::converge::converge;
use crate::control::{ControlPlane, Progress};
use crate::error::Result;
use crate::sys::mapping::{LocalSource, LocalTarget, Strides};

/// How a signal (or an update) writes its word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SignalOp {
    /// Store the value.
    Set,
    /// Add the value (wrapping).
    Add,
}

/// Which write of a word a call makes: an update (complete at the next quiet) or a signal
/// (ordered after this PE's earlier puts to the target, and waking the target's waiter).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WordWrite {
    /// An update.
    Update,
    /// A signal.
    Signal,
}

/// The read-modify-write operations on one word (the bits of the value, zero-extended).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Rmw {
    /// Read.
    Load,
    /// Store the value.
    Store(u64),
    /// Store the value, return the previous one.
    Swap(u64),
    /// Store `desired` if the word is `expected`; return the previous value.
    CompareSwap {
        /// The value the word must hold.
        expected: u64,
        /// The value stored then.
        desired: u64,
    },
    /// Add (wrapping), return the previous value.
    Add(u64),
}

impl Rmw {
    /// The write of an update or a signal: a store or an add of `value`, as `op` says.
    pub(crate) fn update(op: SignalOp, value: u64) -> Rmw {
        match op {
            SignalOp::Set => Rmw::Store(value),
            SignalOp::Add => Rmw::Add(value),
        }
    }
}

/// The kind of an [`Rmw`], for passing one in registers ([`Rmw::split`]).
#[derive(Clone, Copy, Debug)]
pub(crate) enum RmwKind {
    /// [`Rmw::Load`].
    Load,
    /// [`Rmw::Store`].
    Store,
    /// [`Rmw::Swap`].
    Swap,
    /// [`Rmw::CompareSwap`].
    CompareSwap,
    /// [`Rmw::Add`].
    Add,
}

impl Rmw {
    /// This operation as its kind and operands (unused operands zero).
    #[inline(always)]
    pub(crate) fn split(self) -> (RmwKind, [u64; 2]) {
        match self {
            Rmw::Load => (RmwKind::Load, [0, 0]),
            Rmw::Store(value) => (RmwKind::Store, [value, 0]),
            Rmw::Swap(value) => (RmwKind::Swap, [value, 0]),
            Rmw::CompareSwap { expected, desired } => (RmwKind::CompareSwap, [expected, desired]),
            Rmw::Add(value) => (RmwKind::Add, [value, 0]),
        }
    }

    /// The operation [`Rmw::split`] split.
    pub(crate) fn join(kind: RmwKind, [a, b]: [u64; 2]) -> Rmw {
        match kind {
            RmwKind::Load => Rmw::Load,
            RmwKind::Store => Rmw::Store(a),
            RmwKind::Swap => Rmw::Swap(a),
            RmwKind::CompareSwap => Rmw::CompareSwap {
                expected: a,
                desired: b,
            },
            RmwKind::Add => Rmw::Add(a),
        }
    }
}

/// The width of an atomic word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Width {
    /// 32 bits.
    W32,
    /// 64 bits.
    W64,
}

impl Width {
    /// The width of a `bytes`-byte word (4 or 8).
    pub(crate) fn of_bytes(bytes: usize) -> Width {
        if bytes == 4 {
            Width::W32
        } else {
            Width::W64
        }
    }
}

/// What every transport's start-up gets.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Start<'a> {
    /// The transport mode in force (the same on every rank).
    pub(crate) mode: TransportMode,
    /// The root's control plane (the exchange runs over it).
    pub(crate) plane: &'a ControlPlane,
    /// The job secret (names the hand-off socket).
    pub(crate) secret: &'a [u8],
    /// The locality groups.
    pub(crate) locality: &'a Locality,
    /// Every rank's process id, in rank order.
    pub(crate) pids: &'a [u32],
    /// The runtime lifetime (the same on every rank).
    pub(crate) generation: u64,
    /// Heap bytes per PE.
    pub(crate) heap_size: u64,
    /// When start-up gives up.
    pub(crate) deadline: Instant,
    /// The previous lifetime's segment of this PE, to reuse with the heaps in place if the new
    /// heap fits its room (a restart keeping data); `None` for a new segment.
    pub(crate) previous: Option<&'a Segment>,
    /// What a network transport's start-up gets besides (`None` for the shared-memory
    /// transport's). Read only by the network transports this build has.
    #[cfg_attr(not(all(feature = "ucx", not(loom))), allow(dead_code))]
    pub(crate) net: Option<&'a NetStart<'a>>,
}

/// One transport: its start-up stages and its operations. Operations address a peer by the
/// transport's own [`Transport::Peer`] data (computed once, when the route table is built) and a
/// byte offset inside that peer's heap. Teardown is `Drop`: local only.
pub(crate) trait Transport: Sized {
    /// What the local set-up made, kept until attach.
    type Prepared;
    /// What an operation needs to reach one peer (carried in the route table).
    type Peer: Copy + std::fmt::Debug + PartialEq;

    /// Local set-up (no communication).
    fn prepare(start: &Start<'_>) -> Result<Self::Prepared>;

    /// The bytes every peer needs to attach to this PE.
    fn publish(prepared: &Self::Prepared) -> Vec<u8>;

    /// Attaches to the peers, given every rank's published bytes in rank order.
    fn attach(prepared: Self::Prepared, published: &[Vec<u8>], start: &Start<'_>) -> Result<Self>;

    /// How to reach root rank `pe`, or `None` if this transport does not.
    fn peer(&self, pe: usize) -> Option<Self::Peer>;

    /// Copies `source` to `offset` of PE `pe`'s heap; `source` may be reused on return. The
    /// bytes move once: `source` is read in place (it may be shared memory, even the target's).
    fn put(&self, peer: Self::Peer, offset: usize, source: LocalSource<'_>) -> Result<()>;

    /// Copies `offset..` of PE `pe`'s heap into `target`; complete on return. The bytes move
    /// once, into `target` in place (it may be shared memory, even the source's).
    fn get(&self, peer: Self::Peer, offset: usize, target: LocalTarget<'_>) -> Result<()>;

    /// A put that may complete only at the next [`Transport::quiet`].
    fn put_nbi(&self, peer: Self::Peer, offset: usize, source: LocalSource<'_>) -> Result<()> {
        self.put(peer, offset, source)
    }

    /// A get whose target is valid after the next [`Transport::quiet`] (the safe API lends the
    /// target only for the call, so implementations complete it before returning).
    fn get_nbi(&self, peer: Self::Peer, offset: usize, target: LocalTarget<'_>) -> Result<()> {
        self.get(peer, offset, target)
    }

    /// A strided put: `strides.count` elements of `strides.size` bytes from `source`
    /// (`strides.local_stride` bytes apart) to `offset..` of PE `pe`'s heap (`strides.stride`
    /// apart). By default one put per element.
    fn put_strided(
        &self,
        peer: Self::Peer,
        offset: usize,
        source: LocalSource<'_>,
        strides: Strides,
    ) -> Result<()> {
        (0..strides.count).try_for_each(|i| {
            let element = source.part(i * strides.local_stride, strides.size);
            self.put(peer, offset + i * strides.stride, element)
        })
    }

    /// A strided get, the other way round of [`Transport::put_strided`]. By default one get per
    /// element.
    fn get_strided(
        &self,
        peer: Self::Peer,
        offset: usize,
        mut target: LocalTarget<'_>,
        strides: Strides,
    ) -> Result<()> {
        (0..strides.count).try_for_each(|i| {
            let element = target.part(i * strides.local_stride, strides.size);
            self.get(peer, offset + i * strides.stride, element)
        })
    }

    /// Performs `rmw` on the word at `offset` of PE `pe`'s heap; returns the previous value.
    /// Updates wake the target's waiters.
    fn atomic(&self, peer: Self::Peer, offset: usize, width: Width, rmw: Rmw) -> Result<u64>;

    /// Sets or adds (`op`) `value` to the word at `offset` of PE `pe`'s heap without reading it back:
    /// complete at the next [`Transport::quiet`]. Updates wake the target's waiters.
    #[inline(always)]
    fn update(
        &self,
        peer: Self::Peer,
        offset: usize,
        width: Width,
        op: SignalOp,
        value: u64,
    ) -> Result<()> {
        self.atomic(peer, offset, width, Rmw::update(op, value))
            .map(drop)
    }

    /// Sets or adds (`op`) `value` to the signal word at `offset` of PE `pe`'s heap, ordered after this
    /// PE's earlier puts to `pe`, and wakes the target's waiter. By default the update, which
    /// must then be ordered so (a sequentially consistent store or add in shared memory is).
    #[inline(always)]
    fn signal(
        &self,
        peer: Self::Peer,
        offset: usize,
        width: Width,
        op: SignalOp,
        value: u64,
    ) -> Result<()> {
        self.update(peer, offset, width, op, value)
    }

    /// Orders this PE's earlier puts to each PE before its later ones.
    fn fence(&self) -> Result<()>;

    /// Completes every outstanding operation of this PE.
    fn quiet(&self) -> Result<()>;

    /// The address of `offset` of PE `pe`'s heap where it is mapped in this process.
    fn local_ptr(&self, peer: Self::Peer, offset: usize) -> Option<NonNull<u8>>;
}

/// Runs one transport's start-up on every rank: prepare → publish → exchange → attach → agree.
/// A failure at any stage on any rank fails it on every rank (the converged step).
pub(crate) fn start_one<T: Transport>(start: &Start<'_>) -> Result<T> {
    const OP: &str = "initialize";
    let rank = start.plane.rank();
    let (local, prepared) = match T::prepare(start) {
        Ok(prepared) => (Ok(T::publish(&prepared)), Some(prepared)),
        Err(error) => (Err(error.on_rank(rank)), None),
    };
    let published = converge(start.plane, OP, local)?;
    let prepared = prepared.expect("the exchange succeeded, so every rank prepared");
    let (local, attached) = match T::attach(prepared, &published, start) {
        Ok(transport) => (Ok(()), Some(transport)),
        Err(error) => (Err(error.on_rank(rank)), None),
    };
    converge(start.plane, OP, local)?;
    Ok(attached.expect("every rank attached"))
}

/// How a network transport addresses a peer: its root rank.
pub(crate) type NetPeer = usize;

/// A two-rank exchange a network transport started ([`NetworkTransport::send_exchange`]): the
/// key its peer's message arrives under (source rank, tag, sequence).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Exchange(pub(crate) (u64, u64, u64));

/// What a network transport adds to [`Transport`]: its peers are root ranks; it is progressed
/// by the threads that wait on it ([`Progress`]: the data plane's waits and the control
/// plane's waiters drive it); and two ranks can trade one message each way through it without
/// the control plane's router thread (a spanning barrier of two hosts, the argument check of a
/// collective allocate across two).
pub(crate) trait NetworkTransport: Transport<Peer = NetPeer> + Progress {
    /// The transport's name, as `debug_state()` shows the routes through it.
    const NAME: &'static str;

    /// Starts this PE's side of a two-rank exchange with `peer` under `tag`: sends `data` as
    /// one message, to be taken by the peer's matching exchange. Both ranks must make the same
    /// exchanges with each other in the same order (collectives do). The send ends by
    /// `deadline`.
    fn send_exchange(
        &self,
        peer: NetPeer,
        tag: u64,
        data: &[u8],
        deadline: Instant,
    ) -> Result<Exchange>;

    /// The peer's message of an exchange, once it arrived (taken: a second call gives None).
    fn take_exchange(&self, exchange: Exchange) -> Option<Vec<u8>>;

    /// What the control plane's waiters run while they spin (see
    /// `ControlPlane::while_spinning`): the transport's progress, held by the plane's waiters
    /// independently of the transport.
    fn plane_work(&self) -> Arc<dyn Progress>;

    /// Test-only (`fault-injection` builds): the gets this process issued through this
    /// transport, and their bytes, since it started (zeros for a transport without gets of
    /// its own).
    #[cfg(feature = "fault-injection")]
    fn gets_issued() -> (u64, u64) {
        (0, 0)
    }

    /// Test-only (`fault-injection` builds): this process's answers to peers' gets still in
    /// flight, each holding the heap's mapping (0 for a transport that keeps none).
    #[cfg(feature = "fault-injection")]
    fn replies_in_flight() -> usize {
        0
    }
}
