//! The deterministic allocator that hands out offsets in the symmetric heap.
//!
//! Every PE of a root owns a heap of the same capacity, and a collective allocation must return
//! the *same offset* on every PE: that is how a PE addresses a peer's copy of an object (peer base
//! address + offset) without asking the peer. No offsets are exchanged; each PE runs its own
//! [`Allocator`] over the same sequence of `allocate` / `free` calls and gets the same answers
//! because the allocator is a pure function of that sequence and the capacity. So this module uses
//! no randomness, no addresses, no clock and no hash-map iteration order (its one hash map, of
//! the live blocks, is only looked up) and does no I/O. Argument mismatches between PEs are caught by the caller before they
//! reach the allocator; the allocator's job is to never add a divergence of its own.
//!
//! Placement is *best fit*: among the free blocks that can hold the request at an offset aligned
//! as asked, the smallest one wins, ties going to the lowest offset. The alignment padding in front
//! of the block and the remainder behind it stay free as blocks of their own, and `free` merges a
//! block with its free neighbours on both sides, so freeing everything always restores one free
//! block spanning the whole heap. The free blocks are indexed by offset and by (length, offset),
//! except the top — the free block at the heap's end — which is kept aside, so that the common
//! allocation carved from it and the free that merges back into it touch no index (the top
//! competes for best fit like any other block).
//!
//! Example, in prose (the items are crate-private, so no doctest): on `Allocator::new(1024)`,
//! `allocate(100, 16)` reserves 112 bytes (rounded up to a multiple of [`GRANULE`]) at offset 0;
//! `allocate(8, 64)` then reserves a whole cache line at offset 128 and leaves the padding
//! `[112, 128)` free; `allocate(0, 16)` is served from that padding at offset 112. `usage()` now
//! reports 192 bytes allocated in 3 allocations, and `free(0)` returns 112, the reserved length of
//! the first block.
//!
//! A request aligned to 32 bytes or more reserves a multiple of its alignment, up to a cache line
//! ([`LINE`]): so a run of such allocations leaves no padding between them (a padding hole in
//! front of every 8-byte default-aligned word, which no default-aligned request can use, made each
//! best-fit search step over all of them: allocation cost grew with the number of live
//! allocations), and a default-aligned allocation owns whole cache lines, which no later
//! allocation shares.
//! A request no free block can hold fails with [`Exhausted`], whose [`Exhausted::describe`] says
//! how much was asked for, how much is free and what to do.

use std::collections::{BTreeMap, BTreeSet};

use rustc_hash::FxHashMap;

/// Every block starts at an offset that is a multiple of this many bytes.
pub(crate) const MIN_ALIGNMENT: u64 = 16;

/// Reserved sizes are rounded up to a multiple of this many bytes, and are at least one granule,
/// so a 0-byte request still gets an offset of its own.
pub(crate) const GRANULE: u64 = 16;

/// A request aligned to this many bytes or more reserves a multiple of it (one cache line); a
/// less aligned one a multiple of its alignment (see [`reserved_size`]).
pub(crate) const LINE: u64 = 64;

/// Best-fit allocator over the byte range `[0, capacity)` of a symmetric heap.
///
/// It hands out offsets, never pointers. Free blocks are indexed twice: by offset (to find the
/// neighbours to coalesce with) and by `(length, offset)` (to find the best fit). Both indexes
/// always hold exactly the same blocks; no two free blocks are adjacent; free and live blocks
/// together tile `[0, capacity)` without gaps or overlap; every block starts at a multiple of
/// [`MIN_ALIGNMENT`].
///
/// A capacity that is not a multiple of [`GRANULE`] leaves its last partial granule permanently
/// free: it is counted in the free bytes, but no request fits in it.
#[derive(Debug, Clone)]
pub(crate) struct Allocator {
    /// Heap size in bytes.
    capacity: u64,
    /// Free blocks but the top: offset → length.
    free_by_offset: BTreeMap<u64, u64>,
    /// The same free blocks ordered by `(length, offset)`: the best-fit search order.
    free_by_size: BTreeSet<(u64, u64)>,
    /// Where the top starts: the free block `top..capacity` at the heap's end (empty when
    /// `top == capacity`), kept out of the indexes. The untouched tail, and what is freed back
    /// next to it: most allocations are carved from it and most frees merge into it, and then
    /// neither touches a B-tree (their inserts and removals were most of an allocate + free).
    top: u64,
    /// Live blocks: offset → reserved length. Only looked up: a hash map, so that a dozen live
    /// blocks do not make every allocation split a B-tree node and every free merge it back;
    /// hashed with FxHash (the keys are our own offsets; SipHash was a tenth of a
    /// malloc + free through the C API).
    live: FxHashMap<u64, u64>,
    /// Sum of the reserved lengths of the live blocks.
    allocated_bytes: u64,
    /// Sum of the lengths of the free blocks.
    free_bytes: u64,
    /// Highest `allocated_bytes` ever reached.
    peak_allocated_bytes: u64,
}

