//! Control-plane benchmarks: how long a job of N PEs takes to rendezvous, and the latency of
//! barrier, allgather (8 B per rank) and broadcast (8 B) on the TCP control plane, compared with
//! a TCP loopback round trip measured in the same run.
//!
//! Driver ([`drive`]), for each PE count N:
//! 1. launches [`Method::launches`] jobs of N PEs that only rendezvous, timing job start → the
//!    last PE spawned, job start → the last PE's "ready" line, and the slowest PE's own
//!    `World::from_env` call;
//! 2. measures the TCP round-trip reference (threads on two CPUs; and for context on one);
//! 3. launches one job of N PEs that times the collectives; root rank 0 reports them.
//!
//! PE ([`run_pe`]): `World::from_env`, print "ready", time the collectives (unless
//! `--rendezvous-only`), leave with a barrier.
//!
//! ```text
//! hm-bench control --pes 2,4 --quick --json
//! ```

use std::hint::black_box;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use clap::builder::RangedU64ValueParser;
use clap::Args;
use hyper_multicore::control::ControlPlane;
use hyper_multicore::world::World;
use serde::{Deserialize, Serialize};

use crate::launch::{self, emit};
use crate::reference::{self, Placement};
use crate::report::{Report, Row};
use crate::stats::{time_batches, Method, Summary, Timing};

/// The layer reported for every row of this family.
const LAYER: &str = "control";

/// Arguments of `hm-bench control`.
#[derive(Debug, Args)]
pub struct DriverArgs {
    /// PE counts to run, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "2,4,8,16,32",
          value_parser = RangedU64ValueParser::<usize>::new().range(1..))]
    pes: Vec<usize>,
    /// Smoke-test mode: short batches and few trials (checks it works, not how fast).
    #[arg(long)]
    quick: bool,
    /// One JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
}

/// Arguments of the hidden `hm-bench pe-control`.
#[derive(Debug, Args)]
pub struct PeArgs {
    /// Use the smoke-test method.
    #[arg(long)]
    quick: bool,
    /// Only rendezvous (and leave); time no collective.
    #[arg(long)]
    rendezvous_only: bool,
}

/// What a PE prints, one JSON line each.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
enum PeMessage {
    /// `World::from_env` returned on this PE after `from_env_ns`.
    Ready {
        /// The PE's rank.
        rank: usize,
        /// Duration of its `World::from_env` call.
        from_env_ns: u64,
    },
    /// Root rank 0's timing of one collective.
    Timed {
        /// Which collective.
        op: Collective,
        /// Its timing.
        timing: Timing,
    },
}

/// The collectives measured, in the order they are run and reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Collective {
    /// `ControlPlane::barrier`.
    Barrier,
    /// `ControlPlane::allgather` of [`PAYLOAD_BYTES`] per rank.
    Allgather,
    /// `ControlPlane::broadcast` of [`PAYLOAD_BYTES`] from root rank 0.
    Broadcast,
}

/// Payload of allgather (per rank) and broadcast.
const PAYLOAD_BYTES: usize = 8;

impl Collective {
    /// Every collective, in run order.
    const ALL: [Collective; 3] = [
        Collective::Barrier,
        Collective::Allgather,
        Collective::Broadcast,
    ];

    /// Its name in reports.
    fn name(self) -> &'static str {
        match self {
            Collective::Barrier => "barrier",
            Collective::Allgather => "allgather",
            Collective::Broadcast => "broadcast",
        }
    }

    /// Payload bytes per rank.
    fn bytes(self) -> usize {
        match self {
            Collective::Barrier => 0,
            Collective::Allgather | Collective::Broadcast => PAYLOAD_BYTES,
        }
    }

    /// Runs it once; `payload` is this rank's [`PAYLOAD_BYTES`].
    fn run(self, plane: &ControlPlane, payload: &[u8]) -> Result<()> {
        match self {
            Collective::Barrier => plane.barrier()?,
            Collective::Allgather => drop(black_box(plane.allgather(payload)?)),
            Collective::Broadcast => drop(black_box(plane.broadcast(payload)?)),
        }
        Ok(())
    }

    /// Runs it once and checks the result, so a broken collective is never timed.
    fn check(self, plane: &ControlPlane) -> Result<()> {
        let name = self.name();
        match self {
            Collective::Barrier => plane.barrier()?,
            Collective::Allgather => {
                let all = plane.allgather(&payload(plane.rank()))?;
                let expected: Vec<Vec<u8>> =
                    (0..plane.size()).map(|r| payload(r).to_vec()).collect();
                ensure!(
                    all == expected,
                    "{name} returned {all:?}, expected {expected:?}"
                );
            }
            Collective::Broadcast => {
                let root = plane.broadcast(&payload(plane.rank()))?;
                ensure!(
                    root == payload(0),
                    "{name} returned {root:?}, expected root rank 0's payload"
                );
            }
        }
        Ok(())
    }
}

/// Rank `rank`'s payload: its rank, little-endian.
fn payload(rank: usize) -> [u8; PAYLOAD_BYTES] {
    (rank as u64).to_le_bytes()
}

/// The PE side: rendezvous, report ready, time the collectives, leave together.
pub fn run_pe(args: &PeArgs) -> Result<()> {
    let start = Instant::now();
    let world = World::from_env().context("join the world")?;
    let from_env = start.elapsed();
    emit(&PeMessage::Ready {
        rank: world.rank(),
        from_env_ns: nanos(from_env),
    })?;
    if !args.rendezvous_only {
        let method = Method::new(args.quick);
        for op in Collective::ALL {
            let timing = time_collective(world.control(), &method, op)
                .with_context(|| format!("time {} on rank {}", op.name(), world.rank()))?;
            if world.rank() == 0 {
                emit(&PeMessage::Timed { op, timing })?;
            }
        }
    }
    world.control().barrier().context("leave the job")?;
    Ok(())
}

