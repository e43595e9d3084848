//! Starting the processes of a job: the environment every PE needs, shared by `hmrun` and the
//! multi-process tests so both launch PEs the same way.
//!
//! ```no_run
//! use hyper_multicore::{config::Config, launch::JobPlan};
//! let plan = JobPlan::new(2, &Config::from_env()?)?;
//! let children: Vec<_> = (0..2)
//!     .map(|rank| plan.command(rank, "my-program").spawn())
//!     .collect::<Result<_, _>>()?;
//! drop(plan); // the launcher's copy of rank 0's listener is no longer needed
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::marker::PhantomData;
use std::net::TcpListener;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::process::ExitStatus;

use crate::config::{self, Config};

pub mod program;
use crate::control::{BootstrapListener, UniqueId};
use crate::error::{Error, ErrorKind, Result};

/// The plan of one launcher's part of a job: how many PEs it starts, where they sit in the
/// world, the world's unique ID and — on the host of world rank 0 — its bound listener.
#[derive(Debug)]
pub struct JobPlan {
    size: usize,
    nodes: Option<NodePlacement>,
    id: UniqueId,
    listener: Option<BootstrapListener>,
    master: Option<(String, u16)>,
}

/// Where a launcher's PEs sit in a job that spans hosts: one launcher per host (hmrun as a
/// per-host agent, the torchrun way), each starting the same number of PEs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodePlacement {
    /// Number of hosts.
    pub nodes: usize,
    /// This host's index, `0..nodes`; node 0 hosts world rank 0 and its rendezvous.
    pub node_rank: usize,
    /// An address of node 0 that every host reaches.
    pub master_addr: String,
    /// torch's store port (`MASTER_PORT`); the world's rendezvous listens on the next port.
    pub master_port: u16,
}

impl JobPlan {
    /// Plans a job of `size` PEs on this host; binds the world listener now so no port race
    /// exists.
    pub fn new(size: usize, config: &Config) -> Result<JobPlan> {
        check_size(size)?;
        let (id, listener) = UniqueId::create(config)?;
        let master = match std::env::var_os("MASTER_PORT") {
            Some(_) => None,
            None => Some(("127.0.0.1".to_string(), free_port()?)),
        };
        Ok(JobPlan {
            size,
            nodes: None,
            id,
            listener: Some(listener),
            master,
        })
    }

