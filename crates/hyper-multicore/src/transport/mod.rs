//! The transport layer: how this PE reaches every peer's heap.
//!
//! Every transport is a sibling behind one trait, [`Transport`], with one start-up and teardown
//! interface (Sandia OpenSHMEM's init/startup/fini, STYLE.md items 5–6):
//!
//! ```text
//! prepare (local setup) → publish (bytes for peers) → exchange (control plane) → attach → agree
//! teardown: Drop (local only, never collective)
//! ```
//!
//! and the same operations: put/get (blocking and non-blocking), atomics on 32/64-bit words,
//! signal set/add (which wakes the target's waiter), fence, quiet and `local_ptr`.
//!
//! Each peer has a [`Route`], computed once at initialize and held in the route table of
//! [`Transports`]: `Shm` for PEs whose heap is in this process's segment (the route carries the
//! heap's offset in the mapping, so the fast path is one load and a match, no allocation and no
//! dynamic dispatch), `Ucx` otherwise.
//!
//! ```ignore
//! let transports = transport::start(&start)?;          // collective, at initialize
//! transports.put(pe, offset_in_heap, (&bytes).into())?; // match on routes[pe]
//! ```

pub(crate) mod shm;
#[cfg(all(feature = "ucx", not(loom)))]
mod ucx;
#[cfg(not(all(feature = "ucx", not(loom))))]
#[path = "ucx_absent.rs"]
mod ucx;

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::sync::Arc;
use std::time::Instant;

use crate::config::TransportMode;
use crate::control::converge::converge;
use crate::control::ControlPlane;
use crate::error::{Error, ErrorKind, Result};
use crate::sys::copies;
use crate::sys::mapping::{LocalSource, LocalTarget, Strides};
use segment::Segment;
use sync::{AbortWord, Deadline, Doorbell, WaitError, WaitPolicy};

pub(crate) use shm::{segment, sync, ShmPeer, ShmTransport};
pub(crate) use ucx::{Awaited, UcxPeer, UcxTransport};

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
    /// The write of an update or a signal: an add of `value` with `add`, else a store of it.
    pub(crate) fn update(add: bool, value: u64) -> Rmw {
        if add {
            Rmw::Add(value)
        } else {
            Rmw::Store(value)
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
    fn split(self) -> (RmwKind, [u64; 2]) {
        match self {
            Rmw::Load => (RmwKind::Load, [0, 0]),
            Rmw::Store(value) => (RmwKind::Store, [value, 0]),
            Rmw::Swap(value) => (RmwKind::Swap, [value, 0]),
            Rmw::CompareSwap { expected, desired } => (RmwKind::CompareSwap, [expected, desired]),
            Rmw::Add(value) => (RmwKind::Add, [value, 0]),
        }
    }

    /// The operation [`Rmw::split`] split.
    fn join(kind: RmwKind, [a, b]: [u64; 2]) -> Rmw {
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

/// The transport layer of an initialized runtime, as [`super::DebugState`] shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TransportState {
    /// `HYPER_MULTICORE_SHMEM_TRANSPORT` in force: `auto`, `shm` or `ucx`.
    pub mode: String,
    /// How this PE reaches each root rank (itself included), in rank order: `shm` (its heap is
    /// mapped here) or `ucx`.
    pub routes: Vec<String>,
}

/// How a peer is reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Route {
    /// Its heap is mapped here, at this offset of this process's segment.
    Shm(ShmPeer),
    /// Through UCX.
    Ucx(UcxPeer),
}

impl Route {
    /// The route's name, as `debug_state()` shows it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Route::Shm(_) => "shm",
            Route::Ucx(_) => "ucx",
        }
    }
}

/// Test-only: a simulated host name replacing this process's host identity, so one machine
/// can run a root spanning "hosts" (shared memory within each, UCX between them). Read only by
/// builds with the `fault-injection` cargo feature (the test harness).
pub const TEST_HOST_VARIABLE: &str = "HYPER_MULTICORE_TEST_HOST";

