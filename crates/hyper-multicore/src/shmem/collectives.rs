//! Collectives over the root: barrier, all-gather, broadcast, all-to-all and all-reduce. Each
//! moves the data with put/get over every peer's route (copies on the shared mapping within a
//! host, UCX across hosts) and synchronises with the root's barrier (the shared-memory barrier
//! on one host, the hierarchical spanning barrier across hosts), so no data byte crosses the
//! control plane. All-reduce across hosts is hierarchical (`reduce.rs`).

use super::allocation::{Element, Symmetric};
use super::reduce::{ReduceOp, ReduceSet, Reducible};
use super::runtime::Shmem;
use super::sync::{Deadline, WaitPolicy};
use crate::error::{ErrorKind, Result};

impl Shmem {
    /// Waits until every PE of the root has called `barrier`; every put made before it is
    /// visible after it.
    pub fn barrier(&self) -> Result<()> {
        self.data_barrier("barrier")
    }

    pub(crate) fn data_barrier(&self, operation: &str) -> Result<()> {
        if !self.transport.single_group() {
            return self.spanning_barrier(operation);
        }
        self.data_barrier_carrying(operation, None)
    }

    /// [`Shmem::data_barrier`] of a root whose PEs all share this host's segment; with
    /// `carry`, it also hands the words (their tag first) to the other PE of a 2-PE root, which
    /// reads them with [`Transports::carried`](super::transport::Transports::carried).
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
        if input.is_empty() {
            // Validated above on every rank; nothing moves, so no synchronisation is needed.
            return self.check_region(OP, output.region());
        }
        let slot = self.block(output, self.rank, input.len())?;
        // From this PE round the ranks, as in all_to_all: no rank is every PE's first target.
        for step in 0..self.size {
            self.put(&slot, input, (self.rank + step) % self.size)?;
        }
        self.data_barrier(OP)
    }

    /// Copies `source` from PE `root` into every PE's `target` (`source` is ignored elsewhere).
    pub fn broadcast<T: Element>(
        &self,
        target: &impl Symmetric<T>,
        source: &[T],
        root: usize,
    ) -> Result<()> {
        const OP: &str = "broadcast";
        if root >= self.size {
            return Err(self.error(
                ErrorKind::InvalidArgument,
                OP,
                format!(
                    "root PE {root} is out of range for a root of {} PEs",
                    self.size
                ),
            ));
        }
        // Every rank checks the target, so a freed one fails everywhere alike.
        self.check_region(OP, target.region())?;
        if self.rank == root {
            for pe in 0..self.size {
                self.put(target, source, pe)?;
            }
        }
        self.data_barrier(OP)
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
        let block = source.len() / self.size;
        let slot = self.block(target, self.rank, block)?;
        // Each PE starts with its own block and goes round the ranks after it, so that at every
        // step each PE writes to a different one. All starting at rank 0 made that rank a hot
        // spot, and across hosts one PE's put to the other waited for it to progress while it
        // copied its own block (two hosts, 1 MiB per pair: 1.23× OSHMEM's time before, see
        // bench/findings.md, round 20).
        if block > 0 {
            for step in 0..self.size {
                let pe = (self.rank + step) % self.size;
                self.put(&slot, &source[pe * block..(pe + 1) * block], pe)?;
            }
        }
        self.data_barrier(OP)
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

    /// Block `index` of `block` elements of `target`, as a view.
    fn block<'a, T: Element>(
        &self,
        target: &'a impl Symmetric<T>,
        index: usize,
        block: usize,
    ) -> Result<super::allocation::View<'a, T>> {
        let region = target.region();
        let size = std::mem::size_of::<T>() as u64;
        Ok(super::allocation::View::from_region(
            super::allocation::Region {
                id: region.id,
                heap_offset: region.heap_offset + (index * block) as u64 * size,
                bytes: block as u64 * size,
            },
        ))
    }
}
