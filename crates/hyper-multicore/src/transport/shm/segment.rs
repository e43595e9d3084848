//! The heap segment: one memfd per runtime lifetime holding a control block (header, central
//! barrier and abort words, one block of words per PE) followed by every PE's heap.
//!
//! ```text
//! 0                 ControlBlock: SegmentHeader | CentralWords | AbortWord
//! size_of(Control)  PeWords × pes               (doorbells, barrier flags, argument slots)
//! team_offset       team row × pes              (each PE's published collective words; with
//!                                                at most TEAM_SIGNAL_MAX_PES PEs also its
//!                                                team-signal counters, see `team_sync`)
//! heaps_offset      heap of PE 0 | heap of PE 1 | …   (`heap_stride` apart: twice the heap
//!                   rounded up to 2 MiB, plus 2 MiB so copies are never a power of two apart)
//! ```
//!
//! Each heap has room to double in place: the memfd is sparse (the kernel allocates a page when
//! it is first touched), so the room costs address space only. A restart that keeps data and
//! whose new heap fits that room reuses the segment ([`Segment::regrow`]): kept bytes never
//! leave their pages and only the pages the bigger heap newly touches are allocated.
//!
//! Root rank 0 creates the memfd (close-on-exec, sized with `ftruncate`, sealed against resizing),
//! writes the header — layout version last — and hands the descriptor to its local peers (see
//! `handoff`). Every PE maps the whole segment once, its own heap on a boundary of the heap's
//! room rounded up to a power of two (see [`max_alignment`]), and checks
//! magic, layout version, generation and sizes before use. The kernel frees the memory when the
//! last process unmaps it, so a killed job leaves nothing behind.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use rustix::fs::{fcntl_add_seals, ftruncate, memfd_create, MemfdFlags, SealFlags};

use super::sync::{
    self, BarrierFlags, BarrierKind, BarrierWords, CentralWords, Doorbell, MAX_SEGMENT_PES,
};
use crate::error::{Error, ErrorKind, Result};
use crate::primitive::AtomicU32;
use crate::sys::mapping::SharedMapping;
use crate::sys::segment_words::SignalCount;
pub(crate) use crate::sys::segment_words::{ControlBlock, PeWords};

/// `"HMSHMEM1"` as a little-endian word: the first word of every segment.
/// The most PEs a segment may hold for its team rows to carry the pair counters (two 32-bit
/// counters per pair: 512 KiB at this size); a larger segment's teams meet over the control
/// plane.
pub(crate) const TEAM_SIGNAL_MAX_PES: usize = 256;

/// Words each PE publishes for a collective in progress (one cache line in its team row):
/// written by their PE before a meeting, read by the others after it and before the next one.
pub(crate) const PUBLISHED_WORDS: usize = 8;

pub(crate) const SEGMENT_MAGIC: u64 = u64::from_le_bytes(*b"HMSHMEM1");
/// Version of the layout described in the module docs.
pub(crate) const LAYOUT_VERSION: u64 = 4;
/// Alignment of the mapping and of every heap in it.
pub(crate) const HEAP_ALIGNMENT: usize = 2 << 20;

/// The largest alignment an allocation in a heap of `heap_size` bytes may ask for: the heap's
/// size rounded up to a power of two, and at least 2 MiB. Each PE maps its segment so that its
/// own heap starts on a multiple of that (of [`Layout::own_heap_alignment`], which is at least
/// as large), so an offset aligned in the heap is an address aligned in every PE's own copy.
pub fn max_alignment(heap_size: u64) -> u64 {
    heap_size
        .checked_next_power_of_two()
        .unwrap_or(1 << 63)
        .max(HEAP_ALIGNMENT as u64)
}

