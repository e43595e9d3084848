//! Benchmarks that mirror how real programs call the runtime (issue 40), through the Rust API:
//! the local side of a put or get in the symmetric heap as well as in private memory, the
//! peer waiting in a barrier on the heap (not asleep in the control plane), windows of puts,
//! and every collective of the Rust API at the sizes and PE counts programs use.
//! `bench/oshmem/oshmem_bench.c --programs` measures the same patterns through the OpenSHMEM C
//! API (built with `hmcc`) and Open MPI's OSHMEM (built with `oshcc`), with the same row names
//! where the call is the same.
//!
//! Rows, each next to a reference measured in the same job and interleaved with it:
//! - `rma` (2 PEs): `put_private`, `put_heap` (put + quiet from PE 0 to PE 1, the source a
//!   private buffer or PE 0's copy of a symmetric allocation) and `get_private`, `get_heap` (the
//!   landing buffer likewise), 1 B to 16 MiB in powers of 4; reference `memcpy` of the same
//!   size.
//! - `message-rate` (2 PEs): `put_rate_private`, `put_rate_heap`: windows of
//!   [`RATE_WINDOW`] puts then one quiet, 8 B and 4 KiB, reported per put; reference
//!   `memcpy_rate`, one memcpy of the same size.
//! - `waiting-peer` (2 PEs): `memcpy_waiting_peer`, PE 0's memcpy of 1 MiB while PE 1 waits in
//!   `Shmem::barrier`; reference `memcpy_peer_asleep`, the same while PE 1 sleeps in the
//!   control plane (blocked in the kernel).
//! - `collectives` (any PE count): `broadcast` (root 0), `all_gather`, `all_to_all`,
//!   `all_reduce_{sum,min,max}_f64`, `all_reduce_sum_i64` at 8 B, 4 KiB, 64 KiB, 1 MiB and
//!   16 MiB — the message for broadcast, per PE for all_gather, per pair for all_to_all, the
//!   vector for the reductions; reference `memcpy_x<D>`: PE 0 alone copying that size into D
//!   distinct private destinations, D the blocks the operation writes per PE (N for
//!   broadcast, all_gather and all_to_all, 1 for the reductions). Each operation is checked
//!   once per size before it is timed.
//!
//! In the point-to-point rows PE 1 waits in `Shmem::barrier` while PE 0 works
//! ([`Programs::waiting_on_root`]); in every reference PE 0 copies alone while the other PEs
//! sleep in the control plane ([`Programs::asleep_on_root`]). The calibration aims at the batch
//! target instead of doubling towards it, and groups of long calls (16 MiB on 8 PEs sharing 2
//! cores) get fewer trials ([`TRIAL_BUDGET`], [`time_interleaved_within`]), so that the whole
//! matrix runs in minutes.
//!
//! ```text
//! hm-bench programs --json                          # 2, 4, 8 PEs; every group
//! hm-bench programs --pes 2 --max-bytes 65536       # a short look
//! hm-bench programs --quick --no-pin --json --pes 2,4   # the smoke test's run
//! ```

use std::hint::black_box;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use clap::builder::RangedU64ValueParser;
use clap::Args;
use hyper_multicore::shmem::{ReduceOp, Shmem, View};
use hyper_multicore::world::World;
use serde::{Deserialize, Serialize};

use crate::launch::{self, emit};
use crate::report::{Report, Row};
use crate::shmem::{
    allowed_cpus, initialize_over, method, nanos, pin_main_thread, root_duration, together,
    LineAligned,
};
use crate::stats::{time_interleaved_within, Batch, Method, Summary, Timing};

/// The layer of our rows.
const LAYER: &str = "shmem";
/// The layer of same-run references.
const REFERENCE: &str = "reference";

/// The largest put or get of the `rma` rows (sizes 1, 4, 16, … bytes up to it).
const RMA_LARGEST: usize = 16 << 20;
/// Puts per window (one quiet after them) in the `message-rate` rows.
const RATE_WINDOW: u64 = 64;
/// Sizes of the `message-rate` rows.
const RATE_BYTES: [usize; 2] = [8, 4096];
/// Bytes PE 0 copies in the `waiting-peer` row.
const WAITING_BYTES: usize = 1 << 20;
/// Sizes of the collectives.
const COLLECTIVE_BYTES: [usize; 5] = [8, 4 << 10, 64 << 10, 1 << 20, 16 << 20];
/// The largest collective in `--quick` mode (every operation still runs).
const QUICK_COLLECTIVE_LARGEST: usize = 64 << 10;
/// When every trial of a group would make the group's trials last longer than this, only as
/// many as fit, but at least [`crate::stats::MIN_TRIALS`].
const TRIAL_BUDGET: Duration = Duration::from_secs(5);
/// Trials per row in `--quick` mode.
const QUICK_TRIALS: usize = 3;
/// Longest one job (one PE count, every group) may run.
const WATCHDOG: Duration = Duration::from_secs(900);
/// Heap beyond the buffers: allocator alignment and the runtime's own allocations.
const HEAP_SLACK: usize = 64 << 20;

