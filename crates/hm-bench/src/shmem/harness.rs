//! What every family's benchmark is made of: batches run together on every rank, timed,
//! and reported by root rank 0; private line-aligned buffers and the arithmetic of timings.

use std::hint::black_box;
use std::time::{Duration, Instant};

use anyhow::Result;
use hyper_multicore::shmem::Shmem;

use super::{Bench, PeMessage, LAYER, LAYER_UCX};
use crate::launch::emit;
use crate::report::{Report, Row};
use crate::stats::{time_batches, time_interleaved, Batch, Summary, Timing};

impl Bench<'_> {
    /// Calls `op` `ops` times on this PE; the batch's duration.
    pub(super) fn repeat(&self, ops: u64, mut op: impl FnMut() -> Result<()>) -> Result<Duration> {
        let start = Instant::now();
        for _ in 0..ops {
            op()?;
        }
        Ok(start.elapsed())
    }

    /// `batch` as every rank runs it: see [`together`].
    pub(super) fn together<'b>(
        &'b self,
        batch: impl FnMut(u64) -> Result<Duration> + 'b,
    ) -> Batch<'b> {
        together(self.shmem, batch)
    }

    /// [`Bench::together`] where only root rank 0 runs `batch` (the others wait).
    pub(super) fn on_root<'b>(
        &'b self,
        mut batch: impl FnMut(u64) -> Result<Duration> + 'b,
    ) -> Batch<'b> {
        let root = self.shmem.rank() == 0;
        self.together(move |ops| if root { batch(ops) } else { Ok(Duration::ZERO) })
    }

    /// Times one batch made by [`Bench::together`].
    pub(super) fn time_together(
        &self,
        batch: impl FnMut(u64) -> Result<Duration>,
    ) -> Result<Timing> {
        time_batches(&self.method, together(self.shmem, batch))
    }

    /// Times batches made by [`Bench::together`] / [`Bench::on_root`], interleaved.
    pub(super) fn time(&self, mut batches: Vec<Batch<'_>>) -> Result<Vec<Timing>> {
        time_interleaved(&self.method, &mut batches)
    }

    /// Root rank 0 prints a row (the other ranks measured along but print nothing).
    pub(super) fn report(
        &self,
        op: &str,
        layer: &str,
        bytes: usize,
        timing: Timing,
        reference: Option<(&str, Timing)>,
    ) -> Result<()> {
        if self.shmem.rank() != 0 {
            return Ok(());
        }
        let layer = if layer == LAYER && self.remote {
            LAYER_UCX
        } else {
            layer
        };
        if self.rows {
            let reference = reference.map(|(name, t)| (name, t.per_op.median_ns));
            let row = Row::new(op, layer, bytes, self.shmem.size(), &timing, reference);
            return Report::new(true).row(&row);
        }
        emit(&PeMessage::Timed {
            op: op.to_string(),
            layer: layer.to_string(),
            bytes,
            timing,
            reference: reference.map(|(name, t)| (name.to_string(), t.per_op.median_ns)),
        })
    }
}

/// `batch` made collective: each call starts right after a barrier on the shared heap, and
/// root rank 0's duration is broadcast over the control plane (after the clock stops) and
/// returned on every rank, so every rank calibrates the same way and makes the same calls.
pub(crate) fn together<'b>(
    shmem: &'b Shmem,
    mut batch: impl FnMut(u64) -> Result<Duration> + 'b,
) -> Batch<'b> {
    Box::new(move |ops| {
        shmem.barrier()?;
        let took = nanos(batch(ops)?);
        root_duration(shmem.control().broadcast(&took.to_le_bytes())?)
    })
}

/// The duration root rank 0 broadcast (nanoseconds, little-endian).
pub(crate) fn root_duration(bytes: Vec<u8>) -> Result<Duration> {
    let nanos: [u8; 8] = bytes
        .try_into()
        .map_err(|bytes| anyhow::anyhow!("root rank 0 broadcast a malformed duration {bytes:?}"))?;
    Ok(Duration::from_nanos(u64::from_le_bytes(nanos)))
}

/// A private byte buffer that starts on a cache line (64 bytes), every byte written.
pub(crate) struct LineAligned {
    /// The storage, 63 bytes longer than the buffer.
    storage: Vec<u8>,
    /// Where the buffer starts in `storage`.
    start: usize,
    /// The buffer's length.
    len: usize,
}

impl LineAligned {
    /// `len` bytes of `fill`.
    pub(crate) fn new(len: usize, fill: u8) -> LineAligned {
        let storage = vec![fill; len + 63];
        let start = storage.as_ptr().align_offset(64);
        LineAligned {
            storage,
            start,
            len,
        }
    }

    /// The buffer.
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.storage[self.start..self.start + self.len]
    }

    /// The buffer, writable.
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.storage[self.start..self.start + self.len]
    }
}

/// The timing of samples that are one call each (nanoseconds), not batches.
pub(super) fn single_calls(samples_ns: &[f64]) -> Result<Timing> {
    Ok(Timing {
        per_op: Summary::of(samples_ns)?,
        batch_ops: 1,
    })
}

/// Half of each trial: one way of a round trip.
pub(super) fn half(timing: Timing) -> Timing {
    let per_op = timing.per_op;
    Timing {
        per_op: Summary {
            min_ns: per_op.min_ns / 2.0,
            median_ns: per_op.median_ns / 2.0,
            max_ns: per_op.max_ns / 2.0,
            trials: per_op.trials,
        },
        batch_ops: timing.batch_ops,
    }
}

/// Computes (arithmetic only: no runtime call, no system call but the clock's vDSO read) for
/// `window`: a PE busy with its own work.
pub(super) fn compute_for(window: Duration) {
    let end = Instant::now() + window;
    let mut x = 1u64;
    while Instant::now() < end {
        for _ in 0..1024 {
            x = black_box(
                x.wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407),
            );
        }
    }
    black_box(x);
}

/// A duration in whole nanoseconds (saturating).
pub(crate) fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}
