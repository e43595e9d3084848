//! Acquire: taking a reference to the process-wide runtime over a root group, every check made
//! locally before any communication, and the first reference's collective start (barrier, the
//! unique ID from root rank 0, initialize).

use std::sync::Arc;

use super::fault;
use super::recovery::{check_valid, with_hint};
use super::stage::{self, Stage};
use super::{ActiveRoot, LIFECYCLE};
use crate::config::Config;
use crate::control::{BootstrapListener, ChannelMode, GroupChannel, UniqueId};
use crate::error::{Error, ErrorKind, Recovery, Result};
use crate::shmem::process;
use crate::shmem::registry::check_unmanaged;
use crate::shmem::Shmem;
use crate::world::World;

/// The root group of an [`acquire_root`]: the whole world, an ordered list of world ranks, or a
/// channel the caller provides (the Python front's torch process group).
#[derive(Clone, Debug)]
pub enum RootGroup {
    /// Every rank of the launcher's world (a one-PE root for a standalone process).
    World,
    /// The ordered subgroup of these world ranks. Checked against the lifecycle before any
    /// communication; the subgroup itself is formed (collectively, by the members) only for a
    /// first reference, and cached by the world (one per member list).
    Members(Vec<usize>),
    /// A channel the caller made; its [`GroupChannel::mode`] is recorded and compared later.
    Channel(Arc<dyn GroupChannel>),
}

/// [`acquire_root`] with `None` = [`RootGroup::World`] and `Some(channel)` =
/// [`RootGroup::Channel`].
pub fn acquire(root: Option<Arc<dyn GroupChannel>>, heap_size_bytes: Option<u64>) -> Result<()> {
    acquire_root(
        root.map_or(RootGroup::World, RootGroup::Channel),
        heap_size_bytes,
    )
}

/// Takes a reference to the process-wide runtime over `root`, starting it if this is the first
/// reference (a collective call over the root then).
///
/// Every check comes before any communication: the heap size argument, invalidation, a group
/// named without a distributed world, the membership list; then, if a reference is active, the
/// request must match it (same mode as at the first acquire, same ordered membership, a heap no
/// larger) and only the count goes up. Only a first reference forms a subgroup (cached by the
/// world) and starts the runtime.
///
/// `heap_size_bytes`: per-PE heap; `None` = `HYPER_MULTICORE_SHMEM_HEAP_SIZE`, else 1 GiB.
pub fn acquire_root(root: RootGroup, heap_size_bytes: Option<u64>) -> Result<()> {
    check_unmanaged("acquire")?;
    acquire_reference(root, heap_size_bytes)
}

/// [`acquire_root`] without the shared-root check (the shared root's own activation).
pub(super) fn acquire_reference(root: RootGroup, heap_size_bytes: Option<u64>) -> Result<()> {
    const OP: &str = "acquire";
    if heap_size_bytes == Some(0) {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            OP,
            "heap_size_bytes must be a positive integer (or None for the configured default)",
        ));
    }
    let guard = LIFECYCLE.lock();
    check_valid(OP)?;
    let standalone = || {
        Error::new(
            ErrorKind::InvalidArgument,
            OP,
            "a root group was named, but this process has no distributed world (standalone); \
             call acquire without a group, or start the job with hmrun or torchrun",
        )
    };
    // What is asked for, found without any communication.
    let (members, mode, world) = match &root {
        RootGroup::World => {
            let world = World::global()?;
            (
                GroupChannel::members(world.as_ref()),
                world.mode(),
                Some(world),
            )
        }
        RootGroup::Members(members) => {
            let world = World::global()?;
            if world.mode() == ChannelMode::Standalone {
                return Err(standalone());
            }
            world.check_members(members).map_err(|e| {
                Error::new(e.kind(), OP, e.message().to_string()).on_rank(world.rank())
            })?;
            (members.clone(), ChannelMode::LauncherWorld, Some(world))
        }
        RootGroup::Channel(channel) => {
            let mode = channel.mode();
            if mode == ChannelMode::Standalone {
                return Err(standalone());
            }
            if mode == ChannelMode::Destroyed && guard.borrow().root.is_none() {
                return Err(Error::new(
                    ErrorKind::InvalidState,
                    OP,
                    "the root channel's distributed runtime was destroyed; pass a live group",
                ));
            }
            (channel.members(), mode, None)
        }
    };
    {
        let mut state = guard.borrow_mut();
        if let Some(active) = state.root.as_ref() {
            check_mode(OP, active.mode, active.channel.as_ref())?;
            if mode != active.mode {
                return Err(mode_changed(OP, active.mode, mode));
            }
            if active.members != members {
                return Err(Error::new(
                    ErrorKind::InvalidArgument,
                    OP,
                    format!(
                        "the active root has members {:?} but this call names {members:?}; pass \
                         the same ordered group, or release every reference first",
                        active.members
                    ),
                ));
            }
            if let Some(heap) = heap_size_bytes.filter(|&h| h > active.heap_size) {
                return Err(Error::new(
                    ErrorKind::InvalidArgument,
                    OP,
                    format!(
                        "a heap of {heap} bytes was requested but the active runtime has {} \
                         bytes; release every reference and acquire again, or restart with the \
                         larger heap",
                        active.heap_size
                    ),
                ));
            }
            state.references += 1;
            return Ok(());
        }
    }
    if let RootGroup::Channel(channel) = &root {
        check_channel_members(OP, channel.as_ref())?;
    }
    // A first reference: now the collective work.
    let channel: Arc<dyn GroupChannel> = match (root, world) {
        (RootGroup::Channel(channel), _) => channel,
        (RootGroup::Members(members), Some(world)) => world.subgroup(&members)?,
        (_, Some(world)) => world,
        (_, None) => unreachable!("the world was read for a world or member-list root"),
    };
    let shmem = start_runtime(channel.as_ref(), heap_size_bytes)
        .map_err(|e| with_hint(e, OP, Recovery::Retryable, None))?;
    let heap_size = shmem.heap_size();
    *process::hold_runtime() = Some(shmem);
    let mut state = guard.borrow_mut();
    state.references = 1;
    state.root = Some(ActiveRoot {
        channel,
        members,
        mode,
        heap_size,
    });
    Ok(())
}

