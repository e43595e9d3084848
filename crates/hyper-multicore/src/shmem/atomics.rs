//! Atomics, signals and waits of the data plane: the word operations on a peer's heap
//! (fetch, set, swap, compare-and-swap, add), signals and put-with-signal, and the waits on
//! this PE's own words, each with its deadline and the abort word.

use super::allocation::{Element, Region, Symmetric};
use super::data::{AtomicWord, Comparison, Located};
use super::runtime::Shmem;
use crate::error::{Error, ErrorKind, Result};
use crate::transport::sync::{Deadline, WaitError, WaitPolicy};
use crate::transport::{Rmw, SignalOp, Width};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

impl Shmem {
    /// [`Shmem::word_offset`] that names the failed check: `target` must be exactly one
    /// naturally aligned `W`, then as [`Shmem::locate_checked`].
    pub(super) fn word_checked<W: AtomicWord>(
        &self,
        operation: &str,
        target: Region,
        pe: usize,
    ) -> Result<usize> {
        let width = std::mem::size_of::<W>();
        if target.bytes as usize != width {
            return Err(self.error(
                ErrorKind::InvalidArgument,
                operation,
                format!(
                    "the target must be exactly one {width}-byte word, got {} bytes; pass a \
                     one-element view",
                    target.bytes
                ),
            ));
        }
        if target.heap_offset % width as u64 != 0 {
            return Err(self.error(
                ErrorKind::InvalidArgument,
                operation,
                format!(
                    "the {width}-byte word at heap offset {} is not naturally aligned (its \
                     address must be a multiple of {width}); pass an aligned word",
                    target.heap_offset
                ),
            ));
        }
        self.locate_checked(operation, target, pe)
    }

    /// Performs `rmw` on the one-element `target` at PE `pe`; returns the previous value.
    #[inline(always)]
    fn rmw<W: AtomicWord>(
        &self,
        operation: &str,
        target: Region,
        pe: usize,
        rmw: Rmw,
    ) -> Result<W> {
        let offset = self.word_offset::<W>(operation, &target, pe)?;
        self.rmw_at(pe, offset, Width::of_bytes(std::mem::size_of::<W>()), rmw)
    }

    /// The heap offset of the one-`W` word `target` on PE `pe`: exactly one naturally aligned
    /// `W`, and [`Shmem::in_place`]; else [`Shmem::word_checked`]'s error.
    #[inline(always)]
    fn word_offset<W: AtomicWord>(
        &self,
        operation: &str,
        target: &Region,
        pe: usize,
    ) -> Result<usize> {
        let width = std::mem::size_of::<W>() as u64;
        if target.bytes == width && target.heap_offset % width == 0 && self.in_place(target, pe) {
            return Ok(target.heap_offset as usize);
        }
        let target = *target;
        self.refused(move || self.word_checked::<W>(operation, target, pe))
    }

    /// The transport's `rmw` on the word at heap offset `offset` of PE `pe` (located and
    /// checked by the caller).
    #[inline(always)]
    pub(super) fn rmw_at<W: AtomicWord>(
        &self,
        pe: usize,
        offset: usize,
        width: Width,
        rmw: Rmw,
    ) -> Result<W> {
        let previous = self.transport.atomic(pe, offset, width, rmw)?;
        Ok(W::from_bits(previous))
    }

    /// The transport's update (a store or an add, as `op` says) of the word at heap offset
    /// `offset` of PE `pe`, which reads nothing back: complete at the next quiet, like a put.
    /// Returns zero, the value [`Shmem::atomic_located`] gives for [`AtomicOp::Set`] and
    /// [`AtomicOp::Add`].
    #[inline(always)]
    pub(super) fn update_at<W: AtomicWord>(
        &self,
        pe: usize,
        offset: usize,
        width: Width,
        op: SignalOp,
        value: W,
    ) -> Result<W> {
        self.transport
            .update(pe, offset, width, op, value.to_bits())?;
        Ok(W::from_bits(0))
    }

    /// Atomically reads PE `pe`'s copy of the one-element `source`.
    #[inline]
    pub fn atomic_fetch<W: AtomicWord>(&self, source: &impl Symmetric<W>, pe: usize) -> Result<W> {
        self.rmw("atomic_fetch", source.region(), pe, Rmw::Load)
    }

