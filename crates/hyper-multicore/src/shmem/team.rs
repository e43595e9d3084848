//! The PEs a collective runs over ([`ReduceSet`]: the whole root, or the members of a world
//! subgroup — an OpenSHMEM split team or active set) resolved once per call into a [`Team`]:
//! its members in order, this PE's place among them, and whether every member's heap is mapped
//! here. How a team meets ([`Shmem::team_meet`]): the root's barrier; a subgroup whose members
//! all share this segment meets through shared memory (`team_sync`), any other over its
//! control plane. And the copies a collective makes between mapped heaps: one raw copy from
//! heap to heap (or from private memory into a heap), never through a private buffer.
//!
//! ```ignore
//! let team = shmem.team("broadcast", pes)?;
//! if team.mapped() { shmem.copy_between(root, offset, pe, offset, len) }
//! shmem.team_meet("broadcast", &team)?;
//! ```

use super::allocation::Region;
use super::reduce::{ReduceOp, ReduceSet, Reducible};
use super::runtime::Shmem;
use super::team_sync;
use crate::error::{ErrorKind, Result};
use crate::sys::mapped_combine::{zip2_with_mapped, zip_with_mapped};
use crate::transport::sync::{Deadline, WaitPolicy};

/// Which way a one-way meeting goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Direction {
    /// The root tells the others.
    FromRoot,
    /// The others tell the root.
    ToRoot,
}

/// A collective's PEs as this PE sees them.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Team<'a> {
    set: ReduceSet<'a>,
    /// The members' ranks in team order; `None` for the whole root (rank `i` is member `i`).
    listed: Option<&'a [usize]>,
    len: usize,
    index: usize,
    mapped: bool,
}

/// This PE's contribution to a collective: bytes of private memory, or a range of this PE's
/// own copy of a symmetric allocation, which the collective reads in place (and, where the
/// peers map this PE's heap, they may read it directly).
///
/// ```
/// use hyper_multicore::shmem::Contribution;
/// let values = [1u8, 2, 3];
/// assert_eq!(Contribution::Local(&values).len(), 3);
/// ```
#[derive(Clone, Copy, Debug)]
pub enum Contribution<'a> {
    /// Private memory of this process (never memory other processes write).
    Local(&'a [u8]),
    /// This PE's copy of a symmetric range.
    Symmetric(Region),
}

impl Contribution<'_> {
    /// Its length in bytes.
    pub fn len(&self) -> usize {
        match self {
            Contribution::Local(bytes) => bytes.len(),
            Contribution::Symmetric(region) => region.bytes as usize,
        }
    }

    /// True if it holds no byte.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<'a> Team<'a> {
    /// The number of members.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// This PE's place in the team.
    #[inline]
    pub(crate) fn index(&self) -> usize {
        self.index
    }

    /// The rank of member `i`.
    #[inline]
    pub(crate) fn pe(&self, i: usize) -> usize {
        match self.listed {
            Some(members) => members[i],
            None => i,
        }
    }

    /// The place of rank `pe` in the team, if it is a member.
    pub(crate) fn position(&self, pe: usize) -> Option<usize> {
        match self.listed {
            Some(members) => members.iter().position(|&m| m == pe),
            None => (pe < self.len).then_some(pe),
        }
    }

    /// Whether every member's heap is mapped in this process (then the collective copies heap
    /// to heap itself; else it goes through each member's route).
    #[inline]
    pub(crate) fn mapped(&self) -> bool {
        self.mapped
    }

    /// The members from this PE's place on, round the team (each member starts at a different
    /// one, so no member is everybody's first target).
    pub(crate) fn round_from_me(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.len).map(move |step| (self.index + step) % self.len)
    }

    /// The set it was made from.
    pub(crate) fn set(&self) -> ReduceSet<'a> {
        self.set
    }
}

