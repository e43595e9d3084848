//! Collectives: barrier, broadcast, all-gather (OpenSHMEM's fcollect), collect (contributions
//! of different lengths), all-to-all (contiguous and strided) and all-reduce (`reduce.rs`),
//! over the whole root or over the members of a world subgroup ([`ReduceSet`]: an OpenSHMEM
//! split team or active set). No data byte, length or flag crosses the control plane where
//! the members' heaps are mapped here.
//!
//! How the bytes move:
//!
//! - Where every member's heap is mapped in this process (one host), each copy is one raw copy
//!   from heap to heap, or from this PE's private bytes into a heap ([`Contribution`]), and the
//!   members meet at the root's shared-memory barrier or, for a subgroup, the team barrier
//!   through shared memory (`team_sync`). Broadcast: the root copies its source into every
//!   member's target and signals the members, which wait for it ("push"; two members, or
//!   fewer than [`BROADCAST_PULL_MIN_BYTES`]); with more members and larger sources, the root
//!   makes its bytes readable (its symmetric source, or else its own target, filled first),
//!   signals the members, every member copies them into its own target in parallel ("pull")
//!   and signals the root, which waits for all before it may reuse them. All-gather and all-to-all: each member
//!   copies its blocks into every member's target, then the team meets. Collect: each member
//!   publishes its length in its segment words, the team meets, each copies its block to its
//!   place in every target, the team meets again.
//! - Otherwise (members on other hosts, or `HYPER_MULTICORE_SHMEM_TRANSPORT=ucx`) each copy
//!   is a put over the member's route, and the members meet at the root's barrier (hierarchical
//!   across hosts) or the subgroup's control plane; collect's lengths go round the control
//!   plane.

use super::allocation::{Element, Region, Symmetric};
use super::reduce::{ReduceOp, ReduceSet, Reducible};
use super::runtime::Shmem;
use super::team::{Contribution, Team};
use crate::error::{ErrorKind, Result};
use crate::transport::sync::{Deadline, WaitPolicy};

/// The smallest broadcast (in bytes) that members of a team of three or more copy from the
/// root in parallel ("pull") rather than receive from the root's copies ("push"): below it the
/// root's copies cost less than the second meeting pulling needs.
pub const BROADCAST_PULL_MIN_BYTES: usize = 64 << 10;

/// What a broadcast does with the root's own target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RootTarget {
    /// The root's target receives the bytes too (OpenSHMEM's team broadcast, the Rust API).
    Receives,
    /// The root's target is left as it is (OpenSHMEM's legacy active-set broadcast).
    Keeps,
}

/// The published word (see `team_sync::PUBLISHED_WORDS`) where a broadcast's root says where
/// its bytes are: heap offset + 1, or 0 when it copied them itself.
const PUBLISHED_SOURCE: usize = 0;
/// The published word holding a member's length in a collect.
const PUBLISHED_LENGTH: usize = 1;

impl Shmem {
    /// Waits until every PE of the root has called `barrier`; every put made before it is
    /// visible after it.
    pub fn barrier(&self) -> Result<()> {
        self.data_barrier("barrier")
    }

    /// Waits until every PE of `pes` has called `barrier_set` with the same set (this PE's
    /// operations completed first); everything a member wrote before is visible to every
    /// member after. The root meets at [`Shmem::barrier`]; a subgroup whose members all share
    /// this host's segment meets through shared memory, any other over its control plane.
    pub fn barrier_set(&self, pes: ReduceSet<'_>) -> Result<()> {
        const OP: &str = "barrier";
        let team = self.team(OP, pes)?;
        self.team_meet(OP, &team)
    }

    pub(crate) fn data_barrier(&self, operation: &str) -> Result<()> {
        if !self.transport.single_group() {
            return self.spanning_barrier(operation);
        }
        self.data_barrier_carrying(operation, None)
    }

    /// [`Shmem::data_barrier`] of a root whose PEs all share this host's segment; with
    /// `carry`, it also hands the words (their tag first) to the other PE of a 2-PE root, which
    /// reads them with [`Transports::carried`](crate::transport::Transports::carried).
    pub(crate) fn data_barrier_carrying(
        &self,
        operation: &str,
        carry: Option<&[u64; 4]>,
    ) -> Result<()> {
        debug_assert!(self.transport.single_group());
        self.quiet();
        self.barrier_until(operation, Deadline::After(self.config.timeout), carry)
    }

