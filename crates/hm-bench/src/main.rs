//! `hm-bench`: the benchmark harness of hyper_multicore.
//!
//! Each benchmark family is a subcommand whose driver launches a job of PEs of this very binary
//! (through [`hyper_multicore::launch::JobPlan`], not `hmrun`), collects the JSON lines they
//! print, and reports one row per operation and PE count, next to a reference measured in the
//! same run. The PEs run a hidden `pe-…` subcommand of the same family.
//!
//! ```text
//! cargo run --release -p hm-bench -- control                # table
//! cargo run --release -p hm-bench -- control --json --quick --pes 2,4
//! cargo run --release -p hm-bench -- shmem --json --pes 2,4,8,16,32
//! cargo run --release -p hm-bench -- programs --json --pes 2,4,8
//! ```
//!
//! Unsafe code is denied except in `shared_word.rs` (raw atomics on the symmetric heap, the
//! floor the data plane is compared with).

#![deny(unsafe_code)]
#![warn(clippy::missing_docs_in_private_items)]

mod control;
mod launch;
mod programs;
mod reference;
mod report;
mod shared_word;
mod shmem;
mod stats;

use clap::{Parser, Subcommand};

/// The command line.
#[derive(Debug, Parser)]
#[command(
    name = "hm-bench",
    version,
    about = "Benchmarks of the hyper_multicore runtime"
)]
struct Cli {
    /// Which benchmark family to run.
    #[command(subcommand)]
    command: Command,
}

/// The benchmark families, and the hidden PE side of each.
#[derive(Debug, Subcommand)]
enum Command {
    /// Control plane: rendezvous, barrier, allgather and broadcast for each PE count.
    Control(control::DriverArgs),
    /// One PE of a control-plane job (started by `control`, not by hand).
    #[command(hide = true)]
    PeControl(control::PeArgs),
    /// Data plane: init, barrier, put/get, signal ping-pong, fetch-add, malloc+free, all-to-all.
    Shmem(shmem::DriverArgs),
    /// One PE of a data-plane job (started by `shmem`, not by hand).
    #[command(hide = true)]
    PeShmem(shmem::PeArgs),
    /// How real programs call the runtime: put/get with heap and private buffers, windows of
    /// puts, a peer waiting in a barrier, every collective at 8 B to 16 MiB on 2, 4, 8 PEs.
    Programs(programs::DriverArgs),
    /// One PE of a programs job (started by `programs`, not by hand).
    #[command(hide = true)]
    PePrograms(programs::PeArgs),
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Control(args) => control::drive(&args),
        Command::PeControl(args) => control::run_pe(&args),
        Command::Shmem(args) => shmem::drive(&args),
        Command::PeShmem(args) => shmem::run_pe(&args),
        Command::Programs(args) => programs::drive(&args),
        Command::PePrograms(args) => programs::run_pe(&args),
    }
}