/// This host's identity: its name, boot ID (distinct per machine and boot) and network
/// namespace (the segment hand-off's abstract Unix socket is per network namespace, so PEs in
/// different ones cannot share a segment).
pub(crate) fn host_identity() -> String {
    #[cfg(feature = "fault-injection")]
    if let Ok(simulated) = std::env::var(TEST_HOST_VARIABLE) {
        return format!("simulated host {simulated}");
    }
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let name = rustix::system::uname();
    let network = std::fs::read_link("/proc/self/ns/net").unwrap_or_default();
    format!(
        "{}@{}/{}",
        name.nodename().to_string_lossy(),
        boot.trim(),
        network.display()
    )
}

/// Which PEs share a segment: the locality groups of a root, identical on every rank.
///
/// PEs are grouped by host identity (name, boot ID, network namespace). `auto` and `shm`: one
/// group per host (the group's lowest rank creates the segment and hands it to the others);
/// `ucx`: every PE is its own group, so every pair goes through UCX.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Locality {
    /// The groups, each ascending by root rank, ordered by their lowest rank.
    pub(crate) groups: Vec<Vec<usize>>,
    /// Index in `groups` of every rank's group.
    pub(crate) group_of: Vec<usize>,
    /// Index of every rank's host (in order of first appearance).
    pub(crate) host_of: Vec<usize>,
}

impl Locality {
    /// The groups of a root whose ranks report `hosts` (in rank order), under `mode`.
    pub(crate) fn new(mode: TransportMode, hosts: &[&str]) -> Locality {
        let mut names: Vec<&str> = Vec::new();
        let host_of: Vec<usize> = hosts
            .iter()
            .map(|host| match names.iter().position(|n| n == host) {
                Some(index) => index,
                None => {
                    names.push(host);
                    names.len() - 1
                }
            })
            .collect();
        let group_of: Vec<usize> = match mode {
            TransportMode::Auto | TransportMode::Shm => host_of.clone(),
            TransportMode::Ucx => (0..hosts.len()).collect(),
        };
        let count = group_of.iter().max().map_or(0, |g| g + 1);
        let mut groups = vec![Vec::new(); count];
        for (rank, &group) in group_of.iter().enumerate() {
            groups[group].push(rank);
        }
        Locality {
            groups,
            group_of,
            host_of,
        }
    }

    /// How many PEs of the root run on `rank`'s host (its own included).
    pub(crate) fn local_pes(&self, rank: usize) -> usize {
        let host = self.host_of[rank];
        self.host_of.iter().filter(|&&h| h == host).count()
    }