    /// The shared-memory barrier of the PEs that share this process's segment (the whole root
    /// on one host; this PE's locality group in a root spanning several), until `deadline`.
    #[inline]
    pub(crate) fn segment_barrier(&self, operation: &str, deadline: Deadline) -> Result<()> {
        self.barrier_until(operation, deadline, None)
    }

    #[inline]
    fn barrier_until(
        &self,
        operation: &str,
        deadline: Deadline,
        carry: Option<&[u64; 4]>,
    ) -> Result<()> {
        let policy = WaitPolicy {
            spin: self.spin,
            deadline,
        };
        let outcome = self.transport.segment_barrier(&policy, carry);
        self.wait_outcome(operation, outcome, || {
            "not every PE reached the barrier".to_string()
        })
    }

    /// Gathers every PE's `input` into every PE's `output`, in rank order: `output` holds
    /// `size × input.len()` elements. A zero-length input is a validated no-op.
    pub fn all_gather<T: Element>(&self, output: &impl Symmetric<T>, input: &[T]) -> Result<()> {
        const OP: &str = "all_gather";
        let expected = input.len().checked_mul(self.size);
        if expected != Some(output.len()) {
            return Err(self.error(
                ErrorKind::InvalidArgument,
                OP,
                format!(
                    "the output holds {} elements but {} PEs × {} input elements need {}",
                    output.len(),
                    self.size,
                    input.len(),
                    input.len() * self.size
                ),
            ));
        }
        let input = Contribution::Local(bytemuck::cast_slice(input));
        self.all_gather_bytes(ReduceSet::Root, output.region(), input)
    }

    /// Copies `source` from PE `root` into every PE's `target` (`source` is ignored elsewhere).
    pub fn broadcast<T: Element>(
        &self,
        target: &impl Symmetric<T>,
        source: &[T],
        root: usize,
    ) -> Result<()> {
        let source = Contribution::Local(bytemuck::cast_slice(source));
        self.broadcast_bytes(
            ReduceSet::Root,
            target.region(),
            source,
            root,
            RootTarget::Receives,
        )
    }

    /// Sends block `j` of `source` to PE `j`, which stores it as block `self.rank()` of its
    /// `target`; both hold `size × block` elements.
    pub fn all_to_all<T: Element>(&self, target: &impl Symmetric<T>, source: &[T]) -> Result<()> {
        const OP: &str = "all_to_all";
        if source.len() != target.len() || source.len() % self.size != 0 {
            return Err(self.error(
                ErrorKind::InvalidArgument,
                OP,
                format!(
                    "source ({}) and target ({}) must hold the same number of elements, a \
                     multiple of the {} PEs",
                    source.len(),
                    target.len(),
                    self.size
                ),
            ));
        }
        let source = Contribution::Local(bytemuck::cast_slice(source));
        self.all_to_all_bytes(ReduceSet::Root, target.region(), source)
    }

    /// Combines every PE's `source` element-wise with `op` into every PE's `target` (same
    /// length). `target` and `source` may be the same allocation. The whole-root, typed form of
    /// [`Shmem::reduce`] (`reduce.rs`): on one host it combines in rank order; across hosts,
    /// hierarchically — within each host in rank order, then the hosts in order — so every PE
    /// gets the same bits, which for floats may differ from the rank-order combination by
    /// association.
    pub fn all_reduce<T: Reducible + Element>(
        &self,
        target: &impl Symmetric<T>,
        source: &impl Symmetric<T>,
        op: ReduceOp,
    ) -> Result<()> {
        self.reduce::<T>(ReduceSet::Root, target.region(), source.region(), op)
    }

