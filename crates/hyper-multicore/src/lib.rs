//! # hyper_multicore
//!
//! A symmetric-memory (SHMEM) runtime with a managed, collective lifecycle for multi-process
//! programs. A job is N cooperating processes (PEs); this crate gives them
//!
//! - a [`world::World`] read from the launcher environment (`hmrun`, torchrun, or standalone),
//!   with ordered subgroups that run their own collectives,
//! - a [`control::ControlPlane`]: an authenticated TCP star through root rank 0 with
//!   allgather / broadcast / barrier and point-to-point messages, where every wait has a deadline
//!   and ends early with a *peer lost* error naming the rank when a member dies,
//! - one [`Error`] type whose [`ErrorKind`] names the recovery decision.
//!
//! ```no_run
//! use hyper_multicore::world::World;
//! let world = World::from_env()?;
//! let names = world.control().allgather(format!("pe {}", world.rank()).as_bytes())?;
//! world.control().barrier()?;
//! # Ok::<(), hyper_multicore::Error>(())
//! ```

#![deny(unsafe_code)]
// The loom build (`--cfg loom`, scripts/test.sh) compiles the crate for its protocol models,
// which use only part of it: what the rest uses is unused there.
#![cfg_attr(loom, allow(dead_code, unused_imports))]

pub mod config;
pub mod control;
pub mod error;
pub mod launch;
pub mod lifecycle;
pub mod logging;
mod primitive;
pub mod shmem;
mod sys;
mod transport;
pub mod world;

pub use error::{Error, ErrorKind, Recovery, Result};

/// The README's Rust quick start, compiled and run as a doctest (as a standalone one-PE root).
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeQuickStart;
