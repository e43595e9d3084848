//! The world — every process of the job, as the launcher described it — and ordered subgroups
//! of it that run their own collectives.
//!
//! [`World::from_env`] reads the first launcher description it finds (see
//! [`environment`](self) and docs/configuration.md):
//! 1. hmrun's variables (`HYPER_MULTICORE_RANK`, `HYPER_MULTICORE_WORLD_SIZE`,
//!    `HYPER_MULTICORE_LOCAL_RANK`, `HYPER_MULTICORE_WORLD_ID`) — also when hmrun runs as one
//!    per-host agent of a job spanning hosts,
//! 2. torchrun's (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `GROUP_RANK`), Open
//!    MPI's (`OMPI_COMM_WORLD_RANK`, `…_SIZE`, `…_LOCAL_RANK`, `…_LOCAL_SIZE`) or Slurm's
//!    (`SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`, `SLURM_NODEID`): root rank 0 listens on
//!    `HYPER_MULTICORE_SHMEM_BOOTSTRAP_ENDPOINT`, else on `MASTER_ADDR` at `MASTER_PORT + 1`; the
//!    secret is `HYPER_MULTICORE_SHMEM_SECRET` (the Python front sets it from a value rank 0
//!    draws and broadcasts over torch.distributed) — without it the secret is derived from
//!    public launch values and a warning says the rendezvous is unauthenticated,
//! 3. nothing: a standalone world of one process.
//!
//! ```no_run
//! use hyper_multicore::world::World;
//! let world = World::from_env()?;
//! // Like torch.distributed.new_group, but only the members call it.
//! if world.rank() < 2 {
//!     let pair = world.new_group(&[0, 1])?;
//!     pair.control().barrier()?;
//! }
//! # Ok::<(), hyper_multicore::Error>(())
//! ```

mod environment;
mod group;

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

pub use group::Group;

use crate::config::Config;
use crate::control::{ControlPlane, GroupChannel};
use crate::error::Result;

/// How the world was described.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launcher {
    /// Started by `hmrun` (or anything setting its variables), on one host or as per-host agents.
    Hmrun,
    /// Started by torchrun (`RANK`/`WORLD_SIZE`/…).
    Torchrun,
    /// Started by Open MPI's mpirun (`OMPI_COMM_WORLD_*`).
    OpenMpi,
    /// Started by Slurm's srun (`SLURM_PROCID`/`SLURM_NTASKS`/…).
    Slurm,
    /// No launcher: one process alone.
    Standalone,
}

/// Every process of the job, with a connected control plane over all of them.
#[derive(Debug)]
pub struct World {
    launcher: Launcher,
    local_rank: usize,
    config: Config,
    control: ControlPlane,
    groups_created: Mutex<HashMap<Vec<usize>, u64>>,
    /// Subgroups made by [`World::subgroup`], one per member list, freed with the world.
    subgroups: Mutex<HashMap<Vec<usize>, Arc<Group>>>,
}

impl World {
    fn assemble(
        launcher: Launcher,
        local_rank: usize,
        config: Config,
        control: ControlPlane,
    ) -> World {
        crate::logging::set_rank(control.rank());
        World {
            launcher,
            local_rank,
            config,
            control,
            groups_created: Mutex::new(HashMap::new()),
            subgroups: Mutex::new(HashMap::new()),
        }
    }

    /// This process's rank in the world.
    pub fn rank(&self) -> usize {
        self.control.rank()
    }

    /// The number of processes in the world.
    pub fn size(&self) -> usize {
        self.control.size()
    }

    /// This process's rank among the processes on its host.
    pub fn local_rank(&self) -> usize {
        self.local_rank
    }

    /// How the world was described.
    pub fn launcher(&self) -> Launcher {
        self.launcher
    }

    /// The configuration read at start.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The world's control plane (collectives over every process).
    pub fn control(&self) -> &ControlPlane {
        &self.control
    }
}

impl GroupChannel for World {
    fn rank(&self) -> usize {
        World::rank(self)
    }
    fn size(&self) -> usize {
        World::size(self)
    }
    fn members(&self) -> Vec<usize> {
        (0..World::size(self)).collect()
    }
    fn distributed(&self) -> bool {
        self.launcher != Launcher::Standalone
    }
    fn allgather(&self, data: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.control.allgather(data)
    }
    fn barrier(&self) -> Result<()> {
        self.control.barrier()
    }
    fn ensure_alive(&self) -> Result<()> {
        self.control.ensure_alive()
    }
}

static GLOBAL_WORLD: Mutex<Option<Arc<World>>> = Mutex::new(None);

impl World {
    /// The process-wide world, created from the environment by the first call (a collective
    /// call then: every process of the job must make it). Later calls return the same world.
    pub fn global() -> Result<Arc<World>> {
        let mut global = GLOBAL_WORLD.lock();
        if let Some(world) = global.as_ref() {
            return Ok(Arc::clone(world));
        }
        let world = Arc::new(World::from_env()?);
        *global = Some(Arc::clone(&world));
        Ok(world)
    }

    /// The process-wide world if [`World::global`] has created it (never creates it).
    pub(crate) fn existing() -> Option<Arc<World>> {
        GLOBAL_WORLD.lock().clone()
    }
}