    /// The members of `rank`'s group.
    pub(crate) fn members_of(&self, rank: usize) -> &[usize] {
        &self.groups[self.group_of[rank]]
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
    /// The shared-memory transport, once started (the UCX transport registers its heap).
    #[cfg_attr(not(all(feature = "ucx", not(loom))), allow(dead_code))]
    pub(crate) shm: Option<&'a ShmTransport>,
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

    /// Sets or adds `value` to the word at `offset` of PE `pe`'s heap without reading it back:
    /// complete at the next [`Transport::quiet`]. Updates wake the target's waiters.
    #[inline(always)]
    fn update(
        &self,
        peer: Self::Peer,
        offset: usize,
        width: Width,
        add: bool,
        value: u64,
    ) -> Result<()> {
        self.atomic(peer, offset, width, Rmw::update(add, value))
            .map(drop)
    }

    /// Sets or adds `value` to the signal word at `offset` of PE `pe`'s heap, ordered after this
    /// PE's earlier puts to `pe`, and wakes the target's waiter. By default the update, which
    /// must then be ordered so (a sequentially consistent store or add in shared memory is).
    #[inline(always)]
    fn signal(
        &self,
        peer: Self::Peer,
        offset: usize,
        width: Width,
        add: bool,
        value: u64,
    ) -> Result<()> {
        self.update(peer, offset, width, add, value)
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

/// Every route of this PE and the transports behind them.
#[derive(Debug)]
pub(crate) struct Transports {
    routes: Box<[Route]>,
    shm: ShmTransport,
    ucx: Option<UcxTransport>,
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
    /// Collective: starts the transports this PE's routes need.
    pub(crate) fn start(start: &Start<'_>) -> Result<Transports> {
        let shm: ShmTransport = start_one(start)?;
        let rank = start.plane.rank();
        let single_group = start.locality.groups.len() == 1;
        // Every rank of a root spanning several groups has peers outside its own, so all ranks
        // make the same decision (the start-up is collective).
        let ucx: Option<UcxTransport> = if single_group {
            None
        } else {
            Some(start_one(&Start {
                shm: Some(&shm),
                ..*start
            })?)
        };
        let routes = (0..start.pids.len())
            .map(
                |pe| match (shm.peer(pe), ucx.as_ref().and_then(|u| u.peer(pe))) {
                    (Some(peer), _) => Ok(Route::Shm(peer)),
                    (None, Some(peer)) => Ok(Route::Ucx(peer)),
                    (None, None) => Err(Error::new(
                        ErrorKind::Protocol,
                        "initialize",
                        format!("no transport reaches root rank {pe}"),
                    )
                    .on_rank(rank)),
                },
            )
            .collect::<Result<Box<[Route]>>>()?;
        Ok(Transports {
            single_group,
            local_pes: start.locality.local_pes(rank),
            group: start.locality.members_of(rank).into(),
            leaders: start.locality.groups.iter().map(|group| group[0]).collect(),
            mode: start.mode,
            routes,
            shm,
            ucx,
        })
    }

    /// This PE's segment (sync words, keep-alive of the mapping).
    pub(crate) fn segment(&self) -> &Arc<Segment> {
        self.shm.segment()
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
            routes: self.routes.iter().map(|r| r.name().to_string()).collect(),
        }
    }

    /// Each peer's route, in rank order.
    pub(crate) fn routes(&self) -> &[Route] {
        &self.routes
    }

    /// Waits until `ready()`, a look at this PE's own memory that becomes true through a write
    /// followed by a ring of this PE's doorbell (see [`sync::wait_until`]), or the abort or the
    /// deadline. With UCX peers every look also progresses the worker from this thread, so a
    /// waiter in its spin and yield phases applies peers' operations itself instead of waiting
    /// for its progress thread to be scheduled, and sees them as they land; its spin phase is
    /// [`OWN_SPIN_LOOKS`] looks (a progress costs a system call). Before it sleeps it hands
    /// the worker back to the progress thread.
    pub(crate) fn wait_own(
        &self,
        ready: impl FnMut() -> bool,
        policy: &WaitPolicy,
    ) -> std::result::Result<(), WaitError> {
        self.wait_progressing(ready, policy, OWN_SPIN_LOOKS)
    }

    /// Waits until `ready()` becomes true through a UCX peer's message (see
    /// [`Transports::send_exchange`]), or the abort or `deadline`, progressing the worker on
    /// every look. With `spin` (each local PE has a core) it first takes
    /// [`MESSAGE_SPIN_LOOKS`] looks back to back, some ten network round trips: a message that
    /// is already on its way is taken as it lands, not after a yield (a 2-PE barrier over TCP
    /// took 6.6-8.9 µs with yields between looks, 5.0-5.3 µs with this). The spin stays that
    /// short because a waiter spinning for long would keep the sender from running whenever
    /// the scheduler put both on one core — which it does, as each wakes the other. It then
    /// yields, looking, and sleeps.
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

    /// [`Transports::wait_own`] progressing the worker (if any) on every look, with at most
    /// `spin_looks` looks in its spin phase.
    fn wait_progressing(
        &self,
        mut ready: impl FnMut() -> bool,
        policy: &WaitPolicy,
        spin_looks: u32,
    ) -> std::result::Result<(), WaitError> {
        let (bell, abort) = (self.own_doorbell(), self.abort_word());
        let Some(ucx) = &self.ucx else {
            // Without UCX (a one-host root): the look alone, as before the transport layer.
            return sync::wait_until(ready, bell, abort, policy);
        };
        let looks = ucx::Looks::new(ucx);
        let look_and_progress = || {
            looks.progress();
            ready()
        };
        sync::wait_until_then(look_and_progress, bell, abort, policy, spin_looks, &looks)
    }

    /// Starts this PE's side of a two-rank exchange with `pe` under `tag` over UCX (see
    /// [`UcxTransport::send_exchange`]); None when `pe` is not on the UCX route.
    pub(crate) fn send_exchange(
        &self,
        pe: usize,
        tag: u64,
        data: &[u8],
        deadline: Instant,
    ) -> Option<Result<Awaited>> {
        match self.routes[pe] {
            Route::Shm(_) => None,
            Route::Ucx(peer) => Some(
                self.ucx()
                    .and_then(|ucx| ucx.send_exchange(peer, tag, data, deadline)),
            ),
        }
    }

    /// The peer's message of an exchange started with [`Transports::send_exchange`], once it
    /// arrived.
    pub(crate) fn take_exchange(&self, awaited: Awaited) -> Option<Vec<u8>> {
        self.ucx.as_ref().and_then(|ucx| ucx.take_exchange(awaited))
    }

    /// See [`Transport::put`].
    #[inline(always)]
    pub(crate) fn put(&self, pe: usize, offset: usize, source: LocalSource<'_>) -> Result<()> {
        copies::moved(source.len());
        match self.routes[pe] {
            Route::Shm(peer) => self.shm.put(peer, offset, source),
            Route::Ucx(peer) => self.ucx()?.put(peer, offset, source),
        }
    }

    /// See [`Transport::put_nbi`].
    #[inline]
    pub(crate) fn put_nbi(&self, pe: usize, offset: usize, source: LocalSource<'_>) -> Result<()> {
        copies::moved(source.len());
        match self.routes[pe] {
            Route::Shm(peer) => self.shm.put_nbi(peer, offset, source),
            Route::Ucx(peer) => self.ucx()?.put_nbi(peer, offset, source),
        }
    }

    /// See [`Transport::get`].
    #[inline(always)]
    pub(crate) fn get(&self, pe: usize, offset: usize, target: LocalTarget<'_>) -> Result<()> {
        copies::moved(target.len());
        match self.routes[pe] {
            Route::Shm(peer) => self.shm.get(peer, offset, target),
            Route::Ucx(peer) => self.ucx()?.get(peer, offset, target),
        }
    }

    /// See [`Transport::get_nbi`].
    #[inline]
    pub(crate) fn get_nbi(&self, pe: usize, offset: usize, target: LocalTarget<'_>) -> Result<()> {
        copies::moved(target.len());
        match self.routes[pe] {
            Route::Shm(peer) => self.shm.get_nbi(peer, offset, target),
            Route::Ucx(peer) => self.ucx()?.get_nbi(peer, offset, target),
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
            Route::Shm(peer) => self.shm.put_strided(peer, offset, source, strides),
            Route::Ucx(peer) => self.ucx()?.put_strided(peer, offset, source, strides),
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
            Route::Shm(peer) => self.shm.get_strided(peer, offset, target, strides),
            Route::Ucx(peer) => self.ucx()?.get_strided(peer, offset, target, strides),
        }
    }

    /// This PE's own heap's `len` bytes at `offset`, as the source of a put: read in place.
    #[inline]
    pub(crate) fn own_source(&self, offset: usize, len: usize) -> LocalSource<'_> {
        self.shm.own_source(offset, len)
    }

    /// This PE's own heap's `len` bytes at `offset`, as the target of a get: written in place.
    #[inline]
    pub(crate) fn own_target(&self, offset: usize, len: usize) -> LocalTarget<'_> {
        self.shm.own_target(offset, len)
    }

