//! `hmrun`: starts the N local processes (PEs) of a hyper_multicore job.
//!
//! ```text
//! hmrun -n N [--timeout S] [--grace S] [--] PROGRAM [ARGS...]
//! hmrun -n N --nnodes M --node-rank R --master-addr HOST [--master-port P] -- PROGRAM [ARGS...]
//! ```
//!
//! The second form is one per-host agent of a job spanning M hosts (the torchrun way): run it on
//! every host with the same `-n`, `--nnodes`, `--master-addr` and `--master-port` and the host's
//! own `--node-rank`; it starts this host's ranks `R × N .. R × N + N` of the world.
//!
//! - Every rank runs `PROGRAM ARGS...` with the world environment of
//!   [`hyper_multicore::launch::JobPlan`]: `HYPER_MULTICORE_RANK`, `HYPER_MULTICORE_WORLD_SIZE`,
//!   `HYPER_MULTICORE_LOCAL_RANK`, `HYPER_MULTICORE_WORLD_ID`, torchrun's `RANK`, `WORLD_SIZE`,
//!   `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `MASTER_ADDR`/`MASTER_PORT`, and for rank 0 the inherited
//!   listener in `HYPER_MULTICORE_WORLD_LISTEN_FD`.
//! - Each line a rank writes is printed as `[rank] line`, stdout to stdout and stderr to stderr
//!   (see [`output`]). The ranks' stdin is `/dev/null`.
//! - SIGINT, SIGTERM and SIGHUP sent to hmrun are forwarded to every rank. Each rank runs in its
//!   own process group and signals go to the whole group, so a rank's children get them too
//!   (exactly once: the terminal's Ctrl-C reaches hmrun alone). When a rank's main process ends,
//!   whatever it left running in its group is killed.
//! - When a rank fails, the others get SIGTERM and, `--grace` seconds later, SIGKILL (see [`job`]).
//!   If hmrun has already forwarded a signal, that signal counts as the SIGTERM: the ranks finish
//!   their own shutdown undisturbed until the grace period ends.
//! - The ranks die with hmrun, even if it is killed with SIGKILL (`PR_SET_PDEATHSIG`); processes
//!   the ranks started themselves are not covered by that.
//!
//! Exit status: 0 when every rank exited 0; else the first failing rank's status (128 + the
//! signal number if a signal killed it); 124 after `--timeout`; 2 for bad arguments or
//! configuration (checked before anything starts); 1 when hmrun itself fails.

mod job;
mod output;
mod signals;

use std::ffi::OsString;
use std::fmt;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use hyper_multicore::config::{parse_seconds, Config};
use hyper_multicore::launch::NodePlacement;

use crate::job::JobSpec;

/// Exit code for bad arguments or configuration, as clap uses for its own usage errors.
const USAGE_EXIT_CODE: u8 = 2;

/// Start N local processes of a hyper_multicore job, prefix their output with the rank, and stop
/// them all when one fails.
#[derive(Debug, Parser)]
#[command(
    name = "hmrun",
    version,
    after_help = "Exit status: 0 if every rank exited 0; else the first failing rank's status \
                  (128 + signal number if a signal killed it); 124 after --timeout; 2 for bad \
                  arguments or configuration; 1 if hmrun itself fails."
)]
struct Cli {
    /// Number of processes (ranks) to start.
    #[arg(short = 'n', long = "nprocs", value_name = "N", value_parser = parse_process_count)]
    processes: usize,

    /// Stop the job if it still runs after S seconds (fractions allowed); hmrun then exits 124.
    #[arg(long, value_name = "S", value_parser = parse_seconds)]
    timeout: Option<Duration>,

    /// Seconds a stopping rank gets between SIGTERM (or a signal hmrun forwarded) and SIGKILL.
    #[arg(long, value_name = "S", value_parser = parse_seconds, default_value = "2")]
    grace: Duration,

    /// Number of hosts of a job spanning hosts: run one hmrun per host, each with the same -n,
    /// --nnodes, --master-addr and --master-port and its own --node-rank (and the same
    /// HYPER_MULTICORE_SHMEM_SECRET, e.g. from a shared file, so the rendezvous is authenticated).
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = parse_process_count)]
    nnodes: usize,

    /// This host's index in 0..N; node 0 hosts world rank 0. Its ranks are node-rank × -n + 0..n.
    #[arg(long, value_name = "R", default_value_t = 0)]
    node_rank: usize,

    /// An address of node 0 that every host reaches (required with --nnodes above 1).
    #[arg(long, value_name = "HOST")]
    master_addr: Option<String>,

    /// torch's store port on node 0 (MASTER_PORT); the world's rendezvous uses the next port.
    #[arg(long, value_name = "PORT", default_value_t = 29500)]
    master_port: u16,

    /// The program every rank runs (searched in PATH unless it contains a '/'), then its
    /// arguments. Everything from PROGRAM on is passed to the ranks, options included.
    #[arg(
        required = true,
        num_args = 1..,
        trailing_var_arg = true,
        value_names = ["PROGRAM", "ARGS"]
    )]
    command: Vec<OsString>,
}

/// A mistake of the user, reported before anything starts (exit code 2).
#[derive(Debug)]
struct UsageError(String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// Parses the process count of `-n`: a positive integer.
fn parse_process_count(text: &str) -> Result<usize, String> {
    match text.trim().parse::<usize>() {
        Ok(0) => Err("a job needs at least one process".to_string()),
        Ok(count) => Ok(count),
        Err(_) => Err("expected a positive number of processes".to_string()),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match launch(cli) {
        Ok(code) => ExitCode::from(code),
        Err(err) => {
            eprintln!("hmrun: {err:#}");
            if err.is::<UsageError>() {
                ExitCode::from(USAGE_EXIT_CODE)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

/// Checks what the command line and the environment ask for, then runs the job.
fn launch(cli: Cli) -> anyhow::Result<u8> {
    let mut command = cli.command.into_iter();
    let arg0 = command.next().expect("clap requires PROGRAM");
    let config = Config::from_env().map_err(|err| UsageError(err.to_string()))?;
    hyper_multicore::logging::install_as("hmrun").map_err(|err| UsageError(err.to_string()))?;
    let program =
        hyper_multicore::launch::program::resolve(&arg0, std::env::var_os("PATH").as_deref())
            .map_err(|err| UsageError(err.to_string()))?;
    let nodes = match (cli.nnodes, cli.master_addr) {
        (1, None) => None,
        (nodes, Some(master_addr)) => Some(NodePlacement {
            nodes,
            node_rank: cli.node_rank,
            master_addr,
            master_port: cli.master_port,
        }),
        (_, None) => {
            return Err(UsageError(
                "--nnodes above 1 needs --master-addr: an address of node 0 that every host \
                 reaches"
                    .into(),
            )
            .into())
        }
    };
    if cli.node_rank >= cli.nnodes {
        return Err(UsageError(format!(
            "--node-rank {} is outside 0..{} (--nnodes)",
            cli.node_rank, cli.nnodes
        ))
        .into());
    }
    let spec = JobSpec {
        nodes,
        processes: cli.processes,
        program,
        arg0,
        args: command.collect(),
        timeout: cli.timeout,
        grace: cli.grace,
    };
    job::run(&spec, &config)
}