/// A snapshot of the heap's occupancy, as reported by [`Allocator::usage`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Usage {
    /// Sum of the reserved sizes of the live blocks (requests rounded up as [`reserved_size`]
    /// says).
    pub allocated_bytes: u64,
    /// Bytes in free blocks, alignment padding included; `allocated_bytes + free_bytes` is the
    /// capacity.
    pub free_bytes: u64,
    /// Length of the largest free block (0 when nothing is free).
    pub largest_free: u64,
    /// Highest `allocated_bytes` since the allocator was created.
    pub peak_allocated_bytes: u64,
    /// Number of live blocks.
    pub allocation_count: usize,
}

/// No free block can hold a request: the heap is full or too fragmented for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Exhausted {
    /// The requested size in bytes, as the caller asked for it (before rounding).
    pub requested: u64,
    /// The requested alignment in bytes.
    pub alignment: u64,
    /// Bytes free in the whole heap when the request failed.
    pub free_bytes: u64,
    /// Length of the largest free block when the request failed.
    pub largest_free: u64,
}

impl Exhausted {
    /// A user-facing sentence stating the request, the free space and what to do next.
    pub(crate) fn describe(&self) -> String {
        let Exhausted {
            requested,
            alignment,
            free_bytes,
            largest_free,
        } = *self;
        if free_bytes < requested {
            format!(
                "requested {requested} bytes (alignment {alignment}) but only {free_bytes} bytes \
                 are free and the largest free block is {largest_free} bytes; free allocations \
                 or raise the heap size"
            )
        } else {
            format!(
                "requested {requested} bytes (alignment {alignment}) but no free block can hold \
                 it: {free_bytes} bytes are free and the largest free block is {largest_free} \
                 bytes; free allocations or raise the heap size"
            )
        }
    }
}

/// `free` was given an offset at which no live block starts (never allocated, already freed,
/// or pointing inside a block).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NotAllocated {
    /// The offending offset.
    pub offset: u64,
}

impl Allocator {
    /// An allocator whose whole range `[0, capacity)` is one free block (none if `capacity` is 0).
    pub(crate) fn new(capacity: u64) -> Allocator {
        Allocator {
            capacity,
            free_by_offset: BTreeMap::new(),
            free_by_size: BTreeSet::new(),
            top: 0,
            live: FxHashMap::default(),
            allocated_bytes: 0,
            free_bytes: capacity,
            peak_allocated_bytes: 0,
        }
    }

    /// The heap size in bytes this allocator manages.
    pub(crate) fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Reserves a block for `bytes` bytes starting at a multiple of `alignment` and returns its
    /// offset.
    ///
    /// The reserved length is `bytes` rounded up to a multiple of `alignment` up to [`LINE`] (at
    /// least one granule: see [`reserved_size`]). Best fit: among the free blocks that can hold
    /// the reserved length at an aligned offset, the one with the smallest length wins, ties
    /// going to the lowest offset. The padding in front of the aligned offset and the remainder
    /// behind the block stay free.
    ///
    /// `alignment` must be a power of two of at least [`MIN_ALIGNMENT`]. Requests whose rounding
    /// or padding would overflow `u64` fail with [`Exhausted`] like any other request that does
    /// not fit. Cost: O(log n) when the smallest large-enough block is suitably aligned (always
    /// the case for `alignment == MIN_ALIGNMENT`); otherwise larger blocks are tried in size order.
    pub(crate) fn allocate(&mut self, bytes: u64, alignment: u64) -> Result<u64, Exhausted> {
        debug_assert!(
            alignment.is_power_of_two() && alignment >= MIN_ALIGNMENT,
            "alignment {alignment} is not a power of two >= {MIN_ALIGNMENT}"
        );
        let Some(size) = reserved_size(bytes, alignment) else {
            return Err(self.exhausted(bytes, alignment));
        };
        let fit = self.best_fit(size, alignment);
        if let Some(start) = self.top_fit(size, alignment) {
            // The top competes as any free block would, by (length, offset); its offset is the
            // highest, so an indexed block of the same length wins.
            let top = (self.capacity - self.top, self.top);
            if fit.map_or(true, |(offset, len, _)| top < (len, offset)) {
                self.carve_top(start, size);
                return Ok(self.reserved(start, size));
            }
        }
        let Some((block_offset, block_len, start)) = fit else {
            return Err(self.exhausted(bytes, alignment));
        };

        self.remove_free(block_offset, block_len);
        // `best_fit` checked `start + size <= block_offset + block_len`, so none of this overflows.
        let end = start + size;
        let block_end = block_offset + block_len;
        self.insert_free(block_offset, start - block_offset);
        self.insert_free(end, block_end - end);
        Ok(self.reserved(start, size))
    }

    /// Records the live block `start..start + size`; returns `start`.
    fn reserved(&mut self, start: u64, size: u64) -> u64 {
        self.live.insert(start, size);
        self.allocated_bytes += size;
        self.peak_allocated_bytes = self.peak_allocated_bytes.max(self.allocated_bytes);
        start
    }

    /// Where in the top a block of `size` bytes at `alignment` would start, if it fits.
    fn top_fit(&self, size: u64, alignment: u64) -> Option<u64> {
        let start = align_up(self.top, alignment)?;
        (start.checked_add(size)? <= self.capacity).then_some(start)
    }