    /// See [`Transport::atomic`].
    #[inline(always)]
    pub(crate) fn atomic(&self, pe: usize, offset: usize, width: Width, rmw: Rmw) -> Result<u64> {
        match self.routes[pe] {
            Route::Shm(peer) => self.shm.atomic(peer, offset, width, rmw),
            Route::Ucx(peer) => {
                let (kind, operands) = rmw.split();
                self.ucx_atomic(peer, offset, width, kind, operands)
            }
        }
    }

    /// [`Transports::atomic`] on the UCX route, out of line, with `rmw` split into registers
    /// ([`Rmw::split`]): passed whole (24 bytes) it would go by reference, so the caller would
    /// keep it in memory on the shared-memory route too, and read its constant kind back from
    /// there (a jump table) instead of folding it.
    #[inline(never)]
    fn ucx_atomic(
        &self,
        peer: UcxPeer,
        offset: usize,
        width: Width,
        kind: RmwKind,
        operands: [u64; 2],
    ) -> Result<u64> {
        let rmw = Rmw::join(kind, operands);
        self.ucx()?.atomic(peer, offset, width, rmw)
    }

    /// See [`Transport::update`].
    #[inline(always)]
    pub(crate) fn update(
        &self,
        pe: usize,
        offset: usize,
        width: Width,
        add: bool,
        value: u64,
    ) -> Result<()> {
        self.write_word(pe, offset, width, add, value, false)
    }

