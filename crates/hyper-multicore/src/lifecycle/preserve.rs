//! Keeping data across a restart (`Replacement::preserve`): the first min(old, new) bytes of a
//! preserved allocation are in the new allocation after RestoreAllocations, on every PE.
//! PreserveData (after Quiesce: every outstanding operation has completed) keeps this PE's old
//! heap segment alive past Shutdown and notes where each preserved prefix lies in it.
//!
//! Two ways, chosen alike on every PE by the new heap size:
//! - **In place**, when the new heap fits the room each heap has in its segment (twice the old
//!   heap; see `transport/shm/segment.rs`): Initialize maps the same memfd again (`Segment::regrow`),
//!   so the kept bytes never leave their pages. A preserved allocation that lands at another
//!   offset is moved inside the heap, in an order that never overwrites a prefix still to be
//!   moved ([`schedule`]; a cycle goes through a buffer). Then the old mapping is detached
//!   (private zero pages over it), so a stale view of the old heap cannot reach the new one.
//! - **Copied** otherwise: RestoreAllocations makes the new allocation's pages present in one
//!   call each (`MADV_POPULATE_WRITE`, instead of a page fault per 4 KiB), copies from the old
//!   heap, still mapped, and then lets it go.
//!
//! Memory cost: in place, only the pages the bigger heap touches for the first time are new.
//! Copied, the old heap's pages stay until the copy is done, so while the new heap is filled
//! the host holds both: the old heaps' pages plus the preserved bytes of every PE in the new
//! ones (a staging copy would cost the same). Preflight checks that the PEs of this host can
//! hold what the chosen way needs in the memory the host has available (`MemAvailable`), so a
//! restart that cannot fails before teardown, retryable, with nothing changed.

use std::sync::Arc;

use super::Replacement;
use crate::error::{Error, ErrorKind, Result};
use crate::shmem::{AllocationRecord, Region, Segment, Shmem};

/// The bytes a preserved replacement carries over: min(old, new).
fn carried(replacement: &Replacement) -> u64 {
    let target = replacement.target.bytes().unwrap_or(0);
    replacement.current.bytes.min(target)
}

/// True when a restart to heaps of `heap_size` bytes keeping data grows `shmem`'s heap in place.
fn in_place(shmem: &Shmem, heap_size: u64) -> bool {
    shmem.segment.layout().regrown(heap_size).is_some()
}

/// Fails unless the PEs of this host can hold every preserved byte a second time in the memory
/// the host has available (nothing to check when the heap grows in place).
pub(super) fn check_host(
    operation: &str,
    shmem: &Shmem,
    heap_size: u64,
    replacements: &[Replacement],
) -> Result<()> {
    let copied: u64 = replacements
        .iter()
        .filter(|r| r.preserve)
        .map(carried)
        .sum();
    if copied == 0 || in_place(shmem, heap_size) {
        return Ok(());
    }
    let local_pes = shmem.local_pes();
    let wanted = copied.saturating_mul(local_pes as u64);
    match available_memory_bytes() {
        Some(available) if wanted > available => Err(Error::new(
            ErrorKind::InvalidArgument,
            operation,
            format!(
                "preserving data copies {copied} bytes per PE into the new heap while the old \
                 one is still mapped ({local_pes} PEs on this host: {wanted} bytes more), but \
                 this host has only {available} bytes available; preserve less \
                 (preserve=false for buffers whose contents need not survive) or free memory \
                 first"
            ),
        )),
        _ => Ok(()),
    }
}

fn available_memory_bytes() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Where a preserved prefix lies in the old segment's mapping.
#[derive(Clone, Copy)]
pub(super) struct Kept {
    offset: usize,
    bytes: usize,
}

/// What PreserveData keeps until RestoreAllocations: the old segment (`None` when no data is
/// kept) and each replacement's preserved prefix in it.
#[derive(Default)]
pub(super) struct Preserved {
    segment: Option<Arc<Segment>>,
    kept: Vec<Option<Kept>>,
}

impl Preserved {
    /// The old segment, for Initialize to reuse.
    pub(super) fn segment(&self) -> Option<&Segment> {
        self.segment.as_deref()
    }
}

