//! The managed lifecycle: one process-wide runtime, shared by independent consumers through
//! reference counting, that is started, resized ("restarted") and shut down *collectively*:
//! every rank of the root group either succeeds at each stage, or all fail with the same
//! diagnosis naming the failing ranks, classified by what recovery is possible
//! ([`Recovery`]).
//!
//! ```no_run
//! use hyper_multicore::lifecycle::{self, Replacement};
//! use hyper_multicore::shmem::{AllocationSpec, Dtype, Symmetric};
//!
//! lifecycle::acquire(None, Some(64 << 20))?;           // the whole world is the root
//! let buffer = lifecycle::guarded("allocate", |shmem| shmem.allocate::<f32>(1024, None))?;
//! // Grow the heap and turn the buffer into 4096 bf16 values, on every rank at once.
//! let result = lifecycle::restart(
//!     128 << 20,
//!     &[Replacement {
//!         current: buffer.region(),
//!         target: AllocationSpec { shape: vec![4096], dtype: Dtype::BF16, alignment: None },
//!         preserve: true, // the first 4096 bytes survive, on every PE
//!     }],
//!     None,
//! )?;
//! println!("restart stages: {:?}", result.timings);
//! lifecycle::guarded("free", |shmem| shmem.free_id(result.allocations[0].id))?;
//! lifecycle::release()?;
//! # Ok::<(), hyper_multicore::Error>(())
//! ```
//!
//! Every data-plane and allocation call made through [`guarded`] is refused when the lifecycle is
//! invalidated or holds no reference, and cannot interleave with any part of a last release or
//! a restart, Preflight included (a readers/writer lock: calls share it, the release or restart
//! takes it alone from its first stage to its last; [`try_guarded`] does not wait for it).
//!
//! A root is named by [`RootGroup`] ([`acquire_root`]): the world, a list of world ranks (the
//! subgroup is formed only for a first reference, after every check, and cached by the world),
//! or a [`GroupChannel`] of the caller's, whose [`mode`](GroupChannel::mode) is recorded at the
//! first acquire and must not change while references are held.
//!
//! Several consumers of one heap share it through a [`SharedRoot`] (budgets, ownership,
//! execution leases, and heap growth that keeps every consumer's data): it holds the process's
//! single reference, and while it is active the bare calls here (acquire, release, restart) and
//! the runtime's bare allocate/free are refused, and so is a [`guarded`] call outside the lease
//! held ([`Lease::run`]).

mod exit;
mod fault;
mod growth;
mod hook;
mod preserve;
mod shared_root;
mod stage;

use std::cell::RefCell;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::{const_reentrant_mutex, ReentrantMutex, RwLockReadGuard};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

pub use exit::{end_if_global_exit, global_exit, global_exit_status};
pub use fault::FAULT_VARIABLE;
pub use growth::{GrowableBuffer, Growth, GrowthRecord, DEFAULT_GROWTH_FACTOR};
pub use hook::{PreflightHook, DESCRIBE_LIMIT};
pub use shared_root::{
    allocation_budget, Consumer, ConsumerSpec, ConsumerState, Lease, SharedRoot, SharedRootState,
    HEAP_ROUNDING,
};
pub use stage::{Stage, StageTimings};

use crate::config::Config;
use crate::control::{BootstrapListener, ChannelMode, GroupChannel, UniqueId};
use crate::error::{Error, ErrorKind, Recovery, Result};
use crate::shmem::allocator::Allocator;
use crate::shmem::converge::LocalFailure;
use crate::shmem::process::{self, RUNTIME};
use crate::shmem::registry::{check_leased, check_unmanaged};
use crate::shmem::{
    debug_state_inactive, max_alignment, Allocation, AllocationRecord, AllocationSpec, DebugState,
    Element, Joining, Region, Shmem, ShutdownError,
};
use crate::world::World;
use stage::StageFailure;

/// The device the heap lives on (host memory; GPUs come later).
pub const DEVICE: &str = "cpu";

/// One allocation to replace in a [`restart`]: a complete active allocation and what to
/// allocate in its place.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replacement {
    /// The allocation as it is now (its whole region; a view is refused).
    pub current: Region,
    /// What replaces it.
    pub target: AllocationSpec,
    /// Keep data: the first min(old, new) bytes of the old allocation are in the new one after
    /// the restart, on every PE (in place when the new heap fits the old segment's room, else
    /// copied from the old heap into the new one: see `docs/lifecycle.md`). Else the new
    /// allocation starts zero-filled.
    pub preserve: bool,
}

