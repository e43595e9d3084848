//! The `#[repr(C)]` words at the start of every heap segment (see `shmem/segment.rs` for the
//! layout), declared here because viewing them in shared memory is an `unsafe` promise
//! ([`SharedWords`]): each is made only of atomics, valid for every bit pattern.

use std::sync::atomic::AtomicU64;

use super::mapping::SharedWords;
use crate::shmem::arguments::ArgumentSlots;
use crate::shmem::sync::{AbortWord, BarrierFlags, CentralWords, Doorbell};
use crate::shmem::team_sync::SignalCount;

/// The first words of the segment, written once by root rank 0.
#[repr(C, align(64))]
#[derive(Debug)]
pub(crate) struct SegmentHeader {
    pub(crate) magic: AtomicU64,
    pub(crate) layout_version: AtomicU64,
    pub(crate) generation: AtomicU64,
    pub(crate) pes: AtomicU64,
    pub(crate) heap_size: AtomicU64,
    pub(crate) heap_stride: AtomicU64,
    pub(crate) heaps_offset: AtomicU64,
    /// The barrier every PE of the segment runs (`sync::BarrierKind` as a number).
    pub(crate) barrier_kind: AtomicU64,
}

/// Header and job-wide synchronisation words.
#[repr(C)]
#[derive(Debug)]
pub(crate) struct ControlBlock {
    pub(crate) header: SegmentHeader,
    pub(crate) barrier: CentralWords,
    pub(crate) abort: AbortWord,
}

/// Words of one PE: the doorbell its signal waits sleep on, the one its barrier waits sleep on
/// (apart, so that updates of its memory never wake a PE sleeping in a barrier), its barrier
/// flags (written by its barrier partners), and the two (double-buffered) slots where it
/// publishes the arguments of its current collective allocate/free.
#[repr(C, align(64))]
#[derive(Debug)]
pub(crate) struct PeWords {
    pub(crate) doorbell: Doorbell,
    pub(crate) barrier_bell: Doorbell,
    pub(crate) barrier: BarrierFlags,
    pub(crate) arguments: ArgumentSlots,
}

// SAFETY: repr(C), made only of atomics and padding; all-zero is the initial state.
unsafe impl SharedWords for SegmentHeader {}
// SAFETY: repr(C), made only of atomic-only repr(C) words.
unsafe impl SharedWords for ControlBlock {}
// SAFETY: repr(C), made only of atomic-only repr(C) words (the doorbells, the barrier flags,
// the argument slots).
unsafe impl SharedWords for PeWords {}
// SAFETY: repr(transparent) over one atomic: valid for every bit pattern, all-zero included.
unsafe impl SharedWords for SignalCount {}
