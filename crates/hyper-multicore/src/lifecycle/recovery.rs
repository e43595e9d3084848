//! What a failure leaves possible: a stage failure classified as retryable or invalidating
//! ([`Recovery`]), the hint every lifecycle error ends with, and the invalidated state that
//! refuses every later call.

use super::stage::{Stage, StageFailure};
use super::LIFECYCLE;
use crate::control::converge::LocalFailure;
use crate::error::{Error, ErrorKind, Recovery, Result};
use crate::shmem::process;
use crate::shmem::Shmem;

/// The runtime, if present and its control plane intact; else an "unavailable" failure.
pub(super) fn usable<'a>(
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
pub(super) fn classify(
    operation: &str,
    stage: Stage,
    failure: StageFailure,
    terminal_stage: bool,
) -> Error {
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
pub(super) fn with_hint(
    error: Error,
    operation: &str,
    recovery: Recovery,
    stage: Option<Stage>,
) -> Error {
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

pub(super) fn check_valid(operation: &str) -> Result<()> {
    if !process::is_invalidated() {
        return Ok(());
    }
    Err(invalidated_error(operation))
}

pub(super) fn invalidated_error(operation: &str) -> Error {
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