/// What a [`restart`] returns.
#[derive(Clone, Debug, PartialEq)]
pub struct RestartResult {
    /// The new allocations, in request order.
    pub allocations: Vec<AllocationRecord>,
    /// How long each stage took.
    pub timings: StageTimings,
}

impl RestartResult {
    /// The typed handle of new allocation `index` (request order), if its dtype is `T`'s. Take
    /// each handle once: it owns the allocation (free consumes it).
    pub fn allocation<T: Element>(&self, index: usize) -> Result<Allocation<T>> {
        let record = self.allocations.get(index).ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidArgument,
                "restart result",
                format!(
                    "the restart made {} allocations; there is no allocation {index}",
                    self.allocations.len()
                ),
            )
        })?;
        record.clone().into_allocation()
    }
}

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

struct ActiveRoot {
    channel: Arc<dyn GroupChannel>,
    members: Vec<usize>,
    mode: ChannelMode,
    heap_size: u64,
}

struct Lifecycle {
    references: usize,
    root: Option<ActiveRoot>,
}

static LIFECYCLE: ReentrantMutex<RefCell<Lifecycle>> =
    const_reentrant_mutex(RefCell::new(Lifecycle {
        references: 0,
        root: None,
    }));

/// The active root's channel, or an error for `operation` when no reference is active.
fn root_channel(operation: &str) -> Result<Arc<dyn GroupChannel>> {
    let guard = LIFECYCLE.lock();
    let state = guard.borrow();
    state
        .root
        .as_ref()
        .map(|r| Arc::clone(&r.channel))
        .ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidState,
                operation,
                "no reference to the runtime is active; call acquire first",
            )
        })
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
fn acquire_reference(root: RootGroup, heap_size_bytes: Option<u64>) -> Result<()> {
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
fn check_mode(operation: &str, recorded: ChannelMode, channel: &dyn GroupChannel) -> Result<()> {
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
    let ids = crate::shmem::converge::converge(channel, operation, local)?;
    let id_bytes = ids[0].as_deref().unwrap_or_default();
    let id = UniqueId::from_bytes(id_bytes)?;
    Ok((
        config.expect("a rank that failed its local step has returned"),
        id,
        listener,
    ))
}

/// Drops a reference; the last one shuts the runtime down collectively (stages Preflight,
/// Quiesce, Shutdown). The last release excludes every guarded call from its start (Preflight
/// included) to its end.
pub fn release() -> Result<()> {
    check_unmanaged("release")?;
    release_reference()
}

/// [`release`] without the shared-root check (the shared root's own close).
fn release_reference() -> Result<()> {
    const OP: &str = "release";
    let guard = LIFECYCLE.lock();
    check_valid(OP)?;
    let (channel, mode) = {
        let mut state = guard.borrow_mut();
        match state.references {
            0 => {
                return Err(Error::new(
                    ErrorKind::InvalidState,
                    OP,
                    "no reference is active; call acquire first",
                ))
            }
            1 => {}
            _ => {
                state.references -= 1;
                return Ok(());
            }
        }
        let active = state.root.as_ref().expect("a reference has a root");
        (Arc::clone(&active.channel), active.mode)
    };
    let channel = channel.as_ref();
    // The mode is checked before any communication: a destroyed channel cannot converge.
    check_mode(OP, mode, channel)
        .map_err(|e| with_hint(e, OP, Recovery::Retryable, Some(Stage::Preflight)))?;

    let mut steps = Steps::new(channel, OP);
    steps.step(Stage::Preflight, false, |runtime| {
        let shmem = usable(runtime.as_ref(), OP)?;
        shmem.validate_shutdown().map_err(LocalFailure::from)
    })?;
    steps.quiesce()?;
    steps.shut_down()?;
    drop(steps);
    let mut state = guard.borrow_mut();
    state.references = 0;
    state.root = None;
    Ok(())
}

/// The preflight value every rank must agree on: the hook's snapshot (compared by the hook) and
/// the restart's manifest (compared as is).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct PreflightValue {
    hook: Option<Vec<u8>>,
    manifest: Manifest,
}

/// What a restart is asked to do, as every rank must agree on it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Manifest {
    heap_size: u64,
    /// (allocation index, bytes, preserve) of each current allocation, in request order.
    current: Vec<(u64, u64, bool)>,
    target: Vec<AllocationSpec>,
    /// Set by the test-only `differ` fault.
    injected_difference: bool,
}