/// PreserveData: where this PE's first min(old, new) bytes of each preserved allocation lie in
/// the old heap, in request order (`None` for one not preserved); holding the old segment
/// keeps it mapped.
pub(super) fn keep(
    shmem: &Shmem,
    operation: &str,
    replacements: &[Replacement],
) -> Result<Preserved> {
    let kept = replacements
        .iter()
        .map(|replacement| {
            if !replacement.preserve {
                return Ok(None);
            }
            let bytes = carried(replacement);
            let source = Region {
                bytes,
                ..replacement.current
            };
            let (_, offset) = shmem.own_bytes(operation, source)?;
            Ok(Some(Kept {
                offset,
                bytes: bytes as usize,
            }))
        })
        .collect::<Result<Vec<_>>>()?;
    let segment = kept
        .iter()
        .any(Option::is_some)
        .then(|| Arc::clone(&shmem.segment));
    Ok(Preserved { segment, kept })
}

/// RestoreAllocations: puts each kept prefix into its new allocation on this PE, then lets the
/// old heap go.
pub(super) fn copy_in(
    shmem: &Shmem,
    operation: &str,
    allocations: &[AllocationRecord],
    preserved: Preserved,
) -> Result<()> {
    let Preserved { segment, kept } = preserved;
    let Some(old) = segment else { return Ok(()) };
    let mut moves = Vec::new();
    for (record, kept) in allocations.iter().zip(kept) {
        let Some(kept) = kept else { continue };
        let target = Region {
            bytes: kept.bytes as u64,
            ..record.region()
        };
        let (_, offset) = shmem.own_bytes(operation, target)?;
        moves.push(Move {
            source: kept.offset,
            target: offset,
            bytes: kept.bytes,
        });
    }
    let new = &shmem.segment;
    let mapping = new.mapping();
    if !new.reuses(&old) {
        for m in moves {
            // Best effort: without it the copy faults the pages in one by one.
            let _ = mapping.populate_write(m.target, m.bytes);
            old.mapping().copy_to(m.source, mapping, m.target, m.bytes);
        }
        return Ok(());
    }
    // In place: the same offsets in the same memfd.
    let mut staged: Vec<Option<Vec<u8>>> = vec![None; moves.len()];
    for step in schedule(&moves) {
        let Move {
            source,
            target,
            bytes,
        } = moves[step.index];
        match (step.stage, staged[step.index].take()) {
            (true, _) => {
                let mut buffer = vec![0; bytes];
                mapping.read(source, &mut buffer);
                staged[step.index] = Some(buffer);
            }
            (false, Some(buffer)) => mapping.write(target, &buffer),
            (false, None) => mapping.copy_to(source, mapping, target, bytes),
        }
    }
    // Everything else an earlier lifetime may have written is zeroed, as in a new heap.
    if let Some(record) = allocations.first() {
        let (_, offset) = shmem.own_bytes(operation, record.region())?;
        let heap = offset - record.region().heap_offset as usize;
        let written = new.written().min(shmem.heap_size()) as usize;
        let mut kept: Vec<(usize, usize)> = moves
            .iter()
            .map(|m| (m.target - heap, m.target - heap + m.bytes))
            .collect();
        kept.sort_unstable();
        let mut from = 0;
        for (start, end) in kept.into_iter().chain([(written, written)]) {
            let start = start.min(written);
            if start > from {
                mapping.zero(heap + from, start - from);
            }
            from = from.max(end);
        }
    }
    old.detach_from(new);
    Ok(())
}

/// One preserved prefix moved inside a heap grown in place: `bytes` from `source` to `target`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Move {
    pub(super) source: usize,
    pub(super) target: usize,
    pub(super) bytes: usize,
}

/// One step of [`schedule`]: stage move `index`'s source into a buffer, or write its target
/// (from its source, or from its buffer if it was staged).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Step {
    pub(super) index: usize,
    pub(super) stage: bool,
}

fn overlap(a: usize, a_len: usize, b: usize, b_len: usize) -> bool {
    a < b + b_len && b < a + a_len
}