    /// See [`Transport::signal`].
    #[inline(always)]
    pub(crate) fn signal(
        &self,
        pe: usize,
        offset: usize,
        width: Width,
        add: bool,
        value: u64,
    ) -> Result<()> {
        self.write_word(pe, offset, width, add, value, true)
    }

    /// An update, or with `signal` a signal: in shared memory both are the same store or add.
    #[inline(always)]
    fn write_word(
        &self,
        pe: usize,
        offset: usize,
        width: Width,
        add: bool,
        value: u64,
        signal: bool,
    ) -> Result<()> {
        match self.routes[pe] {
            Route::Shm(peer) => self.shm.update(peer, offset, width, add, value),
            Route::Ucx(peer) => self.ucx_write_word(peer, offset, width, add, value, signal),
        }
    }

    /// [`Transports::write_word`] on the UCX route, out of line.
    #[inline(never)]
    fn ucx_write_word(
        &self,
        peer: UcxPeer,
        offset: usize,
        width: Width,
        add: bool,
        value: u64,
        signal: bool,
    ) -> Result<()> {
        let ucx = self.ucx()?;
        if signal {
            ucx.signal(peer, offset, width, add, value)
        } else {
            ucx.update(peer, offset, width, add, value)
        }
    }

    /// See [`Transport::fence`]: every transport in use.
    #[inline]
    pub(crate) fn fence(&self) -> Result<()> {
        self.shm.fence()?;
        match &self.ucx {
            Some(ucx) => ucx.fence(),
            None => Ok(()),
        }
    }

    /// See [`Transport::quiet`]: every transport in use.
    #[inline]
    pub(crate) fn quiet(&self) -> Result<()> {
        self.shm.quiet()?;
        match &self.ucx {
            Some(ucx) => ucx.quiet(),
            None => Ok(()),
        }
    }

    /// The UCX transport (a route says `Ucx` only when it exists).
    #[cold]
    fn ucx(&self) -> Result<&UcxTransport> {
        self.ucx.as_ref().ok_or_else(|| {
            Error::new(
                ErrorKind::Protocol,
                "transport",
                "a peer is routed through UCX but no UCX transport was started",
            )
        })
    }

    /// See [`Transport::local_ptr`].
    #[inline]
    pub(crate) fn local_ptr(&self, pe: usize, offset: usize) -> Option<NonNull<u8>> {
        match self.routes[pe] {
            Route::Shm(peer) => self.shm.local_ptr(peer, offset),
            Route::Ucx(peer) => self.ucx.as_ref().and_then(|u| u.local_ptr(peer, offset)),
        }
    }

