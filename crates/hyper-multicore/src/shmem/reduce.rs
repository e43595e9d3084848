//! Reductions: the operators ([`ReduceOp`]), the element types they combine ([`Reducible`]:
//! 8- to 64-bit integers, `f32`/`f64`, the 16-bit floats `bf16`/`f16`, and complex numbers as `[re, im]` pairs) and the
//! reduction over a set of PEs ([`Shmem::reduce`]): every PE of the root, or the members of a
//! world subgroup (an OpenSHMEM team or active set). [`Shmem::all_reduce`] is its whole-root,
//! typed form.
//!
//! How the data moves, and in which order the values are combined:
//!
//! - A root on one host (one locality group), or a subgroup whose members all share this
//!   host's segment: after the members meet (every source ready), each member combines its
//!   `1/n` share of the elements straight from every member's mapped source, in member order
//!   (rank order for the root), a chunk at a time in a small private buffer on the stack (every
//!   member's values read where they lie, `sys/mapped_combine.rs`; the first two combined in
//!   one pass), and copies each combined chunk into every member's target
//!   (reduce-scatter and all-gather in one pass: each member reads and writes the vector's
//!   length once, whatever `n`); the members meet again. Only this member reads its share of any source, so a target that is
//!   the source itself is overwritten only where nobody reads any more; a target overlapping
//!   its source otherwise gets the share after another meeting. Vectors of at most
//!   [`REDUCE_LOCAL_MAX_BYTES`] are combined whole by every member (into the stack buffer,
//!   written into its own target after the second meeting): for them the copies into every
//!   target cost more than reading every source.
//! - A subgroup with members on other hosts, and a root whose every PE is its own group
//!   (`HYPER_MULTICORE_SHMEM_TRANSPORT=ucx`): every PE gets every member's source over its
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
use super::team::Team;
use crate::transport::sync::Deadline;
use crate::transport::Route;

/// The smallest vector (in bytes) a whole-root reduction across hosts combines hierarchically;
/// a smaller one is combined in rank order (two cross-host barriers instead of four: small
/// vectors are dominated by the barriers, large ones by the bytes that cross hosts, which the
/// hierarchical form sends once per host; the generated tables show where they cross).
pub const HIERARCHICAL_REDUCE_MIN_BYTES: u64 = 64 << 10;

/// The longest vector (in bytes) that every member of a team mapped on one host combines whole
/// itself; longer ones are combined in shares (see the module documentation).
pub const REDUCE_LOCAL_MAX_BYTES: usize = 4 << 10;

/// The elements a member combines at a time, in bytes: the running result, in a buffer on the
/// stack that stays in the first-level cache while every member's values are combined into it
/// where they lie.
const CHUNK_BYTES: usize = 8 << 10;

/// Vectors up to this many bytes are combined in a buffer of this size (zeroed on the stack per
/// call: for a word or two, zeroing a whole chunk would cost more than the combine).
const SMALL_BYTES: usize = 256;

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

    /// `into[i] = into[i].combine(other[i], op)` for every element of the shorter of the two.
    /// The provided types override it with one loop per operator, which the compiler
    /// vectorises.
    fn combine_slices(into: &mut [Self], other: &[Self], op: ReduceOp) {
        for (a, b) in into.iter_mut().zip(other) {
            *a = a.combine(*b, op);
        }
    }
}

/// `into[i] = f(into[i], other[i])` for every element: one loop with nothing else in it, for
/// the compiler to vectorise.
#[inline(always)]
fn zip_with<T: Copy>(into: &mut [T], other: &[T], f: impl Fn(T, T) -> T) {
    for (a, b) in into.iter_mut().zip(other) {
        *a = f(*a, *b);
    }
}

