//! The stages of a release or restart, run one after another with the runtime held
//! exclusively, each converged over the root's channel and its failure classified.

use std::time::Instant;

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::recovery::{classify, usable};
use super::stage::{self, Stage, StageFailure, StageTimings};
use crate::control::converge::LocalFailure;
use crate::control::GroupChannel;
use crate::error::{Error, Recovery, Result};
use crate::shmem::process;
use crate::shmem::{DebugState, Shmem, ShutdownError};

/// The stages of a release or restart, with the runtime locked exclusively from before
/// Preflight to the end: no guarded call overlaps any of it. While it runs, [`debug_state`](super::debug_state)
/// shows the runtime as it was when the lock was taken, and a guarded call from this same
/// thread (a preflight hook) is refused instead of deadlocking.
pub(super) struct Steps<'a> {
    channel: &'a dyn GroupChannel,
    operation: &'static str,
    pub(super) runtime: process::HeldRuntime,
    pub(super) timings: StageTimings,
}

thread_local! {
    /// True on the thread running a release or restart (holding the runtime exclusively).
    pub(super) static RUNNING_STAGES: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The runtime's snapshot while a release or restart holds it (for [`debug_state`](super::debug_state)).
pub(super) static STAGES_SNAPSHOT: parking_lot::Mutex<Option<DebugState>> =
    parking_lot::const_mutex(None);

impl<'a> Steps<'a> {
    pub(super) fn new(channel: &'a dyn GroupChannel, operation: &'static str) -> Self {
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
    pub(super) fn fail(&mut self, stage: Stage, failure: StageFailure, terminal: bool) -> Error {
        let error = classify(self.operation, stage, failure, terminal);
        if error.recovery() != Some(Recovery::Retryable) {
            self.runtime.take();
        }
        error
    }

    /// Runs one converged stage on the locked runtime.
    pub(super) fn step<T: Serialize + DeserializeOwned + std::fmt::Debug + PartialEq>(
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
    pub(super) fn quiesce(&mut self) -> Result<()> {
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
    pub(super) fn shut_down(&mut self) -> Result<()> {
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