    /// Plans this host's `size` PEs of a job spanning `placement.nodes` hosts. Every host's
    /// launcher must be given the same placement (but its own `node_rank`) and the same
    /// `HYPER_MULTICORE_SHMEM_SECRET`; without that variable the world's secret is derived from
    /// the master address and port, which anyone can know (a warning says so). Node 0 binds
    /// the world's rendezvous on `master_addr` at `master_port + 1` now.
    pub fn across_nodes(size: usize, placement: NodePlacement, config: &Config) -> Result<JobPlan> {
        const OP: &str = "plan job";
        check_size(size)?;
        if placement.nodes == 0 || placement.node_rank >= placement.nodes {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                OP,
                format!(
                    "node rank {} is outside a job of {} nodes; give each host's launcher a \
                     distinct node rank in 0..{}",
                    placement.node_rank, placement.nodes, placement.nodes
                ),
            ));
        }
        let port = placement.master_port.checked_add(1).ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidArgument,
                OP,
                "the master port must be below 65535 (the rendezvous uses the next one)",
            )
        })?;
        let endpoint = match config.bootstrap_endpoint {
            Some(endpoint) => endpoint,
            None => config::parse_endpoint(&format!("tcp://{}:{port}", placement.master_addr))
                .map_err(|why| {
                    Error::new(
                        ErrorKind::InvalidArgument,
                        OP,
                        format!("master address {:?}: {why}", placement.master_addr),
                    )
                })?,
        };
        let secret = crate::control::unique_id::world_secret(
            |name| std::env::var(name).ok(),
            &[
                placement.master_addr.clone(),
                placement.master_port.to_string(),
            ],
            "the master address and port",
        )?;
        let id = UniqueId::new(endpoint, secret);
        let listener = match placement.node_rank {
            0 => Some(BootstrapListener::bind(&id)?),
            _ => None,
        };
        let master = Some((placement.master_addr.clone(), placement.master_port));
        Ok(JobPlan {
            size,
            nodes: Some(placement),
            id,
            listener,
            master,
        })
    }

    /// The number of PEs this plan starts (on this host).
    pub fn size(&self) -> usize {
        self.size
    }

    /// The number of PEs in the whole job (all hosts).
    pub fn world_size(&self) -> usize {
        self.size * self.nodes.as_ref().map_or(1, |n| n.nodes)
    }

    /// The world rank of this plan's PE `local_rank`.
    pub fn world_rank(&self, local_rank: usize) -> usize {
        self.nodes.as_ref().map_or(0, |n| n.node_rank) * self.size + local_rank
    }

    /// The world's unique ID.
    pub fn id(&self) -> &UniqueId {
        &self.id
    }

    /// The environment of this plan's PE `local_rank`, as (name, value) pairs (without the
    /// inherited listener).
    pub fn environment(&self, local_rank: usize) -> Vec<(String, String)> {
        let rank = self.world_rank(local_rank).to_string();
        let (size, local) = (self.world_size().to_string(), local_rank.to_string());
        let mut env = vec![
            (config::RANK.to_string(), rank.clone()),
            (config::WORLD_SIZE.to_string(), size.clone()),
            (config::LOCAL_RANK.to_string(), local.clone()),
            (config::WORLD_ID.to_string(), self.id().to_string()),
            ("RANK".to_string(), rank),
            ("WORLD_SIZE".to_string(), size),
            ("LOCAL_RANK".to_string(), local),
            ("LOCAL_WORLD_SIZE".to_string(), self.size.to_string()),
        ];
        if let Some(nodes) = &self.nodes {
            env.push(("GROUP_RANK".to_string(), nodes.node_rank.to_string()));
        }
        if let Some((addr, port)) = &self.master {
            env.push(("MASTER_ADDR".to_string(), addr.clone()));
            env.push(("MASTER_PORT".to_string(), port.to_string()));
        }
        env
    }

    /// A command running `program` as this plan's PE `local_rank`: its environment set, dying
    /// with the launcher, and for world rank 0 the world listener inherited. It borrows the
    /// plan, so the listener is still open when the command spawns.
    pub fn command(&self, local_rank: usize, program: impl AsRef<OsStr>) -> PeCommand<'_> {
        let inherit = self
            .listener
            .as_ref()
            .filter(|_| self.world_rank(local_rank) == 0)
            .map(|bound| bound.listener.as_raw_fd());
        let mut command = PeCommand {
            program: program.as_ref().to_os_string(),
            arg0: None,
            args: Vec::new(),
            env: Vec::new(),
            stdio: [PeStdio::Inherit; 3],
            process_group: false,
            inherit,
            _plan: PhantomData,
        };
        command.envs(self.environment(local_rank));
        match inherit {
            Some(fd) => command.env(config::WORLD_LISTEN_FD, fd.to_string()),
            None => command.env_remove(config::WORLD_LISTEN_FD),
        };
        command
    }
}

/// How a PE's standard stream is connected.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PeStdio {
    /// The launcher's own stream.
    #[default]
    Inherit,
    /// `/dev/null`.
    Null,
    /// A pipe whose other end is the launcher's, in [`PeChild`].
    Piped,
}

/// The process of one PE of a [`JobPlan`], to be started by [`PeCommand::spawn`]: a builder
/// like [`std::process::Command`]'s (program, `argv[0]`, arguments, environment on top of this
/// process's, standard streams, process group).
///
/// Unlike a `Command`, it does not fork the launcher: the child is created sharing the
/// launcher's memory until it executes the program (as `posix_spawn` does) and arms its
/// parent-death signal on the way, so a PE dies with its launcher, even one killed by SIGKILL
/// (`PR_SET_PDEATHSIG`: with the launcher's *thread* that spawned it, so spawn PEs from a
/// thread that lives as long as they should).
#[derive(Debug)]
pub struct PeCommand<'plan> {
    program: OsString,
    arg0: Option<OsString>,
    args: Vec<OsString>,
    /// Changes to this process's environment, in order (`None`: removed).
    env: Vec<(OsString, Option<OsString>)>,
    stdio: [PeStdio; 3],
    process_group: bool,
    inherit: Option<RawFd>,
    _plan: PhantomData<&'plan JobPlan>,
}

