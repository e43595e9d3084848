//! Benchmark of the managed restart (issue bar: 64 MiB → 128 MiB heap with 3 allocations, all
//! stages together ≤ 10 ms). Run under the launcher:
//!
//! ```sh
//! cargo build --release -p hmrun -p hyper-multicore --examples
//! target/release/hmrun -n 2 -- target/release/examples/restart_timings
//! ```
//!
//! Each of 21 rounds acquires a 64 MiB runtime, makes 3 allocations, restarts to 128 MiB with
//! new shapes, dtypes and alignments, frees and releases; the first round is a warm-up. Rank 0
//! prints min / median / max of the total and the median round's stages, also as one JSON line.

use hyper_multicore::lifecycle::{self, Replacement, StageTimings};
use hyper_multicore::shmem::{AllocationSpec, Dtype, Symmetric};

const MIB: u64 = 1 << 20;
const ROUNDS: usize = 21;

fn one_restart() -> hyper_multicore::Result<StageTimings> {
    lifecycle::acquire(None, Some(64 * MIB))?;
    let (a, b, c) = lifecycle::guarded("allocate", |s| {
        Ok((
            s.allocate::<f32>(1 << 20, None)?,
            s.allocate::<u8>(4096, None)?,
            s.allocate::<i64>(1000, Some(4096))?,
        ))
    })?;
    let spec = |shape: Vec<usize>, dtype, alignment| AllocationSpec {
        shape,
        dtype,
        alignment,
    };
    let result = lifecycle::restart(
        128 * MIB,
        &[
            Replacement {
                current: a.region(),
                target: spec(vec![2 << 20], Dtype::BF16, None),
                preserve: false,
            },
            Replacement {
                current: b.region(),
                target: spec(vec![2, 4096], Dtype::U8, Some(256)),
                preserve: false,
            },
            Replacement {
                current: c.region(),
                target: spec(vec![10, 100], Dtype::F64, Some(4096)),
                preserve: false,
            },
        ],
        None,
    )?;
    lifecycle::guarded("free", |s| {
        result.allocations.iter().try_for_each(|r| s.free_id(r.id))
    })?;
    lifecycle::release()?;
    Ok(result.timings)
}

fn main() -> hyper_multicore::Result<()> {
    let mut rounds = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        rounds.push(one_restart()?);
    }
    let mut measured: Vec<StageTimings> = rounds.split_off(1);
    measured.sort_by(|x, y| x.total_ms().total_cmp(&y.total_ms()));
    let world = hyper_multicore::world::World::global()?;
    if world.rank() == 0 {
        let median = measured[measured.len() / 2];
        let (min, max) = (
            measured[0].total_ms(),
            measured[measured.len() - 1].total_ms(),
        );
        println!(
            "restart 64 MiB -> 128 MiB, 3 allocations, {} PEs: total min {min:.2} ms, median {:.2} ms, max {max:.2} ms (bar: 10 ms)",
            world.size(),
            median.total_ms()
        );
        println!("median round by stage (ms): {median:?}");
        println!(
            "{{\"op\":\"restart\",\"bytes\":{},\"pes\":{},\"median_ns\":{:.0},\"min_ns\":{:.0},\"max_ns\":{:.0},\"ref_ns\":null}}",
            128 * MIB,
            world.size(),
            median.total_ms() * 1e6,
            min * 1e6,
            max * 1e6
        );
    }
    Ok(())
}