/// Arguments of `hm-bench programs`.
#[derive(Debug, Args)]
pub struct DriverArgs {
    /// PE counts to run, comma-separated (the point-to-point groups at 2 PEs only).
    #[arg(long, value_delimiter = ',', default_value = "2,4,8",
          value_parser = RangedU64ValueParser::<usize>::new().range(2..))]
    pes: Vec<usize>,
    /// Smoke-test mode: ≈ 2 ms batches, 3 trials, transfers up to 64 KiB (checks it works,
    /// not how fast).
    #[arg(long)]
    quick: bool,
    /// One JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
    /// Leave the PEs unpinned (by default PE r runs on CPU r % CPUs once initialized).
    #[arg(long)]
    no_pin: bool,
    /// Run only these groups.
    #[arg(long, value_delimiter = ',', value_enum)]
    only: Vec<Group>,
    /// Largest transfer of the `rma` rows and largest collective (default 16 MiB, 64 KiB with
    /// `--quick`).
    #[arg(long, value_parser = RangedU64ValueParser::<usize>::new().range(1..))]
    max_bytes: Option<usize>,
}

/// Groups of rows, for `--only`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Group {
    /// `put_private`, `put_heap`, `get_private`, `get_heap`, 1 B … 16 MiB (2 PEs).
    Rma,
    /// `put_rate_private`, `put_rate_heap`: windows of 64 puts, 8 B and 4 KiB (2 PEs).
    MessageRate,
    /// `memcpy_waiting_peer`: PE 0's memcpy while PE 1 waits in a barrier (2 PEs).
    WaitingPeer,
    /// The Rust API's collectives at every size.
    Collectives,
}

impl Group {
    /// Its spelling on the command line.
    fn name(self) -> &'static str {
        match self {
            Group::Rma => "rma",
            Group::MessageRate => "message-rate",
            Group::WaitingPeer => "waiting-peer",
            Group::Collectives => "collectives",
        }
    }

    /// Whether it runs only in a job of 2 PEs.
    fn two_pes_only(self) -> bool {
        !matches!(self, Group::Collectives)
    }
}

/// Every group, in the order they run.
const GROUPS: [Group; 4] = [
    Group::Rma,
    Group::MessageRate,
    Group::WaitingPeer,
    Group::Collectives,
];

/// Arguments of the hidden `hm-bench pe-programs`.
#[derive(Debug, Args)]
pub struct PeArgs {
    /// Use the smoke-test method.
    #[arg(long)]
    quick: bool,
    /// Heap bytes per PE.
    #[arg(long)]
    heap: u64,
    /// Do not pin the main thread.
    #[arg(long)]
    no_pin: bool,
    /// The groups to run.
    #[arg(long, value_delimiter = ',', value_enum, required = true)]
    only: Vec<Group>,
    /// Largest transfer (see [`DriverArgs`]).
    #[arg(long)]
    max_bytes: usize,
}

/// Root rank 0's timing of one row, one JSON line on its stdout.
#[derive(Debug, Serialize, Deserialize)]
struct Timed {
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
}

