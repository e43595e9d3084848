//! Memory per PE for a 1 GiB heap (issue 13's row): pages are touched only where used, so a PE
//! that fills one 1 MiB allocation holds about that much of the heap, whatever the heap's size
//! and the number of PEs. Run under the launcher:
//!
//! ```sh
//! cargo build --release -p hmrun -p hyper-multicore --examples
//! target/release/hmrun -n 8 -- target/release/examples/heap_footprint
//! ```
//!
//! Each PE reads its `/proc/self/smaps_rollup` before the runtime starts, after it starts with a
//! 1 GiB heap, and after it has allocated and written 1 MiB; rank 0 prints every PE's figures
//! (resident, proportional and shared kB) and the heap segment's mapping size.

use hyper_multicore::lifecycle;
use hyper_multicore::world::World;

const MIB: u64 = 1 << 20;

/// `Rss`, `Pss` and `Shared_Clean + Shared_Dirty` of this process, in kB.
fn footprint() -> [u64; 3] {
    let rollup = std::fs::read_to_string("/proc/self/smaps_rollup").unwrap_or_default();
    let field = |name: &str| -> u64 {
        rollup
            .lines()
            .filter(|line| line.starts_with(name))
            .filter_map(|line| line.split_whitespace().nth(1)?.parse::<u64>().ok())
            .sum()
    };
    [field("Rss:"), field("Pss:"), field("Shared_")]
}

fn main() -> hyper_multicore::Result<()> {
    let world = World::global()?;
    let before = footprint();
    lifecycle::acquire(None, Some(1024 * MIB))?;
    let started = footprint();
    let buffer = lifecycle::guarded("allocate", |s| s.allocate::<u8>(MIB as usize, None))?;
    lifecycle::guarded("fill", |s| {
        s.put(&buffer, &vec![1u8; MIB as usize], s.rank())?;
        s.barrier()
    })?;
    let used = footprint();
    let line = format!(
        "{} {} {} {} {} {} {} {} {}",
        before[0],
        before[1],
        before[2],
        started[0],
        started[1],
        started[2],
        used[0],
        used[1],
        used[2]
    );
    let lines = world.control().allgather(line.as_bytes())?;
    if world.rank() == 0 {
        println!(
            "1 GiB heap, {} PEs: kB per PE (resident / proportional / shared) before the \
             runtime, after it started, after writing a 1 MiB allocation",
            world.size()
        );
        for (rank, line) in lines.iter().enumerate() {
            let f: Vec<&str> = std::str::from_utf8(line).unwrap_or("").split(' ').collect();
            if f.len() == 9 {
                println!(
                    "  PE {rank}: {} / {} / {} → {} / {} / {} → {} / {} / {}",
                    f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7], f[8]
                );
            }
        }
    }
    lifecycle::guarded("free", |s| s.free(buffer))?;
    lifecycle::release()?;
    Ok(())
}
