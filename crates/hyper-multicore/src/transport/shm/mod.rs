//! The shared-memory transport: one memfd segment per locality group holding the group's heaps
//! (see `segment`), handed by the group's lowest rank to its other members with `SCM_RIGHTS`
//! (see `handoff`). Every operation is a copy or an atomic instruction on the mapping; updates
//! ring the target's doorbell so a futex sleeper wakes.
//!
//! Start-up: prepare (the group's leader creates and maps the segment and listens on the hand-off
//! socket) → publish (nothing: the generation is already agreed) → exchange → attach (members
//! collect the descriptor, map and check it; the leader serves them) → agree.
//!
//! A restart that keeps data may instead reuse the previous lifetime's segment
//! ([`Start::previous`], see `Segment::regrow`): every member maps its memfd again at prepare
//! (the leader resets the control words and writes the new header), publishes the previous
//! generation, and at attach checks that the whole group did the same and reads the header.

pub(crate) mod handoff;
pub(crate) mod segment;
pub(crate) mod sync;

use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use super::{Rmw, Start, Transport, Width};
use crate::error::{Error, ErrorKind, Result};
use crate::sys::mapping::{LocalSource, LocalTarget, SharedMapping, SharedWords, Strides};
use handoff::HandoffListener;
use segment::{Layout, PeWords, Segment};
use sync::{BarrierKind, Doorbell, WaitError, WaitPolicy};

/// The shared-memory transport of one PE.
#[derive(Debug)]
pub(crate) struct ShmTransport {
    segment: Arc<Segment>,
    /// The segment's mapping, held here too: one load fewer between a data-plane call and the
    /// memory it touches (the segment's own reference is behind its `Arc`).
    mapping: Arc<SharedMapping>,
    /// The root ranks whose heaps the segment holds, ascending (slot order).
    members: Box<[usize]>,
    /// This PE's slot.
    own_slot: usize,
    /// The barrier of the segment's PEs, as its creator chose.
    barrier_kind: BarrierKind,
    /// The epoch of this PE's latest barrier on the segment (see [`sync::barrier`]).
    barrier_epoch: AtomicU32,
}

/// How to reach one PE of the segment: its heap's offset in the mapping and its slot (words,
/// doorbell).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ShmPeer {
    heap: usize,
    slot: usize,
}

/// What prepare made.
#[derive(Debug)]
pub(crate) enum Prepared {
    /// The leader's new segment and hand-off listener.
    Created(Segment, HandoffListener),
    /// A member's layout, to check the segment it will receive against.
    Awaited(Layout),
    /// The previous lifetime's segment, mapped again (and the previous generation).
    Regrown(Segment, u64),
}

/// The hand-off socket of the group led by `leader` in runtime lifetime `generation`.
fn socket_name(secret: &[u8], generation: u64, leader: usize) -> Vec<u8> {
    let mut name = handoff::socket_name(secret, generation);
    name.extend_from_slice(format!("/{leader}").as_bytes());
    name
}

/// The place of `rank` among the PEs of its segment, `members`.
fn own_slot(members: &[usize], rank: usize) -> usize {
    members
        .iter()
        .position(|&pe| pe == rank)
        .expect("a rank is a member of its own group")
}

impl Transport for ShmTransport {
    type Prepared = Prepared;
    type Peer = ShmPeer;

    fn prepare(start: &Start<'_>) -> Result<Prepared> {
        let rank = start.plane.rank();
        let members = start.locality.members_of(rank);
        let leader = members[0] == rank;
        let slot = own_slot(members, rank);
        if let Some(previous) = start.previous.filter(|s| s.layout().pes == members.len()) {
            if let Some(segment) =
                previous.regrow(start.heap_size, start.generation, leader, slot)?
            {
                return Ok(Prepared::Regrown(segment, previous.generation()));
            }
        }
        let layout = Layout::new(members.len(), start.heap_size)?;
        if !leader {
            return Ok(Prepared::Awaited(layout));
        }
        let segment = Segment::create(layout, start.generation, slot)?;
        let listener = HandoffListener::bind(&socket_name(start.secret, start.generation, rank))?;
        Ok(Prepared::Created(segment, listener))
    }

    fn publish(prepared: &Prepared) -> Vec<u8> {
        match prepared {
            Prepared::Regrown(_, previous) => previous.to_le_bytes().to_vec(),
            Prepared::Created(..) | Prepared::Awaited(_) => Vec::new(),
        }
    }

