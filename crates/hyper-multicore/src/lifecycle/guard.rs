//! The guarded API: every data-plane and allocation call reaches the runtime through
//! [`guarded`] (or [`try_guarded`]), which refuses it in an invalidated process, off the lease
//! of an active shared root, or without a reference, and keeps it from interleaving with a
//! release or restart.

use std::sync::atomic::Ordering;

use parking_lot::RwLockReadGuard;

use super::recovery::{check_valid, invalidated_error};
use super::steps::RUNNING_STAGES;
use crate::error::{Error, ErrorKind, Recovery, Result};
use crate::shmem::process::{self, RUNTIME};
use crate::shmem::registry::check_leased;
use crate::shmem::Shmem;

/// Runs `f` on the active runtime: refused if the lifecycle is invalidated or holds no
/// reference. A call made while a release or restart runs waits for it to end (then sees the
/// new runtime, or the refusal); the release or restart excludes every guarded call from its
/// first stage (Preflight) to its last. Called from the thread running the release or restart
/// (its preflight hook), it is refused instead of deadlocking.
///
/// While a [`SharedRoot`](super::SharedRoot) is active, a call is admitted only on a thread acting under the
/// lease held now ([`Lease::run`](super::Lease::run), [`Lease::bind_thread`](super::Lease::bind_thread)); any other is refused naming the
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