/// The "values differ across root ranks" verdict over every rank's Preflight value (each rank
/// computes it from the same gathered values, so all reach the same one), or `None`.
fn preflight_difference(
    values: &[PreflightValue],
    hook: Option<&dyn PreflightHook>,
) -> Option<String> {
    let manifests = hook::group_ranks(values, |a, b| {
        a.manifest == b.manifest && a.hook.is_some() == b.hook.is_some()
    });
    if manifests.len() > 1 {
        let listing: Vec<String> = manifests
            .iter()
            .map(|(ranks, first)| {
                let value = &values[*first];
                let shown = format!(
                    "{:?}{}",
                    value.manifest,
                    if value.hook.is_some() {
                        ""
                    } else {
                        " (no preflight hook)"
                    }
                );
                format!("root_ranks={ranks:?}: {}", hook::cut_short(shown))
            })
            .collect();
        return Some(format!(
            "values differ across root ranks (the restart's heap size and current/target \
             allocations): {}; every rank must pass the same restart arguments",
            listing.join("; ")
        ));
    }
    let hook = hook?;
    let snapshots: Vec<&[u8]> = values
        .iter()
        .map(|v| v.hook.as_deref().unwrap_or_default())
        .collect();
    let groups = hook::group_ranks(&snapshots, |a, b| hook.same(a, b));
    if groups.len() == 1 {
        return None;
    }
    let listing: Vec<String> = groups
        .iter()
        .map(|(ranks, first)| {
            let shown = hook::cut_short(hook.describe(snapshots[*first]));
            format!("root_ranks={ranks:?}: {shown}")
        })
        .collect();
    Some(format!(
        "values differ across root ranks (the preflight hook's snapshots): {}; make the \
         snapshotted state equal on every rank first",
        listing.join("; ")
    ))
}

/// Replaces the runtime by one with a new heap size, replacing every active allocation by a new
/// one (`replacements` must cover each exactly once). Only with exactly one reference; a
/// collective call over the root. `preflight_hook` takes a snapshot of the caller's own state
/// that must be equal *as a value* (by [`PreflightHook::same`]) on every rank; a closure
/// returning bytes is a hook comparing bytes. A replacement with `preserve` keeps the first
/// min(old, new) bytes of its allocation on every PE (copied straight from the old heap, kept
/// mapped until then, into the new one; Preflight checks that the host can hold them).
///
/// Refused while a [`SharedRoot`] holds the runtime (its growth restarts on its behalf).
///
/// Failures before ReleaseAllocations are retryable (unless the runtime is unusable or the ranks
/// could not exchange outcomes: then the lifecycle is invalidated); from ReleaseAllocations on
/// they are terminal.
pub fn restart(
    heap_size_bytes: u64,
    replacements: &[Replacement],
    preflight_hook: Option<&mut dyn PreflightHook>,
) -> Result<RestartResult> {
    check_unmanaged("restart")?;
    restart_as("restart", heap_size_bytes, replacements, preflight_hook)
}

