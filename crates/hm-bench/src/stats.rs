//! Timing: warm up, time batches long enough to drown the clock, repeat over trials and
//! summarise them as min / median / max (the method of `shared/BENCHMARKS.md`).
//!
//! A batch is run through a closure so that a collective can be timed the same way on every
//! rank: the closure returns root rank 0's measurement on every rank, and every rank then makes
//! the same calibration decisions and the same number of calls.
//!
//! ```ignore
//! let method = Method::new(false);
//! let timing = time_batches(&method, |ops| {
//!     let start = Instant::now();
//!     for _ in 0..ops {
//!         std::hint::black_box(1 + 1);
//!     }
//!     Ok(start.elapsed())
//! })?;
//! println!("{} ns per op", timing.per_op.median_ns);
//! ```

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use serde::{Deserialize, Serialize};

/// How long and how often to measure.
#[derive(Clone, Copy, Debug)]
pub struct Method {
    /// Shortest duration of one timed batch.
    pub batch_target: Duration,
    /// Timed batches per operation.
    pub trials: usize,
    /// Whole-job launches per PE count when timing start-up.
    pub launches: usize,
}

impl Method {
    /// The full method (batches ≥ 20 ms, 11 trials, 5 launches), or with `quick` a smoke-test
    /// method (≈ 5 ms, 5 trials, 3 launches) that checks the benchmark works, not how fast.
    pub fn new(quick: bool) -> Method {
        if quick {
            Method {
                batch_target: Duration::from_millis(5),
                trials: 5,
                launches: 3,
            }
        } else {
            Method {
                batch_target: Duration::from_millis(20),
                trials: 11,
                launches: 5,
            }
        }
    }
}

/// Min / median / max of a set of trials, in nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// The fastest trial.
    pub min_ns: f64,
    /// The median trial (the mean of the two middle ones for an even count).
    pub median_ns: f64,
    /// The slowest trial.
    pub max_ns: f64,
    /// How many trials.
    pub trials: usize,
}

impl Summary {
    /// Summarises `samples_ns`; fails on an empty or non-finite set.
    pub fn of(samples_ns: &[f64]) -> Result<Summary> {
        ensure!(!samples_ns.is_empty(), "no trials to summarise");
        ensure!(
            samples_ns.iter().all(|s| s.is_finite()),
            "a trial time is not finite: {samples_ns:?}"
        );
        let mut sorted = samples_ns.to_vec();
        sorted.sort_by(f64::total_cmp);
        let middle = sorted.len() / 2;
        let median_ns = if sorted.len() % 2 == 1 {
            sorted[middle]
        } else {
            (sorted[middle - 1] + sorted[middle]) / 2.0
        };
        Ok(Summary {
            min_ns: sorted[0],
            median_ns,
            max_ns: sorted[sorted.len() - 1],
            trials: sorted.len(),
        })
    }
}

/// The timing of one operation: its cost per call over the trials.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct Timing {
    /// Nanoseconds per call, one sample per timed batch.
    pub per_op: Summary,
    /// Calls per timed batch.
    pub batch_ops: u64,
}

/// Most calls a calibrated batch may hold before the clock is deemed broken.
const MAX_BATCH_OPS: u64 = 1 << 40;

/// A timed batch: `batch(ops)` makes `ops` calls and returns how long they took.
pub type Batch<'a> = Box<dyn FnMut(u64) -> Result<Duration> + 'a>;

