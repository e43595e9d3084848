//! Root groups as the lifecycle sees them ([`GroupChannel`]): a torch `ProcessGroup` reached
//! through a Python callable, or an ordered subgroup of the launcher's world.
//!
//! With torch.distributed initialised, the Python wrapper passes the group's rank, size, ordered
//! global ranks (`torch.distributed.get_process_group_ranks`) and a function that runs
//! `torch.distributed.all_gather_object` over it; the lifecycle's every exchange — the unique ID
//! from root rank 0, each converged stage's outcome — then travels over torch. The channel also
//! reports whether its process group is still alive ([`GroupChannel::mode`]: torch.distributed,
//! or destroyed), so the lifecycle refuses a later acquire, release or restart once
//! `torch.distributed.destroy_process_group()` took it away. Without torch.distributed, a list
//! of world ranks is a [`RootGroup::Members`](hyper_multicore::lifecycle::RootGroup) root of the
//! launcher's world (formed and cached by the library).

use hyper_multicore::control::{ChannelMode, GroupChannel};
use hyper_multicore::{Error, ErrorKind, Result};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::errors::from_python;

/// A root group whose all-gather is a Python callable `allgather(bytes) -> list[bytes]`, and
/// whose liveness is a Python callable `alive() -> bool`.
pub(crate) struct PythonChannel {
    rank: usize,
    size: usize,
    members: Vec<usize>,
    allgather: Py<PyAny>,
    alive: Py<PyAny>,
}

impl PythonChannel {
    /// A channel over `members` (global ranks in group order) where this process is `rank`.
    pub(crate) fn new(
        rank: usize,
        members: Vec<usize>,
        allgather: Py<PyAny>,
        alive: Py<PyAny>,
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
            alive,
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

    /// [`ChannelMode::Torch`] while the process group is alive (torch.distributed initialised
    /// and the group not destroyed), else [`ChannelMode::Destroyed`]. Asked live, with the GIL:
    /// the lifecycle calls it without holding it.
    fn mode(&self) -> ChannelMode {
        let alive = Python::attach(|py| {
            self.alive
                .call0(py)
                .and_then(|answer| answer.extract::<bool>(py))
                .unwrap_or(false)
        });
        if alive {
            ChannelMode::Torch
        } else {
            ChannelMode::Destroyed
        }
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