    /// Copies the root's `source` (ignored on the other members) into every member's `target`
    /// (the root's own too with [`RootTarget::Receives`]). Every member of `pes` calls it with
    /// the same `root` (a rank of the root, one of the members) and target length; zero bytes
    /// are a validated no-op. See the module documentation for how the bytes move.
    pub fn broadcast_bytes(
        &self,
        pes: ReduceSet<'_>,
        target: Region,
        source: Contribution<'_>,
        root: usize,
        root_target: RootTarget,
    ) -> Result<()> {
        const OP: &str = "broadcast";
        let team = self.team(OP, pes)?;
        if team.position(root).is_none() {
            return Err(self.error(
                ErrorKind::InvalidArgument,
                OP,
                format!(
                    "root PE {root} is not one of the {} PEs taking part",
                    team.len()
                ),
            ));
        }
        // Every member checks the target, so a freed one fails everywhere alike.
        self.check_region(OP, target)?;
        let len = target.bytes as usize;
        let is_root = self.rank == root;
        if is_root {
            self.check_contribution(OP, &source, len)?;
        }
        if len == 0 {
            return Ok(());
        }
        let receives = root_target == RootTarget::Receives;
        let at = target.heap_offset;
        if !team.mapped() {
            if is_root {
                let bytes = self.contribution_bytes(OP, &source)?;
                for i in team.round_from_me() {
                    let pe = team.pe(i);
                    if pe != root || receives {
                        self.put_bytes(target, &bytes, pe)?;
                    }
                }
            }
            return self.team_meet(OP, &team);
        }
        let root_index = team.position(root).unwrap_or(0);
        if team.len() < 3 || len < BROADCAST_PULL_MIN_BYTES {
            // Push: the root copies into every target (its own last), then tells the members,
            // which wait for it; the root does not wait for them (every target was ready
            // before the call, and its source is free again once copied).
            if is_root {
                for i in team.round_from_me().skip(1) {
                    self.contribute(&source, 0, len, team.pe(i), at);
                }
                if receives {
                    self.contribute(&source, 0, len, root, at);
                }
            }
            return self.team_release(OP, &team, root_index);
        }
        // Pull: the root says where its bytes are and tells the members; every member copies
        // them and tells the root, which waits for all (its bytes stay put until every member
        // has them). A symmetric source apart from the target is read where it is, and the
        // root fills its own target while the members copy; any other source, the root copies
        // into its own target first and the members read that (or, for a private source the
        // root's target must not receive, the root copies into every target itself).
        let mut own_copy_after = false;
        if is_root {
            let from = match source {
                Contribution::Symmetric(region) if !overlaps(region, target) => {
                    own_copy_after = receives;
                    Some(region.heap_offset)
                }
                _ if receives => {
                    self.contribute(&source, 0, len, root, at);
                    Some(at)
                }
                Contribution::Symmetric(region) => Some(region.heap_offset),
                Contribution::Local(_) => {
                    for i in team.round_from_me().skip(1) {
                        self.contribute(&source, 0, len, team.pe(i), at);
                    }
                    None
                }
            };
            self.publish(PUBLISHED_SOURCE, from.map_or(0, |offset| offset + 1));
        }
        self.team_release(OP, &team, root_index)?;
        if own_copy_after {
            self.contribute(&source, 0, len, root, at);
        }
        if !is_root {
            if let Some(from) = self.published(root, PUBLISHED_SOURCE).checked_sub(1) {
                if from
                    .checked_add(len as u64)
                    .map_or(true, |end| end > self.heap_size)
                {
                    return Err(self.error(
                        ErrorKind::Protocol,
                        OP,
                        format!(
                            "the root PE {root} published bytes {from}+{len}, outside its heap \
                             of {}; every PE must run the same build",
                            self.heap_size
                        ),
                    ));
                }
                self.copy_between(root, from, self.rank, at, len);
            }
        }
        self.team_gather(OP, &team, root_index)
    }

    /// Gathers every member's `source` (the same length on each) into every member's `target`,
    /// which holds one block per member in team order (OpenSHMEM's fcollect; the root's
    /// members in rank order). A zero-length source is a validated no-op.
    pub fn all_gather_bytes(
        &self,
        pes: ReduceSet<'_>,
        target: Region,
        source: Contribution<'_>,
    ) -> Result<()> {
        const OP: &str = "all_gather";
        let team = self.team(OP, pes)?;
        let len = source.len();
        if Some(target.bytes) != (len as u64).checked_mul(team.len() as u64) {
            return Err(self.error(
                ErrorKind::InvalidArgument,
                OP,
                format!(
                    "the target holds {} bytes but {} PEs × {len} source bytes need {}",
                    target.bytes,
                    team.len(),
                    len * team.len()
                ),
            ));
        }
        self.check_region(OP, target)?;
        self.check_contribution(OP, &source, len)?;
        if len == 0 {
            // Validated above on every member; nothing moves, so no synchronisation is needed.
            return Ok(());
        }
        let at = target.heap_offset + (team.index() * len) as u64;
        self.scatter_block(OP, &team, target, &source, len, |_| (0, at))?;
        self.team_meet(OP, &team)
    }