/// Times an operation: `batch(ops)` makes `ops` calls and returns how long they took.
///
/// Warm-up is the calibration: batches of 1, 2, 4, … calls until two batches of one size in a
/// row take at least [`Method::batch_target`] (one slow batch — a descheduled PE, a late
/// wake-up — must not stop the calibration at a size that is far too small); then
/// [`Method::trials`] batches of that size are timed.
pub fn time_batches(method: &Method, batch: impl FnMut(u64) -> Result<Duration>) -> Result<Timing> {
    let mut batches: [Batch<'_>; 1] = [Box::new(batch)];
    let mut timings = time_interleaved(method, &mut batches)?;
    Ok(timings.remove(0))
}

/// Times several operations in the same stretch of time: each is calibrated as by
/// [`time_batches`], then the trials alternate — one batch of each, in order, per trial — so
/// a reference and the operation compared with it see the same machine (on a shared VM the
/// cost of a cache-line transfer can change several-fold when the host moves a virtual CPU).
pub fn time_interleaved(method: &Method, batches: &mut [Batch<'_>]) -> Result<Vec<Timing>> {
    let mut sizes = Vec::with_capacity(batches.len());
    for batch in batches.iter_mut() {
        sizes.push(calibrate(method, batch)?);
    }
    let mut samples: Vec<Vec<f64>> = batches
        .iter()
        .map(|_| Vec::with_capacity(method.trials))
        .collect();
    for _ in 0..method.trials {
        for ((batch, &ops), samples) in batches.iter_mut().zip(&sizes).zip(&mut samples) {
            samples.push(batch(ops)?.as_nanos() as f64 / ops as f64);
        }
    }
    samples
        .iter()
        .zip(sizes)
        .map(|(samples, ops)| {
            Ok(Timing {
                per_op: Summary::of(samples)?,
                batch_ops: ops,
            })
        })
        .collect()
}

/// The calls per batch: doubles until two batches in a row reach the target.
fn calibrate(method: &Method, batch: &mut Batch<'_>) -> Result<u64> {
    let mut ops: u64 = 1;
    while batch(ops)? < method.batch_target || batch(ops)? < method.batch_target {
        ops = ops
            .checked_mul(2)
            .filter(|&ops| ops <= MAX_BATCH_OPS)
            .context(
            "a batch of 2^40 calls still took less than the batch target; is the clock working?",
        )?;
    }
    Ok(ops)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_takes_the_middle_trial_or_the_mean_of_the_two() {
        let odd = Summary::of(&[5.0, 1.0, 3.0]).unwrap();
        assert_eq!(
            (odd.min_ns, odd.median_ns, odd.max_ns, odd.trials),
            (1.0, 3.0, 5.0, 3)
        );
        let even = Summary::of(&[4.0, 1.0, 2.0, 8.0]).unwrap();
        assert_eq!((even.min_ns, even.median_ns, even.max_ns), (1.0, 3.0, 8.0));
        assert!(Summary::of(&[]).is_err());
        assert!(Summary::of(&[1.0, f64::NAN]).is_err());
    }

    #[test]
    fn batches_double_until_they_reach_the_target_then_repeat() {
        let method = Method {
            batch_target: Duration::from_micros(100),
            trials: 3,
            launches: 1,
        };
        let mut sizes = Vec::new();
        // A fake operation of 10 µs per call: 10 calls reach the 100 µs target, so 16 is chosen
        // (after a second batch of 16 confirms it).
        let timing = time_batches(&method, |ops| {
            sizes.push(ops);
            Ok(Duration::from_micros(10 * ops))
        })
        .unwrap();
        assert_eq!(sizes, [1, 2, 4, 8, 16, 16, 16, 16, 16]);
        assert_eq!(timing.batch_ops, 16);
        assert_eq!(timing.per_op.median_ns, 10_000.0);
    }

    #[test]
    fn one_slow_batch_does_not_end_the_calibration() {
        let method = Method {
            batch_target: Duration::from_micros(100),
            trials: 1,
            launches: 1,
        };
        let mut sizes = Vec::new();
        // 10 µs per call, but the first batch of 2 is held up for 1 ms.
        let timing = time_batches(&method, |ops| {
            let slow = sizes == [1];
            sizes.push(ops);
            Ok(Duration::from_micros(
                10 * ops + if slow { 1000 } else { 0 },
            ))
        })
        .unwrap();
        assert_eq!(sizes, [1, 2, 2, 4, 8, 16, 16, 16]);
        assert_eq!(timing.batch_ops, 16);
    }

    #[test]
    fn interleaved_operations_are_calibrated_apart_and_alternate_trials() {
        let method = Method {
            batch_target: Duration::from_micros(100),
            trials: 2,
            launches: 1,
        };
        let calls = std::cell::RefCell::new(Vec::new());
        let mut batches: [Batch<'_>; 2] = [
            Box::new(|ops| {
                calls.borrow_mut().push(('a', ops));
                Ok(Duration::from_micros(50 * ops))
            }),
            Box::new(|ops| {
                calls.borrow_mut().push(('b', ops));
                Ok(Duration::from_micros(30 * ops))
            }),
        ];
        let timings = time_interleaved(&method, &mut batches).unwrap();
        drop(batches);
        assert_eq!(
            calls.into_inner(),
            [
                ('a', 1),
                ('a', 2),
                ('a', 2),
                ('b', 1),
                ('b', 2),
                ('b', 4),
                ('b', 4),
                ('a', 2),
                ('b', 4),
                ('a', 2),
                ('b', 4)
            ]
        );
        assert_eq!(timings[0].per_op.median_ns, 50_000.0);
        assert_eq!(timings[1].per_op.median_ns, 30_000.0);
    }

    #[test]
    fn a_clock_that_never_advances_is_an_error_not_a_hang() {
        let method = Method::new(true);
        assert!(time_batches(&method, |_| Ok(Duration::ZERO)).is_err());
    }
}