/// The order of `moves` (sources pairwise disjoint, targets pairwise disjoint) such that no
/// target is written while it overlaps a source still to be read; a move whose source and
/// target are the same is skipped. When every pending write would overwrite a pending source
/// (a cycle), one source is staged through a buffer first.
pub(super) fn schedule(moves: &[Move]) -> Vec<Step> {
    // (index, staged) of every move still to write.
    let mut pending: Vec<(usize, bool)> = (0..moves.len())
        .filter(|&i| moves[i].source != moves[i].target && moves[i].bytes > 0)
        .map(|i| (i, false))
        .collect();
    let mut steps = Vec::with_capacity(pending.len());
    while !pending.is_empty() {
        let writable = pending.iter().position(|&(i, _)| {
            pending.iter().all(|&(j, staged)| {
                j == i
                    || staged
                    || !overlap(
                        moves[i].target,
                        moves[i].bytes,
                        moves[j].source,
                        moves[j].bytes,
                    )
            })
        });
        match writable {
            Some(position) => {
                let (index, _) = pending.remove(position);
                steps.push(Step {
                    index,
                    stage: false,
                });
            }
            None => {
                // Every pending write overlaps a pending source, so some source is not staged.
                let entry = pending
                    .iter_mut()
                    .find(|(_, staged)| !*staged)
                    .expect("a cycle has an unstaged source");
                entry.1 = true;
                steps.push(Step {
                    index: entry.0,
                    stage: true,
                });
            }
        }
    }
    steps
}

#[cfg(test)]
mod tests {
    use super::{schedule, Move};
    use proptest::prelude::*;

    /// Applies `moves` to `memory` in the scheduled order.
    fn apply(memory: &mut [u8], moves: &[Move]) {
        let mut staged: Vec<Option<Vec<u8>>> = vec![None; moves.len()];
        for step in schedule(moves) {
            let m = moves[step.index];
            if step.stage {
                staged[step.index] = Some(memory[m.source..m.source + m.bytes].to_vec());
            } else if let Some(buffer) = staged[step.index].take() {
                memory[m.target..m.target + m.bytes].copy_from_slice(&buffer);
            } else {
                memory.copy_within(m.source..m.source + m.bytes, m.target);
            }
        }
    }

    /// Disjoint ranges of the given lengths, placed in the given order with the given gaps.
    fn place(lengths: &[usize], order: &[usize], gaps: &[usize]) -> Vec<usize> {
        let mut starts = vec![0; lengths.len()];
        let mut at = 0;
        for (&index, &gap) in order.iter().zip(gaps) {
            at += gap;
            starts[index] = at;
            at += lengths[index];
        }
        starts
    }

    proptest! {
        #[test]
        fn every_target_ends_with_its_sources_bytes(
            lengths in prop::collection::vec(1usize..40, 1..8),
            seed in any::<u64>(),
            gaps in prop::collection::vec(0usize..30, 8),
            more_gaps in prop::collection::vec(0usize..30, 8),
        ) {
            let n = lengths.len();
            // Two orders of the same moves: a permutation by the seed and the identity.
            let mut shuffled: Vec<usize> = (0..n).collect();
            let mut state = seed;
            for i in (1..n).rev() {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                shuffled.swap(i, (state >> 33) as usize % (i + 1));
            }
            let identity: Vec<usize> = (0..n).collect();
            let sources = place(&lengths, &identity, &gaps);
            let targets = place(&lengths, &shuffled, &more_gaps);
            let moves: Vec<Move> = (0..n)
                .map(|i| Move { source: sources[i], target: targets[i], bytes: lengths[i] })
                .collect();
            let size = 8 * 70;
            let mut memory: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
            let before = memory.clone();
            apply(&mut memory, &moves);
            for m in &moves {
                prop_assert_eq!(
                    &memory[m.target..m.target + m.bytes],
                    &before[m.source..m.source + m.bytes]
                );
            }
        }
    }

    #[test]
    fn a_swap_is_staged_once() {
        let moves = [
            Move {
                source: 0,
                target: 10,
                bytes: 10,
            },
            Move {
                source: 10,
                target: 0,
                bytes: 10,
            },
        ];
        let stages = schedule(&moves).iter().filter(|s| s.stage).count();
        assert_eq!(stages, 1);
    }

    #[test]
    fn moves_to_the_right_need_no_buffer() {
        let moves = [
            Move {
                source: 0,
                target: 5,
                bytes: 10,
            },
            Move {
                source: 10,
                target: 20,
                bytes: 10,
            },
            Move {
                source: 20,
                target: 40,
                bytes: 10,
            },
        ];
        assert!(schedule(&moves).iter().all(|s| !s.stage));
    }
}
