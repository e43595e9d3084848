//! RMA: put/get of a word (latency) and of 64 KiB to 16 MiB (bandwidth, beside memcpy), and
//! a get served by a peer that computes or sleeps (UCX route: its progress thread serves it).

use std::hint::black_box;
use std::sync::atomic::{fence, Ordering};
use std::time::{Duration, Instant};

use anyhow::{ensure, Result};
use hyper_multicore::shmem::{Allocation, Comparison, SignalOp};

use super::harness::{compute_for, nanos, single_calls, LineAligned};
use super::{Bench, LAYER, PEER, REFERENCE, WORD_BYTES};
use crate::shared_word::shared_word;
use crate::stats::{Summary, Timing};

/// Transfer sizes of the bandwidth rows.
const BANDWIDTH_BYTES: [usize; 3] = [64 << 10, 1 << 20, 16 << 20];

/// How long PE 1 computes, without calling the runtime, in each sample of the
/// `get_computing_peer` row: a get that waited for the target to call the runtime again would
/// take about this long.
const COMPUTE_WINDOW: Duration = Duration::from_millis(20);

/// How long PE 0 computes before the burst of the `get_burst_waiting_peer` row: past the spin
/// window of PE 1's wait in the barrier (a fraction of this), so PE 1 sleeps when the burst
/// starts.
const ASLEEP_WINDOW: Duration = Duration::from_millis(2);

/// Gets per sample of the `get_burst_waiting_peer` row.
const BURST_GETS: u32 = 200;