/// The driver side: one job per PE count, rows printed as they arrive.
pub fn drive(args: &DriverArgs) -> Result<()> {
    let largest = args.max_bytes.unwrap_or(if args.quick {
        QUICK_COLLECTIVE_LARGEST
    } else {
        COLLECTIVE_BYTES[COLLECTIVE_BYTES.len() - 1]
    });
    let mut report = Report::new(args.json);
    for &pes in &args.pes {
        let groups: Vec<Group> = GROUPS
            .into_iter()
            .filter(|g| args.only.is_empty() || args.only.contains(g))
            .filter(|g| pes == 2 || !g.two_pes_only())
            .collect();
        if groups.is_empty() {
            continue;
        }
        let heap = heap_bytes(pes, largest, &groups)?.to_string();
        let largest = largest.to_string();
        let only = groups
            .iter()
            .map(|g| g.name())
            .collect::<Vec<_>>()
            .join(",");
        let mut pe_args = vec![
            "pe-programs",
            "--heap",
            heap.as_str(),
            "--max-bytes",
            largest.as_str(),
            "--only",
            only.as_str(),
        ];
        if args.quick {
            pe_args.push("--quick");
        }
        if args.no_pin {
            pe_args.push("--no-pin");
        }
        let job = launch::run_job_within(pes, &pe_args, WATCHDOG)
            .with_context(|| format!("programs job of {pes} PEs"))?;
        let mut timed = 0;
        for (rank, _, message) in job.messages::<Timed>()? {
            ensure!(rank == 0, "PE {rank} reported a timing; only rank 0 should");
            let reference = message
                .reference
                .as_ref()
                .map(|(name, ns)| (name.as_str(), *ns));
            report.row(&Row::new(
                &message.op,
                &message.layer,
                message.bytes,
                pes,
                &message.timing,
                reference,
            ))?;
            timed += 1;
        }
        ensure!(
            timed > 0,
            "the programs job of {pes} PEs reported no timing"
        );
    }
    Ok(())
}

/// The heap each PE needs for `groups` at `pes` PEs with transfers up to `largest` bytes:
/// the all_gather/all_to_all target (`pes × largest`), the broadcast target and the four
/// reduction vectors, the three buffers of the `rma` rows, and slack.
fn heap_bytes(pes: usize, largest: usize, groups: &[Group]) -> Result<usize> {
    let collectives = if groups.contains(&Group::Collectives) {
        pes.checked_add(5).and_then(|n| n.checked_mul(largest))
    } else {
        Some(0)
    };
    let point_to_point = if groups.iter().any(|g| g.two_pes_only()) {
        3 * RMA_LARGEST.min(largest)
    } else {
        0
    };
    collectives
        .and_then(|c| c.checked_add(point_to_point + HEAP_SLACK))
        .context("the heap for these collectives overflows")
}

/// The method: [`method`] (≈ 2 ms batches in quick mode), with 3 trials in quick mode (these
/// jobs have many rows; quick mode only checks that they work).
fn programs_method(quick: bool) -> Method {
    let mut method = method(quick);
    if quick {
        method.trials = QUICK_TRIALS;
    }
    method
}

/// The PE side.
pub fn run_pe(args: &PeArgs) -> Result<()> {
    let world = World::from_env().context("join the world")?;
    let shmem = initialize_over(&world, args.heap, None).context("initialize the runtime")?;
    if !args.no_pin {
        pin_main_thread(shmem.rank(), &allowed_cpus()?)?;
    }
    let programs = Programs {
        shmem: &shmem,
        method: programs_method(args.quick),
        budget: TRIAL_BUDGET,
        only: args.only.clone(),
        max_bytes: args.max_bytes,
    };
    programs
        .run()
        .with_context(|| format!("programs benchmarks on rank {}", shmem.rank()))?;
    shmem
        .shutdown()
        .map_err(|e| anyhow::anyhow!("shutdown: {e}"))?;
    world.control().barrier().context("leave the job")
}

/// One PE's benchmarks.
struct Programs<'a> {
    /// The runtime.
    shmem: &'a Shmem,
    /// How long and how often.
    method: Method,
    /// The trial budget of a group of interleaved batches.
    budget: Duration,
    /// The groups to run.
    only: Vec<Group>,
    /// Largest transfer.
    max_bytes: usize,
}

/// The other PE of a 2-PE job.
const PEER: usize = 1;