    /// Atomically stores `value` into PE `pe`'s copy of `target` (complete at the next quiet).
    #[inline]
    pub fn atomic_set<W: AtomicWord>(
        &self,
        target: &impl Symmetric<W>,
        value: W,
        pe: usize,
    ) -> Result<()> {
        let offset = self.word_offset::<W>("atomic_set", &target.region(), pe)?;
        let width = Width::of_bytes(std::mem::size_of::<W>());
        self.update_at(pe, offset, width, SignalOp::Set, value)
            .map(drop)
    }

    /// Atomically replaces PE `pe`'s copy of `target` with `value`; returns the previous value.
    #[inline]
    pub fn atomic_swap<W: AtomicWord>(
        &self,
        target: &impl Symmetric<W>,
        value: W,
        pe: usize,
    ) -> Result<W> {
        self.rmw(
            "atomic_swap",
            target.region(),
            pe,
            Rmw::Swap(value.to_bits()),
        )
    }

    /// Atomically sets PE `pe`'s copy of `target` to `desired` if it equals `expected`; returns
    /// the previous value (equal to `expected` on success).
    #[inline]
    pub fn atomic_compare_swap<W: AtomicWord>(
        &self,
        target: &impl Symmetric<W>,
        expected: W,
        desired: W,
        pe: usize,
    ) -> Result<W> {
        let rmw = Rmw::CompareSwap {
            expected: expected.to_bits(),
            desired: desired.to_bits(),
        };
        self.rmw("atomic_compare_swap", target.region(), pe, rmw)
    }

    /// Atomically adds `value` (wrapping) to PE `pe`'s copy of `target`; returns the previous value.
    #[inline]
    pub fn atomic_fetch_add<W: AtomicWord>(
        &self,
        target: &impl Symmetric<W>,
        value: W,
        pe: usize,
    ) -> Result<W> {
        self.rmw(
            "atomic_fetch_add",
            target.region(),
            pe,
            Rmw::Add(value.to_bits()),
        )
    }

    /// Atomically adds `value` (wrapping) to PE `pe`'s copy of `target` (complete at the next
    /// quiet).
    #[inline]
    pub fn atomic_add<W: AtomicWord>(
        &self,
        target: &impl Symmetric<W>,
        value: W,
        pe: usize,
    ) -> Result<()> {
        let offset = self.word_offset::<W>("atomic_add", &target.region(), pe)?;
        let width = Width::of_bytes(std::mem::size_of::<W>());
        self.update_at(pe, offset, width, SignalOp::Add, value)
            .map(drop)
    }

    /// Updates PE `pe`'s copy of the one-element signal word `signal` (set or add) and wakes
    /// its waiters.
    pub fn signal<W: AtomicWord>(
        &self,
        signal: &impl Symmetric<W>,
        value: W,
        op: SignalOp,
        pe: usize,
    ) -> Result<()> {
        let offset = self.word_offset::<W>("signal", &signal.region(), pe)?;
        self.signal_at(pe, offset, value, op)
    }

    /// Sets or adds `value` to the word of `W` at `offset` (checked) of PE `pe`'s heap.
    #[inline]
    fn signal_at<W: AtomicWord>(
        &self,
        pe: usize,
        offset: usize,
        value: W,
        op: SignalOp,
    ) -> Result<()> {
        let width = Width::of_bytes(std::mem::size_of::<W>());
        self.transport
            .signal(pe, offset, width, op, value.to_bits())
    }

    /// [`Shmem::signal`] on a word located before (see [`Located`]).
    #[inline(always)]
    pub fn signal_located<W: AtomicWord>(
        &self,
        signal: &Located,
        value: W,
        op: SignalOp,
        pe: usize,
    ) -> Result<()> {
        let offset = self.located_word::<W>("signal", signal, pe)?;
        self.signal_at(pe, offset, value, op)
    }

    /// Puts `source` into PE `pe`'s `target`, then signals: a waiter that sees the signal sees
    /// the data.
    pub fn put_signal<T: Element, W: AtomicWord>(
        &self,
        target: &impl Symmetric<T>,
        source: &[T],
        signal: &impl Symmetric<W>,
        value: W,
        op: SignalOp,
        pe: usize,
    ) -> Result<()> {
        self.put(target, source, pe)?;
        self.signal(signal, value, op, pe)
    }