/// [`restart`]'s stages, reported as `OP` (`restart`, or `grow` for a shared root's growth:
/// fault points `grow:<Stage>` then).
fn restart_as(
    op: &'static str,
    heap_size_bytes: u64,
    replacements: &[Replacement],
    mut preflight_hook: Option<&mut dyn PreflightHook>,
) -> Result<RestartResult> {
    let guard = LIFECYCLE.lock();
    check_valid(op)?;
    let (channel, references, mode) = {
        let state = guard.borrow();
        let Some(active) = state.root.as_ref() else {
            return Err(Error::new(
                ErrorKind::InvalidState,
                op,
                "no reference is active; call acquire first",
            ));
        };
        (Arc::clone(&active.channel), state.references, active.mode)
    };
    let channel = channel.as_ref();
    check_mode(op, mode, channel)
        .map_err(|e| with_hint(e, op, Recovery::Retryable, Some(Stage::Preflight)))?;

    // From here to the end, no guarded call runs: one that slipped in after Preflight's checks
    // (a collective allocate on another thread) would be freed by ReleaseAllocations unseen.
    let mut steps = Steps::new(channel, op);
    let started = Instant::now();
    let runtime = &*steps.runtime;
    let preflight = stage::run(
        channel,
        op,
        Stage::Preflight,
        false,
        || {
            // The hook runs first, with no lifecycle borrow held (it may call debug_state).
            let hook = match preflight_hook.as_mut() {
                Some(hook) => Some(hook.snapshot().map_err(LocalFailure::from)?),
                None => None,
            };
            let shmem = usable(runtime.as_ref(), op)?;
            check_restart(op, references, heap_size_bytes, replacements, hook, shmem)
        },
        |value| value.manifest.injected_difference = true,
    );
    steps.timings.record(Stage::Preflight, started);
    let values = preflight.map_err(|failure| steps.fail(Stage::Preflight, failure, false))?;
    if let Some(message) = preflight_difference(&values, preflight_hook.as_deref()) {
        let error = Error::new(ErrorKind::InvalidArgument, op, message).on_rank(channel.rank());
        let failure = StageFailure::Failed {
            error,
            unavailable: false,
        };
        return Err(steps.fail(Stage::Preflight, failure, false));
    }

    steps.quiesce()?;
    let mut preserved = preserve::Preserved::default();
    steps.step(Stage::PreserveData, false, |runtime| {
        let shmem = usable(runtime.as_ref(), op)?;
        preserved = preserve::keep(shmem, op, replacements)?;
        Ok(())
    })?;
    steps.step(Stage::ReleaseAllocations, true, |runtime| {
        let shmem = usable(runtime.as_ref(), op)?;
        for record in shmem.allocations() {
            shmem.free_id(record.id)?;
        }
        match shmem.allocations().len() {
            0 => Ok(()),
            left => Err(LocalFailure::from(Error::new(
                ErrorKind::InvalidState,
                op,
                format!("{left} allocations are still registered after releasing them all"),
            ))),
        }
    })?;
    steps.step(Stage::ValidateShutdown, true, |runtime| {
        usable(runtime.as_ref(), op)?
            .validate_shutdown()
            .map_err(LocalFailure::from)
    })?;
    steps.shut_down()?;
    let mut bootstrap = None;
    let ids = steps.step(Stage::Bootstrap, true, |_| {
        let config = Config::from_env()?;
        let (id, listener) = match channel.rank() {
            0 => Shmem::get_unique_id(&config).map(|(id, l)| (Some(id.to_bytes()), Some(l)))?,
            _ => (None, None),
        };
        bootstrap = Some((config, listener));
        Ok(id)
    })?;
    let (config, listener) = bootstrap.expect("every rank bootstrapped");
    steps.step(Stage::Initialize, true, |runtime| {
        let id = UniqueId::from_bytes(ids[0].as_deref().unwrap_or_default())?;
        let (rank, size) = (channel.rank(), channel.size());
        let watch = || channel.ensure_alive();
        let joining = Joining {
            rank,
            size,
            unique_id: &id,
            listener,
            heap_size: heap_size_bytes,
            watch: &watch,
            previous: preserved.segment(),
        };
        *runtime = Some(Shmem::join(config, joining)?);
        Ok(())
    })?;
    let mut allocations = Vec::with_capacity(replacements.len());
    steps.step(Stage::RestoreAllocations, true, |runtime| {
        let shmem = usable(runtime.as_ref(), op)?;
        for replacement in replacements {
            allocations.push(shmem.allocate_spec(&replacement.target)?);
        }
        preserve::copy_in(shmem, op, &allocations, std::mem::take(&mut preserved))?;
        Ok(())
    })?;
    let timings = steps.timings;
    drop(steps);
    if let Some(active) = guard.borrow_mut().root.as_mut() {
        active.heap_size = heap_size_bytes;
    }
    tracing::debug!(
        "{op} to a heap of {heap_size_bytes} bytes with {} allocations done: {timings:?}",
        replacements.len()
    );
    Ok(RestartResult {
        allocations,
        timings,
    })
}

/// The stages of a release or restart, with the runtime locked exclusively from before
/// Preflight to the end: no guarded call overlaps any of it. While it runs, [`debug_state`]
/// shows the runtime as it was when the lock was taken, and a guarded call from this same
/// thread (a preflight hook) is refused instead of deadlocking.
struct Steps<'a> {
    channel: &'a dyn GroupChannel,
    operation: &'static str,
    runtime: process::HeldRuntime,
    timings: StageTimings,
}