/// The sizes of one segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Layout {
    pub(crate) pes: usize,
    pub(crate) heap_size: u64,
    pub(crate) heap_stride: usize,
    pub(crate) heaps_offset: usize,
    pub(crate) total: usize,
    /// Where the team rows start: one row per PE (see [`Layout::team_row`]).
    pub(crate) team_offset: usize,
    /// Bytes of one PE's team row: its published words on one cache line, then (when the
    /// segment has at most [`TEAM_SIGNAL_MAX_PES`] PEs) the signals every PE sent it and the
    /// signals it consumed from every PE, one 32-bit counter per PE each.
    pub(crate) team_row: usize,
    /// Whether the team rows hold the signal counters.
    pub(crate) team_signals: bool,
}

impl Layout {
    /// The layout for `pes` heaps of `heap_size` bytes, or an error if it cannot be mapped.
    pub(crate) fn new(pes: usize, heap_size: u64) -> Result<Layout> {
        if pes > MAX_SEGMENT_PES {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                "initialize",
                format!(
                    "{pes} PEs on one host are more than one heap segment holds \
                     ({MAX_SEGMENT_PES}); run fewer PEs per host"
                ),
            ));
        }
        let too_large = || {
            Error::new(
                ErrorKind::InvalidArgument,
                "initialize",
                format!(
                    "a heap of {heap_size} bytes for each of {pes} PEs does not fit in this \
                     process's address space; choose a smaller heap size"
                ),
            )
        };
        let team_offset =
            std::mem::size_of::<ControlBlock>() + pes * std::mem::size_of::<PeWords>();
        let team_signals = pes <= TEAM_SIGNAL_MAX_PES;
        let counters = if team_signals {
            2 * round_up(pes * 4, 64).ok_or_else(too_large)?
        } else {
            0
        };
        let team_row = 64 + counters;
        let control = team_row
            .checked_mul(pes)
            .and_then(|rows| rows.checked_add(team_offset))
            .ok_or_else(too_large)?;
        let heaps_offset = round_up(control, HEAP_ALIGNMENT).ok_or_else(too_large)?;
        let heap_size_usize = usize::try_from(heap_size).map_err(|_| too_large())?;
        let room = heap_size_usize.checked_mul(2).ok_or_else(too_large)?;
        // One spare 2 MiB step between heaps: PEs' copies of one object are then never a power
        // of two apart, which on this hardware class makes a cache line shared by two PEs' copies
        // alias in the L1 way predictor, which slows every hand-off of such a line.
        let heap_stride = round_up(room, HEAP_ALIGNMENT)
            .and_then(|s| s.checked_add(HEAP_ALIGNMENT))
            .ok_or_else(too_large)?;
        let total = heap_stride
            .checked_mul(pes)
            .and_then(|heaps| heaps.checked_add(heaps_offset))
            .filter(|&t| t <= isize::MAX as usize)
            .ok_or_else(too_large)?;
        Ok(Layout {
            pes,
            heap_size,
            heap_stride,
            heaps_offset,
            total,
            team_offset,
            team_row,
            team_signals,
        })
    }

    /// Offset in the segment of PE `pe`'s heap.
    #[inline]
    pub(crate) fn heap_offset(&self, pe: usize) -> usize {
        self.heaps_offset + pe * self.heap_stride
    }

    /// The alignment of the address at which each PE maps its own heap: the heap's room (twice
    /// the heap) rounded up to a power of two, so that every heap size the room holds, regrown
    /// in place included, has its [`max_alignment`] satisfied.
    pub(crate) fn own_heap_alignment(&self) -> usize {
        let room = self.heap_stride - HEAP_ALIGNMENT;
        room.checked_next_power_of_two()
            .unwrap_or(1 << (usize::BITS - 1))
            .max(HEAP_ALIGNMENT)
    }

    /// This layout with heaps of `heap_size` bytes in the same places, if each heap's room
    /// holds them (the spare 2 MiB between heaps stays spare).
    pub(crate) fn regrown(&self, heap_size: u64) -> Option<Layout> {
        let room = (self.heap_stride - HEAP_ALIGNMENT) as u64;
        (heap_size > 0 && heap_size <= room).then_some(Layout { heap_size, ..*self })
    }
}