    /// Takes `start..start + size` (from [`Allocator::top_fit`]) out of the top; the padding in
    /// front of `start` becomes a free block of its own.
    fn carve_top(&mut self, start: u64, size: u64) {
        let (padding, end) = (self.top, start + size);
        self.free_bytes -= end - padding;
        self.top = end;
        self.insert_free(padding, start - padding);
    }

    /// Releases the live block starting at `offset`, merges it with its free neighbours on both
    /// sides, and returns the block's reserved length.
    ///
    /// Fails with [`NotAllocated`] if no live block starts at `offset` (never allocated, already
    /// freed, or an offset inside a block); the allocator is then unchanged.
    pub(crate) fn free(&mut self, offset: u64) -> Result<u64, NotAllocated> {
        let Some(len) = self.live.remove(&offset) else {
            return Err(NotAllocated { offset });
        };
        self.allocated_bytes -= len;

        let mut start = offset;
        let mut end = offset + len;
        if let Some((&prev_offset, &prev_len)) = self.free_by_offset.range(..offset).next_back() {
            if prev_offset + prev_len == offset {
                self.remove_free(prev_offset, prev_len);
                start = prev_offset;
            }
        }
        if end == self.top {
            self.free_bytes += end - start;
            self.top = start;
            return Ok(len);
        }
        if let Some(&next_len) = self.free_by_offset.get(&end) {
            self.remove_free(end, next_len);
            end += next_len;
        }
        self.insert_free(start, end - start);
        Ok(len)
    }

    /// Current occupancy of the heap.
    pub(crate) fn usage(&self) -> Usage {
        Usage {
            allocated_bytes: self.allocated_bytes,
            free_bytes: self.free_bytes,
            largest_free: self.largest_free(),
            peak_allocated_bytes: self.peak_allocated_bytes,
            allocation_count: self.live.len(),
        }
    }

    /// Worst-case number of heap bytes one request can consume, for capacity planning:
    /// `reserved_size(bytes, alignment) + alignment - 1`, saturating at `u64::MAX` (which no
    /// heap can hold).
    ///
    /// If the footprints of a sequence of requests sum to at most a heap's capacity, allocating
    /// them in that sequence on a fresh heap of that capacity succeeds (each request consumes at
    /// most its footprint from the untouched tail of the heap). Restart relies on this to check
    /// that the live allocations fit a new heap.
    pub(crate) fn footprint(bytes: u64, alignment: u64) -> u64 {
        reserved_size(bytes, alignment)
            .and_then(|size| size.checked_add(alignment - 1))
            .unwrap_or(u64::MAX)
    }

    /// The best-fit free block for `size` bytes at `alignment`, as
    /// `(block offset, block length, aligned start)`.
    fn best_fit(&self, size: u64, alignment: u64) -> Option<(u64, u64, u64)> {
        self.free_by_size
            .range((size, 0)..)
            .find_map(|&(len, offset)| {
                let start = align_up(offset, alignment)?;
                let needed = (start - offset).checked_add(size)?;
                (needed <= len).then_some((offset, len, start))
            })
    }

    /// The error for a request of `bytes` at `alignment` that does not fit.
    fn exhausted(&self, bytes: u64, alignment: u64) -> Exhausted {
        Exhausted {
            requested: bytes,
            alignment,
            free_bytes: self.free_bytes,
            largest_free: self.largest_free(),
        }
    }

    /// Length of the largest free block, 0 if none.
    fn largest_free(&self) -> u64 {
        let indexed = self.free_by_size.last().map_or(0, |&(len, _)| len);
        indexed.max(self.capacity - self.top)
    }

    /// Every free block as `(offset, length)`, the top last.
    #[cfg(test)]
    fn free_blocks(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        let top = (self.top < self.capacity).then_some((self.top, self.capacity - self.top));
        self.free_by_offset
            .iter()
            .map(|(&offset, &len)| (offset, len))
            .chain(top)
    }

    /// Adds a free block to both indexes; an empty block is not a block and is skipped.
    fn insert_free(&mut self, offset: u64, len: u64) {
        if len == 0 {
            return;
        }
        self.free_by_offset.insert(offset, len);
        self.free_by_size.insert((len, offset));
        self.free_bytes += len;
    }

    /// Removes a free block (which must exist) from both indexes.
    fn remove_free(&mut self, offset: u64, len: u64) {
        let removed_by_offset = self.free_by_offset.remove(&offset);
        let removed_by_size = self.free_by_size.remove(&(len, offset));
        debug_assert_eq!(removed_by_offset, Some(len));
        debug_assert!(removed_by_size);
        self.free_bytes -= len;
    }
}

/// The reserved length of a `bytes`-byte request at `alignment`: at least one granule, rounded
/// up to a multiple of `alignment` clamped to [`GRANULE`]..=[`LINE`]; `None` if rounding
/// overflows `u64`.
fn reserved_size(bytes: u64, alignment: u64) -> Option<u64> {
    bytes
        .max(1)
        .checked_next_multiple_of(alignment.clamp(GRANULE, LINE))
}