/// A channel's membership must be a list of distinct world ranks, one per member, with this
/// process at its rank (local check).
fn check_channel_members(operation: &str, channel: &dyn GroupChannel) -> Result<()> {
    let members = channel.members();
    let mut sorted = members.clone();
    sorted.sort_unstable();
    sorted.dedup();
    if members.is_empty() || sorted.len() != members.len() || members.len() != channel.size() {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            operation,
            format!(
                "the root channel's members {members:?} must be {} distinct world ranks, one per \
                 member of the channel",
                channel.size()
            ),
        ));
    }
    if channel.rank() >= members.len() {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            operation,
            format!(
                "this process is rank {} of a channel of {} members",
                channel.rank(),
                members.len()
            ),
        ));
    }
    Ok(())
}

/// Fails if the active root's channel is no longer in the mode recorded at the first acquire
/// (e.g. its torch process group was destroyed): a local check, before any communication.
pub(super) fn check_mode(
    operation: &str,
    recorded: ChannelMode,
    channel: &dyn GroupChannel,
) -> Result<()> {
    match channel.mode() {
        now if now == recorded => Ok(()),
        now => Err(mode_changed(operation, recorded, now)),
    }
}

fn mode_changed(operation: &str, recorded: ChannelMode, now: ChannelMode) -> Error {
    Error::new(
        ErrorKind::InvalidState,
        operation,
        format!(
            "the root's mode changed since the runtime started: it started as {} and is now {} \
             (e.g. torch.distributed was destroyed or initialized since); restore the mode it \
             started in (or release every reference first)",
            recorded.name(),
            now.name()
        ),
    )
}

/// The first reference's collective work: barrier, unique ID from root rank 0 (or its failure),
/// initialize.
fn start_runtime(channel: &dyn GroupChannel, heap_size: Option<u64>) -> Result<Shmem> {
    const OP: &str = "acquire";
    channel.barrier()?;
    let (config, id, listener) = distribute_unique_id(channel, OP)?;
    // Test-only: `acquire:Initialize:<rank>:abort` kills this rank before it joins the new
    // runtime (the other actions need a converged step, which this one is not: they are ignored).
    let _ = fault::injected(OP, Stage::Initialize, channel.rank());
    let watch = || channel.ensure_alive();
    Shmem::initialize_watched(
        config,
        channel.rank(),
        channel.size(),
        &id,
        listener,
        heap_size,
        &watch,
    )
}

/// Root rank 0 creates a unique ID and every rank gets it — or every rank gets root rank 0's
/// failure to create one (so nobody waits for an ID that will never come).
fn distribute_unique_id(
    channel: &dyn GroupChannel,
    operation: &str,
) -> Result<(Config, UniqueId, Option<BootstrapListener>)> {
    let rank = channel.rank();
    let mut listener = None;
    let local = Config::from_env().and_then(|config| {
        if rank != 0 {
            return Ok((config, None));
        }
        let (id, bound) = Shmem::get_unique_id(&config)?;
        listener = Some(bound);
        Ok((config, Some(id.to_bytes())))
    });
    let (config, local) = match local {
        Ok((config, id)) => (Some(config), Ok(id)),
        Err(error) => (None, Err(error.on_rank(rank))),
    };
    // Test-only: `acquire:Bootstrap:<rank>:<action>` fails (or kills) this rank's part of the
    // unique-ID step, as a real failure to create the ID would.
    let local = match fault::injected(operation, Stage::Bootstrap, rank) {
        Some(fault::Fault::Retryable | fault::Fault::Unavailable) => {
            Err(stage::injected_error(operation, Stage::Bootstrap, rank))
        }
        Some(fault::Fault::Differ) | None => local,
    };
    let ids = crate::control::converge::converge(channel, operation, local)?;
    let id_bytes = ids[0].as_deref().unwrap_or_default();
    let id = UniqueId::from_bytes(id_bytes)?;
    Ok((
        config.expect("a rank that failed its local step has returned"),
        id,
        listener,
    ))
}
