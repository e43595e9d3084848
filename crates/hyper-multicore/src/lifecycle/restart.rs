//! Restart: replacing the runtime by one with a new heap size and every allocation by a new
//! one, in converged stages (Preflight's checks and agreement, Quiesce, PreserveData,
//! ReleaseAllocations, ValidateShutdown, Shutdown, Bootstrap, Initialize, RestoreAllocations).

use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::acquire::check_mode;
use super::hook::{self, PreflightHook};
use super::preserve;
use super::recovery::{check_valid, usable, with_hint};
use super::stage::{self, Stage, StageFailure, StageTimings};
use super::steps::Steps;
use super::LIFECYCLE;
use crate::config::Config;
use crate::control::converge::LocalFailure;
use crate::control::UniqueId;
use crate::error::{Error, ErrorKind, Recovery, Result};
use crate::shmem::allocator::Allocator;
use crate::shmem::registry::check_unmanaged;
use crate::shmem::{
    max_alignment, Allocation, AllocationRecord, AllocationSpec, Element, Joining, Region, Shmem,
};

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
/// Refused while a [`SharedRoot`](super::SharedRoot) holds the runtime (its growth restarts on its behalf).
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
pub(super) fn restart_as(
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
