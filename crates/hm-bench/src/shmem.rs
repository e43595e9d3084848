//! Data-plane benchmarks of the native runtime ([`Shmem`]): start-up and shutdown, barrier,
//! put/get latency and bandwidth, signal ping-pong, remote fetch-add, collective malloc+free
//! and all-to-all — each next to a reference measured in the same run (memcpy of the same size
//! in the same process, or a raw cache-line ping-pong between the same two processes), its
//! trials interleaved with the operation's ([`time_interleaved`]): on these VMs a cache-line
//! transfer between the two CPUs costs 30 ns or 250 ns depending on where the host runs them
//! at the moment, so a reference taken a second earlier may belong to another machine.
//!
//! Driver ([`drive`]), for each PE count N:
//! 1. launches [`Method::launches`] jobs of N PEs that only initialize a runtime, allocate once,
//!    free and shut down (`pe-shmem --init-only`), timing job start → the last PE's "allocated"
//!    line (driver clock), the slowest PE's own world + initialize + first allocation (and
//!    each of the three phases), and the slowest PE's `Shmem::shutdown` (see
//!    [`START_UP_ROWS`]); a PE that fails or exits non-zero fails the run;
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

use std::hint::black_box;
use std::sync::atomic::{fence, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use clap::builder::RangedU64ValueParser;
use clap::Args;
use hyper_multicore::control::UniqueId;
use hyper_multicore::lifecycle;
use hyper_multicore::shmem::{Allocation, Comparison, Shmem, SignalOp};
use hyper_multicore::world::World;
use rustix::thread::{sched_getaffinity, sched_setaffinity, CpuSet};
use serde::{Deserialize, Serialize};

use crate::launch::{self, emit};
use crate::report::{Report, Row};
use crate::shared_word::{futex_pass, futex_until, shared_word, shared_word32, spin_until};
use crate::stats::{time_batches, time_interleaved, Batch, Method, Summary, Timing};

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

/// Transfer sizes of the bandwidth rows.
const BANDWIDTH_BYTES: [usize; 3] = [64 << 10, 1 << 20, 16 << 20];
/// Bytes each PE sends each other PE in the all-to-all row.
const ALL_TO_ALL_BLOCK: usize = 1 << 20;
/// Bytes of the collective allocation in the malloc+free row.
const MALLOC_BYTES: usize = 4096;
/// Bytes of one word (put/get latency, signals, atomics).
const WORD_BYTES: usize = 8;
/// How long PE 1 computes, without calling the runtime, in each sample of the
/// `get_computing_peer` row: a get that waited for the target to call the runtime again would
/// take about this long.
const COMPUTE_WINDOW: Duration = Duration::from_millis(20);
/// How long PE 0 computes before the burst of the `get_burst_waiting_peer` row: past the spin
/// window (0.2 ms) of PE 1's wait in the barrier, so PE 1 sleeps when the burst starts.
const ASLEEP_WINDOW: Duration = Duration::from_millis(2);
/// Gets per sample of the `get_burst_waiting_peer` row.
const BURST_GETS: u32 = 200;
/// How long PE 0 computes before it wakes PE 1 in the `wake_sleeper_*` rows: past the waiter's
/// spin and yield phases (64 `sched_yield`s lasted over 5 ms on the shared 2-core VM), so it
/// sleeps on its futex in slices of 20 ms when the update comes.
const SLEEPER_DELAY: Duration = Duration::from_millis(50);

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

/// Launches the start-up jobs of `pes` PEs and reports their rows ([`START_UP_ROWS`]).
fn report_start_up(
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

/// The method: [`Method::new`], but ≈ 2 ms batches in quick mode.
pub(crate) fn method(quick: bool) -> Method {
    let mut method = Method::new(quick);
    if quick {
        method.batch_target = Duration::from_millis(2);
    }
    method
}

/// The start-up rows, one sample per launch each:
/// - `init`: job start → the last PE's "allocated" line read by the driver (every PE has
///   initialized and made its first allocation);
/// - `init_call`: the slowest PE's own world + initialize + first allocation;
/// - `init_world`, `init_initialize`, `init_allocate`: the slowest PE's `World::from_env`, its
///   unique-ID broadcast + `Shmem::initialize`, its first `allocate` (the slowest PE of each
///   phase, not necessarily the same PE);
/// - `shutdown`: the slowest PE's `Shmem::shutdown`.
const START_UP_ROWS: [&str; 6] = [
    "init",
    "init_call",
    "init_world",
    "init_initialize",
    "init_allocate",
    "shutdown",
];

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

/// The PE side of the guarded job: the runtime comes from `lifecycle::acquire` (over the whole
/// world) and every call goes through `lifecycle::guarded` from outside any other guarded call,
/// as a front makes them (see [`guarded_word_ops`]).
fn run_pe_lifecycle(args: &PeArgs) -> Result<()> {
    lifecycle::acquire(None, Some(args.heap)).context("acquire the runtime")?;
    let rank = lifecycle::guarded("my_pe", |shmem| Ok(shmem.rank()))?;
    if !args.no_pin {
        pin_main_thread(rank, &allowed_cpus()?)?;
    }
    guarded_word_ops(&method(args.quick), rank)
        .with_context(|| format!("guarded benchmarks on rank {rank}"))?;
    lifecycle::release().context("release the runtime")
}

/// Put 8 B + quiet, get 8 B and fetch-add on the peer's word, each call through its own
/// `lifecycle::guarded` (one guard per API call, none nested: a front calling them one by one),
/// interleaved with the same calls made directly inside one guarded call per batch (the
/// reference: the guard's cost).
fn guarded_word_ops(method: &Method, rank: usize) -> Result<()> {
    let (word, counter) = lifecycle::guarded("allocate", |s| {
        let word = s.allocate::<u64>(1, None)?;
        let counter = s.allocate::<u64>(1, None)?;
        s.put(&word, &[0], s.rank())?;
        s.atomic_set(&counter, 0, s.rank())?;
        s.barrier()?;
        Ok((word, counter))
    })?;
    // Each row writes its call out, as a program would (a helper closure shared by the rows
    // is compiled once, out of line, and then called from every row's loop).
    let root = rank == 0;
    let mut batches = vec![
        direct_on_root(root, |s, ops| {
            for i in 0..ops {
                s.put(&word, &[black_box(i)], PEER)?;
                s.quiet();
            }
            Ok(())
        }),
        guarded_on_root(root, |ops| {
            let start = Instant::now();
            for i in 0..ops {
                lifecycle::guarded("put", |s| s.put(&word, &[black_box(i)], PEER))?;
                lifecycle::quiet()?;
            }
            Ok(start.elapsed())
        }),
        direct_on_root(root, |s, ops| {
            let mut value = [0u64];
            for _ in 0..ops {
                s.get(&mut value, &word, PEER)?;
                black_box(&mut value);
            }
            Ok(())
        }),
        guarded_on_root(root, |ops| {
            let mut value = [0u64];
            let start = Instant::now();
            for _ in 0..ops {
                lifecycle::guarded("get", |s| s.get(&mut value, &word, PEER))?;
                black_box(&mut value);
            }
            Ok(start.elapsed())
        }),
        direct_on_root(root, |s, ops| {
            for _ in 0..ops {
                black_box(s.atomic_fetch_add(&counter, 1u64, PEER)?);
            }
            Ok(())
        }),
        guarded_on_root(root, |ops| {
            let start = Instant::now();
            for _ in 0..ops {
                black_box(lifecycle::guarded("atomic_fetch_add", |s| {
                    s.atomic_fetch_add(&counter, 1u64, PEER)
                })?);
            }
            Ok(start.elapsed())
        }),
        // The same guarded calls as a front's entry points make them: each an out-of-line
        // function whose handle and PE arrive as arguments, so nothing of the call can be
        // hoisted out of the loop (what a C API call, behind its library boundary, pays).
        guarded_on_root(root, |ops| {
            let start = Instant::now();
            for i in 0..ops {
                put_call(black_box(&word), black_box(i), black_box(PEER))?;
                quiet_call()?;
            }
            Ok(start.elapsed())
        }),
        guarded_on_root(root, |ops| {
            let start = Instant::now();
            for _ in 0..ops {
                black_box(get_call(black_box(&word), black_box(PEER))?);
            }
            Ok(start.elapsed())
        }),
        guarded_on_root(root, |ops| {
            let start = Instant::now();
            for _ in 0..ops {
                black_box(fetch_add_call(black_box(&counter), black_box(PEER))?);
            }
            Ok(start.elapsed())
        }),
    ];
    let timings = time_interleaved(method, &mut batches)?;
    drop(batches);
    let [put, put_guarded, get, get_guarded, fetch_add, fetch_add_guarded, put_call, get_call, fetch_add_call] =
        timings[..]
    else {
        unreachable!("nine batches were timed")
    };
    if root {
        let rows = [
            (
                "put_quiet_guarded",
                put_guarded,
                "put_quiet without the guard",
                put,
            ),
            ("get_guarded", get_guarded, "get without the guard", get),
            (
                "fetch_add_guarded",
                fetch_add_guarded,
                "fetch_add without the guard",
                fetch_add,
            ),
            (
                "put_quiet_guarded_call",
                put_call,
                "put_quiet_guarded, inlined",
                put_guarded,
            ),
            (
                "get_guarded_call",
                get_call,
                "get_guarded, inlined",
                get_guarded,
            ),
            (
                "fetch_add_guarded_call",
                fetch_add_call,
                "fetch_add_guarded, inlined",
                fetch_add_guarded,
            ),
        ];
        for (op, timing, reference, direct) in rows {
            emit(&PeMessage::Timed {
                op: op.to_string(),
                layer: LAYER.to_string(),
                bytes: WORD_BYTES,
                timing,
                reference: Some((reference.to_string(), direct.per_op.median_ns)),
            })?;
        }
    }
    Ok(lifecycle::guarded("free", |s| {
        s.barrier()?;
        s.free(counter)?;
        s.free(word)
    })?)
}

/// A guarded put of `value` into the peer's `word`, out of line (see [`guarded_word_ops`]).
#[inline(never)]
fn put_call(word: &Allocation<u64>, value: u64, pe: usize) -> hyper_multicore::Result<()> {
    lifecycle::guarded("put", |s| s.put(word, &[value], pe))
}

/// [`lifecycle::quiet`], out of line (see [`guarded_word_ops`]).
#[inline(never)]
fn quiet_call() -> hyper_multicore::Result<()> {
    lifecycle::quiet()
}

/// A guarded get of PE `pe`'s `word`, out of line (see [`guarded_word_ops`]).
#[inline(never)]
fn get_call(word: &Allocation<u64>, pe: usize) -> hyper_multicore::Result<u64> {
    let mut value = [0u64];
    lifecycle::guarded("get", |s| s.get(&mut value, word, pe))?;
    Ok(value[0])
}

/// A guarded fetch-add of 1 on PE `pe`'s `counter`, out of line (see [`guarded_word_ops`]).
#[inline(never)]
fn fetch_add_call(counter: &Allocation<u64>, pe: usize) -> hyper_multicore::Result<u64> {
    lifecycle::guarded("atomic_fetch_add", |s| {
        s.atomic_fetch_add(counter, 1u64, pe)
    })
}

/// A batch of direct calls (`batch(shmem, ops)`) inside one guarded call, as
/// [`guarded_on_root`] runs it.
fn direct_on_root<'b>(
    root: bool,
    batch: impl Fn(&Shmem, u64) -> hyper_multicore::Result<()> + 'b,
) -> Batch<'b> {
    guarded_on_root(root, move |ops| {
        Ok(lifecycle::guarded("batch", |s| {
            let start = Instant::now();
            batch(s, ops)?;
            Ok(start.elapsed())
        })?)
    })
}

