//! Data-plane benchmarks of the native runtime ([`Shmem`]): start-up and shutdown, barrier,
//! put/get latency and bandwidth, signal ping-pong, remote fetch-add, collective malloc+free
//! and all-to-all — each next to a reference measured in the same run (memcpy of the same size
//! in the same process, or a raw cache-line ping-pong between the same two processes), its
//! trials interleaved with the operation's ([`time_interleaved`](crate::stats::time_interleaved)): on a VM a cache-line
//! transfer between the two CPUs costs what the host's placement of them costs at the moment
//! (the same or another socket), which changes within a run, so a reference taken a second
//! earlier may belong to another machine.
//!
//! Driver ([`drive`]), for each PE count N:
//! 1. launches [`Method::launches`] jobs of N PEs that only initialize a runtime, allocate once,
//!    free and shut down (`pe-shmem --init-only`), timing job start → the last PE's "allocated"
//!    line (driver clock), the slowest PE's own world + initialize + first allocation (and
//!    each of the three phases), and the slowest PE's `Shmem::shutdown` (see
//!    [`START_UP_ROWS`](start_up::START_UP_ROWS)); a PE that fails or exits non-zero fails the run;
//! 2. launches one job of N PEs (`pe-shmem`) that times the operations; root rank 0 reports.
//!    With N = 2 every operation is timed, otherwise only the barrier.
//!
//! PE ([`run_pe`]): joins the world, initializes a runtime over it, then (unless `--no-pin`)
//! pins its main thread to CPU `rank % CPUs`. Pinning comes *after* `Shmem::initialize`: the
//! runtime decides once, at initialize, whether waits may spin, from the CPUs the process may
//! use, and a thread pinned to one CPU would make it believe it has a single core.
//!
//! Every batch starts after a barrier on the shared heap, and root rank 0's duration is then
//! broadcast over the control plane, so every rank makes the same calibration decisions (see
//! [`together`]). Point-to-point operations are run by rank 0 towards rank 1, timed by
//! rank 0; rank 1 waits in the control-plane broadcast meanwhile (asleep in the kernel).
//!
//! ```text
//! hm-bench shmem --pes 2,4,16 --quick --json
//! perf record -g hm-bench shmem --pes 2 --only pingpong     # profile one pattern
//! ```

mod atomics;
mod collectives;
mod guarded;
mod harness;
mod rma;
mod signals;
mod start_up;

use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use clap::builder::RangedU64ValueParser;
use clap::Args;
use hyper_multicore::shmem::Shmem;
use hyper_multicore::world::World;
use rustix::thread::{sched_getaffinity, sched_setaffinity, CpuSet};
use serde::{Deserialize, Serialize};

use crate::launch::{self, emit};
use crate::report::{Report, Row};
use crate::stats::{Method, Timing};
use guarded::run_pe_lifecycle;
pub(crate) use harness::{nanos, root_duration, together, LineAligned};
use start_up::report_start_up;

/// The layer reported for the runtime's rows.
const LAYER: &str = "shmem";
/// The layer of our rows when the peer is reached through UCX (`--transport ucx`).
const LAYER_UCX: &str = "shmem-ucx";
/// The layer reported for same-run references.
const REFERENCE: &str = "reference";

/// Heap bytes per PE of the full method.
const HEAP_BYTES: u64 = 256 << 20;
/// Heap bytes per PE in `--quick` mode.
const QUICK_HEAP_BYTES: u64 = 64 << 20;

/// Bytes of the collective allocation in the malloc+free row.
const MALLOC_BYTES: usize = 4096;
/// Bytes of one word (put/get latency, signals, atomics).
const WORD_BYTES: usize = 8;

/// Arguments of `hm-bench shmem`.
#[derive(Debug, Args)]
pub struct DriverArgs {
    /// PE counts to run, comma-separated (every operation at 2 PEs, the barrier at others).
    #[arg(long, value_delimiter = ',', default_value = "2,4,8,16,32",
          value_parser = RangedU64ValueParser::<usize>::new().range(1..))]
    pes: Vec<usize>,
    /// Smoke-test mode: ≈ 2 ms batches, 5 trials, a 64 MiB heap (checks it works, not how fast).
    #[arg(long)]
    quick: bool,
    /// One JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
    /// Leave the PEs unpinned (by default PE r runs on CPU r % CPUs once initialized).
    #[arg(long)]
    no_pin: bool,
    /// Run only these groups (for profiling one pattern, e.g. under `perf record`).
    #[arg(long, value_delimiter = ',', value_enum)]
    only: Vec<Group>,
    /// The PEs' HYPER_MULTICORE_SHMEM_TRANSPORT: `ucx` puts every pair on the UCX route (rows
    /// of layer `shmem-ucx`, without the raw shared-memory references; no guarded job).
    #[arg(long, value_parser = ["auto", "shm", "ucx"])]
    transport: Option<String>,
}

