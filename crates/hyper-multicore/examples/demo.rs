//! The README demo: run it under `hmrun -n 4` (`./scripts/demo.sh`). Every PE joins the world,
//! starts a runtime with a symmetric heap, passes a token around a ring with put + signal,
//! all-gathers and all-reduces, prints its debug state, frees everything and shuts down —
//! printing what it did.

use std::time::Instant;

use hyper_multicore::control::UniqueId;
use hyper_multicore::shmem::{Comparison, ReduceOp, Shmem, SignalOp};
use hyper_multicore::world::World;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let started = Instant::now();
    let world = World::from_env()?;
    let (rank, size) = (world.rank(), world.size());
    println!("joined a world of {size} via {:?}", world.launcher());

    // Root rank 0 creates the runtime's unique ID; the world's control plane carries it.
    let (id, listener) = if rank == 0 {
        let (id, listener) = Shmem::get_unique_id(world.config())?;
        (world.control().broadcast(&id.to_bytes())?, Some(listener))
    } else {
        (world.control().broadcast(&[])?, None)
    };
    let shmem = Shmem::initialize(
        rank,
        size,
        &UniqueId::from_bytes(&id)?,
        listener,
        Some(64 << 20),
    )?;
    println!(
        "runtime ready after {:.1} ms: {} MiB symmetric heap per PE",
        started.elapsed().as_secs_f64() * 1e3,
        shmem.heap_size() >> 20
    );

    let tokens = shmem.allocate::<u64>(4, None)?;
    let arrived = shmem.allocate::<u64>(1, None)?;
    shmem.barrier()?;
    println!(
        "allocated {} + {} bytes at the same offset on every PE",
        tokens.record().bytes,
        arrived.record().bytes
    );

    // A ring: rank 0 starts a token; each PE adds its rank and passes it on.
    let next = (rank + 1) % size;
    if rank == 0 {
        shmem.put_signal(&tokens, &[1, 0, 0, 0], &arrived, 1, SignalOp::Set, next)?;
    }
    shmem.wait_signal(&arrived, 1, Comparison::Eq, None)?;
    let mut token = [0u64; 4];
    shmem.get(&mut token, &tokens, rank)?;
    println!(
        "ring: token {token:?} arrived from PE {}",
        (rank + size - 1) % size
    );
    if rank != 0 {
        token[0] += rank as u64;
        token[1] += 1;
        shmem.put_signal(&tokens, &token, &arrived, 1, SignalOp::Set, next)?;
    } else {
        println!(
            "ring: the token went round all {size} PEs: sum of ranks {}, {} hops",
            token[0] - 1,
            token[1] + 1
        );
    }
    shmem.barrier()?;

    let gathered = shmem.allocate::<u32>(size, None)?;
    shmem.all_gather(&gathered, &[std::process::id()])?;
    let mut pids = vec![0u32; size];
    shmem.get(&mut pids, &gathered, rank)?;
    println!("all_gather: the PEs' process IDs are {pids:?}");

    let values = shmem.allocate::<f64>(2, None)?;
    shmem.put(&values, &[rank as f64, 1.0], rank)?;
    shmem.all_reduce(&values, &values, ReduceOp::Sum)?;
    let mut sums = [0.0; 2];
    shmem.get(&mut sums, &values, rank)?;
    println!(
        "all_reduce(sum): ranks add up to {}, PEs counted {}",
        sums[0], sums[1]
    );

    let state = shmem.debug_state();
    let heap = state.heap.expect("a ready runtime reports its heap");
    println!(
        "debug_state: {:?}, root rank {:?}/{:?}, {} allocations, {} bytes allocated, {} free",
        state.state,
        state.root_rank,
        state.root_size,
        heap.allocation_count,
        heap.allocated_bytes,
        heap.remaining_bytes
    );

    shmem.barrier()?;
    shmem.free(values)?;
    shmem.free(gathered)?;
    shmem.free(arrived)?;
    shmem.free(tokens)?;
    shmem.shutdown()?;
    println!(
        "freed everything and shut down after {:.1} ms",
        started.elapsed().as_secs_f64() * 1e3
    );
    Ok(())
}
