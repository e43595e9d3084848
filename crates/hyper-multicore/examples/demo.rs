//! The README demo: run it under `hmrun -n 4`. Every PE joins the world, the PEs exchange their
//! process IDs, rank 0 broadcasts a message, two ordered subgroups talk at the same time, and
//! everyone leaves cleanly — printing what it did.

use std::time::Instant;

use hyper_multicore::world::World;

fn main() -> Result<(), hyper_multicore::Error> {
    let started = Instant::now();
    let world = World::from_env()?;
    let (rank, size) = (world.rank(), world.size());
    println!(
        "joined a world of {size} via {:?} in {:.1} ms",
        world.launcher(),
        started.elapsed().as_secs_f64() * 1e3
    );

    let pids = world
        .control()
        .allgather(&std::process::id().to_le_bytes())?;
    let pids: Vec<u32> = pids
        .iter()
        .map(|b| u32::from_le_bytes(b[..4].try_into().expect("4 bytes")))
        .collect();
    println!("allgather: the PEs' process IDs are {pids:?}");

    let message = world
        .control()
        .broadcast(format!("hello from rank 0 of {size}").as_bytes())?;
    println!("broadcast: {}", String::from_utf8_lossy(&message));

    // Pairs in reverse order, so group rank 0 is the higher world rank.
    let pair_start = rank - rank % 2;
    let members: Vec<usize> = (pair_start..(pair_start + 2).min(size)).rev().collect();
    let group = world.new_group(&members)?;
    let greetings = group
        .control()
        .allgather(format!("world rank {rank}").as_bytes())?;
    let greetings: Vec<String> = greetings
        .iter()
        .map(|g| String::from_utf8_lossy(g).into_owned())
        .collect();
    println!(
        "group {members:?}: I am group rank {}, the group says {greetings:?}",
        group.rank()
    );
    drop(group);

    world.control().barrier()?;
    println!(
        "barrier passed; leaving after {:.1} ms",
        started.elapsed().as_secs_f64() * 1e3
    );
    Ok(())
}
