//! Collectives: the barrier (of 2 PEs beside a raw cache-line round trip; of more beside its
//! context-switch floor) and the all-to-all beside the memcpy of what each PE copies.

use std::hint::black_box;
use std::time::{Duration, Instant};

use anyhow::{ensure, Result};

use super::harness::LineAligned;
use super::{Bench, LAYER, REFERENCE, WORD_BYTES};
use crate::shared_word::{futex_pass, futex_until, shared_word32};

/// Bytes each PE sends each other PE in the all-to-all row.
const ALL_TO_ALL_BLOCK: usize = 1 << 20;

impl Bench<'_> {
    /// The barrier of 2 PEs, interleaved with a raw cache-line round trip between them.
    pub(super) fn barrier(&self) -> Result<()> {
        let shmem = self.shmem;
        if self.remote {
            let barrier = self.time_together(|ops| self.repeat(ops, || Ok(shmem.barrier()?)))?;
            return self.report("barrier", LAYER, 0, barrier, None);
        }
        let raw = [
            shmem.allocate::<u64>(1, None)?,
            shmem.allocate::<u64>(1, None)?,
        ];
        for word in &raw {
            shmem.atomic_set(word, 0, shmem.rank())?;
        }
        shmem.barrier()?;
        let timings = self.time(vec![
            self.raw_round_trip([&raw[0], &raw[1]])?,
            self.together(|ops| self.repeat(ops, || Ok(shmem.barrier()?))),
        ])?;
        let [round_trip, barrier] = timings[..] else {
            unreachable!("two batches were timed")
        };
        self.report("raw_round_trip", REFERENCE, WORD_BYTES, round_trip, None)?;
        let reference = Some(("raw cache-line round trip", round_trip));
        self.report("barrier", LAYER, 0, barrier, reference)?;
        shmem.barrier()?;
        for word in raw {
            shmem.free(word)?;
        }
        Ok(())
    }

    /// The barrier of more (or fewer) than 2 PEs; on one host, with more PEs than cores,
    /// interleaved with its context-switch floor: a raw futex ring through the PEs pinned to
    /// the first core (PE r runs on core r % cores; each sleeps on its own word until the
    /// previous one passes the token). Every core must run each of its PEs once per barrier,
    /// so one round of that ring — PEs / cores context switches — is what any barrier at least
    /// costs. Also interleaved: the yield rotation, every PE calling `sched_yield` in a loop
    /// (no wake-up, no shared word: the cheapest way the scheduler runs each PE of a core
    /// once), so one call costs one bare context switch per PE of a core; `bench/report.py`
    /// sets the barrier beside N/cores − 1 of those, the least a barrier needs per core.
    pub(super) fn barrier_of_many(&self) -> Result<()> {
        let shmem = self.shmem;
        let barrier = |ops| self.repeat(ops, || Ok(shmem.barrier()?));
        if self.remote || shmem.size() <= self.cores {
            let barrier = self.time_together(barrier)?;
            return self.report("barrier", LAYER, 0, barrier, None);
        }
        let token = shmem.allocate::<u32>(1, None)?;
        shmem.atomic_set(&token, 0u32, shmem.rank())?;
        shmem.barrier()?;
        let rank = shmem.rank();
        // The first core's PEs, in rank order: 0, cores, 2 × cores, …
        let ring: Vec<usize> = (0..shmem.size()).step_by(self.cores).collect();
        let place = ring.iter().position(|&pe| pe == rank);
        let mine = shared_word32(shmem, &token, rank)?;
        let next = match place {
            Some(place) => Some(shared_word32(
                shmem,
                &token,
                ring[(place + 1) % ring.len()],
            )?),
            None => None,
        };
        let mut round = 0u32;
        let ring = self.together(move |ops| {
            let Some(next) = next else {
                return Ok(Duration::ZERO);
            };
            let start = Instant::now();
            for _ in 0..ops {
                round = round.wrapping_add(1);
                if rank == 0 {
                    futex_pass(next, round);
                    futex_until(mine, round)?;
                } else {
                    futex_until(mine, round)?;
                    futex_pass(next, round);
                }
            }
            Ok(start.elapsed())
        });
        let rotation = self.together(|ops| {
            let start = Instant::now();
            for _ in 0..ops {
                rustix::thread::sched_yield();
            }
            Ok(start.elapsed())
        });
        let timings = self.time(vec![ring, rotation, self.together(barrier)])?;
        let [ring, rotation, barrier] = timings[..] else {
            unreachable!("three batches were timed")
        };
        self.report("raw_futex_ring", REFERENCE, 0, ring, None)?;
        self.report("raw_yield_rotation", REFERENCE, 0, rotation, None)?;
        let reference = Some(("raw futex ring through one core's PEs", ring));
        self.report("barrier", LAYER, 0, barrier, reference)?;
        shmem.barrier()?;
        Ok(shmem.free(token)?)
    }

    /// All-to-all of [`ALL_TO_ALL_BLOCK`] per pair, interleaved with two memcpys of a block by
    /// PE 0 alone (what each PE copies, same working set: the reference) and by both PEs at
    /// once (context).
    pub(super) fn all_to_all(&self) -> Result<()> {
        let shmem = self.shmem;
        let total = ALL_TO_ALL_BLOCK * shmem.size();
        let target = shmem.allocate::<u8>(total, None)?;
        let mut source = LineAligned::new(total, 0);
        for (i, byte) in source.bytes_mut().iter_mut().enumerate() {
            *byte = (i % 241) as u8 ^ shmem.rank() as u8;
        }
        let source = source.bytes();
        let mut alone = LineAligned::new(total, 0x5a);
        let mut concurrent = LineAligned::new(total, 0x5a);
        shmem.put(&target, alone.bytes(), shmem.rank())?;
        shmem.barrier()?;
        let copy_blocks = |destination: &mut [u8], ops: u64| {
            let start = Instant::now();
            for _ in 0..ops {
                for block in 0..shmem.size() {
                    let range = block * ALL_TO_ALL_BLOCK..(block + 1) * ALL_TO_ALL_BLOCK;
                    destination[range.clone()].copy_from_slice(black_box(&source[range]));
                }
                black_box(&mut *destination);
            }
            Ok(start.elapsed())
        };
        let alone = alone.bytes_mut();
        let concurrent = concurrent.bytes_mut();
        let timings = self.time(vec![
            self.on_root(|ops| copy_blocks(alone, ops)),
            self.together(|ops| copy_blocks(concurrent, ops)),
            self.together(|ops| self.repeat(ops, || Ok(shmem.all_to_all(&target, source)?))),
        ])?;
        let [memcpy, memcpy_concurrent, all_to_all] = timings[..] else {
            unreachable!("three batches were timed")
        };
        self.report("memcpy_x2", REFERENCE, ALL_TO_ALL_BLOCK, memcpy, None)?;
        self.report(
            "memcpy_x2_concurrent",
            REFERENCE,
            ALL_TO_ALL_BLOCK,
            memcpy_concurrent,
            None,
        )?;
        let reference = Some(("memcpy of 1 MiB x2", memcpy));
        self.report("all_to_all", LAYER, ALL_TO_ALL_BLOCK, all_to_all, reference)?;
        // Block `peer` of this PE's target came from `peer`'s block `rank`.
        let mut received = vec![0u8; total];
        shmem.get(&mut received, &target, shmem.rank())?;
        for peer in 0..shmem.size() {
            let expected = (shmem.rank() * ALL_TO_ALL_BLOCK..(shmem.rank() + 1) * ALL_TO_ALL_BLOCK)
                .map(|i| (i % 241) as u8 ^ peer as u8);
            let got = &received[peer * ALL_TO_ALL_BLOCK..(peer + 1) * ALL_TO_ALL_BLOCK];
            ensure!(
                got.iter().copied().eq(expected),
                "all_to_all: block {peer} is not what PE {peer} sent"
            );
        }
        shmem.barrier()?;
        Ok(shmem.free(target)?)
    }
}
