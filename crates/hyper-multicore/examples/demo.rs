//! The README demo: run it under `hmrun -n 4` (`./scripts/demo.sh`). Every PE takes a reference
//! to the managed runtime, passes a token around a ring with put + signal, all-gathers and
//! all-reduces, restarts the runtime with a larger heap (the data moves to new allocations),
//! prints its debug state, frees everything and releases — printing what it did.

use std::time::Instant;

use hyper_multicore::lifecycle::{self, Replacement};
use hyper_multicore::shmem::{AllocationSpec, Comparison, Dtype, ReduceOp, SignalOp, Symmetric};
use hyper_multicore::world::World;

const MIB: u64 = 1 << 20;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let started = Instant::now();
    let world = World::global()?;
    let (rank, size) = (world.rank(), world.size());
    println!("joined a world of {size} via {:?}", world.launcher());

    lifecycle::acquire(None, Some(32 * MIB))?;
    println!(
        "acquired the runtime after {:.1} ms: 32 MiB symmetric heap per PE",
        ms(started)
    );

    let (tokens, arrived, sums) = lifecycle::guarded("allocate", |shmem| {
        Ok((
            shmem.allocate::<u64>(4, None)?,
            shmem.allocate::<u64>(1, None)?,
            shmem.allocate::<f64>(2, None)?,
        ))
    })?;
    println!("allocated 3 symmetric objects at the same offsets on every PE");

    lifecycle::guarded("ring", |shmem| {
        shmem.barrier()?;
        let next = (rank + 1) % size;
        if rank == 0 {
            shmem.put_signal(&tokens, &[0, 0, 0, 0], &arrived, 1, SignalOp::Set, next)?;
        }
        shmem.wait_signal(&arrived, 1, Comparison::Eq, None)?;
        let mut token = [0u64; 4];
        shmem.get(&mut token, &tokens, rank)?;
        if rank == 0 {
            println!(
                "ring: the token went round all {size} PEs and collected ranks summing to {}",
                token[0]
            );
        } else {
            token[0] += rank as u64;
            shmem.put_signal(&tokens, &token, &arrived, 1, SignalOp::Set, next)?;
            println!("ring: PE {rank} added its rank and passed the token to PE {next}");
        }
        shmem.put(&sums, &[rank as f64, 1.0], rank)?;
        shmem.all_reduce(&sums, &sums, ReduceOp::Sum)?;
        let mut out = [0.0; 2];
        shmem.get(&mut out, &sums, rank)?;
        println!(
            "all_reduce(sum): ranks add up to {}, {} PEs counted",
            out[0], out[1]
        );
        Ok(())
    })?;

    // Restart with a 64 MiB heap: every allocation gets a replacement (new shapes and types).
    let replacements = [
        Replacement {
            current: tokens.region(),
            target: AllocationSpec {
                shape: vec![2, 4],
                dtype: Dtype::U64,
                alignment: None,
            },
            preserve: false,
        },
        Replacement {
            current: arrived.region(),
            target: AllocationSpec {
                shape: vec![1],
                dtype: Dtype::U64,
                alignment: None,
            },
            preserve: false,
        },
        Replacement {
            current: sums.region(),
            target: AllocationSpec {
                shape: vec![1024],
                dtype: Dtype::BF16,
                alignment: Some(4096),
            },
            preserve: false,
        },
    ];
    let mut snapshot = || Ok(b"demo step 1".to_vec());
    let result = lifecycle::restart(64 * MIB, &replacements, Some(&mut snapshot))?;
    let t = result.timings;
    println!(
        "restart to 64 MiB: preflight {:.2} ms, quiesce {:.2}, release {:.2}, finalize {:.2}, bootstrap {:.2}, initialize {:.2}, restore {:.2}",
        t.preflight_ms, t.quiesce_ms, t.release_ms, t.finalize_ms, t.bootstrap_ms, t.initialize_ms, t.restore_ms
    );
    let stale = lifecycle::guarded("put", |shmem| shmem.put(&tokens, &[0; 4], rank)).unwrap_err();
    println!(
        "an old handle is refused after the restart: {}",
        stale.message()
    );

    let state = lifecycle::debug_state();
    let heap = state.heap.expect("an active runtime reports its heap");
    println!(
        "debug_state: {:?}, root rank {:?} of {:?}, {} reference, {} allocations, {} bytes in use of {}",
        state.state,
        state.root_rank,
        state.root_size,
        state.reference_count.unwrap_or(0),
        heap.allocation_count,
        heap.allocated_bytes,
        state.config.heap_size
    );

    lifecycle::guarded("free", |shmem| {
        shmem.barrier()?;
        for record in &result.allocations {
            shmem.free_id(record.id)?;
        }
        Ok(())
    })?;
    lifecycle::release()?;
    println!(
        "freed everything and released the runtime after {:.1} ms",
        ms(started)
    );
    Ok(())
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}
