//! Soak: many cycles of acquire → allocate → restart → free → release on one job, with the PEs
//! sampling their open descriptors, threads, runtime mappings and resident memory. After a
//! warm-up the descriptors and threads must stay exactly flat, nothing of the runtime may stay
//! mapped between lifetimes, and resident memory may grow by at most [`RSS_TOLERANCE_KIB`].

use std::time::{Duration, Instant};

use anyhow::Result;
use hyper_multicore::lifecycle::{self, Replacement};
use hyper_multicore::shmem::{AllocationSpec, Dtype, Symmetric};
use serde::Serialize;

use crate::job::Launcher;
use crate::pe::emit;
use crate::points::describe_leaks;
use crate::probe::Snapshot;
use crate::scenario::{Record, Scenario, HEAP};

/// Resident memory a PE may gain between the end of the warm-up and the last cycle, KiB.
///
/// Why not zero: resident memory moves by whole pages for reasons unrelated to leaks —
/// glibc's malloc keeps freed chunks and trims its arenas only past a threshold, and each
/// runtime lifetime's router thread may be served by a different arena. 1 MiB over the ~900
/// counted cycles of a full run still catches any leak above ~1.2 KiB per cycle (a leaked
/// socket buffer, a frame, a record), and the descriptor, thread and mapping counts — which
/// must be exactly flat — catch the leaks of kernel objects whatever their size.
pub const RSS_TOLERANCE_KIB: u64 = 1024;

/// The PE side.
pub fn run_pe(cycles: usize, warmup: usize, sample_every: usize) -> Result<()> {
    let mut since = Instant::now();
    let mut since_cycle = 0;
    for cycle in 1..=cycles {
        lifecycle::acquire(None, Some(HEAP))?;
        let a = lifecycle::guarded("allocate", |s| s.allocate::<u64>(512, None))?;
        let heap = if cycle % 2 == 0 { HEAP } else { 2 * HEAP };
        let replacement = Replacement {
            current: a.region(),
            target: AllocationSpec {
                shape: vec![1024],
                dtype: Dtype::U64,
                alignment: None,
            },
            preserve: false,
        };
        let result = lifecycle::restart(heap, &[replacement], None)?;
        lifecycle::guarded("free", |s| {
            for record in &result.allocations {
                s.free_id(record.id)?;
            }
            Ok(())
        })?;
        lifecycle::release()?;
        if cycle == warmup || (cycle > warmup && cycle % sample_every == 0) || cycle == cycles {
            let now = Snapshot::take();
            emit(&Record::Sample {
                cycle,
                fds: now.fds.len(),
                threads: now.threads.len(),
                runtime_maps: now.runtime_maps.len(),
                rss_kib: now.rss_kib,
                cycle_ms: since.elapsed().as_secs_f64() * 1e3 / (cycle - since_cycle) as f64,
            });
            since = Instant::now();
            since_cycle = cycle;
        }
    }
    Ok(())
}

/// One PE's soak figures.
#[derive(Debug, Clone, Serialize)]
pub struct PeSoak {
    /// Rank.
    pub rank: usize,
    /// Descriptors after warm-up and at the end.
    pub fds: (usize, usize),
    /// Threads after warm-up and at the end.
    pub threads: (usize, usize),
    /// VmRSS after warm-up and at the end, KiB.
    pub rss_kib: (u64, u64),
    /// Largest VmRSS sampled after warm-up, KiB.
    pub rss_max_kib: u64,
    /// Mean cycle time over the counted cycles, ms.
    pub cycle_ms: f64,
}

/// The soak's verdict and figures.
#[derive(Debug, Clone, Serialize)]
pub struct SoakReport {
    /// PEs.
    pub pes: usize,
    /// Cycles.
    pub cycles: usize,
    /// Warm-up cycles.
    pub warmup: usize,
    /// Every check held.
    pub survived: bool,
    /// Stopped by a timeout or the watchdog.
    pub hang: bool,
    /// Something grew or stayed.
    pub leak: bool,
    /// Per-PE figures.
    pub per_pe: Vec<PeSoak>,
    /// What went wrong.
    pub problems: Vec<String>,
    /// Wall time, s.
    pub elapsed_s: f64,
}