impl Shmem {
    /// Resolves `set` for this PE: fails (the same on every member) if a member is not a PE of
    /// this root or this PE is not a member.
    pub(crate) fn team<'a>(&self, operation: &str, set: ReduceSet<'a>) -> Result<Team<'a>> {
        match set {
            ReduceSet::Root => Ok(Team {
                set,
                listed: None,
                len: self.size,
                index: self.rank,
                mapped: self.transport.single_group(),
            }),
            ReduceSet::Group(group) => {
                let members = group.members();
                if let Some(&outside) = members.iter().find(|&&pe| pe >= self.size) {
                    return Err(self.error(
                        ErrorKind::InvalidArgument,
                        operation,
                        format!(
                            "the group's member {outside} is not a PE of this root of {} PEs",
                            self.size
                        ),
                    ));
                }
                let Some(index) = members.iter().position(|&pe| pe == self.rank) else {
                    return Err(self.error(
                        ErrorKind::InvalidArgument,
                        operation,
                        format!(
                            "rank {} is not a member of the group {members:?}; only members \
                             call its collectives",
                            self.rank
                        ),
                    ));
                };
                let local = self.transport.group();
                let mapped = members.iter().all(|pe| local.binary_search(pe).is_ok());
                Ok(Team {
                    set,
                    listed: Some(members),
                    len: members.len(),
                    index,
                    mapped,
                })
            }
        }
    }

    /// Every member of `team` arrives (this PE's operations completed first); everything a
    /// member wrote before is visible to every member after. The root meets at its barrier; a
    /// subgroup whose heaps are all mapped here, through shared memory (`team_sync`); any
    /// other subgroup over its control plane.
    pub(crate) fn team_meet(&self, operation: &str, team: &Team<'_>) -> Result<()> {
        let group = match team.set {
            ReduceSet::Root => return self.data_barrier(operation),
            ReduceSet::Group(group) => group,
        };
        self.try_quiet()?;
        if team.len == 1 {
            return Ok(());
        }
        if !(team.mapped && self.segment.has_team_signals()) {
            return group.control().barrier();
        }
        let kind = self.segment.barrier_kind()?;
        let local = self.transport.group();
        let slot = |pe: usize| local.binary_search(&pe).unwrap_or(0);
        let slots = |i: usize| slot(team.pe(i));
        let policy = WaitPolicy {
            spin: self.spin,
            deadline: Deadline::After(self.config.timeout),
        };
        let abort = self.transport.abort_word();
        let outcome = team_sync::team_barrier(
            &*self.segment,
            slots,
            team.len,
            team.index,
            kind,
            abort,
            &policy,
        );
        self.wait_outcome(operation, outcome, || {
            format!(
                "not every member of the team {:?} reached its barrier",
                group.members()
            )
        })
    }

    /// Member `root` tells every other member that its part is done (its copies are visible
    /// to them after this), and every other member waits for that — a one-way meeting, where
    /// the root does not wait. Through the pair counters where the team is mapped here (see
    /// `team_sync`); elsewhere (or on a segment without them) the team meets instead.
    pub(crate) fn team_release(&self, operation: &str, team: &Team<'_>, root: usize) -> Result<()> {
        self.one_way(operation, team, root, Direction::FromRoot)
    }

    /// Every member but `root` tells member `root` that its part is done, and `root` waits for
    /// all of them — the other one-way meeting ([`Shmem::team_release`]).
    pub(crate) fn team_gather(&self, operation: &str, team: &Team<'_>, root: usize) -> Result<()> {
        self.one_way(operation, team, root, Direction::ToRoot)
    }

    fn one_way(
        &self,
        operation: &str,
        team: &Team<'_>,
        root: usize,
        direction: Direction,
    ) -> Result<()> {
        if !(team.mapped && self.segment.has_team_signals()) {
            return self.team_meet(operation, team);
        }
        self.try_quiet()?;
        let words = &*self.segment;
        let (me, root_slot) = (self.slot_of(self.rank), self.slot_of(team.pe(root)));
        let sends = (team.index == root) == (direction == Direction::FromRoot);
        if sends {
            if team.index == root {
                for i in (0..team.len).filter(|&i| i != root) {
                    team_sync::signal(words, me, self.slot_of(team.pe(i)));
                }
            } else {
                team_sync::signal(words, me, root_slot);
            }
            return Ok(());
        }
        let policy = WaitPolicy {
            spin: self.spin,
            deadline: Deadline::After(self.config.timeout),
        };
        let abort = self.transport.abort_word();
        let from: &mut dyn Iterator<Item = usize> = if team.index == root {
            &mut (0..team.len).filter(|&i| i != root)
        } else {
            &mut std::iter::once(root)
        };
        for i in from {
            let outcome =
                team_sync::await_signal(words, me, self.slot_of(team.pe(i)), abort, &policy);
            self.wait_outcome(operation, outcome, || {
                format!("PE {} of the collective did not arrive", team.pe(i))
            })?;
        }
        Ok(())
    }

    /// The slot of mapped rank `pe` in this process's segment.
    #[inline]
    fn slot_of(&self, pe: usize) -> usize {
        if self.transport.single_group() {
            return pe;
        }
        self.transport
            .group()
            .binary_search(&pe)
            .expect("a collective copies only to and from mapped PEs")
    }

    /// The offset in this process's mapping of heap offset `offset` of mapped rank `pe`.
    #[inline]
    fn mapped_at(&self, pe: usize, offset: u64) -> usize {
        self.segment.layout().heap_offset(self.slot_of(pe)) + offset as usize
    }

    /// Copies `len` bytes at heap offset `from` of mapped rank `from_pe` to heap offset `to` of
    /// mapped rank `to_pe` (the ranges may overlap). Both ranges lie inside live regions the
    /// caller checked.
    #[inline]
    pub(crate) fn copy_between(
        &self,
        from_pe: usize,
        from: u64,
        to_pe: usize,
        to: u64,
        len: usize,
    ) {
        if len == 0 {
            return;
        }
        let mapping = self.segment.mapping();
        let (from, to) = (self.mapped_at(from_pe, from), self.mapped_at(to_pe, to));
        mapping.copy_to(from, mapping, to, len);
    }

    /// Copies private `bytes` to heap offset `to` of mapped rank `pe`.
    #[inline]
    pub(crate) fn copy_into(&self, bytes: &[u8], pe: usize, to: u64) {
        if !bytes.is_empty() {
            self.segment.mapping().write(self.mapped_at(pe, to), bytes);
        }
    }

    /// `into[i] = into[i] ⊕ x[i]` (`⊕` being `op`) for the `into.len()` elements `x` at heap
    /// offset `from` of mapped rank `pe`, read where they lie (no private copy of them); with
    /// `first`, `into[i] = y[i] ⊕ x[i]` instead, `y` being those elements of mapped rank
    /// `first` (the two combined in one pass).
    #[inline]
    pub(crate) fn combine_from<T: Reducible>(
        &self,
        first: Option<usize>,
        pe: usize,
        from: u64,
        into: &mut [T],
        op: ReduceOp,
    ) {
        let (mapping, at) = (self.segment.mapping(), self.mapped_at(pe, from));
        let first = first.map(|first| self.mapped_at(first, from));
        // One loop per operator with the operator fixed: each compiles to a vectorised loop.
        macro_rules! with_op {
            ($($op:ident),*) => {
                match (op, first) {
                    $((ReduceOp::$op, None) => {
                        zip_with_mapped(into, mapping, at, |a: T, b| a.combine(b, ReduceOp::$op))
                    }
                    (ReduceOp::$op, Some(first)) => zip2_with_mapped(
                        into,
                        mapping,
                        [first, at],
                        |a: T, b| a.combine(b, ReduceOp::$op),
                    ),)*
                }
            };
        }
        with_op!(Sum, Prod, Min, Max, And, Or, Xor);
    }

    /// Copies bytes `offset..offset + len` of `source` (this PE's contribution) to heap offset
    /// `to` of mapped rank `pe`.
    #[inline]
    pub(crate) fn contribute(
        &self,
        source: &Contribution<'_>,
        offset: usize,
        len: usize,
        pe: usize,
        to: u64,
    ) {
        match source {
            Contribution::Local(bytes) => self.copy_into(&bytes[offset..offset + len], pe, to),
            Contribution::Symmetric(region) => {
                self.copy_between(self.rank, region.heap_offset + offset as u64, pe, to, len)
            }
        }
    }

    /// Word `index` PE `pe` (mapped) published for the collective in progress.
    #[inline]
    pub(crate) fn published(&self, pe: usize, index: usize) -> u64 {
        self.segment
            .published(self.slot_of(pe), index)
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Publishes `value` as this PE's word `index` for the collective in progress: written
    /// before a meeting, read by the members after it (the meeting orders both).
    #[inline]
    pub(crate) fn publish(&self, index: usize, value: u64) {
        self.segment
            .published(self.slot_of(self.rank), index)
            .store(value, std::sync::atomic::Ordering::Relaxed);
    }

    /// `source` as private bytes for the routes: a local contribution as it is, a symmetric one
    /// copied out of this PE's heap (the members that are not mapped here need a private
    /// buffer to send from).
    pub(crate) fn contribution_bytes<'s>(
        &self,
        operation: &str,
        source: &Contribution<'s>,
    ) -> Result<std::borrow::Cow<'s, [u8]>> {
        match *source {
            Contribution::Local(bytes) => Ok(std::borrow::Cow::Borrowed(bytes)),
            Contribution::Symmetric(region) => {
                let mut bytes = vec![0u8; region.bytes as usize];
                self.check_region(operation, region)?;
                self.get_bytes(&mut bytes, region, self.rank)?;
                Ok(std::borrow::Cow::Owned(bytes))
            }
        }
    }
}
