//! Atomics: remote fetch-add on the peer's word, beside the raw `lock xadd` on the same word.

use std::hint::black_box;
use std::sync::atomic::Ordering;
use std::time::Instant;

use anyhow::{ensure, Result};

use super::{Bench, LAYER, PEER, REFERENCE, WORD_BYTES};
use crate::shared_word::shared_word;

impl Bench<'_> {
    /// Remote fetch-add on the peer's word, interleaved with the raw `lock xadd` on the same
    /// word (context, no bar ratio).
    pub(super) fn fetch_add(&self) -> Result<()> {
        let shmem = self.shmem;
        let counter = shmem.allocate::<u64>(1, None)?;
        shmem.atomic_set(&counter, 0, shmem.rank())?;
        shmem.barrier()?;
        let theirs = if self.remote {
            None
        } else {
            Some(shared_word(shmem, &counter, PEER)?)
        };
        let mut previous = None;
        let mut batches = Vec::new();
        if let Some(theirs) = &theirs {
            batches.push(self.on_root(|ops| {
                let start = Instant::now();
                for _ in 0..ops {
                    black_box(theirs.fetch_add(1, Ordering::SeqCst));
                }
                Ok(start.elapsed())
            }));
        }
        batches.push(self.on_root(|ops| {
            let start = Instant::now();
            for _ in 0..ops {
                previous = Some(black_box(shmem.atomic_fetch_add(&counter, 1u64, PEER)?));
            }
            Ok(start.elapsed())
        }));
        let timings = self.time(batches)?;
        let (raw, fetch_add) = match timings[..] {
            [raw, fetch_add] => (Some(raw), fetch_add),
            [fetch_add] => (None, fetch_add),
            _ => unreachable!("one or two batches were timed"),
        };
        if shmem.rank() == 0 {
            let now = shmem.atomic_fetch(&counter, PEER)?;
            ensure!(
                previous.is_some_and(|p| p + 1 == now),
                "fetch-add returned {previous:?} but the word now holds {now}"
            );
        }
        if let Some(raw) = raw {
            self.report("raw_fetch_add", REFERENCE, WORD_BYTES, raw, None)?;
        }
        self.report("fetch_add", LAYER, WORD_BYTES, fetch_add, None)?;
        shmem.barrier()?;
        Ok(shmem.free(counter)?)
    }
}