thread_local! {
    /// True on the thread running a release or restart (holding the runtime exclusively).
    static RUNNING_STAGES: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The runtime's snapshot while a release or restart holds it (for [`debug_state`]).
static STAGES_SNAPSHOT: parking_lot::Mutex<Option<DebugState>> = parking_lot::const_mutex(None);

impl<'a> Steps<'a> {
    fn new(channel: &'a dyn GroupChannel, operation: &'static str) -> Self {
        let runtime = process::hold_runtime();
        *STAGES_SNAPSHOT.lock() = runtime.as_ref().map(Shmem::debug_state);
        RUNNING_STAGES.with(|running| running.set(true));
        Steps {
            channel,
            operation,
            runtime,
            timings: StageTimings::default(),
        }
    }

    /// Classifies a failure of `stage` (terminal from `terminal` stages on); an invalidating one
    /// releases the runtime locally.
    fn fail(&mut self, stage: Stage, failure: StageFailure, terminal: bool) -> Error {
        let error = classify(self.operation, stage, failure, terminal);
        if error.recovery() != Some(Recovery::Retryable) {
            self.runtime.take();
        }
        error
    }

    /// Runs one converged stage on the locked runtime.
    fn step<T: Serialize + DeserializeOwned + std::fmt::Debug + PartialEq>(
        &mut self,
        stage: Stage,
        terminal: bool,
        local: impl FnOnce(&mut Option<Shmem>) -> std::result::Result<T, LocalFailure>,
    ) -> Result<Vec<T>> {
        let started = Instant::now();
        let runtime = &mut *self.runtime;
        let outcome = stage::run(
            self.channel,
            self.operation,
            stage,
            false,
            || local(runtime),
            |_| {},
        );
        self.timings.record(stage, started);
        outcome.map_err(|failure| self.fail(stage, failure, terminal))
    }
    /// Quiesce: every outstanding operation completes and every PE arrives (not terminal).
    fn quiesce(&mut self) -> Result<()> {
        let operation = self.operation;
        self.step(Stage::Quiesce, false, |runtime| {
            let shmem = usable(runtime.as_ref(), operation)?;
            shmem.quiet();
            shmem.barrier().map_err(|error| LocalFailure {
                error,
                unavailable: true,
            })
        })
        .map(drop)
    }

    /// Shutdown of the native runtime (terminal on failure).
    fn shut_down(&mut self) -> Result<()> {
        let operation = self.operation;
        self.step(Stage::Shutdown, true, |runtime| {
            usable(runtime.as_ref(), operation)?;
            let failed = |error| LocalFailure {
                error,
                unavailable: true,
            };
            match runtime.take().expect("usable checked it").shutdown() {
                Ok(()) => Ok(()),
                Err(ShutdownError::Refused { runtime, error }) => {
                    drop(runtime);
                    Err(failed(error))
                }
                Err(ShutdownError::Failed(error)) => Err(failed(error)),
            }
        })
        .map(drop)
    }
}

impl Drop for Steps<'_> {
    fn drop(&mut self) {
        RUNNING_STAGES.with(|running| running.set(false));
        *STAGES_SNAPSHOT.lock() = None;
    }
}