    /// Waits until this PE's copy of `signal` compares `comparison` to `value`; returns the
    /// word's value then. `timeout` defaults to the configured timeout; a lost peer ends the
    /// wait with a peer-lost error.
    pub fn wait_signal<W: AtomicWord>(
        &self,
        signal: &impl Symmetric<W>,
        value: W,
        comparison: Comparison,
        timeout: Option<Duration>,
    ) -> Result<W> {
        let timeout = timeout.unwrap_or(self.config.timeout);
        let deadline = Deadline::After(timeout);
        self.wait_for_signal("wait_signal", signal.region(), value, comparison, deadline)
    }

    /// [`Shmem::wait_signal`] with a deadline.
    pub fn wait_signal_deadline<W: AtomicWord>(
        &self,
        signal: &impl Symmetric<W>,
        value: W,
        comparison: Comparison,
        deadline: Instant,
    ) -> Result<W> {
        let deadline = Deadline::At(deadline);
        self.wait_for_signal("wait_signal", signal.region(), value, comparison, deadline)
    }

    /// The wait on this PE's copy of the word `region` (`operation` names it in errors).
    fn wait_for_signal<W: AtomicWord>(
        &self,
        operation: &str,
        region: Region,
        value: W,
        comparison: Comparison,
        deadline: Deadline,
    ) -> Result<W> {
        let offset = self.word_offset::<W>(operation, &region, self.rank)?;
        self.wait_own_word(operation, offset, value, comparison, deadline)
    }

    /// Waits until the word of `W` at `offset` of this PE's own heap (checked) compares
    /// `comparison` to `value`; returns its value then. The clock is not read unless the wait
    /// outlasts its spin phase (see [`Deadline::After`]), and nothing is formatted unless the
    /// wait fails.
    #[inline]
    pub(crate) fn wait_own_word<W: AtomicWord>(
        &self,
        operation: &str,
        offset: usize,
        value: W,
        comparison: Comparison,
        deadline: Deadline,
    ) -> Result<W> {
        // The word is located once, not on every look of the wait. It is in this PE's own
        // heap, which every transport keeps mapped here.
        let transport = &self.transport;
        let narrow = (std::mem::size_of::<W>() == 4).then(|| transport.own_word32(offset));
        let wide = (std::mem::size_of::<W>() == 8).then(|| transport.own_word64(offset));
        let load = || -> W {
            match (narrow, wide) {
                (Some(word), _) => W::from_bits(u64::from(word.load(Ordering::SeqCst))),
                (_, Some(word)) => W::from_bits(word.load(Ordering::SeqCst)),
                (None, None) => unreachable!("atomic words are 4 or 8 bytes"),
            }
        };
        let mut seen = load();
        if comparison.holds(seen, value) {
            return Ok(seen);
        }
        let policy = WaitPolicy {
            spin: self.spin,
            deadline,
        };
        let look = || {
            seen = load();
            comparison.holds(seen, value)
        };
        let outcome = transport.wait_own(look, &policy);
        self.wait_outcome(operation, outcome, || {
            format!("the word is {seen:?}, waiting for {comparison:?} {value:?}")
        })?;
        Ok(seen)
    }

    /// Turns a wait's outcome into this crate's errors.
    pub(crate) fn wait_outcome(
        &self,
        operation: &str,
        outcome: std::result::Result<(), WaitError>,
        waiting_for: impl FnOnce() -> String,
    ) -> Result<()> {
        match outcome {
            Ok(()) => Ok(()),
            Err(WaitError::Timeout { waited }) => {
                Err(Error::timeout(operation, waited, &waiting_for()).on_rank(self.rank))
            }
            Err(WaitError::Aborted { lost_rank }) => {
                // The control plane's own report is the most precise; the shared abort word may
                // have arrived first (another PE's router set it): the report follows within
                // moments (root rank 0's abort, or this PE's own liveness verdict).
                let grace = crate::control::VERDICT_GRACE;
                let error = match self.plane.broken_within(grace) {
                    Some(cause) => cause.restated_as(operation),
                    None if (lost_rank as usize) < self.size => Error::peer_lost(
                        operation,
                        lost_rank as usize,
                        "another PE of the root saw its connection close: the process exited or \
                         was killed",
                    ),
                    None => Error::new(
                        ErrorKind::PeerLost,
                        operation,
                        "the root's control plane broke; the root cannot continue",
                    ),
                };
                Err(error.on_rank(self.rank))
            }
        }
    }
}
