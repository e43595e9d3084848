//! End-to-end tests of `hmrun`: real processes, each test under a watchdog (see [`support`]).

mod arguments;
mod environment;
mod exit_status;
mod lost_host;
mod multinode;
mod output;
mod runtime_job;
mod signals;
mod support;
