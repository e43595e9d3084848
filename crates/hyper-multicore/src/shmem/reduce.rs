//! Reductions: the operators ([`ReduceOp`]), the element types they combine ([`Reducible`]:
//! 8- to 64-bit integers, `f32`/`f64`, and complex numbers as `[re, im]` pairs) and the
//! reduction over a set of PEs ([`Shmem::reduce`]): every PE of the root, or the members of a
//! world subgroup (an OpenSHMEM team or active set). [`Shmem::all_reduce`] is its whole-root,
//! typed form.
//!
//! How the data moves, and in which order the values are combined:
//!
//! - A root on one host (one locality group), a subgroup, and a root whose every PE is its own
//!   group (`HYPER_MULTICORE_SHMEM_TRANSPORT=ucx`): every PE gets every member's source over its
//!   route and combines them in member order (rank order for the root).
//! - A root spanning several locality groups (hosts), for vectors of at least
//!   [`HIERARCHICAL_REDUCE_MIN_BYTES`] (smaller ones as above: their cost is the barriers, and
//!   this form needs two more), hierarchical: within each group over
//!   shared memory, across groups over UCX. Each PE of a group of `g` combines its `1/g` share
//!   of the elements from the group's sources (shared-memory reads) into the group's partial,
//!   kept in the group leader's (lowest rank's) target; after a barrier it reads that share of
//!   every other group's partial from that group's leader (one UCX get per other group),
//!   combines the partials in group order, and after another barrier writes its share of the
//!   result into every target of its group. So each host receives one partial per other host
//!   instead of one source per remote PE, and each PE reads `1/g` of each. The combine order is
//!   *within each host in rank order, then hosts in order* (of their lowest ranks): integers
//!   come out as in rank order, floating-point results may differ from the rank-order combine
//!   by association only, and every PE ends with the same bits. It costs four barriers that
//!   span the hosts (the rank-order form two, three when target and source are the same).
//!
//! ```no_run
//! # fn demo(world: &hyper_multicore::world::World, shmem: &hyper_multicore::shmem::Shmem)
//! #     -> hyper_multicore::Result<()> {
//! use hyper_multicore::shmem::{ReduceOp, ReduceSet, Symmetric};
//! let values = shmem.allocate::<u16>(4, None)?;
//! // The even PEs (a subgroup every even PE forms) combine their values with a bitwise xor.
//! let evens: Vec<usize> = (0..shmem.size()).step_by(2).collect();
//! if shmem.rank() % 2 == 0 {
//!     let group = world.subgroup(&evens)?;
//!     shmem.reduce::<u16>(ReduceSet::Group(&group), values.region(), values.region(), ReduceOp::Xor)?;
//! }
//! # Ok(()) }
//! ```

use crate::error::{ErrorKind, Result};
use crate::world::Group;

use super::allocation::Region;
use super::runtime::Shmem;
use super::sync::Deadline;
use super::transport::Route;

/// The smallest vector (in bytes) a whole-root reduction across hosts combines hierarchically;
/// a smaller one is combined in rank order (two cross-host barriers instead of four: about
/// 1 ms less for 8 bytes over TCP, while from 64 KiB on the hierarchical form is as fast or
/// faster, 2× at 8 MiB — `bench/findings.md`).
pub const HIERARCHICAL_REDUCE_MIN_BYTES: u64 = 64 << 10;

/// Reduction operators.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    /// Sum (wrapping for integers).
    Sum,
    /// Product (wrapping for integers; the complex product for complex numbers).
    Prod,
    /// Minimum.
    Min,
    /// Maximum.
    Max,
    /// Bitwise and (integers only).
    And,
    /// Bitwise or (integers only).
    Or,
    /// Bitwise exclusive or (integers only).
    Xor,
}

/// Element types a reduction combines.
pub trait Reducible: bytemuck::Pod + Send + Sync {
    /// True if `op` applies to this type (a reduction with another one fails before any PE
    /// moves data).
    fn supports(op: ReduceOp) -> bool;

    /// Combines two values with `op` (one [`Reducible::supports`]; any other returns `self`).
    fn combine(self, other: Self, op: ReduceOp) -> Self;
}

macro_rules! reducible_integers {
    ($($ty:ty),*) => {$(
        impl Reducible for $ty {
            fn supports(_: ReduceOp) -> bool {
                true
            }

            fn combine(self, other: Self, op: ReduceOp) -> Self {
                match op {
                    ReduceOp::Sum => self.wrapping_add(other),
                    ReduceOp::Prod => self.wrapping_mul(other),
                    ReduceOp::Min => self.min(other),
                    ReduceOp::Max => self.max(other),
                    ReduceOp::And => self & other,
                    ReduceOp::Or => self | other,
                    ReduceOp::Xor => self ^ other,
                }
            }
        }
    )*};
}
reducible_integers!(i8, u8, i16, u16, i32, u32, i64, u64);