/// Preflight's local checks; returns the value every rank must agree on.
fn check_restart(
    op: &str,
    references: usize,
    heap_size: u64,
    replacements: &[Replacement],
    hook: Option<Vec<u8>>,
    shmem: &Shmem,
) -> std::result::Result<PreflightValue, LocalFailure> {
    let invalid =
        |message: String| LocalFailure::from(Error::new(ErrorKind::InvalidArgument, op, message));
    if references != 1 {
        return Err(LocalFailure::from(Error::new(
            ErrorKind::InvalidState,
            op,
            format!("restart needs exactly one reference, but {references} are held; release the others first"),
        )));
    }
    if heap_size == 0 {
        return Err(invalid("heap_size_bytes must be a positive integer".into()));
    }
    let active = shmem.allocations();
    let mut seen = std::collections::BTreeSet::new();
    let mut footprint: u64 = 0;
    for (index, replacement) in replacements.iter().enumerate() {
        let current = replacement.current;
        let record = shmem.resolve(current.id).map_err(|e| {
            invalid(format!(
                "replacement {index} is not an active allocation: {}",
                e.message()
            ))
        })?;
        if current.heap_offset != record.offset || current.bytes != record.bytes {
            return Err(invalid(format!(
                "replacement {index} is a view (bytes {}..{} of allocation {}), not a complete \
                 allocation; pass the whole allocation",
                current.heap_offset - record.offset.min(current.heap_offset),
                current.heap_offset - record.offset.min(current.heap_offset) + current.bytes,
                current.id.index
            )));
        }
        if !seen.insert(current.id.index) {
            return Err(invalid(format!(
                "allocation {} is replaced twice",
                current.id.index
            )));
        }
        let target = &replacement.target;
        if target.shape.is_empty() || target.shape.contains(&0) {
            return Err(invalid(format!(
                "replacement {index}: the target shape {:?} must be non-empty with positive sizes",
                target.shape
            )));
        }
        let alignment = target.alignment.unwrap_or(crate::shmem::DEFAULT_ALIGNMENT);
        if !alignment.is_power_of_two() {
            return Err(invalid(format!(
                "replacement {index}: alignment {alignment} is not a power of two"
            )));
        }
        if alignment > max_alignment(heap_size) {
            return Err(invalid(format!(
                "replacement {index}: alignment {alignment} must be no larger than the new \
                 heap's maximum, {} bytes (its size rounded up to a power of two)",
                max_alignment(heap_size)
            )));
        }
        let bytes = target.bytes().map_err(LocalFailure::from)?;
        footprint = footprint.saturating_add(Allocator::footprint(bytes, alignment));
    }
    let uncovered: Vec<u64> = active
        .iter()
        .map(|r| r.id.index)
        .filter(|i| !seen.contains(i))
        .collect();
    if !uncovered.is_empty() {
        return Err(invalid(format!(
            "active allocations {uncovered:?} have no replacement; every active allocation must \
             be replaced exactly once"
        )));
    }
    if footprint > heap_size {
        return Err(invalid(format!(
            "the targets need up to {footprint} bytes (sizes plus alignment slack) but the new \
             heap has {heap_size}; raise heap_size_bytes"
        )));
    }
    // The new layout (the targets allocated in order into a fresh heap) and whether the new
    // heap fits this host for every PE on it: checked now, while a failure is still retryable.
    let targets: Vec<AllocationSpec> = replacements.iter().map(|r| r.target.clone()).collect();
    Shmem::plan_heap(shmem.local_pes(), heap_size, &targets)
        .map_err(|e| invalid(e.message().to_string()))?;
    // Preserved data copied into a new heap while the old one is still mapped must fit now.
    preserve::check_host(op, shmem, heap_size, replacements).map_err(LocalFailure::from)?;
    Ok(PreflightValue {
        hook,
        manifest: Manifest {
            heap_size,
            current: replacements
                .iter()
                .map(|r| (r.current.id.index, r.current.bytes, r.preserve))
                .collect(),
            target: replacements.iter().map(|r| r.target.clone()).collect(),
            injected_difference: false,
        },
    })
}

/// The runtime, if present and its control plane intact; else an "unavailable" failure.
fn usable<'a>(
    runtime: Option<&'a Shmem>,
    operation: &str,
) -> std::result::Result<&'a Shmem, LocalFailure> {
    let unavailable = |message: String| LocalFailure {
        error: Error::new(ErrorKind::InvalidState, operation, message),
        unavailable: true,
    };
    let shmem = runtime.ok_or_else(|| unavailable("the runtime is not running".into()))?;
    match shmem.control().broken() {
        Some(cause) => Err(unavailable(format!(
            "the runtime is unusable: {}",
            cause.message()
        ))),
        None => Ok(shmem),
    }
}

/// Turns a stage failure into the caller's error: retryable, or invalidating (terminal /
/// convergence failure) as the lifecycle rules say.
fn classify(operation: &str, stage: Stage, failure: StageFailure, terminal_stage: bool) -> Error {
    let (error, recovery) = match failure {
        StageFailure::Convergence(error) => (error, Recovery::ConvergenceFailure),
        StageFailure::Failed { error, .. } if terminal_stage => (error, Recovery::Terminal),
        StageFailure::Failed {
            error,
            unavailable: true,
        } => (error, Recovery::Terminal),
        StageFailure::Failed {
            error,
            unavailable: false,
        } => (error, Recovery::Retryable),
    };
    let classified = with_hint(error, operation, recovery, Some(stage));
    if recovery != Recovery::Retryable {
        invalidate(recovery, &classified);
    }
    classified
}