    fn attach(
        prepared: Prepared,
        published: &[Vec<u8>],
        start: &Start<'_>,
    ) -> Result<ShmTransport> {
        let rank = start.plane.rank();
        let members: Box<[usize]> = start.locality.members_of(rank).into();
        let leader = members[0];
        let segment = match prepared {
            Prepared::Created(segment, listener) => {
                let pids: Vec<u32> = members[1..].iter().map(|&pe| start.pids[pe]).collect();
                let still_alive = || start.plane.broken().map_or(Ok(()), Err);
                listener.serve(segment.fd(), &pids, start.deadline, still_alive)?;
                segment
            }
            Prepared::Awaited(layout) => {
                let name = socket_name(start.secret, start.generation, leader);
                let fd = handoff::receive(&name, start.pids[leader], start.deadline)?;
                Segment::attach(fd, layout, start.generation, own_slot(&members, rank))?
            }
            Prepared::Regrown(segment, _) => {
                let mine = &published[rank];
                if members.iter().any(|&pe| published[pe] != *mine) {
                    return Err(Error::new(
                        ErrorKind::Protocol,
                        "initialize",
                        format!(
                            "the PEs sharing a heap segment ({members:?}) disagree on reusing \
                             the previous one; every rank must run the same build"
                        ),
                    ));
                }
                segment.check_header()?;
                segment
            }
        };
        let own_slot = own_slot(&members, rank);
        Ok(ShmTransport {
            barrier_kind: segment.barrier_kind()?,
            mapping: Arc::clone(segment.mapping()),
            segment: Arc::new(segment),
            members,
            own_slot,
            barrier_epoch: AtomicU32::new(0),
        })
    }

    fn peer(&self, pe: usize) -> Option<ShmPeer> {
        let slot = self.members.iter().position(|&member| member == pe)?;
        Some(ShmPeer {
            heap: self.segment.layout().heap_offset(slot),
            slot,
        })
    }

    #[inline]
    fn put(&self, peer: ShmPeer, offset: usize, source: LocalSource<'_>) -> Result<()> {
        self.mapping().write_from(peer.heap + offset, source);
        Ok(())
    }

    #[inline]
    fn get(&self, peer: ShmPeer, offset: usize, target: LocalTarget<'_>) -> Result<()> {
        self.mapping().read_into(peer.heap + offset, target);
        Ok(())
    }

    fn put_strided(
        &self,
        peer: ShmPeer,
        offset: usize,
        source: LocalSource<'_>,
        strides: Strides,
    ) -> Result<()> {
        self.mapping()
            .write_strided(peer.heap + offset, source, strides);
        Ok(())
    }

    fn get_strided(
        &self,
        peer: ShmPeer,
        offset: usize,
        target: LocalTarget<'_>,
        strides: Strides,
    ) -> Result<()> {
        self.mapping()
            .read_strided(peer.heap + offset, target, strides);
        Ok(())
    }

    #[inline(always)]
    fn atomic(&self, peer: ShmPeer, offset: usize, width: Width, rmw: Rmw) -> Result<u64> {
        Ok(self.rmw(peer, offset, width, rmw))
    }

    #[inline]
    fn fence(&self) -> Result<()> {
        fence(Ordering::Release);
        Ok(())
    }

    #[inline]
    fn quiet(&self) -> Result<()> {
        fence(Ordering::SeqCst);
        Ok(())
    }

    #[inline]
    fn local_ptr(&self, peer: ShmPeer, offset: usize) -> Option<NonNull<u8>> {
        NonNull::new(self.mapping().address(peer.heap + offset))
    }
}

impl ShmTransport {
    /// The segment.
    pub(crate) fn segment(&self) -> &Arc<Segment> {
        &self.segment
    }

    #[inline]
    fn mapping(&self) -> &SharedMapping {
        &self.mapping
    }

    /// Performs `rmw` on the word at `offset` of `peer`'s heap; updates ring the peer's
    /// doorbell. Returns the previous value.
    #[inline(always)]
    fn rmw(&self, peer: ShmPeer, offset: usize, width: Width, rmw: Rmw) -> u64 {
        let previous = apply_rmw(self.mapping(), peer.heap + offset, width, rmw);
        if !matches!(rmw, Rmw::Load) {
            sync::ring(&self.segment.pe_words(peer.slot).doorbell);
        }
        previous
    }

    /// The words of type `W` at `offset` of this PE's own heap.
    #[inline]
    pub(crate) fn own_words<W: SharedWords>(&self, offset: usize) -> &W {
        let heap = self.segment.layout().heap_offset(self.own_slot);
        self.mapping().words(heap + offset)
    }