macro_rules! reducible_floats {
    ($($ty:ty),*) => {$(
        impl Reducible for $ty {
            fn supports(op: ReduceOp) -> bool {
                matches!(op, ReduceOp::Sum | ReduceOp::Prod | ReduceOp::Min | ReduceOp::Max)
            }

            fn combine(self, other: Self, op: ReduceOp) -> Self {
                match op {
                    ReduceOp::Sum => self + other,
                    ReduceOp::Prod => self * other,
                    ReduceOp::Min => self.min(other),
                    ReduceOp::Max => self.max(other),
                    ReduceOp::And | ReduceOp::Or | ReduceOp::Xor => self,
                }
            }
        }

        /// A complex number `[re, im]` (the layout of C's `_Complex`): sum and product.
        impl Reducible for [$ty; 2] {
            fn supports(op: ReduceOp) -> bool {
                matches!(op, ReduceOp::Sum | ReduceOp::Prod)
            }

            fn combine(self, other: Self, op: ReduceOp) -> Self {
                let ([a, b], [c, d]) = (self, other);
                match op {
                    ReduceOp::Sum => [a + c, b + d],
                    ReduceOp::Prod => [a * c - b * d, a * d + b * c],
                    _ => self,
                }
            }
        }
    )*};
}
reducible_floats!(f32, f64);

/// The PEs a reduction runs over.
#[derive(Clone, Copy, Debug)]
pub enum ReduceSet<'a> {
    /// Every PE of the root; they meet at the shared-memory barrier.
    Root,
    /// The members of a subgroup of the world ([`crate::world::World::subgroup`], whose
    /// members are ranks of this root, this PE among them); they meet at its control plane's
    /// barrier. Only the members call.
    Group(&'a Group),
}

impl Shmem {
    /// Combines the `source` elements of every PE of `pes` element-wise with `op` into every one
    /// of those PEs' `target` (regions of the same length, a whole number of `T`; they may be
    /// the same region). Every PE of `pes` calls it with the same arguments; a type `op` does
    /// not apply to fails on every PE alike before any data moves. The whole root combines
    /// hierarchically when it spans several hosts (see the module documentation for the
    /// order); a subgroup always combines in its members' order.
    pub fn reduce<T: Reducible>(
        &self,
        pes: ReduceSet<'_>,
        target: Region,
        source: Region,
        op: ReduceOp,
    ) -> Result<()> {
        const OP: &str = "reduce";
        let width = std::mem::size_of::<T>() as u64;
        let problem = if !T::supports(op) {
            Some(format!(
                "{op:?} does not apply to {}; reduce integers with any operator, floats with \
                 Sum, Prod, Min or Max, complex numbers with Sum or Prod",
                std::any::type_name::<T>()
            ))
        } else if source.bytes != target.bytes || source.bytes % width != 0 {
            Some(format!(
                "source ({} bytes) and target ({} bytes) must be the same whole number of \
                 {width}-byte elements",
                source.bytes, target.bytes
            ))
        } else {
            None
        };
        if let Some(message) = problem {
            return Err(self.error(ErrorKind::InvalidArgument, OP, message));
        }
        if let ReduceSet::Root = pes {
            if !self.transport.single_group()
                && self.transport.leaders().len() < self.size
                && source.bytes >= HIERARCHICAL_REDUCE_MIN_BYTES
            {
                return self.reduce_across_groups::<T>(target, source, op);
            }
        }
        let members: Vec<usize> = match pes {
            ReduceSet::Root => (0..self.size).collect(),
            ReduceSet::Group(group) => {
                let members = group.members();
                if let Some(&outside) = members.iter().find(|&&pe| pe >= self.size) {
                    return Err(self.error(
                        ErrorKind::InvalidArgument,
                        OP,
                        format!(
                            "the group's member {outside} is not a PE of this root of {} PEs",
                            self.size
                        ),
                    ));
                }
                members.to_vec()
            }
        };
        let meet = || match pes {
            ReduceSet::Root => self.data_barrier(OP),
            ReduceSet::Group(group) => {
                self.try_quiet()?;
                group.control().barrier()
            }
        };
        let len = (source.bytes / width) as usize;
        let mut result = vec![T::zeroed(); len];
        let mut peer = vec![T::zeroed(); len];
        meet()?;
        for (i, &pe) in members.iter().enumerate() {
            let into = if i == 0 { &mut result } else { &mut peer };
            self.get_bytes(bytemuck::cast_slice_mut(into), source, pe)?;
            if i > 0 {
                for (r, p) in result.iter_mut().zip(&peer) {
                    *r = r.combine(*p, op);
                }
            }
        }
        if source.id == target.id {
            // Peers may still be reading this PE's source.
            meet()?;
        }
        self.put_bytes(target, bytemuck::cast_slice(&result), self.rank)?;
        meet()
    }
}