impl Bench<'_> {
    /// Put 8 B + quiet and get 8 B towards the peer, interleaved with the raw store+fence and
    /// load on the same word (context, no bar ratio).
    pub(super) fn word_latency(&self) -> Result<()> {
        let shmem = self.shmem;
        let word = shmem.allocate::<u64>(1, None)?;
        shmem.put(&word, &[0], shmem.rank())?;
        shmem.barrier()?;
        // Check the path before timing it.
        if shmem.rank() == 0 {
            shmem.put(&word, &[0x5eed], PEER)?;
            shmem.quiet();
        }
        shmem.barrier()?;
        let mut seen = [0u64];
        if shmem.rank() == 1 {
            shmem.get(&mut seen, &word, shmem.rank())?;
            ensure!(
                seen == [0x5eed],
                "put 8 B delivered {seen:?}, expected [0x5eed]"
            );
        }
        shmem.barrier()?;
        if self.remote {
            return self.word_latency_remote(word);
        }
        let theirs = shared_word(shmem, &word, PEER)?;
        let timings = self.time(vec![
            self.on_root(|ops| {
                let start = Instant::now();
                for i in 0..ops {
                    theirs.store(black_box(i), Ordering::Relaxed);
                    fence(Ordering::SeqCst);
                }
                Ok(start.elapsed())
            }),
            self.on_root(|ops| {
                let start = Instant::now();
                for i in 0..ops {
                    shmem.put(&word, &[black_box(i)], PEER)?;
                    shmem.quiet();
                }
                Ok(start.elapsed())
            }),
            self.on_root(|ops| {
                let start = Instant::now();
                for _ in 0..ops {
                    black_box(theirs.load(Ordering::Relaxed));
                }
                Ok(start.elapsed())
            }),
            self.on_root(|ops| {
                let mut value = [0u64];
                let start = Instant::now();
                for _ in 0..ops {
                    shmem.get(&mut value, &word, PEER)?;
                    black_box(&mut value);
                }
                Ok(start.elapsed())
            }),
        ])?;
        let [store_fence, put, load, get] = timings[..] else {
            unreachable!("four batches were timed")
        };
        self.report("raw_store_fence", REFERENCE, WORD_BYTES, store_fence, None)?;
        self.report("put_quiet", LAYER, WORD_BYTES, put, None)?;
        self.report("raw_load", REFERENCE, WORD_BYTES, load, None)?;
        self.report("get", LAYER, WORD_BYTES, get, None)?;
        shmem.barrier()?;
        Ok(shmem.free(word)?)
    }

    /// [`Bench::word_latency`] on the UCX route: put 8 B + quiet and get 8 B, no raw floor.
    fn word_latency_remote(&self, word: Allocation<u64>) -> Result<()> {
        let shmem = self.shmem;
        let timings = self.time(vec![
            self.on_root(|ops| {
                let start = Instant::now();
                for i in 0..ops {
                    shmem.put(&word, &[black_box(i)], PEER)?;
                    shmem.try_quiet()?;
                }
                Ok(start.elapsed())
            }),
            self.on_root(|ops| {
                let mut value = [0u64];
                let start = Instant::now();
                for _ in 0..ops {
                    shmem.get(&mut value, &word, PEER)?;
                    black_box(&mut value);
                }
                Ok(start.elapsed())
            }),
        ])?;
        let [put, get] = timings[..] else {
            unreachable!("two batches were timed")
        };
        self.report("put_quiet", LAYER, WORD_BYTES, put, None)?;
        self.report("get", LAYER, WORD_BYTES, get, None)?;
        shmem.barrier()?;
        Ok(shmem.free(word)?)
    }

    /// Put and get bandwidth per size, interleaved with memcpy between two private buffers of
    /// the same size (the same working set: source + destination of that size). The private
    /// buffers start on a cache line, like every heap allocation, so memcpy sees the same
    /// relative alignment in the reference and in the put/get (a source 16 bytes off a line,
    /// as `malloc` gives, makes `rep movsb` split lines and copy measurably slower: the
    /// reference would then flatter the put/get).
    pub(super) fn bandwidth(&self) -> Result<()> {
        let shmem = self.shmem;
        let largest = BANDWIDTH_BYTES[BANDWIDTH_BYTES.len() - 1];
        let remote = shmem.allocate::<u8>(largest, None)?;
        // Touch every page of every copy (a fresh memfd page is faulted in on first write) and
        // of the private buffers (an untouched private page reads as the shared zero page).
        let mut source = LineAligned::new(largest, 0);
        for (i, byte) in source.bytes_mut().iter_mut().enumerate() {
            *byte = (i % 251) as u8;
        }
        let source = source.bytes();
        let mut copy = LineAligned::new(largest, 0x5a);
        let mut landing = LineAligned::new(largest, 0xa5);
        shmem.put(&remote, source, shmem.rank())?;
        shmem.barrier()?;
        for bytes in BANDWIDTH_BYTES {
            let target = remote.view(..bytes)?;
            let copy = &mut copy.bytes_mut()[..bytes];
            let landing = &mut landing.bytes_mut()[..bytes];
            let source = &source[..bytes];
            let timings = self.time(vec![
                self.on_root(|ops| {
                    let start = Instant::now();
                    for _ in 0..ops {
                        copy.copy_from_slice(black_box(source));
                        black_box(&mut *copy);
                    }
                    Ok(start.elapsed())
                }),
                self.on_root(|ops| {
                    let start = Instant::now();
                    for _ in 0..ops {
                        shmem.put(&target, black_box(source), PEER)?;
                        shmem.quiet();
                    }
                    Ok(start.elapsed())
                }),
                self.on_root(|ops| {
                    let start = Instant::now();
                    for _ in 0..ops {
                        shmem.get(&mut *landing, &target, PEER)?;
                        black_box(&mut *landing);
                    }
                    Ok(start.elapsed())
                }),
            ])?;
            let [memcpy, put, get] = timings[..] else {
                unreachable!("three batches were timed")
            };
            self.report("memcpy", REFERENCE, bytes, memcpy, None)?;
            let same_size = Some(("memcpy of the same size", memcpy));
            self.report("put_bandwidth", LAYER, bytes, put, same_size)?;
            self.report("get_bandwidth", LAYER, bytes, get, same_size)?;
        }
        if shmem.rank() == 0 {
            let landing = landing.bytes_mut();
            shmem.get(landing, &remote, PEER)?;
            ensure!(
                landing == source,
                "get of {largest} bytes from PE {PEER} returned other bytes than were put"
            );
        }
        shmem.barrier()?;
        Ok(shmem.free(remote)?)
    }

    /// Get 8 B from a peer that computes: per sample, PE 1 signals PE 0 and then computes for
    /// [`COMPUTE_WINDOW`] without calling the runtime, while PE 0 times one get from it (the
    /// target's progress thread must serve it; without one it would take about the window).
    /// Interleaved with the reference: the same get while PE 1 waits in a barrier. One get per
    /// sample, so each sample is one call's latency (no batch). Then `get_burst_waiting_peer`:
    /// per sample, PE 0 computes for [`ASLEEP_WINDOW`] while PE 1 waits in a barrier (and falls
    /// asleep there), then times [`BURST_GETS`] gets in a row from it (per get): whether the
    /// waiting PE goes back to serving a burst itself or leaves every get to its progress thread.
    pub(super) fn computing_peer(&self) -> Result<()> {
        let shmem = self.shmem;
        let word = shmem.allocate::<u64>(1, None)?;
        let computing = shmem.allocate::<u64>(1, None)?;
        const SEEN: u64 = 0xc0ffee;
        shmem.put(&word, &[SEEN], shmem.rank())?;
        shmem.atomic_set(&computing, 0, shmem.rank())?;
        shmem.barrier()?;
        let get = || -> Result<f64> {
            let mut value = [0u64];
            let start = Instant::now();
            shmem.get(&mut value, &word, PEER)?;
            let took = start.elapsed();
            ensure!(
                value == [SEEN],
                "get returned {value:?}, expected [{SEEN:#x}]"
            );
            Ok(nanos(took) as f64)
        };
        let (mut waiting, mut busy) = (Vec::new(), Vec::new());
        for sample in 1..=self.method.trials as u64 {
            if shmem.rank() == 0 {
                waiting.push(get()?);
            }
            shmem.barrier()?;
            if shmem.rank() == 0 {
                shmem.wait_signal(&computing, sample, Comparison::Eq, None)?;
                busy.push(get()?);
            } else {
                shmem.signal(&computing, sample, SignalOp::Set, 0)?;
                compute_for(COMPUTE_WINDOW);
            }
            shmem.barrier()?;
        }
        if shmem.rank() == 0 {
            let waiting = single_calls(&waiting)?;
            self.report("get_waiting_peer", REFERENCE, WORD_BYTES, waiting, None)?;
            let reference = Some(("get from a peer waiting in a barrier", waiting));
            let busy = single_calls(&busy)?;
            self.report("get_computing_peer", LAYER, WORD_BYTES, busy, reference)?;
        }
        shmem.barrier()?;
        let mut burst = Vec::new();
        for _ in 0..self.method.trials {
            if shmem.rank() == 0 {
                compute_for(ASLEEP_WINDOW);
                let start = Instant::now();
                for _ in 0..BURST_GETS {
                    get()?;
                }
                burst.push(nanos(start.elapsed()) as f64 / f64::from(BURST_GETS));
            }
            shmem.barrier()?;
        }
        if shmem.rank() == 0 {
            let burst = Timing {
                per_op: Summary::of(&burst)?,
                batch_ops: u64::from(BURST_GETS),
            };
            self.report("get_burst_waiting_peer", LAYER, WORD_BYTES, burst, None)?;
        }
        shmem.free(computing)?;
        Ok(shmem.free(word)?)
    }
}