    /// Gathers every member's `source` (each its own length) into every member's `target`, in
    /// team order, from its start (OpenSHMEM's collect): `target` must hold the lengths' total
    /// on every member. Returns the total. The lengths travel through the members' segment
    /// words where their heaps are mapped here, else round the control plane.
    pub fn collect_bytes(
        &self,
        pes: ReduceSet<'_>,
        target: Region,
        source: Contribution<'_>,
    ) -> Result<u64> {
        const OP: &str = "collect";
        let team = self.team(OP, pes)?;
        let len = source.len();
        self.check_contribution(OP, &source, len)?;
        let mut before = 0u64;
        let mut total = 0u64;
        if team.mapped() {
            self.publish(PUBLISHED_LENGTH, len as u64);
            self.team_meet(OP, &team)?;
            for i in 0..team.len() {
                let theirs = self.published(team.pe(i), PUBLISHED_LENGTH);
                before += if i < team.index() { theirs } else { 0 };
                total += theirs;
            }
        } else {
            let length = (len as u64).to_le_bytes();
            let parts = match team.set() {
                ReduceSet::Root => self.plane.allgather(&length)?,
                ReduceSet::Group(group) => group.control().allgather(&length)?,
            };
            for (i, part) in parts.iter().enumerate() {
                let theirs = u64::from_le_bytes(part.as_slice().try_into().unwrap_or_default());
                before += if i < team.index() { theirs } else { 0 };
                total += theirs;
            }
        }
        if total > target.bytes {
            return Err(self.error(
                ErrorKind::InvalidArgument,
                OP,
                format!(
                    "the members' sources hold {total} bytes together but the target holds {}",
                    target.bytes
                ),
            ));
        }
        if total > 0 {
            self.check_region(OP, target)?;
            let at = target.heap_offset + before;
            self.scatter_block(OP, &team, target, &source, len, |_| (0, at))?;
        } else if !team.mapped() {
            // Nothing moves, and the lengths came as messages: nobody reads a word of this PE.
            return Ok(0);
        }
        // Every block is in place, and nobody reads the published lengths any more (a member
        // publishes its next one only after this).
        self.team_meet(OP, &team)?;
        Ok(total)
    }

    /// Sends block `j` of `source` (`target.bytes / n` bytes, for `n` members) to member `j`,
    /// which stores it as block `i` of its `target`, `i` being this PE's place in the team;
    /// `source` and `target` hold `n` blocks. Zero-length blocks are a validated no-op.
    pub fn all_to_all_bytes(
        &self,
        pes: ReduceSet<'_>,
        target: Region,
        source: Contribution<'_>,
    ) -> Result<()> {
        const OP: &str = "all_to_all";
        let team = self.team(OP, pes)?;
        let len = source.len();
        if len as u64 != target.bytes || len % team.len() != 0 {
            return Err(self.error(
                ErrorKind::InvalidArgument,
                OP,
                format!(
                    "source ({len} bytes) and target ({} bytes) must be the same length, a \
                     multiple of the {} PEs",
                    target.bytes,
                    team.len()
                ),
            ));
        }
        self.check_region(OP, target)?;
        self.check_contribution(OP, &source, len)?;
        let block = len / team.len();
        if block == 0 {
            return Ok(());
        }
        let at = target.heap_offset + (team.index() * block) as u64;
        self.scatter_block(OP, &team, target, &source, block, |j| (j * block, at))?;
        self.team_meet(OP, &team)
    }