impl Shmem {
    /// [`Shmem::reduce`] over a root spanning several locality groups (some with more than one
    /// PE): reduce-scatter within each group over shared memory into the group leader's target,
    /// exchange of the partials between groups over UCX, and each PE's share of the result
    /// written into its group's targets. See the module documentation.
    #[inline(never)]
    fn reduce_across_groups<T: Reducible>(
        &self,
        target: Region,
        source: Region,
        op: ReduceOp,
    ) -> Result<()> {
        const OP: &str = "reduce";
        // The allocation state is the same on every PE, so a freed or foreign region fails on
        // every PE alike, before any PE waits for the others.
        self.check_region(OP, source)?;
        self.check_region(OP, target)?;
        let width = std::mem::size_of::<T>();
        let len = source.bytes as usize / width;
        // This PE's group: the PEs whose heap is in its segment, ascending; its leader is the
        // lowest. `leaders` holds every group's leader, in group order.
        let routes = self.transport.routes();
        let group: Vec<usize> = (0..self.size)
            .filter(|&pe| matches!(routes[pe], Route::Shm(_)))
            .collect();
        let leader = group[0];
        let index = group
            .iter()
            .position(|&pe| pe == self.rank)
            .expect("a PE's own heap is in its segment");
        // This PE's share of the elements.
        let share = len * index / group.len()..len * (index + 1) / group.len();
        let part = |region: Region| Region {
            id: region.id,
            heap_offset: region.heap_offset + (share.start * width) as u64,
            bytes: (share.len() * width) as u64,
        };
        let mut partial = vec![T::zeroed(); share.len()];
        let mut peer = vec![T::zeroed(); share.len()];

        // Every PE's source is ready (every put made before the call is visible).
        self.data_barrier(OP)?;
        // 1. The group's partial of this share: the group's sources in rank order, over shared
        //    memory, into the leader's target. Only this PE reads this share of any source of
        //    the group, so the write cannot overwrite a source still to be read when target and
        //    source are the same region or apart; when they overlap otherwise, the group meets
        //    between the reads and the writes (nobody outside it reads a source).
        if !share.is_empty() {
            for (i, &pe) in group.iter().enumerate() {
                let into = if i == 0 { &mut partial } else { &mut peer };
                self.get_bytes(bytemuck::cast_slice_mut(into), part(source), pe)?;
                if i > 0 {
                    combine_into(&mut partial, &peer, op);
                }
            }
        }
        let overlapping = source.id == target.id
            && source.heap_offset != target.heap_offset
            && source.heap_offset < target.heap_offset + target.bytes
            && target.heap_offset < source.heap_offset + source.bytes;
        if overlapping {
            self.segment_barrier(OP, Deadline::After(self.config.timeout))?;
        }
        if !share.is_empty() {
            self.put_bytes(part(target), bytemuck::cast_slice(&partial), leader)?;
        }
        // Every group's partial is in its leader's target.
        self.data_barrier(OP)?;
        // 2. This share of the result: every group's partial, in group order (this group's is
        //    `partial`; another's is one UCX get from its leader).
        let mut result = vec![T::zeroed(); share.len()];
        if !share.is_empty() {
            for (g, &their_leader) in self.transport.leaders().iter().enumerate() {
                let theirs: &[T] = if their_leader == leader {
                    &partial
                } else {
                    self.get_bytes(
                        bytemuck::cast_slice_mut(&mut peer),
                        part(target),
                        their_leader,
                    )?;
                    &peer
                };
                if g == 0 {
                    result.copy_from_slice(theirs);
                } else {
                    combine_into(&mut result, theirs, op);
                }
            }
        }
        // Nobody reads a leader's target any more.
        self.data_barrier(OP)?;
        // 3. This share of the result into every target of the group, over shared memory.
        if !share.is_empty() {
            for &pe in &group {
                self.put_bytes(part(target), bytemuck::cast_slice(&result), pe)?;
            }
        }
        self.data_barrier(OP)
    }

    /// Test-only (`fault-injection` builds): how many gets this process has issued over the
    /// UCX route, and their bytes, since it started (zeros without the `ucx` feature). Tests
    /// compare it before and after a collective to see what crossed hosts.
    #[cfg(feature = "fault-injection")]
    pub fn ucx_gets_issued(&self) -> (u64, u64) {
        #[cfg(all(feature = "ucx", not(loom)))]
        return super::transport::UcxTransport::gets_issued();
        #[cfg(not(all(feature = "ucx", not(loom))))]
        return (0, 0);
    }

    /// Test-only (`fault-injection` builds): how many of this process's answers to peers' large
    /// gets over UCX are still in flight, each holding this PE's heap mapped until UCX completes
    /// or fails its send (0 without the `ucx` feature). Process-wide: it outlives the runtime,
    /// so a test can check that a teardown released them.
    #[cfg(feature = "fault-injection")]
    pub fn ucx_replies_in_flight() -> usize {
        #[cfg(all(feature = "ucx", not(loom)))]
        return super::transport::UcxTransport::replies_in_flight();
        #[cfg(not(all(feature = "ucx", not(loom))))]
        return 0;
    }
}

/// `into[i] = into[i] ⊕ other[i]` for every element.
fn combine_into<T: Reducible>(into: &mut [T], other: &[T], op: ReduceOp) {
    for (a, b) in into.iter_mut().zip(other) {
        *a = a.combine(*b, op);
    }
}
