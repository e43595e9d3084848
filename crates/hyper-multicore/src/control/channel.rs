//! [`GroupChannel`]: what the lifecycle and the runtime need from a root group's communication —
//! its ordered membership and an allgather with deadlines and peer-loss detection — whatever
//! carries it: a [`ControlPlane`], the world and its subgroups (`crate::world`), or a torch
//! `ProcessGroup` in the Python front.

use super::ControlPlane;
use crate::error::Result;

/// Where a root group's communication comes from (see [`GroupChannel::mode`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ChannelMode {
    /// One process alone: no distributed world.
    Standalone,
    /// The launcher's world (hmrun, torchrun's environment) or a subgroup of it, over this
    /// crate's control plane.
    LauncherWorld,
    /// A torch.distributed process group (the Python front's channel), while it is alive.
    Torch,
    /// A channel whose distributed runtime was torn down (e.g. its torch process group was
    /// destroyed): it can no longer carry the root's collectives.
    Destroyed,
}

impl ChannelMode {
    /// Lower-case name, as errors show it.
    pub fn name(self) -> &'static str {
        match self {
            ChannelMode::Standalone => "standalone",
            ChannelMode::LauncherWorld => "launcher world",
            ChannelMode::Torch => "torch.distributed",
            ChannelMode::Destroyed => "destroyed",
        }
    }
}

/// The communication the managed lifecycle needs from a root group: its ordered membership and
/// an allgather with deadlines and peer-loss detection. Implemented by [`ControlPlane`], the
/// world and its groups; the Python front implements it over a torch `ProcessGroup`.
pub trait GroupChannel: Send + Sync + std::fmt::Debug {
    /// This process's rank in the group.
    fn rank(&self) -> usize;
    /// The number of members.
    fn size(&self) -> usize;
    /// The members' world ranks, in group-rank order.
    fn members(&self) -> Vec<usize>;
    /// True if the group belongs to a distributed world (false for a standalone process).
    fn distributed(&self) -> bool;
    /// Where the group's communication comes from, now. The lifecycle records it at the first
    /// acquire and refuses a later acquire, release or restart once it has changed (e.g. the
    /// torch process group was destroyed). Default: [`ChannelMode::LauncherWorld`] if
    /// [`distributed`](GroupChannel::distributed), else [`ChannelMode::Standalone`].
    fn mode(&self) -> ChannelMode {
        if self.distributed() {
            ChannelMode::LauncherWorld
        } else {
            ChannelMode::Standalone
        }
    }
    /// Every member's `data`, in group-rank order (a collective call).
    fn allgather(&self, data: &[u8]) -> Result<Vec<Vec<u8>>>;
    /// Returns once every member has called it.
    fn barrier(&self) -> Result<()> {
        self.allgather(&[]).map(drop)
    }
    /// Fails if the channel already knows it cannot work any more (a member died); checked
    /// while the lifecycle waits in a runtime's rendezvous.
    fn ensure_alive(&self) -> Result<()> {
        Ok(())
    }
}

impl GroupChannel for ControlPlane {
    fn rank(&self) -> usize {
        ControlPlane::rank(self)
    }
    fn size(&self) -> usize {
        ControlPlane::size(self)
    }
    fn members(&self) -> Vec<usize> {
        (0..ControlPlane::size(self)).collect()
    }
    fn distributed(&self) -> bool {
        ControlPlane::size(self) > 1
    }
    fn allgather(&self, data: &[u8]) -> Result<Vec<Vec<u8>>> {
        ControlPlane::allgather(self, data)
    }
    fn barrier(&self) -> Result<()> {
        ControlPlane::barrier(self)
    }
    fn ensure_alive(&self) -> Result<()> {
        self.broken().map_or(Ok(()), Err)
    }
}