impl PeCommand<'_> {
    /// Sets `argv[0]` (by default the program as given).
    pub fn arg0(&mut self, arg0: impl AsRef<OsStr>) -> &mut Self {
        self.arg0 = Some(arg0.as_ref().to_os_string());
        self
    }

    /// Adds an argument.
    pub fn arg(&mut self, arg: impl AsRef<OsStr>) -> &mut Self {
        self.args.push(arg.as_ref().to_os_string());
        self
    }

    /// Adds arguments.
    pub fn args<I, S>(&mut self, args: I) -> &mut Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.args
            .extend(args.into_iter().map(|a| a.as_ref().to_os_string()));
        self
    }

    /// Sets an environment variable of the PE.
    pub fn env(&mut self, name: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> &mut Self {
        let value = Some(value.as_ref().to_os_string());
        self.env.push((name.as_ref().to_os_string(), value));
        self
    }

    /// Sets environment variables of the PE.
    pub fn envs<I, K, V>(&mut self, vars: I) -> &mut Self
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<OsStr>,
        V: AsRef<OsStr>,
    {
        for (name, value) in vars {
            self.env(name, value);
        }
        self
    }

    /// Removes an environment variable from the PE's environment.
    pub fn env_remove(&mut self, name: impl AsRef<OsStr>) -> &mut Self {
        self.env.push((name.as_ref().to_os_string(), None));
        self
    }

    /// Connects the PE's standard input.
    pub fn stdin(&mut self, stdio: PeStdio) -> &mut Self {
        self.stdio[0] = stdio;
        self
    }

    /// Connects the PE's standard output.
    pub fn stdout(&mut self, stdio: PeStdio) -> &mut Self {
        self.stdio[1] = stdio;
        self
    }

    /// Connects the PE's standard error.
    pub fn stderr(&mut self, stdio: PeStdio) -> &mut Self {
        self.stdio[2] = stdio;
        self
    }

    /// Puts the PE in a process group of its own (its process ID), so a signal to the group
    /// reaches everything it starts.
    pub fn process_group(&mut self, own: bool) -> &mut Self {
        self.process_group = own;
        self
    }

    /// Starts the PE; returns once it executes the program (a program that cannot be executed
    /// is this call's error).
    pub fn spawn(&mut self) -> std::io::Result<PeChild> {
        let mut env: Vec<(OsString, OsString)> = std::env::vars_os().collect();
        for (name, value) in &self.env {
            env.retain(|(n, _)| n != name);
            if let Some(value) = value {
                env.push((name.clone(), value.clone()));
            }
        }
        // The child's ends (closed here once it has its copies) and the launcher's.
        let mut child_ends: [Option<OwnedFd>; 3] = [None, None, None];
        let mut ours: [Option<File>; 3] = [None, None, None];
        for (stream, stdio) in self.stdio.iter().enumerate() {
            match stdio {
                PeStdio::Inherit => {}
                PeStdio::Null => {
                    let flags = rustix::fs::OFlags::RDWR | rustix::fs::OFlags::CLOEXEC;
                    child_ends[stream] = Some(rustix::fs::open(
                        "/dev/null",
                        flags,
                        rustix::fs::Mode::empty(),
                    )?);
                }
                PeStdio::Piped => {
                    let (read, write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
                    let (child, launcher) = match stream {
                        0 => (read, write),
                        _ => (write, read),
                    };
                    child_ends[stream] = Some(child);
                    ours[stream] = Some(File::from(launcher));
                }
            }
        }
        let argv0 = self.arg0.as_deref().unwrap_or(&self.program);
        // The program is looked up in the child's PATH, as `execvp` would, before the clone.
        let search = env.iter().find(|(name, _)| name == "PATH");
        let path = program::resolve(&self.program, search.map(|(_, v)| v.as_os_str()))?;
        let spawn = crate::sys::spawn::Spawn {
            path: &path,
            argv: std::iter::once(argv0)
                .chain(self.args.iter().map(OsString::as_os_str))
                .collect(),
            env,
            stdio: child_ends
                .each_ref()
                .map(|end| end.as_ref().map(AsRawFd::as_raw_fd)),
            process_group: self.process_group,
            inherit: self.inherit,
        };
        let id = crate::sys::spawn::spawn(&spawn)?;
        let [stdin, stdout, stderr] = ours;
        Ok(PeChild {
            id,
            status: None,
            stdin,
            stdout,
            stderr,
        })
    }
}

/// A PE started by [`PeCommand::spawn`]. Dropping it neither kills nor waits for the process.
#[derive(Debug)]
pub struct PeChild {
    id: u32,
    status: Option<ExitStatus>,
    /// The launcher's end of the PE's standard input, if [`PeStdio::Piped`].
    pub stdin: Option<File>,
    /// The launcher's end of the PE's standard output, if [`PeStdio::Piped`].
    pub stdout: Option<File>,
    /// The launcher's end of the PE's standard error, if [`PeStdio::Piped`].
    pub stderr: Option<File>,
}

impl PeChild {
    /// The PE's process ID (also its process group's, with [`PeCommand::process_group`]).
    pub fn id(&self) -> u32 {
        self.id
    }

    /// [`PeChild::id`] as a `rustix` process ID (for signals and waits through `rustix`).
    pub fn pid(&self) -> rustix::process::Pid {
        rustix::process::Pid::from_raw(self.id as i32).expect("a process ID is positive")
    }

    /// Waits for the PE to exit and reaps it (later calls return the same status). Closes
    /// the launcher's end of the PE's standard input first, as `std::process::Child::wait`
    /// does, so a PE reading it to its end is not left waiting.
    pub fn wait(&mut self) -> std::io::Result<ExitStatus> {
        drop(self.stdin.take());
        if let Some(status) = self.status {
            return Ok(status);
        }
        let status = crate::sys::spawn::wait(self.id)?;
        self.status = Some(status);
        Ok(status)
    }
}

fn check_size(size: usize) -> Result<()> {
    if size == 0 {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            "plan job",
            "a job needs at least one process; pass a positive process count",
        ));
    }
    Ok(())
}