macro_rules! reducible_integers {
    ($($ty:ty),*) => {$(
        impl Reducible for $ty {
            fn supports(_: ReduceOp) -> bool {
                true
            }

            #[inline]
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

            fn combine_slices(into: &mut [Self], other: &[Self], op: ReduceOp) {
                match op {
                    ReduceOp::Sum => zip_with(into, other, <$ty>::wrapping_add),
                    ReduceOp::Prod => zip_with(into, other, <$ty>::wrapping_mul),
                    ReduceOp::Min => zip_with(into, other, Ord::min),
                    ReduceOp::Max => zip_with(into, other, Ord::max),
                    ReduceOp::And => zip_with(into, other, |a, b| a & b),
                    ReduceOp::Or => zip_with(into, other, |a, b| a | b),
                    ReduceOp::Xor => zip_with(into, other, |a, b| a ^ b),
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

            #[inline]
            fn combine(self, other: Self, op: ReduceOp) -> Self {
                match op {
                    ReduceOp::Sum => self + other,
                    ReduceOp::Prod => self * other,
                    ReduceOp::Min => self.min(other),
                    ReduceOp::Max => self.max(other),
                    ReduceOp::And | ReduceOp::Or | ReduceOp::Xor => self,
                }
            }

            fn combine_slices(into: &mut [Self], other: &[Self], op: ReduceOp) {
                match op {
                    ReduceOp::Sum => zip_with(into, other, |a, b| a + b),
                    ReduceOp::Prod => zip_with(into, other, |a, b| a * b),
                    ReduceOp::Min => zip_with(into, other, <$ty>::min),
                    ReduceOp::Max => zip_with(into, other, <$ty>::max),
                    ReduceOp::And | ReduceOp::Or | ReduceOp::Xor => {}
                }
            }
        }

        /// A complex number `[re, im]` (the layout of C's `_Complex`): sum and product.
        impl Reducible for [$ty; 2] {
            fn supports(op: ReduceOp) -> bool {
                matches!(op, ReduceOp::Sum | ReduceOp::Prod)
            }

            #[inline]
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

macro_rules! reducible_halves {
    ($($ty:ty),*) => {$(
        /// A 16-bit float (sum, product, min, max), combined as torch's CPU kernels combine it:
        /// both values widened to `f32`, combined there, and rounded back to the nearest (ties
        /// to even) once per combine.
        impl Reducible for $ty {
            fn supports(op: ReduceOp) -> bool {
                f32::supports(op)
            }

            #[inline]
            fn combine(self, other: Self, op: ReduceOp) -> Self {
                <$ty>::from_f32(self.to_f32().combine(other.to_f32(), op))
            }
        }
    )*};
}
reducible_halves!(half::bf16, half::f16);

/// The PEs a collective (a reduction, [`Shmem::broadcast_bytes`], …) runs over.
#[derive(Clone, Copy, Debug)]
pub enum ReduceSet<'a> {
    /// Every PE of the root; they meet at the root's barrier.
    Root,
    /// The members of a subgroup of the world ([`crate::world::World::subgroup`], whose
    /// members are ranks of this root, this PE among them), in the group's order; they meet
    /// through shared memory when every member shares this host's segment, else at the group's
    /// control plane's barrier. Only the members call.
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
        let team = self.team(OP, pes)?;
        if team.mapped() {
            return self.reduce_mapped::<T>(&team, target, source, op);
        }
        // Routed: every member's whole source over its route, combined in member order.
        let len = (source.bytes / width) as usize;
        let mut result = vec![T::zeroed(); len];
        let mut peer = vec![T::zeroed(); len];
        self.team_meet(OP, &team)?;
        for i in 0..team.len() {
            let into = if i == 0 { &mut result } else { &mut peer };
            self.get_bytes(bytemuck::cast_slice_mut(into), source, team.pe(i))?;
            if i > 0 {
                T::combine_slices(&mut result, &peer, op);
            }
        }
        if source.id == target.id {
            // Peers may still be reading this PE's source.
            self.team_meet(OP, &team)?;
        }
        self.put_bytes(target, bytemuck::cast_slice(&result), self.rank)?;
        self.team_meet(OP, &team)
    }

    /// [`Shmem::reduce`] over a team whose every member's heap is mapped here (see the module
    /// documentation): whole by every member up to [`REDUCE_LOCAL_MAX_BYTES`], else in shares.
    fn reduce_mapped<T: Reducible>(
        &self,
        team: &Team<'_>,
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
        if len == 0 {
            return Ok(());
        }
        if team.len() == 1 {
            self.copy_between(
                self.rank,
                source.heap_offset,
                self.rank,
                target.heap_offset,
                source.bytes as usize,
            );
            return Ok(());
        }
        // Every member's source is ready (every put made before the call is visible).
        self.team_meet(OP, team)?;
        if source.bytes as usize <= SMALL_BYTES {
            return with_buffer::<T, _, { SMALL_BYTES / 8 }>(|result| {
                self.reduce_whole(team, target, source, op, result)
            });
        }
        with_buffer::<T, _, { CHUNK_BYTES / 8 }>(|result| {
            if source.bytes as usize <= REDUCE_LOCAL_MAX_BYTES {
                return self.reduce_whole(team, target, source, op, result);
            }
            self.reduce_shares(team, target, source, op, result)
        })
    }

    /// Every member combines the whole vector (it fits `result`) and writes its own target
    /// once nobody reads a source any more (the team met before: every source is ready).
    fn reduce_whole<T: Reducible>(
        &self,
        team: &Team<'_>,
        target: Region,
        source: Region,
        op: ReduceOp,
        result: &mut [T],
    ) -> Result<()> {
        const OP: &str = "reduce";
        let len = source.bytes as usize / std::mem::size_of::<T>();
        let result = &mut result[..len];
        self.combine_members(team, source, 0, result, op);
        // Nobody reads a source any more: this PE's target may be its source.
        self.team_meet(OP, team)?;
        self.copy_into(bytemuck::cast_slice(result), self.rank, target.heap_offset);
        Ok(())
    }

    /// Every member combines its share of the elements, a chunk (`result.len()` elements) at a
    /// time, into every member's target (the team met before: every source is ready).
    fn reduce_shares<T: Reducible>(
        &self,
        team: &Team<'_>,
        target: Region,
        source: Region,
        op: ReduceOp,
        result: &mut [T],
    ) -> Result<()> {
        const OP: &str = "reduce";
        let width = std::mem::size_of::<T>();
        let len = source.bytes as usize / width;
        let (index, n) = (team.index(), team.len());
        let share = len * index / n..len * (index + 1) / n;
        let overlapping = source.id == target.id
            && source.heap_offset != target.heap_offset
            && source.heap_offset < target.heap_offset + target.bytes
            && target.heap_offset < source.heap_offset + source.bytes;
        let step = result.len();
        if overlapping {
            // The target overlaps other members' shares of the sources: the whole share is
            // combined first, and written once nobody reads a source any more.
            let mut combined = vec![T::zeroed(); share.len()];
            for (first, into) in share.clone().step_by(step).zip(combined.chunks_mut(step)) {
                self.combine_members(team, source, first, into, op);
            }
            self.team_meet(OP, team)?;
            let at = target.heap_offset + (share.start * width) as u64;
            for j in team.round_from_me() {
                self.copy_into(bytemuck::cast_slice(&combined), team.pe(j), at);
            }
        } else {
            for first in share.clone().step_by(step) {
                let count = step.min(share.end - first);
                let result = &mut result[..count];
                self.combine_members(team, source, first, result, op);
                let at = target.heap_offset + (first * width) as u64;
                for j in team.round_from_me() {
                    self.copy_into(bytemuck::cast_slice(result), team.pe(j), at);
                }
            }
        }
        // Every share is in every target, and nobody reads a source any more.
        self.team_meet(OP, team)
    }

    /// Elements `first..first + result.len()` of every member's `source` combined in member
    /// order into `result` (a team of two members or more), read where they lie: the first
    /// two members' in one pass, every later member's combined in.
    fn combine_members<T: Reducible>(
        &self,
        team: &Team<'_>,
        source: Region,
        first: usize,
        result: &mut [T],
        op: ReduceOp,
    ) {
        let at = source.heap_offset + (first * std::mem::size_of::<T>()) as u64;
        self.combine_from(Some(team.pe(0)), team.pe(1), at, result, op);
        for i in 2..team.len() {
            self.combine_from(None, team.pe(i), at, result, op);
        }
    }
}

impl Shmem {
    /// Elements `first..first + result.len()` of `source` on every PE of `pes`, combined with
    /// `op` in the order of `pes` into `result`, a private buffer: `result = x0 ⊕ x1 ⊕ …`, each
    /// combine rounded to `T` (so a float result has the bits of that order). PEs whose heap is
    /// mapped here are read where their values lie; the others through their route (a get into
    /// a private copy). A building block for collectives a front composes itself (torch's
    /// symmetric-memory operators): no PE waits here, so the caller makes sure the sources are
    /// ready and stay unchanged while it reads them.
    pub fn combine_sources<T: Reducible>(
        &self,
        pes: &[usize],
        source: Region,
        first: usize,
        result: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        const OP: &str = "combine";
        let width = std::mem::size_of::<T>();
        let end = (first + result.len()) * width;
        let problem = if !T::supports(op) {
            Some(format!(
                "{op:?} does not apply to {}",
                std::any::type_name::<T>()
            ))
        } else if pes.is_empty() {
            Some("no PE to combine".to_string())
        } else if let Some(pe) = pes.iter().find(|&&pe| pe >= self.size) {
            Some(format!(
                "{pe} is not a PE of this root of {} PEs",
                self.size
            ))
        } else if end as u64 > source.bytes {
            Some(format!(
                "elements {first}..{} of {width} bytes are past the end of the {}-byte source",
                first + result.len(),
                source.bytes
            ))
        } else {
            None
        };
        if let Some(message) = problem {
            return Err(self.error(ErrorKind::InvalidArgument, OP, message));
        }
        self.check_region(OP, source)?;
        if result.is_empty() {
            return Ok(());
        }
        let local = self.transport.group();
        let mapped = |pe: usize| self.transport.single_group() || local.binary_search(&pe).is_ok();
        let at = source.heap_offset + (first * width) as u64;
        let part = Region {
            id: source.id,
            heap_offset: at,
            bytes: std::mem::size_of_val(result) as u64,
        };
        let mut fetched: Vec<T> = Vec::new();
        let mut i = 0;
        while i < pes.len() {
            let pe = pes[i];
            if !mapped(pe) {
                if i == 0 {
                    self.get_bytes(bytemuck::cast_slice_mut(result), part, pe)?;
                } else {
                    fetched.resize(result.len(), T::zeroed());
                    self.get_bytes(bytemuck::cast_slice_mut(&mut fetched), part, pe)?;
                    T::combine_slices(result, &fetched, op);
                }
                i += 1;
            } else if i == 0 && pes.len() > 1 && mapped(pes[1]) {
                // The first two members' values in one pass.
                self.combine_from(Some(pe), pes[1], at, result, op);
                i += 2;
            } else if i == 0 {
                self.get_bytes(bytemuck::cast_slice_mut(result), part, pe)?;
                i += 1;
            } else {
                self.combine_from(None, pe, at, result, op);
                i += 1;
            }
        }
        Ok(())
    }
}

/// Calls `f` with a buffer of as many whole `T` as fit in `WORDS` 64-bit words: on the stack
/// for every element type aligned to at most 8 bytes whose size divides them (all the provided
/// ones), else on the heap.
fn with_buffer<T: Reducible, R, const WORDS: usize>(f: impl FnOnce(&mut [T]) -> R) -> R {
    let mut words = [0u64; WORDS];
    match bytemuck::try_cast_slice_mut::<u64, T>(&mut words) {
        Ok(buffer) if !buffer.is_empty() => f(buffer),
        _ => f(&mut vec![
            T::zeroed();
            (WORDS * 8 / std::mem::size_of::<T>().max(1))
                .max(1)
        ]),
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
            .filter(|&pe| matches!(routes[pe], Route::Local(_)))
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
                    T::combine_slices(&mut partial, &peer, op);
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
                    T::combine_slices(&mut result, theirs, op);
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
        crate::transport::Network::gets_issued()
    }

    /// Test-only (`fault-injection` builds): how many of this process's answers to peers' large
    /// gets over UCX are still in flight, each holding this PE's heap mapped until UCX completes
    /// or fails its send (0 without the `ucx` feature). Process-wide: it outlives the runtime,
    /// so a test can check that a teardown released them.
    #[cfg(feature = "fault-injection")]
    pub fn ucx_replies_in_flight() -> usize {
        crate::transport::Network::replies_in_flight()
    }
}

#[cfg(test)]
mod tests {
    use super::{ReduceOp, Reducible};
    use half::{bf16, f16};

    #[test]
    fn sixteen_bit_floats_round_each_combine_to_nearest_even() {
        // 1 + 2^-8 lies halfway between two bf16 values: ties go to the even mantissa (1.0),
        // and 1 + 2^-7 + 2^-8 to 1 + 2^-6.
        let one = bf16::from_f32(1.0);
        let tie = bf16::from_f32(2f32.powi(-8));
        assert_eq!(one.combine(tie, ReduceOp::Sum), one);
        let odd = bf16::from_f32(1.0 + 2f32.powi(-7));
        assert_eq!(
            odd.combine(tie, ReduceOp::Sum),
            bf16::from_f32(1.0 + 2f32.powi(-6))
        );
        // f16 keeps 10 bits: 1 + 2^-11 ties to 1.0.
        let (one, tie) = (f16::from_f32(1.0), f16::from_f32(2f32.powi(-11)));
        assert_eq!(one.combine(tie, ReduceOp::Sum), one);
        assert_eq!(
            f16::from_f32(3.0).combine(f16::from_f32(-5.0), ReduceOp::Max),
            f16::from_f32(3.0)
        );
        assert!(!bf16::supports(ReduceOp::Xor) && f16::supports(ReduceOp::Prod));
    }
}