/// `offset` rounded up to a multiple of `alignment` (a power of two); `None` on overflow.
fn align_up(offset: u64, alignment: u64) -> Option<u64> {
    offset.checked_next_multiple_of(alignment)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use proptest::sample::Index;

    const KIB: u64 = 1024;

    /// Checks every structural invariant of the allocator: both free indexes agree, free and live
    /// blocks tile `[0, capacity)` exactly, no two free blocks are adjacent, every block starts at
    /// a multiple of `MIN_ALIGNMENT`, and the byte counters match the blocks.
    fn check_invariants(allocator: &Allocator) -> Result<(), TestCaseError> {
        let by_size: BTreeSet<(u64, u64)> = allocator
            .free_by_offset
            .iter()
            .map(|(&offset, &len)| (len, offset))
            .collect();
        prop_assert_eq!(&by_size, &allocator.free_by_size);

        // (offset, len, is_free), sorted by offset.
        let mut blocks: Vec<(u64, u64, bool)> = allocator
            .free_blocks()
            .map(|(offset, len)| (offset, len, true))
            .chain(
                allocator
                    .live
                    .iter()
                    .map(|(&offset, &len)| (offset, len, false)),
            )
            .collect();
        blocks.sort_unstable();
        let mut cursor = 0u64;
        let mut previous_free = false;
        for &(offset, len, is_free) in &blocks {
            prop_assert_eq!(offset, cursor, "gap or overlap at {}", offset);
            prop_assert!(len > 0);
            prop_assert_eq!(offset % MIN_ALIGNMENT, 0);
            prop_assert!(
                !(is_free && previous_free),
                "adjacent free blocks at {}",
                offset
            );
            cursor = offset + len;
            previous_free = is_free;
        }
        prop_assert_eq!(cursor, allocator.capacity());

        let free: u64 = allocator.free_blocks().map(|(_, len)| len).sum();
        let live: u64 = allocator.live.values().sum();
        prop_assert_eq!(free, allocator.usage().free_bytes);
        prop_assert_eq!(live, allocator.usage().allocated_bytes);
        Ok(())
    }

    /// The free blocks as `(offset, len)`, sorted by offset.
    fn free_blocks(allocator: &Allocator) -> Vec<(u64, u64)> {
        allocator.free_blocks().collect()
    }

    /// Brute-force reference for `allocate`: the offset best fit must return, computed by scanning
    /// every free block in 128-bit arithmetic (no overflow possible), or `None` if no block fits.
    fn brute_force_best_fit(allocator: &Allocator, bytes: u64, alignment: u64) -> Option<u64> {
        let unit = u128::from(alignment.clamp(GRANULE, LINE));
        let size = u128::from(bytes.max(1)).div_ceil(unit) * unit;
        let alignment = u128::from(alignment);
        allocator
            .free_blocks()
            .filter_map(|(offset, len)| {
                let start = u128::from(offset).div_ceil(alignment) * alignment;
                (start + size <= u128::from(offset) + u128::from(len))
                    .then_some((len, offset, start))
            })
            .min()
            .map(|(_, _, start)| u64::try_from(start).unwrap())
    }

    #[test]
    fn fresh_allocator_is_one_free_block() {
        let allocator = Allocator::new(64 * KIB);
        assert_eq!(allocator.capacity(), 64 * KIB);
        assert_eq!(
            allocator.usage(),
            Usage {
                allocated_bytes: 0,
                free_bytes: 64 * KIB,
                largest_free: 64 * KIB,
                peak_allocated_bytes: 0,
                allocation_count: 0,
            }
        );
        assert_eq!(free_blocks(&allocator), vec![(0, 64 * KIB)]);
    }

    #[test]
    fn module_doc_example_holds() {
        let mut allocator = Allocator::new(1024);
        assert_eq!(allocator.allocate(100, 16), Ok(0));
        assert_eq!(allocator.allocate(8, 64), Ok(128));
        assert_eq!(allocator.allocate(0, 16), Ok(112));
        let usage = allocator.usage();
        assert_eq!((usage.allocated_bytes, usage.allocation_count), (192, 3));
        assert_eq!(allocator.free(0), Ok(112));
    }

    #[test]
    fn first_allocation_is_at_offset_zero() {
        let mut allocator = Allocator::new(64 * KIB);
        assert_eq!(allocator.allocate(100, MIN_ALIGNMENT), Ok(0));
        assert_eq!(allocator.allocate(100, MIN_ALIGNMENT), Ok(112));
        let usage = allocator.usage();
        assert_eq!(usage.allocated_bytes, 224);
        assert_eq!(usage.allocation_count, 2);
        check_invariants(&allocator).unwrap();
    }

    #[test]
    fn alignment_is_honoured_and_padding_is_reused_by_a_later_small_allocation() {
        let mut allocator = Allocator::new(64 * KIB);
        assert_eq!(allocator.allocate(16, MIN_ALIGNMENT), Ok(0));
        assert_eq!(allocator.allocate(64, 256), Ok(256));
        // The padding [16, 256) stays free as its own block, and the tail after the block too.
        assert_eq!(
            free_blocks(&allocator),
            vec![(16, 240), (320, 64 * KIB - 320)]
        );
        // The padding is the smallest block that fits, so a small request lands in it.
        assert_eq!(allocator.allocate(32, MIN_ALIGNMENT), Ok(16));
        assert_eq!(allocator.allocate(1, 64), Ok(64));
        check_invariants(&allocator).unwrap();
    }

    #[test]
    fn exhaustion_reports_requested_free_and_largest_exactly() {
        let mut allocator = Allocator::new(1024);
        let first = allocator.allocate(512, MIN_ALIGNMENT).unwrap();
        allocator.allocate(256, MIN_ALIGNMENT).unwrap();
        allocator.free(first).unwrap();
        // Free: [0, 512) and [768, 1024).
        let error = allocator.allocate(600, 64).unwrap_err();
        assert_eq!(
            error,
            Exhausted {
                requested: 600,
                alignment: 64,
                free_bytes: 768,
                largest_free: 512,
            }
        );
        assert_eq!(
            error.describe(),
            "requested 600 bytes (alignment 64) but no free block can hold it: 768 bytes are \
             free and the largest free block is 512 bytes; free allocations or raise the heap \
             size"
        );
        // The failed request changed nothing.
        assert_eq!(free_blocks(&allocator), vec![(0, 512), (768, 256)]);

        let error = allocator.allocate(1 << 20, 64).unwrap_err();
        assert_eq!(
            error.describe(),
            "requested 1048576 bytes (alignment 64) but only 768 bytes are free and the largest \
             free block is 512 bytes; free allocations or raise the heap size"
        );
    }

    #[test]
    fn free_of_an_unknown_offset_is_not_allocated() {
        let mut allocator = Allocator::new(64 * KIB);
        assert_eq!(allocator.free(0), Err(NotAllocated { offset: 0 }));
        let offset = allocator.allocate(100, MIN_ALIGNMENT).unwrap();
        // An offset inside a live block is not a block start.
        assert_eq!(
            allocator.free(offset + 16),
            Err(NotAllocated {
                offset: offset + 16
            })
        );
        assert_eq!(
            allocator.free(u64::MAX),
            Err(NotAllocated { offset: u64::MAX })
        );
        assert_eq!(allocator.usage().allocation_count, 1);
        check_invariants(&allocator).unwrap();
    }

    #[test]
    fn double_free_is_not_allocated() {
        let mut allocator = Allocator::new(64 * KIB);
        let offset = allocator.allocate(100, MIN_ALIGNMENT).unwrap();
        assert_eq!(allocator.free(offset), Ok(112));
        assert_eq!(allocator.free(offset), Err(NotAllocated { offset }));
        check_invariants(&allocator).unwrap();
    }

    #[test]
    fn freeing_everything_coalesces_into_one_block_of_the_full_capacity() {
        let mut allocator = Allocator::new(64 * KIB);
        let offsets: Vec<u64> = [(10, 16), (300, 256), (0, 16), (4000, 1024), (17, 64)]
            .into_iter()
            .map(|(bytes, alignment)| allocator.allocate(bytes, alignment).unwrap())
            .collect();
        // Middle blocks first, so later frees merge with free neighbours on both sides.
        for index in [1, 3, 0, 4, 2] {
            allocator.free(offsets[index]).unwrap();
            check_invariants(&allocator).unwrap();
        }
        assert_eq!(free_blocks(&allocator), vec![(0, 64 * KIB)]);
        assert_eq!(allocator.usage().largest_free, 64 * KIB);
        assert_eq!(allocator.usage().allocation_count, 0);
    }

    #[test]
    fn best_fit_picks_the_smallest_hole_that_fits() {
        let mut allocator = Allocator::new(64 * KIB);
        let mut hole_offsets = Vec::new();
        for hole in [64, 32, 48] {
            hole_offsets.push(allocator.allocate(hole, MIN_ALIGNMENT).unwrap());
            allocator.allocate(16, MIN_ALIGNMENT).unwrap(); // separator
        }
        for offset in &hole_offsets {
            allocator.free(*offset).unwrap();
        }
        assert_eq!(hole_offsets, vec![0, 80, 128]);
        // Holes of 64 @ 0, 32 @ 80, 48 @ 128, plus the tail; 40 bytes need 48.
        assert_eq!(allocator.allocate(40, MIN_ALIGNMENT), Ok(128));
        assert_eq!(allocator.allocate(17, MIN_ALIGNMENT), Ok(80));
        assert_eq!(allocator.allocate(1, MIN_ALIGNMENT), Ok(0));
        check_invariants(&allocator).unwrap();
    }

    #[test]
    fn best_fit_ties_go_to_the_lowest_offset() {
        let mut allocator = Allocator::new(64 * KIB);
        let mut holes = Vec::new();
        for _ in 0..3 {
            holes.push(allocator.allocate(32, MIN_ALIGNMENT).unwrap());
            allocator.allocate(16, MIN_ALIGNMENT).unwrap(); // separator
        }
        for offset in holes.iter().rev() {
            allocator.free(*offset).unwrap();
        }
        assert_eq!(allocator.allocate(32, MIN_ALIGNMENT), Ok(holes[0]));
        assert_eq!(allocator.allocate(32, MIN_ALIGNMENT), Ok(holes[1]));
    }

    #[test]
    fn best_fit_skips_a_smaller_block_that_cannot_be_aligned() {
        let mut allocator = Allocator::new(64 * KIB);
        allocator.allocate(16, MIN_ALIGNMENT).unwrap();
        let hole = allocator.allocate(64, MIN_ALIGNMENT).unwrap();
        allocator.allocate(16, MIN_ALIGNMENT).unwrap(); // separator
        allocator.free(hole).unwrap();
        // The 64-byte hole at 16 holds the 64 bytes a 64-aligned request reserves, but not at a
        // 64-aligned offset: 64 + 64 > 80.
        let offset = allocator.allocate(32, 64).unwrap();
        assert_eq!(offset, 128);
        // A less aligned request fits it (the padding [96, 128) is too short).
        assert_eq!(allocator.allocate(48, 16), Ok(16));
        check_invariants(&allocator).unwrap();
    }

    #[test]
    fn default_aligned_words_leave_no_padding_behind() {
        // Every 8-byte word at the default alignment reserves its whole line, so the next starts
        // right behind it: no padding holes for later best-fit searches to step over.
        let mut allocator = Allocator::new(64 * KIB);
        let offsets: Vec<u64> = (0..256)
            .map(|_| allocator.allocate(8, LINE).unwrap())
            .collect();
        assert!(offsets.iter().zip(0..).all(|(&o, i)| o == i * LINE));
        assert_eq!(free_blocks(&allocator), vec![(256 * LINE, 48 * KIB)]);
        // Freeing every other word leaves line-sized, line-aligned holes that words reuse.
        for &offset in offsets.iter().step_by(2) {
            allocator.free(offset).unwrap();
        }
        assert_eq!(allocator.allocate(8, LINE), Ok(0));
        check_invariants(&allocator).unwrap();
    }

    #[test]
    fn zero_byte_requests_get_distinct_offsets() {
        let mut allocator = Allocator::new(64 * KIB);
        let offsets: Vec<u64> = (0..4)
            .map(|_| allocator.allocate(0, MIN_ALIGNMENT).unwrap())
            .collect();
        assert_eq!(offsets, vec![0, 16, 32, 48]);
        assert_eq!(allocator.usage().allocated_bytes, 4 * GRANULE);
        assert_eq!(allocator.free(16), Ok(GRANULE));
    }

    #[test]
    fn overflowing_requests_are_exhausted_not_panics() {
        let mut allocator = Allocator::new(64 * KIB);
        let free = 64 * KIB;
        // Rounding up to a granule overflows.
        assert_eq!(
            allocator.allocate(u64::MAX, MIN_ALIGNMENT),
            Err(Exhausted {
                requested: u64::MAX,
                alignment: MIN_ALIGNMENT,
                free_bytes: free,
                largest_free: free,
            })
        );
        assert!(allocator.allocate(u64::MAX - 14, 1 << 63).is_err());
        // Offset 0 is aligned to anything, so a huge alignment succeeds on an empty heap (one
        // line reserved)...
        assert_eq!(allocator.allocate(16, 1 << 63), Ok(0));
        // ...but once offset 0 is taken the next aligned offset lies far beyond the heap.
        assert_eq!(
            allocator.allocate(16, 1 << 63),
            Err(Exhausted {
                requested: 16,
                alignment: 1 << 63,
                free_bytes: free - LINE,
                largest_free: free - LINE,
            })
        );
        check_invariants(&allocator).unwrap();
    }

    #[test]
    fn overflowing_padding_on_a_maximal_heap_is_exhausted() {
        let mut allocator = Allocator::new(u64::MAX);
        assert_eq!(allocator.allocate(16, MIN_ALIGNMENT), Ok(0));
        // The free tail [16, 2^64 - 1) is long enough for 2^64 - 32 bytes, but at the aligned
        // start 2^63 the padding (2^63 - 16) plus the size (2^64 - 32) overflows.
        assert!(allocator.allocate(u64::MAX - 31, 1 << 63).is_err());
        // Move the free tail past 2^63: aligning its offset up to 2^63 then overflows.
        assert_eq!(allocator.allocate((1 << 63) + 16, MIN_ALIGNMENT), Ok(16));
        let error = allocator.allocate(16, 1 << 63).unwrap_err();
        assert_eq!(error.free_bytes, u64::MAX - (1 << 63) - 32);
        // The allocator still works after all that.
        assert_eq!(allocator.allocate(16, MIN_ALIGNMENT), Ok((1 << 63) + 32));
        check_invariants(&allocator).unwrap();
    }

    #[test]
    fn capacity_not_a_multiple_of_the_granule_leaves_an_unusable_tail() {
        let mut allocator = Allocator::new(100);
        assert_eq!(allocator.allocate(90, MIN_ALIGNMENT), Ok(0));
        let error = allocator.allocate(0, MIN_ALIGNMENT).unwrap_err();
        assert_eq!((error.free_bytes, error.largest_free), (4, 4));
        assert_eq!(allocator.free(0), Ok(96));
        assert_eq!(free_blocks(&allocator), vec![(0, 100)]);
    }

    #[test]
    fn empty_heap_exhausts_every_request() {
        let mut allocator = Allocator::new(0);
        assert_eq!(allocator.usage().largest_free, 0);
        assert_eq!(
            allocator.allocate(0, MIN_ALIGNMENT),
            Err(Exhausted {
                requested: 0,
                alignment: MIN_ALIGNMENT,
                free_bytes: 0,
                largest_free: 0,
            })
        );
    }

    #[test]
    fn peak_tracks_the_highest_allocated_bytes() {
        let mut allocator = Allocator::new(64 * KIB);
        let a = allocator.allocate(1000, MIN_ALIGNMENT).unwrap();
        let b = allocator.allocate(1000, MIN_ALIGNMENT).unwrap();
        allocator.free(a).unwrap();
        allocator.free(b).unwrap();
        allocator.allocate(16, MIN_ALIGNMENT).unwrap();
        let usage = allocator.usage();
        assert_eq!(usage.allocated_bytes, 16);
        assert_eq!(usage.peak_allocated_bytes, 2 * 1008);
    }

    #[test]
    fn footprint_is_rounded_size_plus_alignment_minus_one() {
        assert_eq!(Allocator::footprint(0, 16), 16 + 15);
        assert_eq!(Allocator::footprint(1, 16), 16 + 15);
        assert_eq!(Allocator::footprint(40, 32), 64 + 31);
        assert_eq!(Allocator::footprint(100, 64), 128 + 63);
        assert_eq!(Allocator::footprint(4096, 4096), 4096 + 4095);
        assert_eq!(Allocator::footprint(u64::MAX, 16), u64::MAX);
        assert_eq!(Allocator::footprint(1 << 63, 1 << 63), u64::MAX);
    }

    /// One step of a generated workload.
    #[derive(Debug, Clone)]
    enum Op {
        /// Allocate `bytes` at alignment `1 << align_shift`.
        Alloc { bytes: u64, align_shift: u32 },
        /// Free the live block picked by `index` among the live blocks in allocation order (or,
        /// with nothing live, try to free offset 0 and expect `NotAllocated`).
        Free { index: Index },
    }

    /// The result of one step, for comparing runs.
    #[derive(Debug, Clone, PartialEq, Eq)]
    enum Outcome {
        Allocated(Result<u64, Exhausted>),
        Freed(Result<u64, NotAllocated>),
    }

    const CAPACITY: u64 = 64 * KIB;
    const CASES: u32 = 512;

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (0u64..5000, 4u32..12).prop_map(|(bytes, align_shift)| Op::Alloc { bytes, align_shift }),
            2 => any::<Index>().prop_map(|index| Op::Free { index }),
        ]
    }

    fn ops() -> impl Strategy<Value = Vec<Op>> {
        prop::collection::vec(op(), 0..200)
    }

    /// Runs `ops` on `allocator`, keeping `live` (offsets in allocation order) up to date and
    /// calling `observe` before and after every step with the op's outcome.
    fn run(
        allocator: &mut Allocator,
        live: &mut Vec<u64>,
        ops: &[Op],
        mut observe: impl FnMut(&Allocator, &Op, &Outcome) -> Result<(), TestCaseError>,
    ) -> Result<Vec<Outcome>, TestCaseError> {
        let mut outcomes = Vec::with_capacity(ops.len());
        for op in ops {
            let outcome = match *op {
                Op::Alloc { bytes, align_shift } => {
                    let result = allocator.allocate(bytes, 1 << align_shift);
                    if let Ok(offset) = result {
                        live.push(offset);
                    }
                    Outcome::Allocated(result)
                }
                Op::Free { .. } if live.is_empty() => {
                    let result = allocator.free(0);
                    prop_assert_eq!(result, Err(NotAllocated { offset: 0 }));
                    Outcome::Freed(result)
                }
                Op::Free { index } => {
                    let offset = live.remove(index.index(live.len()));
                    Outcome::Freed(allocator.free(offset))
                }
            };
            observe(allocator, op, &outcome)?;
            outcomes.push(outcome);
        }
        Ok(outcomes)
    }

    /// The generated ops and a shuffled order in which to free the blocks they leave live.
    fn ops_and_free_order() -> impl Strategy<Value = (Vec<Op>, Vec<usize>)> {
        ops().prop_flat_map(|ops| {
            let mut live = Vec::new();
            run(&mut Allocator::new(CAPACITY), &mut live, &ops, |_, _, _| {
                Ok(())
            })
            .expect("the workload itself never fails");
            let order: Vec<usize> = (0..live.len()).collect();
            (Just(ops), Just(order).prop_shuffle())
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(CASES))]

        #[test]
        fn same_ops_give_identical_offsets_on_fresh_allocators(ops in ops()) {
            let first = run(&mut Allocator::new(CAPACITY), &mut Vec::new(), &ops, |_, _, _| Ok(()))?;
            let second = run(&mut Allocator::new(CAPACITY), &mut Vec::new(), &ops, |_, _, _| Ok(()))?;
            prop_assert_eq!(first, second);
        }

        #[test]
        fn live_blocks_never_overlap_and_stay_within_capacity(ops in ops()) {
            let mut allocator = Allocator::new(CAPACITY);
            run(&mut allocator, &mut Vec::new(), &ops, |allocator, _, _| {
                let mut end = 0;
                let mut live: Vec<(u64, u64)> = allocator.live.iter().map(|(&o, &l)| (o, l)).collect();
                live.sort_unstable();
                for (offset, len) in live {
                    prop_assert!(offset >= end, "block at {} overlaps the previous one", offset);
                    end = offset + len;
                }
                prop_assert!(end <= CAPACITY);
                check_invariants(allocator)
            })?;
        }

        #[test]
        fn every_allocation_honours_its_alignment(ops in ops()) {
            let mut allocator = Allocator::new(CAPACITY);
            run(&mut allocator, &mut Vec::new(), &ops, |allocator, op, outcome| {
                if let (Op::Alloc { bytes, align_shift }, Outcome::Allocated(Ok(offset))) = (op, outcome) {
                    prop_assert_eq!(*offset % (1u64 << *align_shift), 0);
                    let reserved = allocator.live[offset];
                    prop_assert!(reserved >= *bytes && reserved % GRANULE == 0 && reserved > 0);
                }
                Ok(())
            })?;
        }

        #[test]
        fn usage_accounting_balances_at_every_step(ops in ops()) {
            let mut allocator = Allocator::new(CAPACITY);
            let mut previous_peak = 0;
            let mut live = Vec::new();
            let mut count = 0usize;
            run(&mut allocator, &mut live, &ops, |allocator, _, outcome| {
                match outcome {
                    Outcome::Allocated(Ok(_)) => count += 1,
                    Outcome::Freed(Ok(_)) => count -= 1,
                    _ => {}
                }
                let usage = allocator.usage();
                prop_assert_eq!(usage.allocated_bytes + usage.free_bytes, CAPACITY);
                prop_assert_eq!(usage.allocation_count, count);
                prop_assert!(usage.peak_allocated_bytes >= previous_peak);
                prop_assert!(usage.peak_allocated_bytes >= usage.allocated_bytes);
                prop_assert!(usage.largest_free <= usage.free_bytes);
                previous_peak = usage.peak_allocated_bytes;
                Ok(())
            })?;
            prop_assert_eq!(allocator.usage().allocation_count, live.len());
        }

        #[test]
        fn freeing_every_live_block_in_any_order_restores_one_full_block(
            (ops, order) in ops_and_free_order(),
        ) {
            let mut allocator = Allocator::new(CAPACITY);
            let mut live = Vec::new();
            run(&mut allocator, &mut live, &ops, |_, _, _| Ok(()))?;
            prop_assert_eq!(order.len(), live.len());
            for index in order {
                let reserved = allocator.live[&live[index]];
                prop_assert_eq!(allocator.free(live[index]), Ok(reserved));
                check_invariants(&allocator)?;
            }
            prop_assert_eq!(free_blocks(&allocator), vec![(0, CAPACITY)]);
            let usage = allocator.usage();
            prop_assert_eq!(usage.largest_free, CAPACITY);
            prop_assert_eq!(usage.allocated_bytes, 0);
            prop_assert_eq!(usage.allocation_count, 0);
        }

        #[test]
        fn allocation_matches_a_brute_force_best_fit_model(ops in ops()) {
            let mut allocator = Allocator::new(CAPACITY);
            let mut live = Vec::new();
            for op in &ops {
                let expected = match *op {
                    Op::Alloc { bytes, align_shift } => {
                        Some((brute_force_best_fit(&allocator, bytes, 1 << align_shift), bytes, align_shift))
                    }
                    Op::Free { .. } => None,
                };
                let usage_before = allocator.usage();
                let outcomes = run(&mut allocator, &mut live, std::slice::from_ref(op), |_, _, _| Ok(()))?;
                if let (Some((expected, bytes, align_shift)), Outcome::Allocated(result)) = (expected, &outcomes[0]) {
                    match (expected, *result) {
                        (Some(expected), Ok(offset)) => prop_assert_eq!(offset, expected),
                        (None, Err(error)) => prop_assert_eq!(error, Exhausted {
                            requested: bytes,
                            alignment: 1 << align_shift,
                            free_bytes: usage_before.free_bytes,
                            largest_free: usage_before.largest_free,
                        }),
                        (expected, result) => {
                            return Err(TestCaseError::fail(format!(
                                "model says {expected:?}, allocator says {result:?}"
                            )));
                        }
                    }
                }
            }
        }

        #[test]
        fn footprints_that_fit_the_capacity_always_allocate_on_a_fresh_heap(
            requests in prop::collection::vec((0u64..5000, 4u32..12), 0..100),
        ) {
            let mut allocator = Allocator::new(CAPACITY);
            let mut planned = 0u64;
            for (bytes, align_shift) in requests {
                planned += Allocator::footprint(bytes, 1 << align_shift);
                if planned > CAPACITY {
                    break;
                }
                prop_assert!(allocator.allocate(bytes, 1 << align_shift).is_ok());
            }
        }
    }
}
