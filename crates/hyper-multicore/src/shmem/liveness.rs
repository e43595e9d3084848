//! Which allocations of one runtime lifetime are live, and their byte spans, readable without a
//! lock: the data plane checks every [`Region`] against it (a load and a compare or two), so a
//! freed allocation, a copied `Region` that outlived its allocation, or a range past its end is
//! rejected instead of touching memory that may have been handed to another allocation.
//!
//! Allocation indices are never reused within a lifetime, so a span is written once when the
//! allocation is made (start, then end with `Release`) and cleared once when it is freed (end
//! set to 0). The table grows in chunks of doubling size (chunk `k` holds `BASE << k` spans), so
//! spans never move and no lookup takes a lock. A page of a chunk whose spans have all been
//! freed is handed back to the kernel (it reads as zeros: every span in it not live), so a
//! process that allocates and frees in a loop keeps a table the size of what it holds live at
//! once, not of everything it ever allocated (16 bytes per allocation, before).
//!
//! ```ignore
//! let live = Liveness::default();
//! live.insert(0, 4096, 64);
//! assert!(live.contains(Region { id, heap_offset: 4096, bytes: 8 }));
//! live.remove(0);
//! ```

use std::io;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::OnceLock;

use super::allocation::Region;
use crate::sys::zero_pages::{page_size, ZeroPages};

/// Spans in chunk 0; chunk `k` holds `BASE << k`.
const BASE: u64 = 64;
/// Chunks: room for `BASE * (2^CHUNKS - 1)` allocations per lifetime.
const CHUNKS: usize = 40;

/// One allocation's span: its first heap byte, and one past its last byte (0 while not live).
type Span = [AtomicU64; 2];
/// The bytes of a [`Span`].
const SPAN_BYTES: usize = std::mem::size_of::<Span>();

/// Chunk `k` (1 and up): its spans in pages of their own, and for each page how many of its
/// spans are still to be freed (it goes back to the kernel when none is).
#[derive(Debug)]
struct Chunk {
    spans: ZeroPages,
    /// Spans per page (the system's page size over [`SPAN_BYTES`]).
    per_page: usize,
    to_free: Box<[AtomicU32]>,
}

impl Chunk {
    /// Chunk `chunk`'s spans, none live.
    fn new(chunk: usize) -> io::Result<Chunk> {
        let spans = (BASE as usize) << chunk;
        let per_page = (page_size() / SPAN_BYTES).max(1);
        let to_free = (0..spans.div_ceil(per_page))
            .map(|page| AtomicU32::new((spans - page * per_page).min(per_page) as u32))
            .collect();
        Ok(Chunk {
            spans: ZeroPages::map(spans * SPAN_BYTES)?,
            per_page,
            to_free,
        })
    }

    #[inline]
    fn span(&self, at: usize) -> &Span {
        self.spans.words(at * SPAN_BYTES)
    }
}

/// The live allocations of one runtime lifetime (see the module docs).
#[derive(Debug)]
pub(crate) struct Liveness {
    /// Chunk 0 (the first `BASE` allocations), allocated up front: the common case is one
    /// bounds check and two loads.
    first: Box<[Span]>,
    /// Chunks 1.. (chunk 0's slot stays empty).
    chunks: [OnceLock<Chunk>; CHUNKS],
}

impl Default for Liveness {
    fn default() -> Self {
        Liveness {
            first: (0..BASE).map(|_| Span::default()).collect(),
            chunks: std::array::from_fn(|_| OnceLock::new()),
        }
    }
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
        Some(self.chunks[chunk].get()?.span(at))
    }

    /// Marks allocation `index` live over heap bytes `offset..offset + bytes` (called once per
    /// index, by the allocating thread, before the allocation is handed out).
    ///
    /// # Panics
    /// If a new chunk of the table cannot be mapped: the process is out of memory (as an
    /// allocation of the chunk on the heap would abort it), and a rank that went on without
    /// the allocation every other rank made would disagree with them about the heap.
    pub(crate) fn insert(&self, index: u64, offset: u64, bytes: u64) {
        let Some((chunk, at)) = position(index) else {
            return; // Past the table: never reported live, so every use is refused.
        };
        let span = match chunk {
            0 => &self.first[at],
            _ => self.chunks[chunk]
                .get_or_init(|| {
                    Chunk::new(chunk).unwrap_or_else(|error| {
                        panic!("out of memory: the table of live allocations cannot grow: {error}")
                    })
                })
                .span(at),
        };
        let [start, end] = span;
        start.store(offset, Ordering::Relaxed);
        // A zero-byte allocation is live too: its end is its start, plus a marker bit that no
        // real end can have (heaps are far below 2^63 bytes).
        end.store((offset + bytes) | LIVE, Ordering::Release);
    }

    /// Marks allocation `index` freed (once per inserted index). The last span of a page to be
    /// freed gives the page back to the kernel.
    pub(crate) fn remove(&self, index: u64) {
        let Some((chunk, at)) = position(index) else {
            return;
        };
        if chunk == 0 {
            self.first[at][1].store(0, Ordering::Release);
            return;
        }
        let Some(chunk) = self.chunks[chunk].get() else {
            return;
        };
        chunk.span(at)[1].store(0, Ordering::Release);
        let page = at / chunk.per_page;
        if chunk.to_free[page].fetch_sub(1, Ordering::AcqRel) == 1 {
            let bytes = chunk.per_page * SPAN_BYTES;
            chunk.spans.discard(page * bytes, bytes);
        }
    }

    /// True if `region`'s allocation is live and the region lies inside it.
    #[inline]
    pub(crate) fn contains(&self, region: Region) -> bool {
        let Some([start, end]) = self.span(region.id.index) else {
            return false;
        };
        let end = end.load(Ordering::Acquire);
        end != 0
            && start.load(Ordering::Relaxed) <= region.heap_offset
            && region
                .heap_offset
                .checked_add(region.bytes)
                .is_some_and(|region_end| region_end <= end & !LIVE)
    }

    /// True if allocation `index` is live (whatever range is asked for).
    #[inline]
    pub(crate) fn is_live(&self, index: u64) -> bool {
        self.span(index)
            .is_some_and(|[_, end]| end.load(Ordering::Acquire) != 0)
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

    #[test]
    fn a_page_whose_spans_are_all_freed_goes_back_to_the_kernel() {
        let live = Liveness::default();
        // The first page of spans of chunk 2 (indices 192..448; 256 spans a page of 4 KiB), or
        // of the first chunk that holds more than a page.
        let per_page = (page_size() / SPAN_BYTES) as u64;
        let chunk = (2..CHUNKS).find(|&k| BASE << k > per_page).unwrap();
        let first = BASE * ((1 << chunk) - 1);
        let page = first..first + per_page;
        for index in page.clone().chain([page.end]) {
            live.insert(index, 4096 + 64 * index, 8);
        }
        for index in page.clone().skip(1) {
            live.remove(index);
        }
        let start = |index| live.span(index).unwrap()[0].load(Ordering::Relaxed);
        assert_ne!(start(page.end - 1), 0, "one span of the page is still live");
        assert!(live.contains(region(page.start, 4096 + 64 * page.start, 8)));
        live.remove(page.start);
        // The page was discarded: its words read zero (a freed span keeps its start otherwise).
        assert!((page.start..page.end).all(|index| start(index) == 0 && !live.is_live(index)));
        assert!(
            live.contains(region(page.end, 4096 + 64 * page.end, 8)),
            "the next page"
        );
        // Later allocations in other pages still work.
        live.insert(page.end + 1, 64, 8);
        assert!(live.is_live(page.end + 1));
    }
}
