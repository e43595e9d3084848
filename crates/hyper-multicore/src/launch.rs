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

use std::ffi::OsStr;
use std::marker::PhantomData;
use std::net::TcpListener;
use std::ops::{Deref, DerefMut};
use std::os::fd::AsRawFd;
use std::process::Command;

use crate::config::{self, Config};
use crate::control::{BootstrapListener, UniqueId};
use crate::error::{Error, ErrorKind, Result};

/// The plan of one job: its size, the world's unique ID and root rank 0's bound listener.
#[derive(Debug)]
pub struct JobPlan {
    size: usize,
    listener: BootstrapListener,
    master_port: Option<u16>,
}

impl JobPlan {
    /// Plans a job of `size` local PEs; binds the world listener now so no port race exists.
    pub fn new(size: usize, config: &Config) -> Result<JobPlan> {
        if size == 0 {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                "plan job",
                "a job needs at least one process; pass a positive process count",
            ));
        }
        let (_, listener) = UniqueId::create(config)?;
        let master_port = if std::env::var_os("MASTER_PORT").is_some() {
            None
        } else {
            Some(free_port()?)
        };
        Ok(JobPlan {
            size,
            listener,
            master_port,
        })
    }

    /// The number of PEs.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The world's unique ID.
    pub fn id(&self) -> &UniqueId {
        self.listener.id()
    }

    /// The environment of PE `rank`, as (name, value) pairs (without the inherited listener).
    pub fn environment(&self, rank: usize) -> Vec<(String, String)> {
        let mut env = vec![
            (config::RANK.to_string(), rank.to_string()),
            (config::WORLD_SIZE.to_string(), self.size.to_string()),
            (config::LOCAL_RANK.to_string(), rank.to_string()),
            (config::WORLD_ID.to_string(), self.id().to_string()),
            ("RANK".to_string(), rank.to_string()),
            ("WORLD_SIZE".to_string(), self.size.to_string()),
            ("LOCAL_RANK".to_string(), rank.to_string()),
            ("LOCAL_WORLD_SIZE".to_string(), self.size.to_string()),
        ];
        if let Some(port) = self.master_port {
            env.push(("MASTER_ADDR".to_string(), "127.0.0.1".to_string()));
            env.push(("MASTER_PORT".to_string(), port.to_string()));
        }
        env
    }

    /// A command running `program` as PE `rank`: its environment set, dying with the launcher,
    /// and for rank 0 the world listener inherited. It borrows the plan, so the listener is
    /// still open when the command spawns.
    pub fn command(&self, rank: usize, program: impl AsRef<OsStr>) -> PeCommand<'_> {
        let mut command = Command::new(program);
        command.envs(self.environment(rank));
        let inherit = (rank == 0).then(|| self.listener.listener.as_raw_fd());
        if let Some(fd) = inherit {
            command.env(config::WORLD_LISTEN_FD, fd.to_string());
        } else {
            command.env_remove(config::WORLD_LISTEN_FD);
        }
        crate::sys::spawn::die_with_parent(&mut command, inherit);
        PeCommand {
            command,
            _plan: PhantomData,
        }
    }
}

/// A [`Command`] for one PE of a [`JobPlan`]; use it as a `Command` (it dereferences to one).
#[derive(Debug)]
pub struct PeCommand<'plan> {
    command: Command,
    _plan: PhantomData<&'plan JobPlan>,
}

impl Deref for PeCommand<'_> {
    type Target = Command;

    fn deref(&self) -> &Command {
        &self.command
    }
}

impl DerefMut for PeCommand<'_> {
    fn deref_mut(&mut self) -> &mut Command {
        &mut self.command
    }
}

/// A currently free TCP port on loopback (for torch's `MASTER_PORT`).
fn free_port() -> Result<u16> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| Error::backend("plan job", "cannot find a free port for MASTER_PORT", e))
}