    /// The 32-bit word at `offset` of this PE's own heap (signal waits).
    #[inline]
    pub(crate) fn own_word32(&self, offset: usize) -> &AtomicU32 {
        self.shm.own_words(offset)
    }

    /// The 64-bit word at `offset` of this PE's own heap (signal waits).
    #[inline]
    pub(crate) fn own_word64(&self, offset: usize) -> &AtomicU64 {
        self.shm.own_words(offset)
    }

    /// This PE's own words in the segment (doorbell, allocation-argument slots).
    pub(crate) fn own_pe_words(&self) -> &segment::PeWords {
        self.shm.own_pe_words()
    }

    /// This PE's doorbell: writers of its signal words ring it.
    #[inline]
    pub(crate) fn own_doorbell(&self) -> &Doorbell {
        self.shm.own_doorbell()
    }

    /// This PE's next barrier with the PEs of its segment (see [`ShmTransport::barrier`]).
    #[inline]
    pub(crate) fn segment_barrier(
        &self,
        policy: &WaitPolicy,
        carry: Option<&[u64; 4]>,
    ) -> std::result::Result<(), WaitError> {
        self.shm.barrier(policy, carry)
    }

    /// The other PE of a 2-PE segment and the words tagged `tag` it carried with the last
    /// segment barrier (see [`ShmTransport::carried`]), if still there whole.
    #[inline]
    pub(crate) fn carried(&self, tag: u64) -> Option<(usize, [u64; 4])> {
        self.shm.carried(tag)
    }

    /// The abort word this PE's waits watch.
    #[inline]
    pub(crate) fn abort_word(&self) -> &AbortWord {
        &self.shm.segment().control().abort
    }
}

/// The looks of a UCX-aware wait's spin phase ([`Transports::wait_own`]): each progresses the
/// worker (over TCP an `epoll_wait`, some 0.2 µs here), so they take some 0.2-0.3 ms, as the
/// 4096 looks of a shared-memory wait did when only every 16th progressed. Progressing on every
/// look rather than every 16th (~0.7 µs of `PAUSE`s apart) won each of 4 alternated rounds of
/// the 2-PE ping-pongs over TCP by 0.1-0.4 µs (signal 6.98-7.55 → 6.67-7.14 µs one way).
const OWN_SPIN_LOOKS: u32 = 1024;
/// The looks of a message wait's spin phase ([`Transports::wait_message`]): each progresses the
/// worker (over TCP an `epoll_wait`, some 0.2 µs here), so they take some 50 µs. Alternated
/// 2-PE barriers over TCP (median µs of 4 runs each): no spin 6.6-8.9, 64 looks 5.6-6.3, 256
/// / 1024 / 4096 looks alike at 4.8-5.5.
pub(super) const MESSAGE_SPIN_LOOKS: u32 = 256;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_and_shm_group_pes_by_host() {
        let hosts = ["a", "b", "a", "c", "b"];
        for mode in [TransportMode::Auto, TransportMode::Shm] {
            let locality = Locality::new(mode, &hosts);
            assert_eq!(locality.groups, vec![vec![0, 2], vec![1, 4], vec![3]]);
            assert_eq!(locality.members_of(4), &[1, 4]);
            assert_eq!(locality.local_pes(0), 2);
            assert_eq!(locality.local_pes(3), 1);
        }
    }

    #[test]
    fn ucx_makes_every_pe_its_own_group() {
        let locality = Locality::new(TransportMode::Ucx, &["a", "a", "a"]);
        assert_eq!(locality.groups, vec![vec![0], vec![1], vec![2]]);
        assert_eq!(locality.members_of(1), &[1]);
        // Still three PEs on the host (the waiting policy counts them).
        assert_eq!(locality.local_pes(1), 3);
    }

    #[test]
    fn one_host_is_one_group() {
        let locality = Locality::new(TransportMode::Auto, &["h"; 4]);
        assert_eq!(locality.groups, vec![vec![0, 1, 2, 3]]);
        assert_eq!(locality.group_of, vec![0; 4]);
    }
}
