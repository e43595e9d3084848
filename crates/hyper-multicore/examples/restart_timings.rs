//! Benchmark of the managed restart (issue bar: 64 MiB → 128 MiB heap with 3 allocations, all
//! stages together ≤ 10 ms) and of a shared root's growth (64 MiB → 128 MiB with 3 consumers
//! and preserved data, copy included, ≤ 15 ms). Run under the launcher:
//!
//! ```sh
//! cargo build --release -p hmrun -p hyper-multicore --examples
//! target/release/hmrun -n 2 -- target/release/examples/restart_timings
//! target/release/hmrun -n 2 -- target/release/examples/restart_timings grow 4
//! ```
//!
//! Restart: each of 21 rounds acquires a 64 MiB runtime, makes 3 allocations, restarts to
//! 128 MiB with new shapes, dtypes and alignments, frees and releases. `grow <MiB>`: each round
//! activates a shared root of 3 consumers (budgets 32 + 16 + 16 MiB: a 64 MiB heap), each
//! allocates one buffer of about a third of `<MiB>` and fills it, then the first consumer grows
//! its budget to 96 MiB (the heap to 128 MiB) keeping every buffer's data, which is checked. The
//! first round is a warm-up. Rank 0 prints min / median / max of the total and the median
//! round's stages, also as one JSON line (layer `shmem`, with `stages_ms`: `bench/run_all.sh`
//! adds it to `bench/results/shmem.jsonl`, and `bench/report.py` judges it).

use hyper_multicore::lifecycle::{
    self, ConsumerSpec, Replacement, RootGroup, SharedRoot, StageTimings,
};
use hyper_multicore::shmem::{AllocationSpec, Dtype, Symmetric};
use hyper_multicore::{Error, ErrorKind};

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

/// One growth 64 → 128 MiB of a shared root of 3 consumers preserving `preserved` bytes.
fn one_growth(preserved: u64) -> hyper_multicore::Result<StageTimings> {
    let root = SharedRoot::new(RootGroup::World, None);
    let budgets = [32 * MIB, 16 * MIB, 16 * MIB];
    let consumers = budgets
        .iter()
        .enumerate()
        .map(|(i, &budget)| root.reserve(ConsumerSpec::new(format!("c{i}"), "bench", budget, "")))
        .collect::<hyper_multicore::Result<Vec<_>>>()?;
    root.activate()?;
    let mut buffers = Vec::new();
    for (i, consumer) in consumers.iter().enumerate() {
        let lease = consumer.claim()?;
        let bytes = (preserved / 3).max(64) as usize;
        let record = lease.allocate_spec(&AllocationSpec::of::<u8>(bytes, None))?;
        let data = vec![i as u8 + 1; bytes];
        lease.run("fill", |s| s.put_bytes(record.region(), &data, s.rank()))?;
        buffers.push((record, data));
    }
    let lease = consumers[0].claim()?;
    let growth = lease.grow(96 * MIB)?.expect("the budget had to grow");
    assert_eq!(growth.record.to_bytes, 128 * MIB);
    for (i, (record, data)) in buffers.iter().enumerate() {
        let record = lease.current(record.id)?;
        let mut now = vec![0u8; data.len()];
        lease.run("check", |s| {
            s.get_bytes(&mut now, record.region(), s.rank())
        })?;
        if now != *data {
            return Err(Error::new(
                ErrorKind::Protocol,
                "grow",
                format!("buffer {i} changed"),
            ));
        }
    }
    lease.release()?;
    for (consumer, (record, _)) in consumers.iter().zip(&buffers) {
        let lease = consumer.claim()?;
        lease.free(lease.current(record.id)?.id)?;
        lease.release()?;
        consumer.close()?;
    }
    root.close()?;
    Ok(growth.record.timings)
}

fn main() -> hyper_multicore::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let grow = match args.as_slice() {
        [] => None,
        [mode, mib] if mode == "grow" => Some(mib.parse::<u64>().map_err(|e| {
            Error::new(
                ErrorKind::InvalidArgument,
                "arguments",
                format!("MiB {mib:?}: {e}"),
            )
        })?),
        _ => {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                "arguments",
                "usage: restart_timings [grow <preserved MiB>]",
            ))
        }
    };
    let mut rounds = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        rounds.push(match grow {
            Some(mib) => one_growth(mib * MIB)?,
            None => one_restart()?,
        });
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
        let (op, what, bar) = match grow {
            Some(mib) => ("grow", format!("3 consumers, {mib} MiB preserved"), 15),
            None => ("restart", "3 allocations".to_string(), 10),
        };
        println!(
            "{op} 64 MiB -> 128 MiB, {what}, {} PEs: total min {min:.2} ms, median {:.2} ms, max {max:.2} ms (bar: {bar} ms)",
            world.size(),
            median.total_ms()
        );
        println!("median round by stage (ms): {median:?}");
        // The median round's stages, for the report's per-stage line.
        let stages = median
            .by_key()
            .map(|(key, ms)| format!("\"{}\":{ms:.4}", key.trim_end_matches("_ms")))
            .join(",");
        println!(
            "{{\"layer\":\"shmem\",\"op\":\"{op}\",\"bytes\":{},\"pes\":{},\"median_ns\":{:.0},\"min_ns\":{:.0},\"max_ns\":{:.0},\"ref_ns\":null,\"stages_ms\":{{{stages}}}}}",
            128 * MIB,
            world.size(),
            median.total_ms() * 1e6,
            min * 1e6,
            max * 1e6
        );
    }
    Ok(())
}