/// `error` restated as a lifecycle failure of `operation`: classified, ending with the hint,
/// with its rank, peer and cause kept.
fn with_hint(error: Error, operation: &str, recovery: Recovery, stage: Option<Stage>) -> Error {
    let message = format!("{}; {}", error.message(), recovery.hint());
    let mut classified = Error::new(error.kind(), operation, message).with_recovery(recovery);
    if let Some(stage) = stage {
        classified = classified.during(stage.name());
    }
    if let Some(rank) = error.rank() {
        classified = classified.on_rank(rank);
    }
    if let Some(peer) = error.peer() {
        classified = classified.with_peer(peer);
    }
    classified.caused_by(error)
}

/// Marks the lifecycle unusable: every later call fails with `recovery`'s hint. The runtime, if
/// any is left, is released locally and no reference remains (the runtime is gone), but the
/// lifecycle stays invalidated: a later acquire fails too.
fn invalidate(recovery: Recovery, cause: &Error) {
    process::invalidate(recovery, cause);
    // A release or restart holding the runtime releases it itself (see `Steps::fail`).
    if let Some(mut runtime) = process::try_hold_runtime() {
        runtime.take();
    }
    let guard = LIFECYCLE.lock();
    if let Ok(mut state) = guard.try_borrow_mut() {
        state.references = 0;
        state.root = None;
    };
}

fn check_valid(operation: &str) -> Result<()> {
    if !process::is_invalidated() {
        return Ok(());
    }
    Err(invalidated_error(operation))
}

fn invalidated_error(operation: &str) -> Error {
    let invalidation = process::invalidation();
    let (recovery, cause) = invalidation.unwrap_or((Recovery::Terminal, "unknown cause".into()));
    Error::new(
        ErrorKind::InvalidState,
        operation,
        format!(
            "the runtime was invalidated by an earlier failure ({cause}); {}",
            recovery.hint()
        ),
    )
    .with_recovery(recovery)
}

/// Runs `f` on the active runtime: refused if the lifecycle is invalidated or holds no
/// reference. A call made while a release or restart runs waits for it to end (then sees the
/// new runtime, or the refusal); the release or restart excludes every guarded call from its
/// first stage (Preflight) to its last. Called from the thread running the release or restart
/// (its preflight hook), it is refused instead of deadlocking.
///
/// While a [`SharedRoot`] is active, a call is admitted only on a thread acting under the
/// lease held now ([`Lease::run`], [`Lease::bind_thread`]); any other is refused naming the
/// shared root (but `my_pe` and `n_pes`, which touch neither the heap nor a peer).
#[inline(always)]
pub fn guarded<R>(operation: &str, f: impl FnOnce(&Shmem) -> Result<R>) -> Result<R> {
    through_gate(operation, f, read_locked)
}

/// [`guarded`] that never waits: while a release or restart of the runtime is in progress it
/// fails at once (invalid state, retryable: call again after it).
#[inline(always)]
pub fn try_guarded<R>(operation: &str, f: impl FnOnce(&Shmem) -> Result<R>) -> Result<R> {
    through_gate(operation, f, |operation| {
        RUNTIME
            .try_read_recursive()
            .ok_or_else(|| in_progress(operation, "on another thread"))
    })
}

/// Completes every outstanding put, get and atomic of this PE: [`Shmem::try_quiet`] as a
/// [`guarded`] call. On a root whose every peer is in this host's shared memory a quiet is a
/// memory fence, so while the runtime's gate admits calls at once it is made without entering
/// the runtime (the C API's `shmem_quiet` is this call).
#[inline]
pub fn quiet() -> Result<()> {
    if process::ordering_only(Ordering::SeqCst) {
        return Ok(());
    }
    guarded("quiet", Shmem::try_quiet)
}

/// Orders this PE's earlier puts and atomics before its later ones, per target PE:
/// [`Shmem::fence`] as a [`guarded`] call, made without entering the runtime as [`quiet`] is.
#[inline]
pub fn fence() -> Result<()> {
    if process::ordering_only(Ordering::Release) {
        return Ok(());
    }
    guarded("fence", |shmem| {
        shmem.fence();
        Ok(())
    })
}

/// The runtime read by a guarded call whose gate was closed.
type Locked = RwLockReadGuard<'static, Option<Shmem>>;