    /// The strided all-to-all (OpenSHMEM's alltoalls): for every member `j`, the `count`
    /// elements of `element` bytes of block `j` of `source` (block `j` starts at element
    /// `j × count × strides[1]`, its elements `strides[1]` apart) go to block `i` of member `j`'s
    /// `target` (elements `strides[0]` apart), `i` being this PE's place in the team. `source`
    /// and `target` must hold their strided extents; strides are at least 1.
    pub fn all_to_all_strided(
        &self,
        pes: ReduceSet<'_>,
        target: Region,
        source: Contribution<'_>,
        strides: [usize; 2],
        element: usize,
        count: usize,
    ) -> Result<()> {
        const OP: &str = "all_to_all_strided";
        let team = self.team(OP, pes)?;
        let n = team.len();
        let extent = |stride: usize| -> Option<usize> {
            (n * count)
                .checked_sub(1)?
                .checked_mul(stride)?
                .checked_add(1)?
                .checked_mul(element)
        };
        let (target_extent, source_extent) = (extent(strides[0]), extent(strides[1]));
        let fits = count == 0
            || matches!(
                (target_extent, source_extent),
                (Some(t), Some(s)) if t as u64 <= target.bytes && s <= source.len()
            );
        if strides.contains(&0) || element == 0 || !fits {
            return Err(self.error(
                ErrorKind::InvalidArgument,
                OP,
                format!(
                    "{n} blocks of {count} elements of {element} bytes, strides {strides:?} \
                     (target, source; at least 1) need more than the target's {} bytes or the \
                     source's {}",
                    target.bytes,
                    source.len()
                ),
            ));
        }
        if count == 0 {
            return Ok(());
        }
        self.check_region(OP, target)?;
        self.check_contribution(OP, &source, source.len())?;
        let [to_stride, from_stride] = strides;
        let me = team.index();
        let bytes = match team.mapped() {
            true => None,
            false => Some(self.contribution_bytes(OP, &source)?),
        };
        for j in team.round_from_me() {
            let pe = team.pe(j);
            for k in 0..count {
                let from = (j * count + k) * from_stride * element;
                let to = target.heap_offset + ((me * count + k) * to_stride * element) as u64;
                match &bytes {
                    None => self.contribute(&source, from, element, pe, to),
                    Some(bytes) => {
                        let into = Region {
                            heap_offset: to,
                            bytes: element as u64,
                            ..target
                        };
                        self.put_bytes(into, &bytes[from..from + element], pe)?;
                    }
                }
            }
        }
        self.team_meet(OP, &team)
    }

    /// Copies `len` bytes of `source` to every member `j` (round the team from this PE): those
    /// at offset `part(j).0` of the source to heap offset `part(j).1` of member `j`'s copy of
    /// `target`'s allocation. One copy per member where the team is mapped here, else a put.
    fn scatter_block(
        &self,
        operation: &str,
        team: &Team<'_>,
        target: Region,
        source: &Contribution<'_>,
        len: usize,
        part: impl Fn(usize) -> (usize, u64),
    ) -> Result<()> {
        if team.mapped() {
            for j in team.round_from_me() {
                let (offset, at) = part(j);
                self.contribute(source, offset, len, team.pe(j), at);
            }
            return Ok(());
        }
        let bytes = self.contribution_bytes(operation, source)?;
        for j in team.round_from_me() {
            let (offset, at) = part(j);
            let block = Region {
                heap_offset: at,
                bytes: len as u64,
                ..target
            };
            self.put_bytes(block, &bytes[offset..offset + len], team.pe(j))?;
        }
        Ok(())
    }

    /// Checks this PE's `source`: `len` bytes, and a symmetric one live.
    fn check_contribution(
        &self,
        operation: &str,
        source: &Contribution<'_>,
        len: usize,
    ) -> Result<()> {
        if source.len() != len {
            return Err(self.error(
                ErrorKind::InvalidArgument,
                operation,
                format!(
                    "byte-count mismatch: the source has {} bytes, the symmetric target {len}; \
                     pass a source of the same length",
                    source.len()
                ),
            ));
        }
        match *source {
            Contribution::Symmetric(region) if len > 0 => self.check_region(operation, region),
            _ => Ok(()),
        }
    }
}

/// Whether two ranges of the heap share a byte (ranges of different allocations never do).
fn overlaps(a: Region, b: Region) -> bool {
    a.id == b.id
        && a.heap_offset < b.heap_offset + b.bytes
        && b.heap_offset < a.heap_offset + a.bytes
}