impl Programs<'_> {
    /// Runs the groups asked for, root rank 0 reporting.
    fn run(&self) -> Result<()> {
        let two = self.shmem.size() == 2;
        let wants = |group| self.only.contains(&group) && (two || !Group::two_pes_only(group));
        if wants(Group::Rma) {
            self.rma()?;
        }
        if wants(Group::MessageRate) {
            self.message_rate()?;
        }
        if wants(Group::WaitingPeer) {
            self.waiting_peer()?;
        }
        if wants(Group::Collectives) {
            self.collectives()?;
        }
        Ok(self.shmem.barrier()?)
    }

    /// Put + quiet and get, 1 B … 16 MiB, the local side private or in the heap, next to memcpy
    /// of the same size.
    fn rma(&self) -> Result<()> {
        let shmem = self.shmem;
        let sizes: Vec<usize> = std::iter::successors(Some(1usize), |b| b.checked_mul(4))
            .take_while(|&b| b <= RMA_LARGEST.min(self.max_bytes))
            .collect();
        let Some(&largest) = sizes.last() else {
            return Ok(());
        };
        let remote = shmem.allocate::<u8>(largest, None)?;
        // The heap rows' local side: this PE's own copy of a symmetric allocation, moved with
        // `put_from` / `get_into` (heap to heap, no slice over the heap), as a program does.
        let heap_source = shmem.allocate::<u8>(largest, None)?;
        let heap_landing = shmem.allocate::<u8>(largest, None)?;
        let mut source = LineAligned::new(largest, 0);
        fill_pattern(source.bytes_mut(), 0);
        let mut landing = LineAligned::new(largest, 0xa5);
        let mut copy = LineAligned::new(largest, 0x5a);
        let me = shmem.rank();
        shmem.put(&heap_source, source.bytes(), me)?;
        shmem.put(&heap_landing, landing.bytes(), me)?;
        // Touch every page of the target on every PE (a fresh page is faulted in on first use).
        shmem.put(&remote, copy.bytes(), me)?;
        shmem.barrier()?;
        let source = source.bytes();
        if me == 0 {
            for what in ["heap", "private"] {
                match what {
                    "heap" => shmem.put_from(&remote, &heap_source, PEER)?,
                    _ => shmem.put(&remote, source, PEER)?,
                }
                shmem.quiet();
                shmem.get(landing.bytes_mut(), &remote, PEER)?;
                ensure!(
                    landing.bytes() == source,
                    "put from a {what} source, then get: other bytes came back"
                );
                landing.bytes_mut().fill(0xa5);
            }
            shmem.get_into(&heap_landing, &remote, PEER)?;
            shmem.get(landing.bytes_mut(), &heap_landing, me)?;
            ensure!(
                landing.bytes() == source,
                "get into the heap: other bytes came back"
            );
        }
        shmem.barrier()?;
        let reference = "memcpy of the same size, PE 1 asleep";
        for bytes in sizes {
            let target = remote.view(..bytes)?;
            let (heap_source, heap_landing) =
                (heap_source.view(..bytes)?, heap_landing.view(..bytes)?);
            let source = &source[..bytes];
            let copy = &mut copy.bytes_mut()[..bytes];
            let landing = &mut landing.bytes_mut()[..bytes];
            let put = |from: &[u8], ops| -> Result<Duration> {
                let start = Instant::now();
                for _ in 0..ops {
                    shmem.put(&target, black_box(from), PEER)?;
                    shmem.quiet();
                }
                Ok(start.elapsed())
            };
            let put_heap = |ops| -> Result<Duration> {
                let start = Instant::now();
                for _ in 0..ops {
                    shmem.put_from(&target, black_box(&heap_source), PEER)?;
                    shmem.quiet();
                }
                Ok(start.elapsed())
            };
            let get = |ops| -> Result<Duration> {
                let start = Instant::now();
                for _ in 0..ops {
                    shmem.get(&mut *landing, &target, PEER)?;
                    black_box(&mut *landing);
                }
                Ok(start.elapsed())
            };
            let get_heap = |ops| -> Result<Duration> {
                let start = Instant::now();
                for _ in 0..ops {
                    shmem.get_into(black_box(&heap_landing), &target, PEER)?;
                }
                Ok(start.elapsed())
            };
            let timings = self.time(vec![
                self.asleep_on_root(|ops| Ok(memcpy(copy, source, ops))),
                self.waiting_on_root(|ops| put(source, ops)),
                self.waiting_on_root(put_heap),
                self.waiting_on_root(get),
                self.waiting_on_root(get_heap),
            ])?;
            let [memcpy, put_private, put_heap, get_private, get_heap] = timings[..] else {
                unreachable!("five batches were timed")
            };
            self.report("memcpy", REFERENCE, bytes, memcpy, None)?;
            let same_size = Some((reference, memcpy));
            self.report("put_private", LAYER, bytes, put_private, same_size)?;
            self.report("put_heap", LAYER, bytes, put_heap, same_size)?;
            self.report("get_private", LAYER, bytes, get_private, same_size)?;
            self.report("get_heap", LAYER, bytes, get_heap, same_size)?;
        }
        shmem.barrier()?;
        shmem.free(heap_landing)?;
        shmem.free(heap_source)?;
        Ok(shmem.free(remote)?)
    }

    /// Windows of [`RATE_WINDOW`] puts then one quiet, reported per put, the source private or
    /// in the heap, next to one memcpy of the same size.
    fn message_rate(&self) -> Result<()> {
        let shmem = self.shmem;
        let largest = RATE_BYTES[RATE_BYTES.len() - 1];
        let remote = shmem.allocate::<u8>(largest, None)?;
        let heap_source = shmem.allocate::<u8>(largest, None)?;
        let mut source = LineAligned::new(largest, 0);
        fill_pattern(source.bytes_mut(), 0);
        let mut copy = LineAligned::new(largest, 0x5a);
        shmem.put(&heap_source, source.bytes(), shmem.rank())?;
        shmem.put(&remote, copy.bytes(), shmem.rank())?;
        shmem.barrier()?;
        for bytes in RATE_BYTES {
            let target = remote.view(..bytes)?;
            let (source, heap_source) = (&source.bytes()[..bytes], heap_source.view(..bytes)?);
            let copy = &mut copy.bytes_mut()[..bytes];
            // One window of puts, each from the private `source` or (None) from the heap.
            let windows = |from: Option<&[u8]>, ops| -> Result<Duration> {
                let start = Instant::now();
                for _ in 0..ops {
                    for _ in 0..RATE_WINDOW {
                        match from {
                            Some(from) => shmem.put(&target, black_box(from), PEER)?,
                            None => shmem.put_from(&target, black_box(&heap_source), PEER)?,
                        }
                    }
                    shmem.quiet();
                }
                Ok(start.elapsed())
            };
            let timings = self.time(vec![
                self.asleep_on_root(|ops| Ok(memcpy(copy, source, ops))),
                self.waiting_on_root(|ops| windows(Some(source), ops)),
                self.waiting_on_root(|ops| windows(None, ops)),
            ])?;
            let [memcpy, private, heap] = timings[..] else {
                unreachable!("three batches were timed")
            };
            self.report("memcpy_rate", REFERENCE, bytes, memcpy, None)?;
            let same_size = Some(("memcpy of the same size, PE 1 asleep", memcpy));
            let private = per_put(private);
            self.report("put_rate_private", LAYER, bytes, private, same_size)?;
            self.report("put_rate_heap", LAYER, bytes, per_put(heap), same_size)?;
        }
        if shmem.rank() == PEER {
            let mut arrived = vec![0u8; largest];
            shmem.get(&mut arrived, &remote, PEER)?;
            ensure!(
                arrived == source.bytes(),
                "the windows of puts left other bytes than their source's"
            );
        }
        shmem.barrier()?;
        shmem.free(heap_source)?;
        Ok(shmem.free(remote)?)
    }

    /// PE 0's memcpy of [`WAITING_BYTES`] while PE 1 waits in `Shmem::barrier`, next to the
    /// same memcpy while PE 1 sleeps in the control plane.
    fn waiting_peer(&self) -> Result<()> {
        let mut source = LineAligned::new(WAITING_BYTES, 0);
        fill_pattern(source.bytes_mut(), 0);
        let mut copy = LineAligned::new(WAITING_BYTES, 0x5a);
        let (source, copy) = (source.bytes(), copy.bytes_mut());
        // Two closures copy into the same buffer, one batch at a time.
        let copy = std::cell::RefCell::new(copy);
        let timings = self.time(vec![
            self.asleep_on_root(|ops| Ok(memcpy(&mut copy.borrow_mut(), source, ops))),
            self.waiting_on_root(|ops| Ok(memcpy(&mut copy.borrow_mut(), source, ops))),
        ])?;
        let [asleep, waiting] = timings[..] else {
            unreachable!("two batches were timed")
        };
        self.report("memcpy_peer_asleep", REFERENCE, WAITING_BYTES, asleep, None)?;
        let reference = Some(("the same memcpy, PE 1 asleep", asleep));
        self.report(
            "memcpy_waiting_peer",
            LAYER,
            WAITING_BYTES,
            waiting,
            reference,
        )
    }

    /// Every collective of the Rust API at each size up to `max_bytes`, next to memcpy into as
    /// many destinations as the operation writes per PE.
    fn collectives(&self) -> Result<()> {
        let shmem = self.shmem;
        let (rank, pes) = (shmem.rank(), shmem.size());
        let sizes: Vec<usize> = COLLECTIVE_BYTES
            .into_iter()
            .filter(|&bytes| bytes <= self.max_bytes)
            .collect();
        let Some(&largest) = sizes.last() else {
            return Ok(());
        };
        let words = largest / 8;
        let gathered = shmem.allocate::<u8>(pes * largest, None)?;
        let broadcast = shmem.allocate::<u8>(largest, None)?;
        let sum_source = shmem.allocate::<f64>(words, None)?;
        let sum_target = shmem.allocate::<f64>(words, None)?;
        let integer_source = shmem.allocate::<i64>(words, None)?;
        let integer_target = shmem.allocate::<i64>(words, None)?;
        let mut source = LineAligned::new(pes * largest, 0);
        fill_pattern(source.bytes_mut(), rank);
        let source = source.bytes();
        let floats: Vec<f64> = (0..words).map(|i| (rank + i % 7) as f64).collect();
        let integers: Vec<i64> = (0..words).map(|i| (rank + i % 7) as i64).collect();
        shmem.put(&sum_source, &floats, rank)?;
        shmem.put(&integer_source, &integers, rank)?;
        // The memcpy references' destinations, on PE 0 only (the others never copy).
        let mut copies = LineAligned::new(if rank == 0 { pes * largest } else { 0 }, 0x5a);
        let copies = std::cell::RefCell::new(copies.bytes_mut());
        let mut scratch = vec![0u8; pes * largest];
        for bytes in sizes {
            let (n, block) = (bytes / 8, &source[..bytes]);
            let targets = Targets {
                gathered: gathered.view(..pes * bytes)?,
                broadcast: broadcast.view(..bytes)?,
                sum_source: sum_source.view(..n)?,
                sum_target: sum_target.view(..n)?,
                integer_source: integer_source.view(..n)?,
                integer_target: integer_target.view(..n)?,
            };
            self.check_collectives(&targets, source, bytes, &mut scratch)?;
            let mut dests = vec![1];
            if pes != 1 {
                dests.push(pes);
            }
            let t = &targets;
            let operations: [Operation<'_>; 7] = [
                (
                    "broadcast",
                    pes,
                    Box::new(move || Ok(shmem.broadcast(&t.broadcast, block, 0)?)),
                ),
                (
                    "all_gather",
                    pes,
                    Box::new(move || Ok(shmem.all_gather(&t.gathered, block)?)),
                ),
                (
                    "all_to_all",
                    pes,
                    Box::new(move || Ok(shmem.all_to_all(&t.gathered, &source[..pes * bytes])?)),
                ),
                (
                    "all_reduce_sum_f64",
                    1,
                    Box::new(move || {
                        Ok(shmem.all_reduce(&t.sum_target, &t.sum_source, ReduceOp::Sum)?)
                    }),
                ),
                (
                    "all_reduce_sum_i64",
                    1,
                    Box::new(move || {
                        Ok(
                            shmem.all_reduce(
                                &t.integer_target,
                                &t.integer_source,
                                ReduceOp::Sum,
                            )?,
                        )
                    }),
                ),
                (
                    "all_reduce_min_f64",
                    1,
                    Box::new(move || {
                        Ok(shmem.all_reduce(&t.sum_target, &t.sum_source, ReduceOp::Min)?)
                    }),
                ),
                (
                    "all_reduce_max_f64",
                    1,
                    Box::new(move || {
                        Ok(shmem.all_reduce(&t.sum_target, &t.sum_source, ReduceOp::Max)?)
                    }),
                ),
            ];
            let mut batches: Vec<Batch<'_>> = dests
                .iter()
                .map(|&d| {
                    let copies = &copies;
                    self.asleep_on_root(move |ops| {
                        let mut copies = copies.borrow_mut();
                        let start = Instant::now();
                        for _ in 0..ops {
                            for destination in copies[..d * bytes].chunks_exact_mut(bytes) {
                                destination.copy_from_slice(black_box(block));
                                black_box(&mut *destination);
                            }
                        }
                        Ok(start.elapsed())
                    })
                })
                .collect();
            for (_, _, call) in &operations {
                batches.push(self.in_heap_barrier(move |ops| {
                    let start = Instant::now();
                    for _ in 0..ops {
                        call()?;
                    }
                    Ok(start.elapsed())
                }));
            }
            let timings = self.time(batches)?;
            let (references, rows) = timings.split_at(dests.len());
            let names: Vec<(String, String)> = dests
                .iter()
                .map(|&d| {
                    if d == 1 {
                        (
                            "memcpy_x1".to_string(),
                            "memcpy of the same size, others asleep".to_string(),
                        )
                    } else {
                        (
                            format!("memcpy_x{d}"),
                            format!("memcpy of the same size to {d} destinations, others asleep"),
                        )
                    }
                })
                .collect();
            for ((op, _), timing) in names.iter().zip(references) {
                self.report(op, REFERENCE, bytes, *timing, None)?;
            }
            for ((op, d, _), timing) in operations.iter().zip(rows) {
                let index = dests.iter().position(|x| x == d).context("a reference")?;
                let reference = Some((names[index].1.as_str(), references[index]));
                self.report(op, LAYER, bytes, *timing, reference)?;
            }
        }
        shmem.barrier()?;
        for allocation in [integer_target, integer_source] {
            shmem.free(allocation)?;
        }
        for allocation in [sum_target, sum_source] {
            shmem.free(allocation)?;
        }
        shmem.free(broadcast)?;
        Ok(shmem.free(gathered)?)
    }

    /// One call of each collective at `bytes`, its result checked on every PE.
    fn check_collectives(
        &self,
        t: &Targets<'_>,
        source: &[u8],
        bytes: usize,
        scratch: &mut [u8],
    ) -> Result<()> {
        let shmem = self.shmem;
        let (rank, pes) = (shmem.rank(), shmem.size());
        let (n, block) = (bytes / 8, &source[..bytes]);
        let scratch = &mut scratch[..pes * bytes];
        let wrong = |op: &str| format!("{op} of {bytes} B on {pes} PEs: wrong result on PE {rank}");
        let clear = |scratch: &mut [u8]| -> Result<()> {
            scratch.fill(0);
            shmem.put(&t.gathered, scratch, rank)?;
            shmem.put(&t.broadcast, &scratch[..bytes], rank)?;
            shmem.put(&t.sum_target, &vec![0.0; n], rank)?;
            shmem.put(&t.integer_target, &vec![0; n], rank)?;
            Ok(shmem.barrier()?)
        };
        clear(scratch)?;
        shmem.broadcast(&t.broadcast, block, 0)?;
        shmem.get(&mut scratch[..bytes], &t.broadcast, rank)?;
        let expected = (0..bytes).map(|i| pattern(0, i));
        ensure!(
            scratch[..bytes].iter().copied().eq(expected),
            wrong("broadcast")
        );
        clear(scratch)?;
        shmem.all_gather(&t.gathered, block)?;
        shmem.get(scratch, &t.gathered, rank)?;
        let expected = (0..pes).flat_map(|pe| (0..bytes).map(move |i| pattern(pe, i)));
        ensure!(scratch.iter().copied().eq(expected), wrong("all_gather"));
        clear(scratch)?;
        shmem.all_to_all(&t.gathered, &source[..pes * bytes])?;
        shmem.get(scratch, &t.gathered, rank)?;
        let expected =
            (0..pes).flat_map(|pe| (0..bytes).map(move |i| pattern(pe, rank * bytes + i)));
        ensure!(scratch.iter().copied().eq(expected), wrong("all_to_all"));
        let mut floats = vec![0.0f64; n];
        let mut integers = vec![0i64; n];
        let sum = |i: usize| pes * (pes - 1) / 2 + pes * (i % 7);
        for (op, reduce, expected) in [
            (
                "all_reduce_sum_f64",
                ReduceOp::Sum,
                &sum as &dyn Fn(usize) -> usize,
            ),
            ("all_reduce_min_f64", ReduceOp::Min, &|i| i % 7),
            ("all_reduce_max_f64", ReduceOp::Max, &|i| pes - 1 + i % 7),
        ] {
            clear(scratch)?;
            shmem.all_reduce(&t.sum_target, &t.sum_source, reduce)?;
            shmem.get(&mut floats, &t.sum_target, rank)?;
            ensure!(
                floats
                    .iter()
                    .enumerate()
                    .all(|(i, &x)| x == expected(i) as f64),
                wrong(op)
            );
        }
        clear(scratch)?;
        shmem.all_reduce(&t.integer_target, &t.integer_source, ReduceOp::Sum)?;
        shmem.get(&mut integers, &t.integer_target, rank)?;
        ensure!(
            integers
                .iter()
                .enumerate()
                .all(|(i, &x)| x == sum(i) as i64),
            wrong("all_reduce_sum_i64")
        );
        Ok(shmem.barrier()?)
    }

    /// Times batches made by the helpers below, interleaved, within the trial budget.
    fn time(&self, mut batches: Vec<Batch<'_>>) -> Result<Vec<Timing>> {
        time_interleaved_within(&self.method, &mut batches, self.budget)
    }

    /// `batch` on every PE, each call between two barriers on the heap: the PEs start
    /// together, and a PE that finishes first waits in `Shmem::barrier` (as a program's PEs do)
    /// until the last is done; then root rank 0's duration goes to every PE over the control
    /// plane (after the barrier, so nobody waits in the control plane while another works).
    fn in_heap_barrier<'b>(
        &'b self,
        mut batch: impl FnMut(u64) -> Result<Duration> + 'b,
    ) -> Batch<'b> {
        let shmem = self.shmem;
        Box::new(move |ops| {
            shmem.barrier()?;
            let took = nanos(batch(ops)?);
            shmem.barrier()?;
            root_duration(shmem.control().broadcast(&took.to_le_bytes())?)
        })
    }

    /// `batch` on root rank 0 while every other PE waits in `Shmem::barrier` (a point-to-point
    /// row: the target of a program's puts waits in a barrier meanwhile).
    fn waiting_on_root<'b>(
        &'b self,
        mut batch: impl FnMut(u64) -> Result<Duration> + 'b,
    ) -> Batch<'b> {
        let root = self.shmem.rank() == 0;
        self.in_heap_barrier(move |ops| if root { batch(ops) } else { Ok(Duration::ZERO) })
    }

    /// `batch` on root rank 0 while every other PE sleeps in the control plane (blocked in the
    /// kernel, taking no CPU time): the references.
    fn asleep_on_root<'b>(
        &'b self,
        mut batch: impl FnMut(u64) -> Result<Duration> + 'b,
    ) -> Batch<'b> {
        let root = self.shmem.rank() == 0;
        together(self.shmem, move |ops| {
            if root {
                batch(ops)
            } else {
                Ok(Duration::ZERO)
            }
        })
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
        emit(&Timed {
            op: op.to_string(),
            layer: layer.to_string(),
            bytes,
            timing,
            reference: reference.map(|(name, t)| (name.to_string(), t.per_op.median_ns)),
        })
    }
}

