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
    /// with the launcher, and for world rank 0 the world listener inherited. It borrows the plan, so the listener is
    /// still open when the command spawns.
    pub fn command(&self, local_rank: usize, program: impl AsRef<OsStr>) -> PeCommand<'_> {
        let mut command = Command::new(program);
        command.envs(self.environment(local_rank));
        let inherit = self
            .listener
            .as_ref()
            .filter(|_| self.world_rank(local_rank) == 0)
            .map(|bound| bound.listener.as_raw_fd());
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