fn round_up(value: usize, multiple: usize) -> Option<usize> {
    value.checked_add(multiple - 1).map(|v| v & !(multiple - 1))
}

/// One mapped segment, and its memfd (kept so that [`Segment::regrow`] can map it again).
#[derive(Debug)]
pub(crate) struct Segment {
    mapping: Arc<SharedMapping>,
    layout: Layout,
    generation: u64,
    fd: OwnedFd,
    /// The generation of the segment this one regrew ([`Segment::regrow`]).
    regrown_from: Option<u64>,
    /// Bytes from the start of each heap that earlier lifetimes of this memfd may have written
    /// (the rest of the heap is still zero).
    written: u64,
}

impl Segment {
    /// Creates and maps a new segment (the group's leader), whose memfd ([`Segment::fd`]) it
    /// hands out.
    /// `slot` is this PE's place among the segment's PEs (its own heap is aligned, see
    /// [`max_alignment`]).
    pub(crate) fn create(layout: Layout, generation: u64, slot: usize) -> Result<Segment> {
        const OP: &str = "initialize";
        let fd = memfd_create(
            "hyper_multicore-heap",
            MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
        )
        .map_err(|e| Error::backend(OP, "memfd_create failed", e.into()))?;
        ftruncate(&fd, layout.total as u64).map_err(|e| {
            Error::backend(
                OP,
                &format!("cannot size the heap segment to {} bytes", layout.total),
                e.into(),
            )
        })?;
        fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)
            .map_err(|e| Error::backend(OP, "cannot seal the heap segment", e.into()))?;
        let mapping = map(&fd, layout, slot)?;
        write_header(&mapping, layout, generation);
        Ok(Segment {
            mapping: Arc::new(mapping),
            layout,
            generation,
            fd,
            regrown_from: None,
            written: 0,
        })
    }

    /// The same memfd for a new runtime lifetime whose heaps of `heap_size` bytes stay where
    /// this segment's are (`None` unless [`Layout::regrown`] allows it): the heaps' bytes are
    /// kept. The mapping itself is reused when nothing else holds it (no page is mapped again);
    /// else the memfd is mapped again, and [`Segment::detach_from`] later ends the old view.
    /// The group's leader (`leader`) clears the control words and writes the new header; no
    /// other member may touch the segment until the new lifetime's start-up has agreed (the
    /// members check the header in [`Segment::check_header`]). Nothing of the old lifetime may
    /// use this segment any more.
    pub(crate) fn regrow(
        &self,
        heap_size: u64,
        generation: u64,
        leader: bool,
        slot: usize,
    ) -> Result<Option<Segment>> {
        let Some(layout) = self.layout.regrown(heap_size) else {
            return Ok(None);
        };
        let fd = self.fd.try_clone().map_err(|e| {
            Error::backend("initialize", "cannot duplicate the heap segment's memfd", e)
        })?;
        let mapping = if Arc::strong_count(&self.mapping) == 1 {
            Arc::clone(&self.mapping)
        } else {
            Arc::new(map(&fd, layout, slot)?)
        };
        if leader {
            mapping.zero(0, layout.heaps_offset);
            write_header(&mapping, layout, generation);
        }
        Ok(Some(Segment {
            mapping,
            layout,
            generation,
            fd,
            regrown_from: Some(self.generation),
            written: self.written.max(self.layout.heap_size),
        }))
    }

    /// True if this segment is `previous` regrown (the same memfd, its heaps in place).
    pub(crate) fn reuses(&self, previous: &Segment) -> bool {
        self.regrown_from == Some(previous.generation)
    }

    /// Bytes from the start of each heap that earlier lifetimes may have written (zero for a
    /// new memfd).
    pub(crate) fn written(&self) -> u64 {
        self.written
    }

    /// Ends this process's view of the shared pages that `successor` (this segment regrown)
    /// now uses, unless both use one mapping: the old mapping's range then holds private zero
    /// pages, so a stale view of an old heap (a front's retired tensor) can neither read nor
    /// overwrite the live heap.
    pub(crate) fn detach_from(&self, successor: &Segment) {
        if !Arc::ptr_eq(&self.mapping, &successor.mapping) {
            self.mapping.detach();
        }
    }

    /// Maps a segment received from root rank 0 and checks that it is the expected one; `slot`
    /// as for [`Segment::create`].
    pub(crate) fn attach(
        fd: OwnedFd,
        layout: Layout,
        generation: u64,
        slot: usize,
    ) -> Result<Segment> {
        let segment = Segment {
            mapping: Arc::new(map(&fd, layout, slot)?),
            layout,
            generation,
            fd,
            regrown_from: None,
            written: 0,
        };
        segment.check_header()?;
        Ok(segment)
    }

    /// Checks that the header written by the group's leader describes this segment.
    pub(crate) fn check_header(&self) -> Result<()> {
        let header = &self.control().header;
        let found = (
            header.layout_version.load(Ordering::Acquire),
            header.magic.load(Ordering::Relaxed),
            header.generation.load(Ordering::Relaxed),
            header.pes.load(Ordering::Relaxed),
            header.heap_size.load(Ordering::Relaxed),
            header.heap_stride.load(Ordering::Relaxed),
            header.heaps_offset.load(Ordering::Relaxed),
        );
        let layout = self.layout;
        let expected = (
            LAYOUT_VERSION,
            SEGMENT_MAGIC,
            self.generation,
            layout.pes as u64,
            layout.heap_size,
            layout.heap_stride as u64,
            layout.heaps_offset as u64,
        );
        if found != expected {
            return Err(Error::new(
                ErrorKind::Protocol,
                "initialize",
                format!(
                    "the heap segment from root rank 0 does not match (version, magic, \
                     generation, pes, heap size, stride, heaps offset): found {found:?}, \
                     expected {expected:?}; every rank must run the same build"
                ),
            ));
        }
        Ok(())
    }

    /// The barrier the segment's creator chose for its PEs (read after [`Segment::check_header`]).
    pub(crate) fn barrier_kind(&self) -> Result<BarrierKind> {
        let word = self.control().header.barrier_kind.load(Ordering::Relaxed);
        BarrierKind::from_word(word).ok_or_else(|| {
            Error::new(
                ErrorKind::Protocol,
                "initialize",
                format!(
                    "the heap segment names barrier {word}, which this build does not know; \
                     every rank must run the same build"
                ),
            )
        })
    }

    /// The memfd (handed to the group's other members).
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The mapping, shared with everything that must keep it alive (views, tensors).
    #[inline]
    pub(crate) fn mapping(&self) -> &Arc<SharedMapping> {
        &self.mapping
    }

    /// The sizes.
    #[inline]
    pub(crate) fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The runtime lifetime this segment belongs to.
    #[inline]
    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }

    /// Header and job-wide synchronisation words.
    #[inline]
    pub(crate) fn control(&self) -> &ControlBlock {
        self.mapping.words(0)
    }

    /// PE `pe`'s own words.
    #[inline]
    pub(crate) fn pe_words(&self, pe: usize) -> &PeWords {
        assert!(pe < self.layout.pes);
        self.mapping
            .words(std::mem::size_of::<ControlBlock>() + pe * std::mem::size_of::<PeWords>())
    }

    /// Word `index` (below [`PUBLISHED_WORDS`]) of the words PE `pe` publishes for a
    /// collective in progress (written by that PE only, read by the others after a meeting).
    #[inline]
    pub(crate) fn published(&self, pe: usize, index: usize) -> &std::sync::atomic::AtomicU64 {
        assert!(pe < self.layout.pes && index < PUBLISHED_WORDS);
        let layout = &self.layout;
        self.mapping
            .words(layout.team_offset + pe * layout.team_row + 8 * index)
    }

    /// The team-signal counter `which` of PE `owner` about PE `other`: the signals `other` sent
    /// it, or those it consumed. `None` if this segment has none (more than
    /// [`TEAM_SIGNAL_MAX_PES`] PEs).
    #[inline]
    pub(crate) fn counter(&self, owner: usize, other: usize, which: Counter) -> Option<&AtomicU32> {
        let layout = &self.layout;
        if !layout.team_signals {
            return None;
        }
        assert!(owner < layout.pes && other < layout.pes);
        let half = (layout.team_row - 64) / 2;
        let row = layout.team_offset + owner * layout.team_row + 64;
        let offset = row + usize::from(which == Counter::Consumed) * half + 4 * other;
        Some(&self.mapping.words::<SignalCount>(offset).0)
    }

    /// Whether this segment's PEs can meet in teams through shared memory ([`PairWords`]).
    #[inline]
    pub(crate) fn has_team_signals(&self) -> bool {
        self.layout.team_signals
    }

    /// Every PE's doorbells (signal and barrier waits), in slot order.
    fn doorbells(&self) -> impl Iterator<Item = &Doorbell> {
        (0..self.layout.pes).flat_map(|pe| {
            let words = self.pe_words(pe);
            [&words.doorbell, &words.barrier_bell]
        })
    }

    /// Records that rank `lost` was lost and wakes every wait on this segment (see
    /// [`sync::abort`]).
    pub(crate) fn abort(&self, lost: u32) {
        let control = self.control();
        sync::abort(&control.abort, lost, &control.barrier, self.doorbells());
    }
}