/// Runs the soak on `pes` PEs for `cycles` cycles.
pub fn drive(launcher: &Launcher, pes: usize, cycles: usize) -> Result<SoakReport> {
    let warmup = (cycles / 10).clamp(1, 100);
    let sample_every = (cycles / 20).max(1);
    let scenario = Scenario::Soak {
        cycles,
        warmup,
        sample_every,
    };
    // Generous: a cycle takes tens of ms; a hang still ends in bounded time.
    let watchdog = Duration::from_secs(60) + Duration::from_millis(250) * cycles as u32;
    let run = launcher.run(pes, &scenario, &[], watchdog)?;
    let mut problems = Vec::new();
    let mut leak = false;
    if run.hung {
        problems.push(format!("hang after {:.1} s", run.elapsed.as_secs_f64()));
    }
    if run.exit != Some(0) {
        problems.push(format!("hmrun exited {:?}", run.exit));
    }
    let mut per_pe = Vec::new();
    for rank in 0..pes {
        let samples: Vec<(usize, usize, usize, usize, u64, f64)> = run
            .of(rank)
            .filter_map(|r| match r {
                Record::Sample {
                    cycle,
                    fds,
                    threads,
                    runtime_maps,
                    rss_kib,
                    cycle_ms,
                } => Some((*cycle, *fds, *threads, *runtime_maps, *rss_kib, *cycle_ms)),
                _ => None,
            })
            .collect();
        let (Some(first), Some(last)) = (samples.first(), samples.last()) else {
            problems.push(format!("rank {rank}: no samples"));
            continue;
        };
        if last.0 != cycles {
            problems.push(format!("rank {rank}: stopped at cycle {}", last.0));
        }
        for sample in &samples {
            if sample.1 != first.1 || sample.2 != first.2 || sample.3 != 0 {
                leak = true;
                problems.push(format!(
                    "rank {rank}: cycle {}: {} fds, {} threads, {} runtime mappings (after \
                     warm-up: {} fds, {} threads, 0 mappings)",
                    sample.0, sample.1, sample.2, sample.3, first.1, first.2
                ));
            }
        }
        let growth = last.4.saturating_sub(first.4);
        if growth > RSS_TOLERANCE_KIB {
            leak = true;
            problems.push(format!(
                "rank {rank}: VmRSS grew {growth} KiB from cycle {} to {} (tolerance {RSS_TOLERANCE_KIB} KiB)",
                first.0, last.0
            ));
        }
        let counted: Vec<f64> = samples.iter().skip(1).map(|s| s.5).collect();
        per_pe.push(PeSoak {
            rank,
            fds: (first.1, last.1),
            threads: (first.2, last.2),
            rss_kib: (first.4, last.4),
            rss_max_kib: samples.iter().map(|s| s.4).max().unwrap_or(0),
            cycle_ms: counted.iter().sum::<f64>() / counted.len().max(1) as f64,
        });
        match run.of(rank).find_map(|r| match r {
            Record::Resources { leaks, .. } => Some(leaks),
            _ => None,
        }) {
            Some(leaks) if leaks.is_empty() => {}
            Some(leaks) => {
                leak = true;
                problems.push(format!("rank {rank}: leaked {}", describe_leaks(leaks)));
            }
            None => problems.push(format!("rank {rank}: did not report its resources")),
        }
    }
    if !run.left_behind.is_empty() {
        leak = true;
        problems.push(format!("left behind: {}", run.left_behind.join(", ")));
    }
    if !problems.is_empty() {
        problems.push(format!("job output:\n{}", run.describe()));
    }
    Ok(SoakReport {
        pes,
        cycles,
        warmup,
        survived: problems.is_empty(),
        hang: run.hung,
        leak,
        per_pe,
        problems,
        elapsed_s: run.elapsed.as_secs_f64(),
    })
}
