//! What this process knows about its runtime across lifetimes: whether one is active, whether a
//! failed shutdown made the process terminal, and the latest failure of any runtime operation.

use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::control::lock_unpoisoned;
use crate::error::{Error, ErrorKind, Result};

/// The native runtime's state in this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RuntimeState {
    /// No runtime is active; `initialize` may be called.
    Uninitialized,
    /// A runtime is active (or being initialized).
    Ready,
    /// A shutdown failed: nothing works in this process any more.
    Finalized,
}

/// The latest failed runtime operation in this process.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailureRecord {
    /// The operation (`"initialize"`, `"allocate"`, …).
    pub operation: String,
    /// The step of it that failed.
    pub phase: String,
    /// This process's rank in the root, if known.
    pub root_rank: Option<usize>,
    /// The error kind.
    pub kind: ErrorKind,
    /// The full error message.
    pub message: String,
}

#[derive(Debug)]
struct ProcessState {
    state: RuntimeState,
    finalized_because: Option<String>,
    latest_failure: Option<FailureRecord>,
}

static PROCESS: Mutex<ProcessState> = Mutex::new(ProcessState {
    state: RuntimeState::Uninitialized,
    finalized_because: None,
    latest_failure: None,
});

/// The runtime state of this process.
pub fn runtime_state() -> RuntimeState {
    lock_unpoisoned(&PROCESS).state
}

/// The latest failure of a runtime operation in this process, if any.
pub fn latest_failure() -> Option<FailureRecord> {
    lock_unpoisoned(&PROCESS).latest_failure.clone()
}

/// Claims the process for a new runtime lifetime.
pub(crate) fn begin_lifetime() -> Result<()> {
    let mut process = lock_unpoisoned(&PROCESS);
    match process.state {
        RuntimeState::Uninitialized => {
            process.state = RuntimeState::Ready;
            Ok(())
        }
        RuntimeState::Ready => Err(Error::new(
            ErrorKind::InvalidState,
            "initialize",
            "a runtime is already active in this process (a process belongs to at most one \
             active root); shut it down first",
        )),
        RuntimeState::Finalized => {
            Err(Error::new(
                ErrorKind::InvalidState,
                "initialize",
                format!(
                "the runtime of this process is finalized after a failed shutdown ({}); restart \
                 the process",
                process.finalized_because.as_deref().unwrap_or("unknown cause")
            ),
            ))
        }
    }
}

/// Ends the current lifetime: back to `Uninitialized`, or `Finalized` if `failure` is given.
pub(crate) fn end_lifetime(failure: Option<&Error>) {
    let mut process = lock_unpoisoned(&PROCESS);
    if process.state == RuntimeState::Finalized {
        return;
    }
    match failure {
        None => process.state = RuntimeState::Uninitialized,
        Some(error) => {
            process.state = RuntimeState::Finalized;
            process.finalized_because = Some(error.to_string());
        }
    }
}

/// Records `error` as the latest failure, at `phase` of its operation.
pub(crate) fn record_failure(error: &Error, phase: &str) {
    lock_unpoisoned(&PROCESS).latest_failure = Some(FailureRecord {
        operation: error.operation().to_string(),
        phase: phase.to_string(),
        root_rank: error.rank(),
        kind: error.kind(),
        message: error.to_string(),
    });
}