/// Groups of rows, for `--only`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Group {
    /// `init`, `init_call`, `init_world`, `init_initialize`, `init_allocate`, `shutdown` (the
    /// start-up launches).
    Init,
    /// `barrier` (and its raw round-trip reference).
    Barrier,
    /// `put_quiet` and `get` of 8 B.
    Latency,
    /// `put_bandwidth` and `get_bandwidth`.
    Bandwidth,
    /// `pingpong_signal` and `pingpong_put_signal` (and on the UCX route `pingpong_atomic_add`:
    /// a plain remote atomic add on the word the peer waits on).
    Pingpong,
    /// `fetch_add`.
    FetchAdd,
    /// `malloc_free`.
    MallocFree,
    /// `all_to_all`.
    AllToAll,
    /// `get_computing_peer` (and its reference `get_waiting_peer`): a get of 8 B from a peer
    /// busy in a compute loop that does not call the runtime (UCX route only: its target's
    /// progress thread must serve the get); and `get_burst_waiting_peer`: a burst of gets from
    /// a peer that fell asleep in a barrier.
    ComputingPeer,
    /// `wake_sleeper_atomic_add` and `wake_sleeper_signal`: a remote atomic add (or a signal)
    /// on the word a peer sleeps on in `wait_signal`, round trip (UCX route only).
    Sleeper,
    /// `put_quiet_guarded`, `get_guarded`, `fetch_add_guarded`: the word operations through
    /// `lifecycle::guarded`, in a job of their own whose runtime comes from
    /// `lifecycle::acquire` (2 PEs only); and the same calls out of line
    /// (`put_quiet_guarded_call`, `get_guarded_call`, `fetch_add_guarded_call`: a front's entry
    /// points, the floor of a C API call).
    Guarded,
}

impl Group {
    /// Its spelling on the command line.
    fn name(self) -> &'static str {
        match self {
            Group::Init => "init",
            Group::Barrier => "barrier",
            Group::Latency => "latency",
            Group::Bandwidth => "bandwidth",
            Group::Pingpong => "pingpong",
            Group::FetchAdd => "fetch-add",
            Group::MallocFree => "malloc-free",
            Group::AllToAll => "all-to-all",
            Group::ComputingPeer => "computing-peer",
            Group::Sleeper => "sleeper",
            Group::Guarded => "guarded",
        }
    }
}

/// Arguments of the hidden `hm-bench pe-shmem`.
#[derive(Debug, Args)]
pub struct PeArgs {
    /// Use the smoke-test method.
    #[arg(long)]
    quick: bool,
    /// Only initialize, allocate once, free and shut down (start-up timing).
    #[arg(long)]
    init_only: bool,
    /// Heap bytes per PE.
    #[arg(long)]
    heap: u64,
    /// Do not pin the main thread.
    #[arg(long)]
    no_pin: bool,
    /// Run only these groups (all if empty).
    #[arg(long, value_delimiter = ',', value_enum)]
    only: Vec<Group>,
    /// Take the runtime from `lifecycle::acquire` and time the guarded word operations.
    #[arg(long)]
    lifecycle: bool,
    /// The transport mode (overrides HYPER_MULTICORE_SHMEM_TRANSPORT).
    #[arg(long)]
    transport: Option<String>,
    /// Root rank 0 prints the driver's rows (the JSON lines of `hm-bench shmem --json`) instead
    /// of messages to a driver: for PEs another launcher started (`bench/run_all.sh` runs them
    /// under one `hmrun --nnodes 2` per host of `bench/namespace_hosts.sh`). Not with the start-up or guarded
    /// jobs, whose messages the driver turns into rows of its own.
    #[arg(long, conflicts_with_all = ["init_only", "lifecycle"])]
    rows: bool,
}

/// What a PE prints, one JSON line each.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
enum PeMessage {
    /// The first allocation returned on this PE (so every PE has initialized).
    Allocated {
        /// The PE's rank.
        rank: usize,
        /// `World::from_env` + `Shmem::initialize` + the first `allocate`, by the PE's clock.
        init_call_ns: u64,
        /// Of which `World::from_env`.
        world_ns: u64,
        /// Of which the unique ID's creation and broadcast and `Shmem::initialize`.
        initialize_ns: u64,
        /// Of which the first `allocate`.
        allocate_ns: u64,
    },
    /// `Shmem::shutdown` returned on this PE.
    ShutDown {
        /// The PE's rank.
        rank: usize,
        /// Its duration.
        shutdown_ns: u64,
    },
    /// Root rank 0's timing of one operation.
    Timed {
        /// The operation.
        op: String,
        /// `shmem` or `reference`.
        layer: String,
        /// Payload bytes.
        bytes: usize,
        /// The timing.
        timing: Timing,
        /// The same-run reference (name, median nanoseconds), if one applies.
        reference: Option<(String, f64)>,
    },
}

