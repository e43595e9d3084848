//! Start-up and shutdown: jobs that only initialize, allocate once, free and shut down,
//! timed by the driver and by each PE.

use anyhow::{bail, ensure, Context, Result};

use super::harness::nanos;
use super::{PeMessage, LAYER};
use crate::launch::{self};
use crate::report::{Report, Row};
use crate::stats::{Method, Summary, Timing};

/// The start-up rows, one sample per launch each:
/// - `init`: job start → the last PE's "allocated" line read by the driver (every PE has
///   initialized and made its first allocation);
/// - `init_call`: the slowest PE's own world + initialize + first allocation;
/// - `init_world`, `init_initialize`, `init_allocate`: the slowest PE's `World::from_env`, its
///   unique-ID broadcast + `Shmem::initialize`, its first `allocate` (the slowest PE of each
///   phase, not necessarily the same PE);
/// - `shutdown`: the slowest PE's `Shmem::shutdown`.
pub(super) const START_UP_ROWS: [&str; 6] = [
    "init",
    "init_call",
    "init_world",
    "init_initialize",
    "init_allocate",
    "shutdown",
];

/// Launches the start-up jobs of `pes` PEs and reports their rows ([`START_UP_ROWS`]).
pub(super) fn report_start_up(
    report: &mut Report,
    pes: usize,
    method: &Method,
    pe_args: &[&str],
) -> Result<()> {
    let timings = time_start_up(pes, method, pe_args)?;
    for (op, timing) in START_UP_ROWS.iter().zip(&timings) {
        report.row(&Row::new(op, LAYER, 0, pes, timing, None))?;
    }
    Ok(())
}

/// Launches [`Method::launches`] start-up-only jobs of `pes` PEs and times them: the timings
/// of [`START_UP_ROWS`], in that order.
fn time_start_up(pes: usize, method: &Method, pe_args: &[&str]) -> Result<Vec<Timing>> {
    let mut args = pe_args.to_vec();
    args.push("--init-only");
    let mut samples: Vec<Vec<f64>> = START_UP_ROWS
        .iter()
        .map(|_| Vec::with_capacity(method.launches))
        .collect();
    for launch in 0..method.launches {
        // `run_job` fails unless every PE exits with status 0: a clean exit is checked here.
        let job = launch::run_job(pes, &args)
            .with_context(|| format!("start-up job {launch} of {pes} PEs"))?;
        let (mut allocated, mut shut_down) = (0, 0);
        let mut last_allocated = None;
        // The slowest PE's init_call, world, initialize, allocate, shutdown.
        let mut slowest = [0u64; 5];
        for (rank, at, message) in job.messages::<PeMessage>()? {
            match message {
                PeMessage::Allocated {
                    rank: said,
                    init_call_ns,
                    world_ns,
                    initialize_ns,
                    allocate_ns,
                } => {
                    ensure!(said == rank, "PE {rank} reported itself as rank {said}");
                    allocated += 1;
                    last_allocated = last_allocated.max(Some(at));
                    let phases = [init_call_ns, world_ns, initialize_ns, allocate_ns];
                    for (slowest, phase) in slowest.iter_mut().zip(phases) {
                        *slowest = (*slowest).max(phase);
                    }
                }
                PeMessage::ShutDown { shutdown_ns, .. } => {
                    shut_down += 1;
                    slowest[4] = slowest[4].max(shutdown_ns);
                }
                PeMessage::Timed { .. } => bail!("PE {rank} timed something in a start-up job"),
            }
        }
        ensure!(
            allocated == pes && shut_down == pes,
            "{allocated} of {pes} PEs allocated and {shut_down} shut down"
        );
        let last = last_allocated.context("no PE allocated")?;
        samples[0].push(nanos(last.duration_since(job.started)) as f64);
        for (samples, slowest) in samples[1..].iter_mut().zip(slowest) {
            samples.push(slowest as f64);
        }
    }
    samples
        .iter()
        .map(|samples| {
            Ok(Timing {
                per_op: Summary::of(samples)?,
                batch_ops: 1,
            })
        })
        .collect()
}
