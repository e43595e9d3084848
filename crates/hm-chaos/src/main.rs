//! `hm-chaos`: the chaos and abuse suite of hyper_multicore.
//!
//! ```text
//! hm-chaos run [--ci] [--hmrun PATH] [--only TEXT] [--json PATH]   # scripts/chaos.sh runs this
//! ```
//!
//! The driver runs, one job at a time (the machine has two cores):
//! 1. every **fault point** ([`points`]): each lifecycle stage (acquire's first reference:
//!    the PE dying at entry, the unique-ID step, the start of initialize; release: Preflight,
//!    Quiesce, Shutdown; restart: the eight stages) × each root rank × {kill -9, injected
//!    retryable failure, injected unavailable failure}, and each blocking data-plane operation
//!    × each PE killed — a job of PEs of this very binary under `hmrun`, checked for the
//!    survivors' error (kind, recovery, stage, the rank named, time to error below half the
//!    runtime timeout), their recovery or refusal, hmrun's exit status, hangs, and leaks
//!    ([`probe`], [`job::SystemView`]);
//! 2. the **soak** ([`soak`]);
//! 3. the **bootstrap abuse** ([`abuse`]);
//! 4. the **host faults** ([`host_faults`]): a host of four network-namespace hosts lost by a
//!    link cut, its processes killed, or frozen (as root only; skipped elsewhere, saying why);
//!
//! and ends with one line: `fault points: N tried, N survived, hangs: H, leaks: L, host faults:
//! K` (the soak, the abuse scenario and each host fault count as one point each; `host faults:
//! skipped` where they could not run). The exit status is 0 only if every point
//! survived.

#![deny(unsafe_code)]

mod abuse;
mod host_faults;
mod job;
mod pe;
mod points;
mod probe;
mod report;
mod scenario;
mod soak;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};

use crate::job::Launcher;
use crate::points::{Selection, Verdict};
use crate::report::{distributions, RunReport};

/// The command line.
#[derive(Debug, Parser)]
#[command(
    name = "hm-chaos",
    version,
    about = "Chaos and abuse suite of hyper_multicore"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the suite.
    Run(RunArgs),
    /// One PE of a job (started through hmrun by `run`, not by hand).
    #[command(hide = true)]
    Pe {
        /// The scenario, as JSON.
        scenario: String,
    },
}

/// Options of `run`.
#[derive(Debug, Args)]
struct RunArgs {
    /// The bounded form CI runs: fault points on 3 and 4 PEs within a time budget, a 200-cycle
    /// soak (the full form: 2, 3 and 4 PEs, 1000 cycles).
    #[arg(long)]
    ci: bool,
    /// The hmrun binary (default: next to this one).
    #[arg(long, value_name = "PATH")]
    hmrun: Option<PathBuf>,
    /// PEs per fault-point job; several counts run every point at each (default 3,4 with
    /// --ci, else 2,3,4).
    #[arg(long, value_name = "N,...", value_delimiter = ',', value_parser = clap::value_parser!(u32).range(2..=4))]
    pes: Vec<u32>,
    /// Only the fault points whose label contains TEXT (the soak, the abuse scenario and the
    /// host faults run only without it, or with `soak` / `bootstrap` / `host` as TEXT).
    #[arg(long, value_name = "TEXT")]
    only: Option<String>,
    /// Soak cycles (default 1000, 200 with --ci).
    #[arg(long, value_name = "N")]
    soak_cycles: Option<usize>,
    /// Strangers queued at the world rendezvous before the PEs start.
    #[arg(long, value_name = "N", default_value_t = 200)]
    strangers: usize,
    /// Strangers queued at the explicit plane behind a real member's hello (default 50; the
    /// rendezvous keeps at most 256 unauthenticated connections pending).
    #[arg(long, value_name = "N", default_value_t = 50)]
    plane_strangers: usize,
    /// HYPER_MULTICORE_SHMEM_TIMEOUT_SEC given to every PE.
    #[arg(long, value_name = "S", default_value_t = 10)]
    runtime_timeout: u64,
    /// Stop starting fault points after S seconds (default 300 with --ci, so the bounded form
    /// stays bounded even if every point hung); the points not run fail the run.
    #[arg(long, value_name = "S")]
    budget: Option<u64>,
    /// Write the whole run as JSON here.
    #[arg(long, value_name = "PATH")]
    json: Option<PathBuf>,
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Command::Run(args) => {
            let all_survived = run(&args)?;
            std::process::exit(if all_survived { 0 } else { 1 });
        }
        Command::Pe { scenario } => pe::run(&scenario),
    }
}

