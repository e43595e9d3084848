//! Which allocations of one runtime lifetime are live, and their byte spans, readable without a
//! lock: the data plane checks every [`Region`] against it (a load and a compare or two), so a
//! freed allocation, a copied `Region` that outlived its allocation, or a range past its end is
//! rejected instead of touching memory that may have been handed to another allocation.
//!
//! Allocation indices are never reused within a lifetime, so a span is written once when the
//! allocation is made (start, then end with `Release`) and cleared once when it is freed (end
//! set to 0). The table grows in chunks of doubling size (chunk `k` holds `BASE << k` spans), so
//! spans never move and no lookup takes a lock.
//!
//! ```ignore
//! let live = Liveness::default();
//! live.insert(0, 4096, 64);
//! assert!(live.contains(Region { id, heap_offset: 4096, bytes: 8 }));
//! live.remove(0);
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use super::allocation::Region;

/// Spans in chunk 0; chunk `k` holds `BASE << k`.
const BASE: u64 = 64;
/// Chunks: room for `BASE * (2^CHUNKS - 1)` allocations per lifetime.
const CHUNKS: usize = 40;

#[derive(Debug, Default)]
struct Span {
    /// First heap byte of the allocation.
    start: AtomicU64,
    /// One past its last byte, 0 while not live.
    end: AtomicU64,
}

/// The live allocations of one runtime lifetime (see the module docs).
#[derive(Debug)]
pub(crate) struct Liveness {
    /// Chunk 0 (the first `BASE` allocations), allocated up front: the common case is one
    /// bounds check and two loads.
    first: Box<[Span]>,
    /// Chunks 1.. (chunk 0's slot stays empty).
    chunks: [OnceLock<Box<[Span]>>; CHUNKS],
}

impl Default for Liveness {
    fn default() -> Self {
        Liveness {
            first: new_chunk(0),
            chunks: std::array::from_fn(|_| OnceLock::new()),
        }
    }
}

fn new_chunk(chunk: usize) -> Box<[Span]> {
    (0..(BASE << chunk))
        .map(|_| Span::default())
        .collect::<Vec<_>>()
        .into_boxed_slice()
}

/// The chunk and the position in it of allocation `index`, or `None` past the table's end.
#[inline]
fn position(index: u64) -> Option<(usize, usize)> {
    let n = (index / BASE).checked_add(1)?;
    let chunk = (63 - n.leading_zeros()) as usize;
    if chunk >= CHUNKS {
        return None;
    }
    let first = BASE * ((1u64 << chunk) - 1);
    Some((chunk, (index - first) as usize))
}

impl Liveness {
    #[inline]
    fn span(&self, index: u64) -> Option<&Span> {
        if index < BASE {
            return Some(&self.first[index as usize]);
        }
        let (chunk, at) = position(index)?;
        self.chunks[chunk].get()?.get(at)
    }

    /// Marks allocation `index` live over heap bytes `offset..offset + bytes` (called once per
    /// index, by the allocating thread, before the allocation is handed out).
    pub(crate) fn insert(&self, index: u64, offset: u64, bytes: u64) {
        let Some((chunk, at)) = position(index) else {
            return; // Past the table: never reported live, so every use is refused.
        };
        let span = match chunk {
            0 => &self.first[at],
            _ => &self.chunks[chunk].get_or_init(|| new_chunk(chunk))[at],
        };
        span.start.store(offset, Ordering::Relaxed);
        // A zero-byte allocation is live too: its end is its start, plus a marker bit that no
        // real end can have (heaps are far below 2^63 bytes).
        span.end.store((offset + bytes) | LIVE, Ordering::Release);
    }

    /// Marks allocation `index` freed.
    pub(crate) fn remove(&self, index: u64) {
        if let Some(span) = self.span(index) {
            span.end.store(0, Ordering::Release);
        }
    }

    /// True if `region`'s allocation is live and the region lies inside it.
    #[inline]
    pub(crate) fn contains(&self, region: Region) -> bool {
        let Some(span) = self.span(region.id.index) else {
            return false;
        };
        let end = span.end.load(Ordering::Acquire);
        end != 0
            && span.start.load(Ordering::Relaxed) <= region.heap_offset
            && region
                .heap_offset
                .checked_add(region.bytes)
                .is_some_and(|region_end| region_end <= end & !LIVE)
    }

    /// True if allocation `index` is live (whatever range is asked for).
    #[inline]
    pub(crate) fn is_live(&self, index: u64) -> bool {
        self.span(index)
            .is_some_and(|span| span.end.load(Ordering::Acquire) != 0)
    }
}

/// The marker bit of a live span's end.
const LIVE: u64 = 1 << 63;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shmem::AllocationId;

    fn region(index: u64, heap_offset: u64, bytes: u64) -> Region {
        Region {
            id: AllocationId {
                index,
                generation: 1,
            },
            heap_offset,
            bytes,
        }
    }

    #[test]
    fn positions_cover_every_index_once() {
        assert_eq!(position(0), Some((0, 0)));
        assert_eq!(position(63), Some((0, 63)));
        assert_eq!(position(64), Some((1, 0)));
        assert_eq!(position(191), Some((1, 127)));
        assert_eq!(position(192), Some((2, 0)));
        assert_eq!(position(u64::MAX), None);
    }

    #[test]
    fn spans_are_checked_and_freed_ones_refused() {
        let live = Liveness::default();
        assert!(!live.contains(region(5, 0, 8)), "never allocated");
        live.insert(5, 1024, 64);
        live.insert(1000, 0, 0);
        assert!(live.contains(region(5, 1024, 64)));
        assert!(live.contains(region(5, 1080, 8)));
        assert!(!live.contains(region(5, 1080, 9)), "past the end");
        assert!(!live.contains(region(5, 1016, 8)), "before the start");
        assert!(!live.contains(region(5, u64::MAX, 2)), "overflowing");
        assert!(live.contains(region(1000, 0, 0)), "a zero-byte allocation");
        live.remove(5);
        assert!(!live.contains(region(5, 1024, 8)), "freed");
        assert!(!live.is_live(5) && live.is_live(1000));
    }
}
