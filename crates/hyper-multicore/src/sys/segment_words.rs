//! The `#[repr(C)]` words of every heap segment (see `transport/shm/segment.rs` for the layout): the
//! header, the barrier's and doorbells' words, the argument slots and the team signal counters.
//! They are declared here, below the protocols that use them (`transport/shm/sync.rs`,
//! `shmem/team_sync.rs`, `shmem/arguments.rs`), because viewing them in shared memory is an
//! `unsafe` promise ([`SharedWords`]): each is made only of atomics, valid for every bit pattern.

use std::sync::atomic::AtomicU64 as StdAtomicU64;

use super::mapping::SharedWords;
use crate::primitive::{fence, AtomicU32, AtomicU64, Ordering};

/// Rounds a barrier can have: ⌈log2 pes⌉ ≤ 16, so at most 2^16 PEs share a segment.
pub(crate) const MAX_BARRIER_ROUNDS: usize = 16;

/// The first words of the segment, written once by root rank 0.
#[repr(C, align(64))]
#[derive(Debug)]
pub(crate) struct SegmentHeader {
    pub(crate) magic: StdAtomicU64,
    pub(crate) layout_version: StdAtomicU64,
    pub(crate) generation: StdAtomicU64,
    pub(crate) pes: StdAtomicU64,
    pub(crate) heap_size: StdAtomicU64,
    pub(crate) heap_stride: StdAtomicU64,
    pub(crate) heaps_offset: StdAtomicU64,
    /// The barrier every PE of the segment runs (`sync::BarrierKind` as a number).
    pub(crate) barrier_kind: StdAtomicU64,
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

/// Declares `new()` (all words zero) for the in-process tests and models; the runtime gets the
/// same state from a freshly zero-filled segment. `const` normally, plain under loom (whose
/// atomics are not const-constructible).
macro_rules! zeroed_words {
    ($name:ident: $($field:ident),+) => {
        impl $name {
            /// All words zero: the state of a freshly created (zero-filled) segment.
            #[cfg(all(test, not(loom)))]
            pub(crate) const fn new() -> Self {
                Self { $($field: AtomicU32::new(0)),+ }
            }

            /// All words zero: the state of a freshly created (zero-filled) segment.
            #[cfg(loom)]
            pub(crate) fn new() -> Self {
                Self { $($field: AtomicU32::new(0)),+ }
            }
        }
    };
}

/// One PE's barrier flags: round k's flag holds the epoch of the latest barrier whose round k
/// the PE's round-k partner has reached. Written only by the partners, read by the owner.
///
/// Round 0's flag shares its cache line with [`Carried`] words, which the round-0 partner may
/// store before the flag: the owner then reads them from the line its wait just brought in
/// (the argument check of a 2-PE root, where round 0 is the whole barrier: reading the
/// partner's own argument slot instead costs one more cache-line transfer). The later rounds'
/// flags are on the next line.
#[repr(C, align(64))]
#[derive(Debug)]
pub(crate) struct BarrierFlags {
    first: AtomicU32,
    carried: Carried,
    later: LaterRounds,
}

/// [`BarrierFlags`] of rounds 1.., on a cache line of their own.
#[repr(C, align(64))]
#[derive(Debug)]
struct LaterRounds {
    round: [AtomicU32; MAX_BARRIER_ROUNDS - 1],
}

/// Four words the round-0 partner hands over with a barrier (`sync::dissemination_barrier`'s
/// `carry`), under a sequence lock: word 0 is their tag (never 0), zeroed while the others
/// change, so a reader detects words overwritten by the partner's next barrier (it may be one
/// barrier ahead) and looks for them elsewhere.
#[repr(C)]
#[derive(Debug)]
struct Carried {
    words: [AtomicU64; 4],
}

impl BarrierFlags {
    /// All flags zero: the state of a freshly created (zero-filled) segment.
    #[cfg(test)]
    pub(crate) fn new() -> Self {
        BarrierFlags {
            first: AtomicU32::new(0),
            carried: Carried {
                words: std::array::from_fn(|_| AtomicU64::new(0)),
            },
            later: LaterRounds {
                round: std::array::from_fn(|_| AtomicU32::new(0)),
            },
        }
    }

    /// Round `k`'s flag.
    #[inline]
    pub(crate) fn round(&self, k: usize) -> &AtomicU32 {
        match k {
            0 => &self.first,
            _ => &self.later.round[k - 1],
        }
    }

    /// Hands `words` (word 0, the tag, not 0) to this PE's owner, before the round-0 flag
    /// store that publishes them.
    #[inline]
    pub(crate) fn carry(&self, words: &[u64; 4]) {
        let carried = &self.carried.words;
        carried[0].store(0, Ordering::Relaxed);
        // Orders the zeroed tag before the new words: a reader that sees any of them sees the
        // tag change too.
        fence(Ordering::Release);
        for (word, value) in carried[1..].iter().zip(&words[1..]) {
            word.store(*value, Ordering::Relaxed);
        }
        carried[0].store(words[0], Ordering::Release);
    }