/// The guarded calls' common part: runs `f` past the runtime's gate when its word admits the
/// call on one load (open, not invalidated, no shared root); else refuses the call in an
/// invalidated process or off the lease, then runs `f` past the open gate, or under the read
/// lock `locked` takes. `f` is called from one place, so that the compiler inlines it here (a
/// caller's constant arguments, e.g. an atomic operation's kind, then fold into the data-plane
/// code).
#[inline(always)]
fn through_gate<R>(
    operation: &str,
    f: impl FnOnce(&Shmem) -> Result<R>,
    locked: impl FnOnce(&str) -> Result<Locked>,
) -> Result<R> {
    let entered = match RUNTIME.enter_clear() {
        Some(entered) => Some(entered),
        None => {
            admit(operation)?;
            RUNTIME.enter()
        }
    };
    let read;
    let runtime = match &entered {
        Some(runtime) => runtime.as_ref(),
        None => {
            read = locked(operation)?;
            read.as_ref()
        }
    };
    with_runtime(operation, runtime, f)
}

/// What the gate word's holds stand for, checked when it does not admit a call at once:
/// refuses a call in an invalidated process, or off the lease while a shared root manages the
/// heap.
#[inline(never)]
fn admit(operation: &str) -> Result<()> {
    if process::is_invalidated() {
        return Err(invalidated_error(operation));
    }
    check_leased(operation)
}

/// The read lock for [`guarded`] past a closed gate: waits for the writer, unless this very
/// thread runs the release or restart.
#[cold]
#[inline(never)]
fn read_locked(operation: &str) -> Result<Locked> {
    if let Some(runtime) = RUNTIME.try_read_recursive() {
        return Ok(runtime);
    }
    if RUNNING_STAGES.with(std::cell::Cell::get) {
        return Err(in_progress(
            operation,
            "on this very thread (a preflight hook?)",
        ));
    }
    let runtime = RUNTIME.read_recursive();
    check_valid(operation)?;
    Ok(runtime)
}

#[inline(always)]
fn with_runtime<R>(
    operation: &str,
    runtime: Option<&Shmem>,
    f: impl FnOnce(&Shmem) -> Result<R>,
) -> Result<R> {
    match runtime {
        // A call that fails while a global exit is under way fails because the others end:
        // this process ends with the global exit's status instead (control/global_exit.rs).
        Some(shmem) => f(shmem).inspect_err(|_| crate::control::global_exit::end_if_announced()),
        None => Err(Error::new(
            ErrorKind::InvalidState,
            operation,
            "no reference to the runtime is active; call acquire first",
        )),
    }
}

fn in_progress(operation: &str, where_: &str) -> Error {
    Error::new(
        ErrorKind::InvalidState,
        operation,
        format!(
            "a release or restart of the runtime is in progress {where_}; call again after it \
             (the runtime cannot be used while it is torn down or checked for teardown)"
        ),
    )
    .with_recovery(Recovery::Retryable)
}

/// The ordered membership of `group` (world ranks), or of the world for `None` (`[0]` for a
/// standalone process).
pub fn root_members(group: Option<&dyn GroupChannel>) -> Result<Vec<usize>> {
    match group {
        Some(group) => Ok(group.members()),
        None => Ok(World::global()?.members()),
    }
}

/// Barrier of the active root over its group channel (the control plane, not shared memory).
pub fn host_barrier() -> Result<()> {
    const OP: &str = "host_barrier";
    let guard = LIFECYCLE.lock();
    check_valid(OP)?;
    let channel = guard.borrow().root.as_ref().map(|r| Arc::clone(&r.channel));
    match channel {
        Some(channel) => channel.barrier(),
        None => Err(Error::new(
            ErrorKind::InvalidState,
            OP,
            "no reference is active; call acquire first",
        )),
    }
}

/// References currently held in this process (0 once the runtime is gone, also after a
/// terminal failure: the lifecycle then stays invalidated).
pub fn reference_count() -> usize {
    LIFECYCLE.lock().borrow().references
}

/// A snapshot of the runtime and the lifecycle, safe to call in any state (also from a
/// preflight hook: while a release or restart holds the runtime, the runtime part is as it was
/// when that began).
pub fn debug_state() -> DebugState {
    let guard = LIFECYCLE.lock();
    let references = guard.borrow().references;
    let runtime = RUNTIME.try_read_recursive();
    let mut state = match runtime.as_ref().map(|r| r.as_ref()) {
        Some(Some(shmem)) => shmem.debug_state(),
        Some(None) => debug_state_inactive(),
        None => STAGES_SNAPSHOT
            .lock()
            .clone()
            .unwrap_or_else(debug_state_inactive),
    };
    state.reference_count = Some(references);
    state
}
