//! Reductions: the operators ([`ReduceOp`]), the element types they combine ([`Reducible`]:
//! 8- to 64-bit integers, `f32`/`f64`, and complex numbers as `[re, im]` pairs) and the
//! reduction over a set of PEs ([`Shmem::reduce`]): every PE of the root, or the members of a
//! world subgroup (an OpenSHMEM team or active set). [`Shmem::all_reduce`] is its whole-root,
//! typed form.
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
    /// not apply to fails on every PE alike before any data moves.
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
