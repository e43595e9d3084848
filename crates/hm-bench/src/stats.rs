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
    interleaved(method, batches, None)
}

/// The fewest trials [`time_interleaved_within`] leaves when a budget cuts them (or all of
/// [`Method::trials`] if that is fewer): a median of three long calls.
pub const MIN_TRIALS: usize = 3;

/// With an aiming calibration, a single call lasting this many batch targets is a batch at
/// once, without a second to confirm it (no smaller batch exists; the second call would cost
/// as much as a trial).
const LONG_CALL: u32 = 5;

/// [`time_interleaved`], with a budget for the trials: when [`Method::trials`] trials of the
/// group (one batch of each, their calibrated durations summed) would last longer than
/// `budget`, only as many as fit, but at least [`MIN_TRIALS`]. The durations are the ones the
/// batches return — root rank 0's on every rank for a collective batch — so every rank makes
/// the same number of calls. For groups whose calls are long (collectives of 16 MiB on 8 PEs
/// sharing 2 cores), where 11 trials would make the run last too long to be run at all.
///
/// With a budget the calibration also aims: a batch short of the target grows the calls to
/// what should last 1.1× the target (at least 1.25×, at most 64× as many) instead of doubling,
/// so the warm-up takes a few batches, not one per doubling (each batch of a collective row is
/// a round of barriers, which on an oversubscribed or busy machine costs more than the calls),
/// and the batches last about the target rather than up to twice it (the doubling's
/// overshoot). It still settles on a size at which two batches in a row reach the target, but
/// for a single call that lasts [`LONG_CALL`] targets or more, which is taken at once and
/// counts as the first trial.
pub fn time_interleaved_within(
    method: &Method,
    batches: &mut [Batch<'_>],
    budget: Duration,
) -> Result<Vec<Timing>> {
    interleaved(method, batches, Some(budget))
}

/// [`time_interleaved`] (no budget, doubling calibration) or [`time_interleaved_within`]
/// (`budget`, aiming calibration).
fn interleaved(
    method: &Method,
    batches: &mut [Batch<'_>],
    budget: Option<Duration>,
) -> Result<Vec<Timing>> {
    let mut sizes = Vec::with_capacity(batches.len());
    let mut samples: Vec<Vec<f64>> = Vec::with_capacity(batches.len());
    let mut trial = Duration::ZERO;
    for batch in batches.iter_mut() {
        let (ops, last, first_trial) = calibrate(method, batch, budget.is_some())?;
        sizes.push(ops);
        samples.push(first_trial.into_iter().collect());
        trial += last;
    }
    let trials = trials_within(method.trials, trial, budget);
    for _ in 0..trials {
        for ((batch, &ops), samples) in batches.iter_mut().zip(&sizes).zip(&mut samples) {
            // A long call's calibration was its first trial already (see `calibrate`).
            if samples.len() < trials {
                samples.push(batch(ops)?.as_nanos() as f64 / ops as f64);
            }
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

/// The largest factor an aiming calibration grows a batch by.
const MAX_GROWTH: u64 = 64;

/// The calls of the next batch after `ops` calls took `took`, short of `target`: as many as
/// should last 1.1 × `target`, but at least 1.25× as many (and one more) and at most
/// [`MAX_GROWTH`]× as many.
fn aim_at(ops: u64, target: Duration, took: Duration) -> u64 {
    let aimed = (u128::from(ops) * target.as_nanos() * 11).div_ceil(took.as_nanos().max(1) * 10);
    let least = ops.saturating_add((ops / 4).max(1));
    let most = ops.saturating_mul(MAX_GROWTH);
    u64::try_from(aimed).unwrap_or(most).clamp(least, most)
}

/// How many trials of `trial` each fit in `budget`: `trials` without a budget or when they
/// fit, else as many as fit but at least [`MIN_TRIALS`] (or `trials`, if fewer).
fn trials_within(trials: usize, trial: Duration, budget: Option<Duration>) -> usize {
    let Some(budget) = budget else {
        return trials;
    };
    if trial.is_zero() || trial * trials as u32 <= budget {
        return trials;
    }
    let fit = (budget.as_nanos() / trial.as_nanos()) as usize;
    fit.max(MIN_TRIALS.min(trials)).min(trials)
}

/// The calls per batch: doubles (or with `aim`, grows as [`aim_at`] says) until two batches
/// in a row reach the target. Returns that size, the second batch's duration, and with `aim`
/// for a single call of [`LONG_CALL`] targets or more (taken at once) that call's nanoseconds:
/// a batch of the final size, so the first trial.
fn calibrate(
    method: &Method,
    batch: &mut Batch<'_>,
    aim: bool,
) -> Result<(u64, Duration, Option<f64>)> {
    let mut ops: u64 = 1;
    loop {
        let first = batch(ops)?;
        if aim && ops == 1 && first >= method.batch_target * LONG_CALL {
            return Ok((1, first, Some(first.as_nanos() as f64)));
        }
        if first >= method.batch_target {
            let second = batch(ops)?;
            if second >= method.batch_target {
                return Ok((ops, second, None));
            }
        }
        let next = if aim {
            Some(aim_at(ops, method.batch_target, first))
        } else {
            ops.checked_mul(2)
        };
        ops = next.filter(|&ops| ops <= MAX_BATCH_OPS).context(
            "a batch of 2^40 calls still took less than the batch target; is the clock working?",
        )?;
    }
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
    fn a_budget_cuts_long_groups_to_what_fits_but_not_below_the_least() {
        let second = Duration::from_secs(1);
        // No budget, or trials that fit: every trial.
        assert_eq!(trials_within(11, second, None), 11);
        assert_eq!(trials_within(11, second, Some(Duration::from_secs(11))), 11);
        // 11 trials of 1 s in 8 s: 8.
        assert_eq!(trials_within(11, second, Some(Duration::from_secs(8))), 8);
        // In 2 s: the least, MIN_TRIALS; and never more than asked.
        assert_eq!(
            trials_within(11, second, Some(Duration::from_secs(2))),
            MIN_TRIALS
        );
        assert_eq!(trials_within(3, second, Some(Duration::from_secs(1))), 3);
        let method = Method {
            batch_target: Duration::from_micros(100),
            trials: 11,
            launches: 1,
        };
        // An aiming calibration: at 1 µs per call, 1 call grows ×64 (the most), then 64 calls
        // to the 110 that should last 1.1× the 100 µs target, confirmed by a second batch.
        let mut sizes = Vec::new();
        let mut batches: [Batch<'_>; 1] = [Box::new(|ops| {
            sizes.push(ops);
            Ok(Duration::from_micros(ops))
        })];
        let timings =
            time_interleaved_within(&method, &mut batches, Duration::from_secs(1)).unwrap();
        drop(batches);
        assert_eq!(sizes[..4], [1, 64, 110, 110]);
        assert_eq!((timings[0].batch_ops, sizes.len()), (110, 4 + 11));
        let target = Duration::from_micros(100);
        assert_eq!(aim_at(8, target, Duration::ZERO), 8 * MAX_GROWTH);
        // Just short of the target: at least 1.25× (and one more call).
        assert_eq!(aim_at(100, target, Duration::from_micros(99)), 125);
        assert_eq!(aim_at(1, target, Duration::from_micros(99)), 2);
        let mut calls = 0;
        // One call of 1 ms per batch (10 targets: a batch at once, unconfirmed, and the first
        // trial): 11 trials would take 11 ms, 6 fit in a budget of 6.5 ms.
        let mut batches: [Batch<'_>; 1] = [Box::new(|_| {
            calls += 1;
            Ok(Duration::from_millis(1))
        })];
        let timings =
            time_interleaved_within(&method, &mut batches, Duration::from_micros(6500)).unwrap();
        drop(batches);
        assert_eq!((timings[0].per_op.trials, calls), (6, 6));
    }

    #[test]
    fn a_clock_that_never_advances_is_an_error_not_a_hang() {
        let method = Method::new(true);
        assert!(time_batches(&method, |_| Ok(Duration::ZERO)).is_err());
    }
}