    /// The words the round-0 partner carried with tag `tag`, if they are still there whole
    /// (read after the barrier that carried them).
    #[inline]
    pub(crate) fn carried(&self, tag: u64) -> Option<[u64; 4]> {
        let carried = &self.carried.words;
        let before = carried[0].load(Ordering::Acquire);
        let words: [u64; 4] = std::array::from_fn(|i| match i {
            0 => before,
            _ => carried[i].load(Ordering::Relaxed),
        });
        // Pairs with `carry`'s release fence: if a word came from a later carry, the tag read
        // below is that carry's (or its zero).
        fence(Ordering::Acquire);
        let after = carried[0].load(Ordering::Relaxed);
        (before == tag && after == tag).then_some(words)
    }
}

/// The central barrier's words: one per segment, on its own cache line (see
/// `sync::central_barrier`).
#[repr(C, align(64))]
#[derive(Debug)]
pub(crate) struct CentralWords {
    /// PEs that arrived in the current round.
    pub(crate) count: AtomicU32,
    /// Round number times `sync::GENERATION_STEP`; the last arriver of a round bumps it, which
    /// releases the others. Bit 0 is `sync::GENERATION_ABORT_FLAG`.
    pub(crate) generation: AtomicU32,
    /// PEs asleep (or about to sleep) on `generation`.
    pub(crate) sleepers: AtomicU32,
}
zeroed_words!(CentralWords: count, generation, sleepers);

/// A PE's doorbell: writers ring it after updating a word that PE may be waiting on (a signal,
/// a barrier flag). One per PE, on its own cache line.
#[repr(C, align(64))]
#[derive(Debug)]
pub(crate) struct Doorbell {
    /// The futex word; bumped by every ring that finds a sleeper.
    pub(crate) ring: AtomicU32,
    /// Waits of this PE asleep (or about to sleep) on `ring`.
    pub(crate) sleepers: AtomicU32,
}
zeroed_words!(Doorbell: ring, sleepers);

/// The job's abort word: 0 while healthy, `r + 1` once rank `r` was lost. One per segment, on
/// its own cache line.
#[repr(C, align(64))]
#[derive(Debug)]
pub(crate) struct AbortWord {
    pub(crate) word: AtomicU32,
}
zeroed_words!(AbortWord: word);

#[cfg(not(loom))]
const _: () = {
    // Round 0's flag and the carried words on one line, the later rounds on the next.
    assert!(std::mem::size_of::<BarrierFlags>() == 128);
    assert!(std::mem::offset_of!(BarrierFlags, later) == 64);
    assert!(std::mem::size_of::<CentralWords>() == 64);
    assert!(std::mem::size_of::<Doorbell>() == 64);
    assert!(std::mem::size_of::<AbortWord>() == 64);
};

/// One PE's two argument slots (call `n` uses slot `n % 2`), four words each.
#[repr(C)]
#[derive(Debug)]
pub(crate) struct ArgumentSlots {
    slots: [[AtomicU64; 4]; 2],
}

impl ArgumentSlots {
    /// Publishes `words` in slot `slot` (relaxed: the barrier that follows publishes them).
    pub(crate) fn publish(&self, slot: usize, words: [u64; 4]) {
        for (word, value) in self.slots[slot].iter().zip(words) {
            word.store(value, Ordering::Relaxed);
        }
    }

    /// The words of slot `slot` (after the barrier that followed every PE's publish).
    pub(crate) fn read(&self, slot: usize) -> [u64; 4] {
        std::array::from_fn(|i| self.slots[slot][i].load(Ordering::Relaxed))
    }

    /// All words zero (the in-process models; the runtime's come zeroed from the segment).
    #[cfg(loom)]
    pub(crate) fn new() -> Self {
        ArgumentSlots {
            slots: std::array::from_fn(|_| std::array::from_fn(|_| AtomicU64::new(0))),
        }
    }
}

/// One signal counter in shared memory (`shmem/team_sync.rs`).
#[repr(transparent)]
#[derive(Debug)]
pub(crate) struct SignalCount(pub(crate) AtomicU32);

// SAFETY: repr(C), made only of atomics and padding; all-zero is the initial state.
unsafe impl SharedWords for SegmentHeader {}
// SAFETY: repr(C), made only of atomic-only repr(C) words.
unsafe impl SharedWords for ControlBlock {}
// SAFETY: repr(C), made only of atomic-only repr(C) words (the doorbells, the barrier flags,
// the argument slots).
unsafe impl SharedWords for PeWords {}
// SAFETY: repr(transparent) over one atomic: valid for every bit pattern, all-zero included.
unsafe impl SharedWords for SignalCount {}