/// The driver side: every PE count in turn, rows printed as they are measured.
pub fn drive(args: &DriverArgs) -> Result<()> {
    let method = method(args.quick);
    let heap = if args.quick {
        QUICK_HEAP_BYTES
    } else {
        HEAP_BYTES
    };
    let heap_arg = heap.to_string();
    let mut pe_args = vec!["pe-shmem", "--heap", heap_arg.as_str()];
    if args.quick {
        pe_args.push("--quick");
    }
    if args.no_pin {
        pe_args.push("--no-pin");
    }
    let only: Vec<&str> = args.only.iter().map(|g| g.name()).collect();
    let only = only.join(",");
    if !args.only.is_empty() {
        pe_args.extend(["--only", only.as_str()]);
    }
    if let Some(transport) = &args.transport {
        pe_args.extend(["--transport", transport.as_str()]);
    }
    let forced_ucx = args.transport.as_deref() == Some("ucx");
    let wants = |group| args.only.is_empty() || args.only.contains(&group);
    let mut report = Report::new(args.json);
    for &pes in &args.pes {
        if wants(Group::Init) {
            report_start_up(&mut report, pes, &method, &pe_args)?;
        }
        let native = if pes == 2 {
            args.only.is_empty()
                || args
                    .only
                    .iter()
                    .any(|g| !matches!(g, Group::Init | Group::Guarded))
        } else {
            wants(Group::Barrier)
        };
        if native {
            report_job(&mut report, pes, &pe_args, "data-plane job")?;
        }
        if pes == 2 && wants(Group::Guarded) && !forced_ucx {
            let mut lifecycle_args = pe_args.clone();
            lifecycle_args.push("--lifecycle");
            report_job(&mut report, pes, &lifecycle_args, "guarded job")?;
        }
    }
    Ok(())
}

/// Runs one job of `pes` PEs and reports the rows root rank 0 timed (at least one).
fn report_job(report: &mut Report, pes: usize, pe_args: &[&str], what: &str) -> Result<()> {
    let job = launch::run_job(pes, pe_args).with_context(|| format!("{what} of {pes} PEs"))?;
    let mut timed = 0;
    for (rank, _, message) in job.messages::<PeMessage>()? {
        let PeMessage::Timed {
            op,
            layer,
            bytes,
            timing,
            reference,
        } = message
        else {
            continue;
        };
        ensure!(rank == 0, "PE {rank} reported a timing; only rank 0 should");
        let reference = reference.as_ref().map(|(name, ns)| (name.as_str(), *ns));
        report.row(&Row::new(&op, &layer, bytes, pes, &timing, reference))?;
        timed += 1;
    }
    ensure!(timed > 0, "the {what} of {pes} PEs reported no timing");
    Ok(())
}

/// The method: [`Method::new`], but ≈ 2 ms batches in quick mode.
pub(crate) fn method(quick: bool) -> Method {
    let mut method = Method::new(quick);
    if quick {
        method.batch_target = Duration::from_millis(2);
    }
    method
}

/// The PE side.
pub fn run_pe(args: &PeArgs) -> Result<()> {
    if args.lifecycle {
        return run_pe_lifecycle(args);
    }
    let started = Instant::now();
    let world = World::from_env().context("join the world")?;
    let joined = Instant::now();
    let shmem = initialize_over(&world, args.heap, args.transport.as_deref())
        .context("initialize the runtime")?;
    let initialized = Instant::now();
    let first = shmem
        .allocate::<u8>(MALLOC_BYTES, None)
        .context("the first allocation")?;
    let allocated = Instant::now();
    if args.init_only {
        emit(&PeMessage::Allocated {
            rank: shmem.rank(),
            init_call_ns: nanos(allocated - started),
            world_ns: nanos(joined - started),
            initialize_ns: nanos(initialized - joined),
            allocate_ns: nanos(allocated - initialized),
        })?;
        shmem.free(first).context("free the first allocation")?;
        let rank = shmem.rank();
        let shutdown_started = Instant::now();
        shmem
            .shutdown()
            .map_err(|e| anyhow::anyhow!("shutdown: {e}"))?;
        let shutdown_ns = nanos(shutdown_started.elapsed());
        return emit(&PeMessage::ShutDown { rank, shutdown_ns });
    }
    shmem.free(first).context("free the first allocation")?;
    let cpus = allowed_cpus()?;
    if !args.no_pin {
        pin_main_thread(shmem.rank(), &cpus)?;
    }
    let remote = shmem
        .debug_state()
        .transport
        .is_some_and(|t| t.routes.iter().any(|route| route != "shm"));
    let bench = Bench {
        shmem: &shmem,
        method: method(args.quick),
        only: args.only.clone(),
        remote,
        cores: cpus.len(),
        rows: args.rows,
    };
    bench
        .run()
        .with_context(|| format!("benchmarks on rank {}", shmem.rank()))?;
    shmem
        .shutdown()
        .map_err(|e| anyhow::anyhow!("shutdown: {e}"))?;
    world.control().barrier().context("leave the job")
}