/// [`together`] for the guarded job, where no `&Shmem` outlives a guarded call: each call of
/// the batch starts right after a barrier, and root rank 0's duration is broadcast, each
/// through `lifecycle::guarded`; only root rank 0 runs `batch` (the others wait).
fn guarded_on_root<'b>(
    root: bool,
    mut batch: impl FnMut(u64) -> Result<Duration> + 'b,
) -> Batch<'b> {
    Box::new(move |ops| {
        lifecycle::guarded("barrier", |s| s.barrier())?;
        let took = if root { nanos(batch(ops)?) } else { 0 };
        let root_took =
            lifecycle::guarded("broadcast", |s| s.control().broadcast(&took.to_le_bytes()))?;
        root_duration(root_took)
    })
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
    let (bytes, listener) = if world.rank() == 0 {
        let (id, listener) = Shmem::get_unique_id(world.config())?;
        (world.control().broadcast(&id.to_bytes())?, Some(listener))
    } else {
        (world.control().broadcast(&[])?, None)
    };
    let id = UniqueId::from_bytes(&bytes)?;
    Ok(Shmem::initialize_with(
        config,
        world.rank(),
        world.size(),
        &id,
        listener,
        Some(heap),
    )?)
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

    /// The barrier of 2 PEs, interleaved with a raw cache-line round trip between them.
    fn barrier(&self) -> Result<()> {
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
    fn barrier_of_many(&self) -> Result<()> {
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

    /// Put 8 B + quiet and get 8 B towards the peer, interleaved with the raw store+fence and
    /// load on the same word (context, no bar ratio).
    fn word_latency(&self) -> Result<()> {
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
    /// as `malloc` gives, made a 64 KiB `rep movsb` copy up to ≈ 30 % slower on this CPU).
    fn bandwidth(&self) -> Result<()> {
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

    /// One-way signal ping-pong (signal, and put_signal of 8 B) between PEs 0 and 1,
    /// interleaved with a raw cache-line ping-pong between the same two processes on a pair of
    /// symmetric words (the reference: PE 0 spins on one, PE 1 on the other), and for context
    /// on one word (each PE spins on its copy: the two lines then sit at the same offset of
    /// the two heaps, as a signal word's copies do).
    fn ping_pong(&self) -> Result<()> {
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

    /// Remote fetch-add on the peer's word, interleaved with the raw `lock xadd` on the same
    /// word (context, no bar ratio).
    fn fetch_add(&self) -> Result<()> {
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

    /// All-to-all of [`ALL_TO_ALL_BLOCK`] per pair, interleaved with two memcpys of a block by
    /// PE 0 alone (what each PE copies, same working set: the reference) and by both PEs at
    /// once (context).
    fn all_to_all(&self) -> Result<()> {
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

    /// Get 8 B from a peer that computes: per sample, PE 1 signals PE 0 and then computes for
    /// [`COMPUTE_WINDOW`] without calling the runtime, while PE 0 times one get from it (the
    /// target's progress thread must serve it; without one it would take about the window).
    /// Interleaved with the reference: the same get while PE 1 waits in a barrier. One get per
    /// sample, so each sample is one call's latency (no batch). Then `get_burst_waiting_peer`:
    /// per sample, PE 0 computes for [`ASLEEP_WINDOW`] while PE 1 waits in a barrier (and falls
    /// asleep there), then times [`BURST_GETS`] gets in a row from it (per get): whether the
    /// waiting PE goes back to serving a burst itself or leaves every get to its progress thread.
    fn computing_peer(&self) -> Result<()> {
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

    /// Waking a peer asleep in `wait_signal`: per sample, PE 0 computes for [`SLEEPER_DELAY`]
    /// (PE 1, waiting meanwhile, is past its spin and yield phases and asleep on its futex),
    /// then updates PE 1's word — with a plain `atomic_add` (only PE 1's progress hook rings
    /// its doorbell) or with `signal` (which sends a doorbell message too) — and waits for PE 1
    /// to answer the same way on PE 0's word (PE 0 is awake then). One sample is that round
    /// trip, timed by PE 0.
    fn wake_sleeper(&self) -> Result<()> {
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
    fn raw_round_trip<'b>(&'b self, words: [&'b Allocation<u64>; 2]) -> Result<Batch<'b>> {
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

    /// Calls `op` `ops` times on this PE; the batch's duration.
    fn repeat(&self, ops: u64, mut op: impl FnMut() -> Result<()>) -> Result<Duration> {
        let start = Instant::now();
        for _ in 0..ops {
            op()?;
        }
        Ok(start.elapsed())
    }

    /// `batch` as every rank runs it: see [`together`].
    fn together<'b>(&'b self, batch: impl FnMut(u64) -> Result<Duration> + 'b) -> Batch<'b> {
        together(self.shmem, batch)
    }

    /// [`Bench::together`] where only root rank 0 runs `batch` (the others wait).
    fn on_root<'b>(&'b self, mut batch: impl FnMut(u64) -> Result<Duration> + 'b) -> Batch<'b> {
        let root = self.shmem.rank() == 0;
        self.together(move |ops| if root { batch(ops) } else { Ok(Duration::ZERO) })
    }

    /// Times one batch made by [`Bench::together`].
    fn time_together(&self, batch: impl FnMut(u64) -> Result<Duration>) -> Result<Timing> {
        time_batches(&self.method, together(self.shmem, batch))
    }

    /// Times batches made by [`Bench::together`] / [`Bench::on_root`], interleaved.
    fn time(&self, mut batches: Vec<Batch<'_>>) -> Result<Vec<Timing>> {
        time_interleaved(&self.method, &mut batches)
    }

    /// Root rank 0 prints a row (the other ranks measured along but print nothing).
    fn report(
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
fn single_calls(samples_ns: &[f64]) -> Result<Timing> {
    Ok(Timing {
        per_op: Summary::of(samples_ns)?,
        batch_ops: 1,
    })
}

/// Half of each trial: one way of a round trip.
fn half(timing: Timing) -> Timing {
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
fn compute_for(window: Duration) {
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