fn hmrun_path(given: Option<&PathBuf>) -> Result<PathBuf> {
    if let Some(path) = given {
        return Ok(path.clone());
    }
    let me = std::env::current_exe().context("find this binary")?;
    let sibling = me.with_file_name("hmrun");
    if sibling.is_file() {
        return Ok(sibling);
    }
    bail!(
        "no hmrun next to {}; build it (cargo build -p hmrun) or pass --hmrun PATH",
        me.display()
    )
}

fn run(args: &RunArgs) -> Result<bool> {
    let started = Instant::now();
    let scratch = std::env::temp_dir().join(format!("hm-chaos-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)?;
    let launcher = Launcher {
        hmrun: hmrun_path(args.hmrun.as_ref())?,
        program: std::env::current_exe()?,
        runtime_timeout: Duration::from_secs(args.runtime_timeout),
        scratch: scratch.clone(),
    };
    let pes: Vec<usize> = match args.pes.as_slice() {
        [] if args.ci => vec![3, 4],
        [] => vec![2, 3, 4],
        given => given.iter().map(|&n| n as usize).collect(),
    };
    let wanted = |label: &str| {
        args.only
            .as_deref()
            .map_or(true, |only| label.contains(only))
    };
    let points: Vec<_> = pes
        .iter()
        .flat_map(|&pes| points::enumerate(Selection { pes }))
        .filter(|p| wanted(&p.label))
        .collect();
    // Worst legitimate case: a couple of runtime timeouts back to back, then the report.
    let watchdog = launcher.runtime_timeout * 3 + Duration::from_secs(15);
    println!(
        "hm-chaos: {} fault points on {pes:?} PEs (runtime timeout {} s, watchdog {} s), hmrun {}",
        points.len(),
        args.runtime_timeout,
        watchdog.as_secs(),
        launcher.hmrun.display()
    );
    let budget = args
        .budget
        .or(args.ci.then_some(300))
        .map(Duration::from_secs);
    let mut verdicts: Vec<Verdict> = Vec::new();
    let mut not_run = 0;
    for point in &points {
        if budget.is_some_and(|budget| started.elapsed() > budget) {
            not_run += 1;
            continue;
        }
        let run = launcher.run(point.pes, &point.scenario, &point.env(), watchdog)?;
        let verdict = points::judge(point, &run, launcher.runtime_timeout);
        println!(
            "{} {:<38} exit {:<4} wait ms {:<28} {:.1} s",
            if verdict.survived { "ok  " } else { "FAIL" },
            verdict.label,
            verdict.exit.map_or("-".into(), |c| c.to_string()),
            format!("{:.1?}", verdict.wait_ms),
            verdict.elapsed_s
        );
        if !verdict.survived {
            for problem in &verdict.problems {
                println!("     {problem}");
            }
            print!("{}", run.describe());
        }
        if !run.unattributed.is_empty() {
            println!(
                "     (appeared during the job, not the job's: {:?})",
                run.unattributed
            );
        }
        verdicts.push(verdict);
    }

    let soak =
        if args.only.as_deref().map_or(true, |o| o == "soak") {
            let cycles = args.soak_cycles.unwrap_or(if args.ci { 200 } else { 1000 });
            let soak = soak::drive(&launcher, 2, cycles)?;
            println!(
                "{} soak: {} cycles of acquire → allocate → restart → free → release on {} PEs \
             ({} warm-up), {:.1} s",
                if soak.survived { "ok  " } else { "FAIL" },
                soak.cycles,
                soak.pes,
                soak.warmup,
                soak.elapsed_s
            );
            for pe in &soak.per_pe {
                println!(
                "       rank {}: fds {} → {}, threads {} → {}, VmRSS {} → {} KiB (max {} KiB), \
                 {:.2} ms/cycle",
                pe.rank, pe.fds.0, pe.fds.1, pe.threads.0, pe.threads.1, pe.rss_kib.0,
                pe.rss_kib.1, pe.rss_max_kib, pe.cycle_ms
            );
            }
            for problem in &soak.problems {
                println!("     {problem}");
            }
            Some(soak)
        } else {
            None
        };

    let abuse =
        if args.only.as_deref().map_or(true, |o| o == "bootstrap") {
            let abuse = abuse::drive(&launcher, args.strangers, args.plane_strangers)?;
            println!(
                "{} bootstrap abuse: {} strangers before the world rendezvous",
                if abuse.survived { "ok  " } else { "FAIL" },
                args.strangers
            );
            for (label, job) in [("control ", &abuse.control), ("attacked", &abuse.attacked)] {
                if let Some(job) = job {
                    println!(
                    "       {label}: strangers {} before, {} during (world), {} at the runtime's \
                     rendezvous, {} at the explicit plane; rank 0 VmRSS {} KiB, VmHWM {} KiB; \
                     {:.1} s",
                    job.before, job.during_world, job.during_runtime, job.plane,
                    job.rank0_rss_kib, job.rank0_hwm_kib, job.elapsed_s
                );
                }
            }
            for problem in &abuse.problems {
                println!("     {problem}");
            }
            Some(abuse)
        } else {
            None
        };

    let hosts = if args.only.as_deref().map_or(true, |o| o == "host") {
        let hosts = host_faults::drive(&launcher);
        if let Some(why) = &hosts.skipped {
            println!("skip host faults: {why}");
        }
        for fault in &hosts.faults {
            println!(
                "{} host fault: {} on 4 namespace hosts × 2 PEs, last survivor's agent out {} \
                 after the fault",
                if fault.survived { "ok  " } else { "FAIL" },
                fault.label,
                fault.detected_ms.map_or("never".to_string(), |ms| format!(
                    "{:.1} s",
                    ms as f64 / 1e3
                ))
            );
            for problem in &fault.problems {
                println!("     {problem}");
            }
        }
        Some(hosts)
    } else {
        None
    };

    let distributions = distributions(&verdicts);
    if !distributions.is_empty() {
        println!("time to error (ms):");
        for d in &distributions {
            println!(
                "  {:<62} n {:<4} median {:>8.1}  p90 {:>8.1}  max {:>8.1}",
                d.series, d.count, d.median_ms, d.p90_ms, d.max_ms
            );
        }
    }

    let extra = [
        soak.as_ref().map(|s| (s.survived, s.hang, s.leak)),
        abuse.as_ref().map(|a| (a.survived, a.hang, a.leak)),
    ];
    let host_outcomes = hosts
        .iter()
        .flat_map(|hosts| &hosts.faults)
        .map(|f| (f.survived, f.hang, f.leak));
    let outcomes = verdicts
        .iter()
        .map(|v| (v.survived, v.hang, v.leak))
        .chain(extra.into_iter().flatten())
        .chain(host_outcomes);
    let (mut tried, mut survived, mut hangs, mut leaks) = (0, 0, 0, 0);
    for (ok, hang, leak) in outcomes {
        tried += 1;
        survived += usize::from(ok);
        hangs += usize::from(hang);
        leaks += usize::from(leak);
    }
    let host_count = match &hosts {
        Some(hosts) if hosts.skipped.is_some() => "skipped".to_string(),
        Some(hosts) => hosts.faults.len().to_string(),
        None => "not selected".to_string(),
    };
    let report = RunReport {
        mode: if args.ci { "ci" } else { "full" }.into(),
        pes,
        runtime_timeout_s: launcher.runtime_timeout.as_secs_f64(),
        points: verdicts,
        distributions,
        soak,
        abuse,
        hosts,
        totals: (tried, survived, hangs, leaks),
        elapsed_s: started.elapsed().as_secs_f64(),
    };
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("write {}", path.display()))?;
    }
    let _ = std::fs::remove_dir(&scratch);
    println!("run time {:.0} s", report.elapsed_s);
    if not_run > 0 {
        println!("budget exhausted: {not_run} fault points were not run");
    }
    println!(
        "fault points: {tried} tried, {survived} survived, hangs: {hangs}, leaks: {leaks}, \
         host faults: {host_count}"
    );
    Ok(tried == survived && not_run == 0)
}