/// Times `op` on every rank alike: each batch starts after a barrier, and root rank 0's batch
/// duration is broadcast (after the clock stops) so every rank calibrates the same way.
fn time_collective(plane: &ControlPlane, method: &Method, op: Collective) -> Result<Timing> {
    op.check(plane)?;
    let payload = payload(plane.rank());
    time_batches(method, |ops| {
        plane.barrier()?;
        let start = Instant::now();
        for _ in 0..ops {
            op.run(plane, &payload)?;
        }
        let took = nanos(start.elapsed());
        let root_took = plane.broadcast(&took.to_le_bytes())?;
        let root_took: [u8; 8] = root_took.try_into().map_err(|bytes| {
            anyhow::anyhow!("root rank 0 broadcast a malformed duration {bytes:?}")
        })?;
        Ok(Duration::from_nanos(u64::from_le_bytes(root_took)))
    })
}

/// The driver side: every PE count in turn, rows printed as they are measured.
pub fn drive(args: &DriverArgs) -> Result<()> {
    let method = Method::new(args.quick);
    let mut report = Report::new(args.json);
    for &pes in &args.pes {
        let start_up = time_start_up(pes, &method)?;
        report.row(&Row::new("spawn", LAYER, 0, pes, &start_up.spawn, None))?;
        report.row(&Row::new(
            "rendezvous",
            LAYER,
            0,
            pes,
            &start_up.rendezvous,
            None,
        ))?;
        let from_env = &start_up.world_from_env;
        report.row(&Row::new("world_from_env", LAYER, 0, pes, from_env, None))?;

        let same_cpu = reference::tcp_loopback_round_trip(&method, Placement::SameCpu)?;
        report.row(&Row::new(
            "tcp_round_trip_same_cpu",
            "reference",
            reference::PING_BYTES,
            pes,
            &same_cpu.timing,
            None,
        ))?;
        let round_trip = reference::tcp_loopback_round_trip(&method, Placement::CrossCpu)?;
        report.row(&Row::new(
            "tcp_round_trip",
            "reference",
            reference::PING_BYTES,
            pes,
            &round_trip.timing,
            None,
        ))?;
        let reference = Some((round_trip.name.as_str(), round_trip.timing.per_op.median_ns));

        let mut pe_args = vec!["pe-control"];
        if args.quick {
            pe_args.push("--quick");
        }
        let job = launch::run_job(pes, &pe_args)
            .with_context(|| format!("control-plane job of {pes} PEs"))?;
        let mut timed: Vec<(Collective, Timing)> = job
            .messages::<PeMessage>()?
            .into_iter()
            .filter_map(|(_, _, message)| match message {
                PeMessage::Timed { op, timing } => Some((op, timing)),
                PeMessage::Ready { .. } => None,
            })
            .collect();
        for op in Collective::ALL {
            let Some(index) = timed.iter().position(|(o, _)| *o == op) else {
                bail!("the job of {pes} PEs reported no timing for {}", op.name());
            };
            let (_, timing) = timed.swap_remove(index);
            report.row(&Row::new(
                op.name(),
                LAYER,
                op.bytes(),
                pes,
                &timing,
                reference,
            ))?;
        }
    }
    Ok(())
}

/// How long a job of N PEs takes to start, over [`Method::launches`] launches.
struct StartUp {
    /// Job start → the driver's last `spawn` returned.
    spawn: Timing,
    /// Job start → the last PE's "ready" line read by the driver: every PE has returned from
    /// `World::from_env`.
    rendezvous: Timing,
    /// The slowest PE's own `World::from_env` call.
    world_from_env: Timing,
}

/// Launches [`Method::launches`] jobs of `pes` PEs that only rendezvous, and times them.
fn time_start_up(pes: usize, method: &Method) -> Result<StartUp> {
    let mut spawn = Vec::with_capacity(method.launches);
    let mut rendezvous = Vec::with_capacity(method.launches);
    let mut world_from_env = Vec::with_capacity(method.launches);
    for launch in 0..method.launches {
        let job = launch::run_job(pes, &["pe-control", "--rendezvous-only"])
            .with_context(|| format!("rendezvous job {launch} of {pes} PEs"))?;
        let mut last_ready = None;
        let mut slowest = 0;
        let mut ready = 0;
        for (rank, at, message) in job.messages::<PeMessage>()? {
            let PeMessage::Ready {
                rank: said,
                from_env_ns,
            } = message
            else {
                bail!("PE {rank} reported a timing in a rendezvous-only job");
            };
            ensure!(said == rank, "PE {rank} reported itself as rank {said}");
            ready += 1;
            last_ready = last_ready.max(Some(at));
            slowest = slowest.max(from_env_ns);
        }
        ensure!(ready == pes, "{ready} of {pes} PEs reported ready");
        let last_ready = last_ready.context("no PE reported ready")?;
        spawn.push(nanos(job.spawned.duration_since(job.started)) as f64);
        rendezvous.push(nanos(last_ready.duration_since(job.started)) as f64);
        world_from_env.push(slowest as f64);
    }
    let per_launch = |samples: &[f64]| -> Result<Timing> {
        Ok(Timing {
            per_op: Summary::of(samples)?,
            batch_ops: 1,
        })
    };
    Ok(StartUp {
        spawn: per_launch(&spawn)?,
        rendezvous: per_launch(&rendezvous)?,
        world_from_env: per_launch(&world_from_env)?,
    })
}

/// A duration in whole nanoseconds (saturating; no run lasts 584 years).
fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}
