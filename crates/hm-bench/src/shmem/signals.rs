//! Signals: one-way signal and put-with-signal ping-pong beside a raw cache-line ping-pong, and
//! waking a peer asleep in `wait_signal` (UCX route).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{ensure, Result};
use hyper_multicore::shmem::{Allocation, Comparison, SignalOp};

use super::harness::{compute_for, half, nanos, single_calls};
use super::{Bench, LAYER, REFERENCE, WORD_BYTES};
use crate::shared_word::{shared_word, spin_until};
use crate::stats::{Batch, Timing};

/// How long PE 0 computes before it wakes PE 1 in the `wake_sleeper_*` rows: well past the
/// waiter's spin and yield phases (its yields last as long as the other processes on the core
/// run, so on a shared machine they take far longer than the spin), so it sleeps on its futex
/// when the update comes.
const SLEEPER_DELAY: Duration = Duration::from_millis(50);

impl Bench<'_> {
    /// One-way signal ping-pong (signal, and put_signal of 8 B) between PEs 0 and 1,
    /// interleaved with a raw cache-line ping-pong between the same two processes on a pair of
    /// symmetric words (the reference: PE 0 spins on one, PE 1 on the other), and for context
    /// on one word (each PE spins on its copy: the two lines then sit at the same offset of
    /// the two heaps, as a signal word's copies do).
    pub(super) fn ping_pong(&self) -> Result<()> {
        let shmem = self.shmem;
        let raw = shmem.allocate::<u64>(1, None)?;
        let raw_pair = shmem.allocate::<u64>(1, None)?;
        let flag = shmem.allocate::<u64>(1, None)?;
        let put_flag = shmem.allocate::<u64>(1, None)?;
        let data = shmem.allocate::<u64>(1, None)?;
        let add_flag = shmem.allocate::<u64>(1, None)?;
        for word in [&raw, &raw_pair, &flag, &put_flag, &data, &add_flag] {
            shmem.atomic_set(word, 0, shmem.rank())?;
        }
        shmem.barrier()?;
        let peer = 1 - shmem.rank();
        // Each ping-pong counts its own round trips (both PEs alike) on its own flag.
        let mut signals = 0u64;
        let mut put_signals = 0u64;
        let mut adds = 0u64;
        let mut batches = Vec::new();
        if !self.remote {
            batches.push(self.raw_round_trip([&raw, &raw_pair])?);
            batches.push(self.raw_round_trip([&raw, &raw])?);
        }
        batches.extend([
            self.together(|ops| {
                let start = Instant::now();
                for _ in 0..ops {
                    signals += 1;
                    if shmem.rank() == 0 {
                        shmem.signal(&flag, signals, SignalOp::Set, peer)?;
                        shmem.wait_signal(&flag, signals, Comparison::Eq, None)?;
                    } else {
                        shmem.wait_signal(&flag, signals, Comparison::Eq, None)?;
                        shmem.signal(&flag, signals, SignalOp::Set, peer)?;
                    }
                }
                Ok(start.elapsed())
            }),
            self.together(|ops| {
                let start = Instant::now();
                for _ in 0..ops {
                    put_signals += 1;
                    let n = put_signals;
                    if shmem.rank() == 0 {
                        shmem.put_signal(&data, &[n], &put_flag, n, SignalOp::Set, peer)?;
                        shmem.wait_signal(&put_flag, n, Comparison::Eq, None)?;
                    } else {
                        shmem.wait_signal(&put_flag, n, Comparison::Eq, None)?;
                        shmem.put_signal(&data, &[n], &put_flag, n, SignalOp::Set, peer)?;
                    }
                }
                Ok(start.elapsed())
            }),
        ]);
        if self.remote {
            // A plain remote atomic (not a signal) on the word the peer waits on: only the
            // target's progress hook rings its doorbell (docs/multinode.md).
            batches.push(self.together(|ops| {
                let start = Instant::now();
                for _ in 0..ops {
                    adds += 1;
                    if shmem.rank() == 0 {
                        shmem.atomic_add(&add_flag, 1u64, peer)?;
                        shmem.wait_signal(&add_flag, adds, Comparison::Eq, None)?;
                    } else {
                        shmem.wait_signal(&add_flag, adds, Comparison::Eq, None)?;
                        shmem.atomic_add(&add_flag, 1u64, peer)?;
                    }
                }
                Ok(start.elapsed())
            }));
        }
        let timings = self.time(batches)?;
        if self.remote {
            let [signal, put_signal, add] = timings[..] else {
                unreachable!("three batches were timed")
            };
            self.report("pingpong_atomic_add", LAYER, WORD_BYTES, half(add), None)?;
            self.report("pingpong_signal", LAYER, WORD_BYTES, half(signal), None)?;
            self.report(
                "pingpong_put_signal",
                LAYER,
                WORD_BYTES,
                half(put_signal),
                None,
            )?;
        } else {
            self.report_ping_pong(&timings)?;
        }
        let mut last = [0u64];
        shmem.get(&mut last, &data, shmem.rank())?;
        ensure!(
            last == [put_signals],
            "put_signal delivered {last:?}, expected [{put_signals}]"
        );
        shmem.barrier()?;
        for word in [add_flag, data, put_flag, flag, raw_pair, raw] {
            shmem.free(word)?;
        }
        Ok(())
    }

    /// The rows of [`Bench::ping_pong`] on the shared-memory route, with their references.
    fn report_ping_pong(&self, timings: &[Timing]) -> Result<()> {
        let [round_trip, round_trip_same_offset, signal, put_signal] = timings[..] else {
            unreachable!("four batches were timed")
        };
        let one_way = half(round_trip);
        self.report("raw_one_way", REFERENCE, WORD_BYTES, one_way, None)?;
        let same_offset = half(round_trip_same_offset);
        self.report(
            "raw_one_way_same_offset",
            REFERENCE,
            WORD_BYTES,
            same_offset,
            None,
        )?;
        let reference = Some(("raw cache-line ping-pong, one way", one_way));
        self.report(
            "pingpong_signal",
            LAYER,
            WORD_BYTES,
            half(signal),
            reference,
        )?;
        self.report(
            "pingpong_put_signal",
            LAYER,
            WORD_BYTES,
            half(put_signal),
            reference,
        )
    }

    /// Waking a peer asleep in `wait_signal`: per sample, PE 0 computes for [`SLEEPER_DELAY`]
    /// (PE 1, waiting meanwhile, is past its spin and yield phases and asleep on its futex),
    /// then updates PE 1's word — with a plain `atomic_add` (only PE 1's progress hook rings
    /// its doorbell) or with `signal` (which sends a doorbell message too) — and waits for PE 1
    /// to answer the same way on PE 0's word (PE 0 is awake then). One sample is that round
    /// trip, timed by PE 0.
    pub(super) fn wake_sleeper(&self) -> Result<()> {
        let shmem = self.shmem;
        let word = shmem.allocate::<u64>(1, None)?;
        shmem.atomic_set(&word, 0, shmem.rank())?;
        shmem.barrier()?;
        let peer = 1 - shmem.rank();
        let mut sequence = 0u64;
        for (op, by_signal) in [
            ("wake_sleeper_atomic_add", false),
            ("wake_sleeper_signal", true),
        ] {
            let mut samples = Vec::new();
            for _ in 0..self.method.trials {
                sequence += 1;
                shmem.barrier()?;
                let update = || -> Result<()> {
                    if by_signal {
                        Ok(shmem.signal(&word, sequence, SignalOp::Set, peer)?)
                    } else {
                        Ok(shmem.atomic_add(&word, 1u64, peer)?)
                    }
                };
                if shmem.rank() == 0 {
                    compute_for(SLEEPER_DELAY);
                    let start = Instant::now();
                    update()?;
                    shmem.wait_signal(&word, sequence, Comparison::Eq, None)?;
                    samples.push(nanos(start.elapsed()) as f64);
                } else {
                    shmem.wait_signal(&word, sequence, Comparison::Eq, None)?;
                    update()?;
                }
            }
            if shmem.rank() == 0 {
                self.report(op, LAYER, WORD_BYTES, single_calls(&samples)?, None)?;
            }
        }
        shmem.barrier()?;
        Ok(shmem.free(word)?)
    }

    /// A batch of raw cache-line round trips between PEs 0 and 1, timed by rank 0: PE r spins
    /// on its own copy of `words[r]` and stores into the peer's copy of `words[peer]`. With two
    /// words the two lines sit at different offsets of the two heaps; with the same word twice
    /// at the same offset, as a signal word's copies do (a power-of-two distance apart).
    pub(super) fn raw_round_trip<'b>(
        &'b self,
        words: [&'b Allocation<u64>; 2],
    ) -> Result<Batch<'b>> {
        let shmem = self.shmem;
        let (rank, peer) = (shmem.rank(), 1 - shmem.rank());
        let mine = shared_word(shmem, words[rank], rank)?;
        let theirs = shared_word(shmem, words[peer], peer)?;
        // Both copies hold the last value this PE received (the peer's sequence is the same).
        let mut sequence = mine.load(Ordering::Acquire);
        Ok(self.together(move |ops| {
            let start = Instant::now();
            for _ in 0..ops {
                sequence += 1;
                if shmem.rank() == 0 {
                    theirs.store(sequence, Ordering::Release);
                    spin_until(mine, sequence)?;
                } else {
                    spin_until(mine, sequence)?;
                    theirs.store(sequence, Ordering::Release);
                }
            }
            Ok(start.elapsed())
        }))
    }
}