impl BarrierWords for Segment {
    fn central(&self) -> &CentralWords {
        &self.control().barrier
    }

    fn flags(&self, pe: usize) -> &BarrierFlags {
        &self.pe_words(pe).barrier
    }

    fn bell(&self, pe: usize) -> &Doorbell {
        &self.pe_words(pe).barrier_bell
    }
}

/// Which of a pair's two team-signal counters ([`Segment::counter`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Counter {
    /// The signals the other PE sent the owner (written by the other PE).
    Sent,
    /// The signals the owner consumed (written by the owner).
    Consumed,
}

/// Writes the header of a segment of `layout`, the layout version last: a reader that sees the
/// version sees everything above it.
fn write_header(mapping: &SharedMapping, layout: Layout, generation: u64) {
    let header = &mapping.words::<ControlBlock>(0).header;
    header.magic.store(SEGMENT_MAGIC, Ordering::Relaxed);
    header.generation.store(generation, Ordering::Relaxed);
    header.pes.store(layout.pes as u64, Ordering::Relaxed);
    header.heap_size.store(layout.heap_size, Ordering::Relaxed);
    header
        .heap_stride
        .store(layout.heap_stride as u64, Ordering::Relaxed);
    header
        .heaps_offset
        .store(layout.heaps_offset as u64, Ordering::Relaxed);
    header
        .barrier_kind
        .store(BarrierKind::for_pes(layout.pes) as u64, Ordering::Relaxed);
    header
        .layout_version
        .store(LAYOUT_VERSION, Ordering::Release);
}

/// Maps the segment so that the heap in `slot` (this PE's own) is aligned to
/// [`Layout::own_heap_alignment`].
fn map(fd: &impl AsFd, layout: Layout, slot: usize) -> Result<SharedMapping> {
    let alignment = layout.own_heap_alignment();
    SharedMapping::map(fd, layout.total, alignment, layout.heap_offset(slot)).map_err(|e| {
        Error::backend(
            "initialize",
            &format!("cannot map the {}-byte heap segment", layout.total),
            e,
        )
    })
}
