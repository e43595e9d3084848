//! The table of this PE's live `shmem_malloc` allocations, by heap offset.

use std::collections::BTreeMap;

use hyper_multicore::shmem::{AllocationId, AllocationRecord, Region};

/// One live allocation made through this API: what the calls need of its record.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Allocated {
    pub(crate) id: AllocationId,
    /// Heap offset of its first byte.
    pub(crate) offset: u64,
    pub(crate) bytes: u64,
    /// The alignment it was asked for (a restart asks for the same).
    pub(super) alignment: Option<u64>,
}

impl Allocated {
    pub(super) fn of(record: &AllocationRecord) -> Allocated {
        Allocated {
            id: record.id,
            offset: record.offset,
            bytes: record.bytes,
            alignment: record.spec.alignment,
        }
    }

    pub(super) fn region(&self) -> Region {
        Region {
            id: self.id,
            heap_offset: self.offset,
            bytes: self.bytes,
        }
    }
}

/// The live allocations by heap offset: a vector sorted by offset while few are live (it keeps
/// its room when the last block is freed, where a B-tree allocates and frees a node on every
/// `shmem_malloc` + `shmem_free` of a program with nothing else live, which shows in the
/// `malloc_free` row), a B-tree once many are (a vector's free moves every later block, a cost
/// that grows with the number live while the B-tree's grows with its logarithm).
#[derive(Debug)]
pub(super) enum Allocations {
    /// Sorted by offset, searched by bisection.
    Few(Vec<Allocated>),
    /// By offset.
    Many(BTreeMap<u64, Allocated>),
}

/// Past this many live blocks [`Allocations`] moves to a B-tree; below [`FEW`], back.
const MANY: usize = 1024;
/// See [`MANY`] (apart, so that a program hovering at the limit does not convert on every call).
const FEW: usize = 256;

impl Default for Allocations {
    fn default() -> Self {
        Allocations::Few(Vec::new())
    }
}

impl Allocations {
    pub(super) fn insert(&mut self, allocated: Allocated) {
        match self {
            Allocations::Few(sorted) if sorted.len() < MANY => {
                let at = sorted.partition_point(|a| a.offset < allocated.offset);
                sorted.insert(at, allocated);
            }
            Allocations::Few(sorted) => {
                let mut tree: BTreeMap<u64, Allocated> =
                    sorted.drain(..).map(|a| (a.offset, a)).collect();
                tree.insert(allocated.offset, allocated);
                *self = Allocations::Many(tree);
            }
            Allocations::Many(tree) => {
                tree.insert(allocated.offset, allocated);
            }
        }
    }

    /// The allocation starting at heap offset `offset`.
    pub(super) fn get(&self, offset: u64) -> Option<Allocated> {
        match self {
            Allocations::Few(sorted) => sorted
                .binary_search_by_key(&offset, |a| a.offset)
                .ok()
                .map(|at| sorted[at]),
            Allocations::Many(tree) => tree.get(&offset).copied(),
        }
    }

    /// Takes out the allocation starting at heap offset `offset`.
    pub(super) fn remove(&mut self, offset: u64) -> Option<Allocated> {
        match self {
            Allocations::Few(sorted) => {
                let at = sorted.binary_search_by_key(&offset, |a| a.offset).ok()?;
                Some(sorted.remove(at))
            }
            Allocations::Many(tree) => {
                let removed = tree.remove(&offset);
                if tree.len() < FEW {
                    *self = Allocations::Few(std::mem::take(tree).into_values().collect());
                }
                removed
            }
        }
    }

    /// The allocations in offset order.
    pub(super) fn iter(&self) -> Box<dyn Iterator<Item = &Allocated> + '_> {
        match self {
            Allocations::Few(sorted) => Box::new(sorted.iter()),
            Allocations::Many(tree) => Box::new(tree.values()),
        }
    }

    /// The allocation with the highest offset at or below `offset`.
    pub(super) fn at_or_below(&self, offset: u64) -> Option<&Allocated> {
        match self {
            Allocations::Few(sorted) => {
                let after = sorted.partition_point(|a| a.offset <= offset);
                after.checked_sub(1).map(|at| &sorted[at])
            }
            Allocations::Many(tree) => tree.range(..=offset).next_back().map(|(_, a)| a),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(index: u64, offset: u64) -> Allocated {
        Allocated {
            id: AllocationId {
                index,
                generation: 1,
            },
            offset,
            bytes: 64,
            alignment: None,
        }
    }

    /// Inserts, finds and removes blocks across both forms of the table: the answers are those
    /// of a plain sorted list, and the table turns into a B-tree past [`MANY`] blocks and back
    /// below [`FEW`].
    #[test]
    fn allocations_answer_alike_in_both_forms() {
        let mut table = Allocations::default();
        // Offsets 0, 128, ..., inserted out of order (every odd one first).
        let offsets: Vec<u64> = (1..=MANY as u64 + 8)
            .step_by(2)
            .chain((0..=MANY as u64 + 8).step_by(2))
            .map(|i| i * 128)
            .collect();
        for (index, &offset) in offsets.iter().enumerate() {
            table.insert(block(index as u64, offset));
            let few = matches!(table, Allocations::Few(_));
            assert_eq!(few, index < MANY, "after {} blocks", index + 1);
        }
        let check = |table: &Allocations, live: &[u64]| {
            let listed: Vec<u64> = table.iter().map(|a| a.offset).collect();
            assert_eq!(listed, live);
            for probe in [0, 1, 127, 128, 200, 4096, 4160, u64::MAX] {
                let below = live.iter().rev().find(|&&o| o <= probe).copied();
                assert_eq!(table.at_or_below(probe).map(|a| a.offset), below, "{probe}");
                let exact = live.contains(&probe).then_some(probe);
                assert_eq!(table.get(probe).map(|a| a.offset), exact, "{probe}");
            }
        };
        let mut live: Vec<u64> = offsets.clone();
        live.sort_unstable();
        check(&table, &live);
        // Free from the front (oldest offsets first) until the table is a vector again.
        while live.len() >= FEW {
            let offset = live.remove(0);
            assert_eq!(table.remove(offset).map(|a| a.offset), Some(offset));
            assert!(table.remove(offset).is_none(), "freed twice");
        }
        assert!(matches!(table, Allocations::Few(_)));
        check(&table, &live);
    }
}
