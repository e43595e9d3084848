//! # libhmshmem: the OpenSHMEM 1.5 C API over hyper_multicore
//!
//! `cargo build` produces `libhmshmem.so` / `libhmshmem.a`, the headers `include/shmem.h` and
//! `include/shmemx.h`, `pkgconfig/hmshmem.pc` and the compiler wrapper `hmcc`, all in
//! `target/<profile>/`. An unmodified OpenSHMEM program then runs with
//!
//! ```text
//! target/debug/hmcc prog.c -o prog
//! target/debug/hmrun -n 4 -- ./prog
//! ```
//!
//! Every call goes to the Rust runtime (the lifecycle's process-wide [`Shmem`]): this crate
//! only translates — a symmetric address into the runtime's (allocation, offset) region
//! (`job/addresses.rs`), a C buffer into bytes (`sys/caller_memory.rs`), a failure into one
//! line on stderr and a non-zero exit (`failure.rs`). docs/c-api.md lists what is covered and
//! the deviations.
//!
//! [`Shmem`]: hyper_multicore::shmem::Shmem

mod atomics;
mod collectives;
mod contexts;
mod extensions;
mod failure;
mod job;
mod locks;
mod memory;
mod rma;
mod setup;
mod sys;
mod teams;
mod typed;
mod wait;