/// A collective row: its op, the destinations of its memcpy reference, one call.
type Operation<'a> = (&'static str, usize, Box<dyn Fn() -> Result<()> + 'a>);

/// The symmetric buffers of one size of the collectives.
struct Targets<'a> {
    /// all_gather's output and all_to_all's target: `pes × bytes`.
    gathered: View<'a, u8>,
    /// broadcast's target.
    broadcast: View<'a, u8>,
    /// The reductions over f64: source and target.
    sum_source: View<'a, f64>,
    /// See `sum_source`.
    sum_target: View<'a, f64>,
    /// The reduction over i64: source and target.
    integer_source: View<'a, i64>,
    /// See `integer_source`.
    integer_target: View<'a, i64>,
}

/// A window's timing as the timing of one put of it.
fn per_put(timing: Timing) -> Timing {
    let per = |ns: f64| ns / RATE_WINDOW as f64;
    Timing {
        per_op: Summary {
            min_ns: per(timing.per_op.min_ns),
            median_ns: per(timing.per_op.median_ns),
            max_ns: per(timing.per_op.max_ns),
            trials: timing.per_op.trials,
        },
        batch_ops: timing.batch_ops * RATE_WINDOW,
    }
}

/// Fills `bytes` with the pattern of PE `pe`: byte `i` is [`pattern`]`(pe, i)`.
fn fill_pattern(bytes: &mut [u8], pe: usize) {
    for (i, byte) in bytes.iter_mut().enumerate() {
        *byte = pattern(pe, i);
    }
}

/// Byte `i` of PE `pe`'s data (distinct between PEs at every offset).
fn pattern(pe: usize, i: usize) -> u8 {
    (i % 251) as u8 ^ (pe as u8).wrapping_mul(37)
}

/// `ops` copies of `source` into `destination`; their duration.
fn memcpy(destination: &mut [u8], source: &[u8], ops: u64) -> Duration {
    let start = Instant::now();
    for _ in 0..ops {
        destination.copy_from_slice(black_box(source));
        black_box(&mut *destination);
    }
    start.elapsed()
}