/// Initializes a runtime over every rank of `world` (collective): root rank 0 creates the
/// unique ID and the world's control plane carries it to the others. `transport` overrides
/// HYPER_MULTICORE_SHMEM_TRANSPORT.
pub(crate) fn initialize_over(world: &World, heap: u64, transport: Option<&str>) -> Result<Shmem> {
    let mut config = hyper_multicore::config::Config::from_env()?;
    if let Some(transport) = transport {
        config.transport =
            hyper_multicore::config::parse_transport(transport).map_err(anyhow::Error::msg)?;
    }
    Ok(Shmem::initialize_over(world, config, Some(heap))?)
}

/// The CPUs this process may use (before any pinning).
pub(crate) fn allowed_cpus() -> Result<Vec<usize>> {
    let allowed = sched_getaffinity(None).context("read the CPU affinity")?;
    let cpus: Vec<usize> = (0..CpuSet::MAX_CPU)
        .filter(|&cpu| allowed.is_set(cpu))
        .collect();
    ensure!(!cpus.is_empty(), "this process may run on no CPU");
    Ok(cpus)
}

/// Pins the calling thread to CPU `rank % n` of the `n` CPUs `cpus`.
pub(crate) fn pin_main_thread(rank: usize, cpus: &[usize]) -> Result<()> {
    let cpu = cpus[rank % cpus.len()];
    let mut set = CpuSet::new();
    set.set(cpu);
    sched_setaffinity(None, &set).with_context(|| format!("pin rank {rank} to cpu {cpu}"))
}

/// One PE's benchmarks.
struct Bench<'a> {
    /// The runtime.
    shmem: &'a Shmem,
    /// How long and how often.
    method: Method,
    /// The groups to run (all if empty).
    only: Vec<Group>,
    /// True when some PE is on the UCX route (the same on every rank; no raw shared-memory
    /// references then).
    remote: bool,
    /// How many CPUs the PEs are spread over (PE r on CPU r % cores).
    cores: usize,
    /// Root rank 0 prints rows, not driver messages (see [`PeArgs`]).
    rows: bool,
}

/// The other PE of a 2-PE job.
const PEER: usize = 1;

impl<'s> Bench<'s> {
    /// Runs every benchmark for this job's size, root rank 0 reporting.
    fn run(&self) -> Result<()> {
        let shmem = self.shmem;
        if shmem.size() != 2 {
            if self.wants(Group::Barrier) {
                self.barrier_of_many()?;
            }
            return Ok(shmem.barrier()?);
        }
        if self.wants(Group::Barrier) {
            self.barrier()?;
        }
        if self.wants(Group::Latency) {
            self.word_latency()?;
        }
        if self.wants(Group::Bandwidth) {
            self.bandwidth()?;
        }
        if self.wants(Group::Pingpong) {
            self.ping_pong()?;
        }
        if self.wants(Group::FetchAdd) {
            self.fetch_add()?;
        }
        if self.wants(Group::MallocFree) {
            let malloc_free = self.time_together(|ops| {
                self.repeat(ops, || {
                    let block = shmem.allocate::<u8>(MALLOC_BYTES, None)?;
                    Ok(shmem.free(block)?)
                })
            })?;
            self.report("malloc_free", LAYER, MALLOC_BYTES, malloc_free, None)?;
        }
        if self.wants(Group::AllToAll) {
            self.all_to_all()?;
        }
        if self.remote && self.wants(Group::ComputingPeer) {
            self.computing_peer()?;
        }
        if self.remote && self.wants(Group::Sleeper) {
            self.wake_sleeper()?;
        }
        Ok(shmem.barrier()?)
    }

    /// Whether `group` is to run.
    fn wants(&self, group: Group) -> bool {
        self.only.is_empty() || self.only.contains(&group)
    }
}