/// A currently free TCP port on loopback (for torch's `MASTER_PORT`).
fn free_port() -> Result<u16> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| Error::backend("plan job", "cannot find a free port for MASTER_PORT", e))
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use super::*;

    fn read_all(file: Option<File>) -> String {
        let mut text = String::new();
        file.expect("piped").read_to_string(&mut text).unwrap();
        text
    }

    #[test]
    fn a_pe_runs_its_program_with_the_arguments_environment_and_streams_given() {
        let plan = JobPlan::new(2, &Config::default()).unwrap();
        let script = r#"echo "$0 $1 rank=$RANK removed=${HM_TEST_REMOVED-unset} set=$HM_TEST_SET"
read line; echo "got $line" >&2; exit 7"#;
        let mut child = plan
            .command(1, "sh")
            .args(["-c", script, "zero", "one"])
            .env("HM_TEST_REMOVED", "1")
            .env_remove("HM_TEST_REMOVED")
            .env("HM_TEST_SET", "yes")
            .stdin(PeStdio::Piped)
            .stdout(PeStdio::Piped)
            .stderr(PeStdio::Piped)
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(b"hello\n").unwrap();
        assert_eq!(
            read_all(child.stdout.take()),
            "zero one rank=1 removed=unset set=yes\n"
        );
        assert_eq!(read_all(child.stderr.take()), "got hello\n");
        assert_eq!(child.wait().unwrap().code(), Some(7));
        assert_eq!(child.wait().unwrap().code(), Some(7), "the status is kept");
    }

    #[test]
    fn rank_0_alone_inherits_the_world_listener_and_a_pe_may_lead_its_own_group() {
        let plan = JobPlan::new(2, &Config::default()).unwrap();
        let script = format!(
            r#"fd=${{{}-none}}; [ "$fd" = none ] || [ -e /proc/$$/fd/$fd ] || fd=closed
echo "$fd $(cut -d' ' -f5 /proc/$$/stat)""#,
            config::WORLD_LISTEN_FD
        );
        for rank in [0, 1] {
            let mut child = plan
                .command(rank, "sh")
                .args(["-c", &script])
                .process_group(true)
                .stdout(PeStdio::Piped)
                .spawn()
                .unwrap();
            let said = read_all(child.stdout.take());
            let (fd, group) = said.trim().split_once(' ').unwrap();
            assert_eq!(group, child.id().to_string(), "its own process group");
            match rank {
                0 => assert!(fd.parse::<u32>().is_ok(), "an open listener: {said}"),
                _ => assert_eq!(fd, "none", "{said}"),
            }
            assert!(child.wait().unwrap().success());
        }
    }

    #[test]
    fn a_program_that_cannot_be_executed_is_the_spawns_error() {
        let plan = JobPlan::new(1, &Config::default()).unwrap();
        for (program, kind) in [
            ("hm-no-such-program", std::io::ErrorKind::NotFound),
            ("/nonexistent/hm-program", std::io::ErrorKind::NotFound),
            ("/", std::io::ErrorKind::PermissionDenied),
        ] {
            let error = plan.command(0, program).spawn().unwrap_err();
            assert_eq!(error.kind(), kind, "{program}: {error}");
        }
    }
}
