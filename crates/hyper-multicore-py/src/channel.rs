//! Root groups as the lifecycle sees them ([`GroupChannel`]): a torch `ProcessGroup` reached
//! through a Python callable, or an ordered subgroup of the launcher's world.
//!
//! With torch.distributed initialised, the Python wrapper passes the group's rank, size, ordered
//! global ranks (`torch.distributed.get_process_group_ranks`) and a function that runs
//! `torch.distributed.all_gather_object` over it; the lifecycle's every exchange — the unique ID
//! from root rank 0, each converged stage's outcome — then travels over torch. Without it, a list
//! of world ranks forms a subgroup of [`World::global`] (hmrun's or torchrun's environment) with
//! its own control plane, created once per membership and reused by later acquires.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use hyper_multicore::control::GroupChannel;
use hyper_multicore::world::{Group, Launcher, World};
use hyper_multicore::{Error, ErrorKind, Result};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::errors::from_python;

/// A root group whose all-gather is a Python callable `allgather(bytes) -> list[bytes]`.
pub(crate) struct PythonChannel {
    rank: usize,
    size: usize,
    members: Vec<usize>,
    allgather: Py<PyAny>,
}

impl PythonChannel {
    /// A channel over `members` (global ranks in group order) where this process is `rank`.
    pub(crate) fn new(
        rank: usize,
        members: Vec<usize>,
        allgather: Py<PyAny>,
    ) -> std::result::Result<PythonChannel, String> {
        if rank >= members.len() {
            return Err(format!(
                "group rank {rank} is outside a group of {} members",
                members.len()
            ));
        }
        Ok(PythonChannel {
            rank,
            size: members.len(),
            members,
            allgather,
        })
    }
}

impl std::fmt::Debug for PythonChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PythonChannel")
            .field("rank", &self.rank)
            .field("members", &self.members)
            .finish_non_exhaustive()
    }
}

impl GroupChannel for PythonChannel {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn members(&self) -> Vec<usize> {
        self.members.clone()
    }

    fn distributed(&self) -> bool {
        true
    }

    fn allgather(&self, data: &[u8]) -> Result<Vec<Vec<u8>>> {
        const OP: &str = "allgather";
        Python::attach(|py| {
            let gathered = self
                .allgather
                .call1(py, (PyBytes::new(py, data),))
                .and_then(|list| list.extract::<Vec<Vec<u8>>>(py))
                .map_err(|e| {
                    from_python(
                        py,
                        ErrorKind::Backend,
                        OP,
                        "the torch.distributed all_gather_object over the root group failed",
                        e,
                    )
                })?;
            if gathered.len() != self.size {
                return Err(Error::new(
                    ErrorKind::Protocol,
                    OP,
                    format!(
                        "the root group's all-gather returned {} entries for {} members",
                        gathered.len(),
                        self.size
                    ),
                )
                .on_rank(self.rank));
            }
            Ok(gathered)
        })
    }
}

static SUBGROUPS: Mutex<Option<HashMap<Vec<usize>, Arc<Group>>>> = Mutex::new(None);

/// The subgroup `members` (world ranks, in order) of the launcher's world, created on first use
/// (a collective call over the members then) and reused afterwards.
pub(crate) fn world_subgroup(members: &[usize]) -> Result<Arc<Group>> {
    let world = World::global()?;
    if world.launcher() == Launcher::Standalone {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            "acquire",
            "a root group was named, but this process has no distributed world (standalone); \
             call acquire without a group, or start the job with hmrun or torchrun",
        ));
    }
    let mut groups = SUBGROUPS.lock().unwrap_or_else(PoisonError::into_inner);
    let groups = groups.get_or_insert_with(HashMap::new);
    if let Some(group) = groups.get(members) {
        return Ok(Arc::clone(group));
    }
    let group = Arc::new(world.new_group(members)?);
    groups.insert(members.to_vec(), Arc::clone(&group));
    Ok(group)
}