    /// The `len` bytes at `offset` of this PE's own heap as the source of a put (read in
    /// place).
    #[inline]
    pub(crate) fn own_source(&self, offset: usize, len: usize) -> LocalSource<'_> {
        let heap = self.segment.layout().heap_offset(self.own_slot);
        self.mapping().source(heap + offset, len)
    }

    /// The `len` bytes at `offset` of this PE's own heap as the target of a get (written in
    /// place).
    #[inline]
    pub(crate) fn own_target(&self, offset: usize, len: usize) -> LocalTarget<'_> {
        let heap = self.segment.layout().heap_offset(self.own_slot);
        self.mapping().target(heap + offset, len)
    }

    /// This PE's slot in the segment (its words and doorbell).
    #[cfg_attr(not(all(feature = "ucx", not(loom))), allow(dead_code))]
    pub(crate) fn own_slot(&self) -> usize {
        self.own_slot
    }

    /// The mapping holding this PE's own heap, and the heap's offset in it (for registration
    /// with another transport).
    #[cfg_attr(not(all(feature = "ucx", not(loom))), allow(dead_code))]
    pub(crate) fn own_heap(&self) -> (Arc<SharedMapping>, usize) {
        let heap = self.segment.layout().heap_offset(self.own_slot);
        (Arc::clone(self.segment.mapping()), heap)
    }

    /// This PE's own words (doorbell, argument slots).
    #[inline]
    pub(crate) fn own_pe_words(&self) -> &PeWords {
        self.segment.pe_words(self.own_slot)
    }

    /// This PE's doorbell.
    #[inline]
    pub(crate) fn own_doorbell(&self) -> &Doorbell {
        &self.own_pe_words().doorbell
    }

    /// This PE's next barrier with every PE of the segment ([`sync::barrier`] of the segment's
    /// kind). This PE counts its epochs: every member makes the same calls, so all count alike,
    /// and a new segment lifetime starts from zeroed words and a new count. With `carry`, on a
    /// segment of two PEs, the words go to the other PE with it ([`ShmTransport::carried`]).
    #[inline]
    pub(crate) fn barrier(
        &self,
        policy: &WaitPolicy,
        carry: Option<&[u64; 4]>,
    ) -> std::result::Result<(), WaitError> {
        // A read-modify-write: two threads of this PE calling a barrier at once (a program
        // error: collectives are ordered) get different epochs, so one of them waits for a
        // barrier the peers never make and times out, instead of both passing one.
        let epoch = self
            .barrier_epoch
            .fetch_add(1, Ordering::Relaxed)
            .wrapping_add(1);
        let abort = &self.segment.control().abort;
        let pes = self.members.len();
        let words = &*self.segment;
        let me = self.own_slot;
        match carry.filter(|_| self.carries()) {
            Some(carry) => {
                sync::dissemination_barrier(words, me, pes, epoch, abort, policy, Some(carry))
            }
            None => sync::barrier(self.barrier_kind, words, me, pes, epoch, abort, policy),
        }
    }

    /// Whether a barrier hands carried words over: a segment of two PEs, whose (dissemination)
    /// barrier is one flag store each way.
    #[inline]
    fn carries(&self) -> bool {
        self.members.len() == 2 && self.barrier_kind == BarrierKind::Dissemination
    }

    /// The rank of the other PE of a 2-PE segment and the words tagged `tag` it carried with
    /// a barrier, if this segment carries words and they are still there whole
    /// ([`sync::BarrierFlags::carried`]).
    #[inline]
    pub(crate) fn carried(&self, tag: u64) -> Option<(usize, [u64; 4])> {
        if !self.carries() {
            return None;
        }
        let words = self.own_pe_words().barrier.carried(tag)?;
        Some((self.members[1 - self.own_slot], words))
    }
}

/// Performs `rmw` (sequentially consistent) on the `width` word at `offset` of `mapping`, which
/// must be aligned to the width; returns the previous value (zero for a store). The one atomic
/// every route applies to a heap word in this host's memory: the shared-memory route's, and
/// the UCX route's signal message (`transport::ucx`), so both stay atomic with each other.
#[inline(always)]
pub(super) fn apply_rmw(mapping: &SharedMapping, offset: usize, width: Width, rmw: Rmw) -> u64 {
    let order = Ordering::SeqCst;
    match width {
        Width::W32 => {
            let word: &AtomicU32 = mapping.words(offset);
            u64::from(match rmw {
                Rmw::Load => word.load(order),
                Rmw::Store(v) => {
                    word.store(v as u32, order);
                    0
                }
                Rmw::Swap(v) => word.swap(v as u32, order),
                Rmw::CompareSwap { expected, desired } => {
                    match word.compare_exchange(expected as u32, desired as u32, order, order) {
                        Ok(previous) | Err(previous) => previous,
                    }
                }
                Rmw::Add(v) => word.fetch_add(v as u32, order),
            })
        }
        Width::W64 => {
            let word: &AtomicU64 = mapping.words(offset);
            match rmw {
                Rmw::Load => word.load(order),
                Rmw::Store(v) => {
                    word.store(v, order);
                    0
                }
                Rmw::Swap(v) => word.swap(v, order),
                Rmw::CompareSwap { expected, desired } => {
                    match word.compare_exchange(expected, desired, order, order) {
                        Ok(previous) | Err(previous) => previous,
                    }
                }
                Rmw::Add(v) => word.fetch_add(v, order),
            }
        }
    }
}
