//! The stages of release and restart, their converged execution and their timings.

use std::time::Instant;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::fault::{self, Fault};
use crate::control::converge::{converge_step, Diverged, LocalFailure};
use crate::control::GroupChannel;
use crate::error::{Error, ErrorKind};

/// One step of a collective state change.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Stage {
    /// Checks before anything changes (arguments, state, equal values on every rank).
    Preflight,
    /// Every outstanding operation completes; every PE arrives.
    Quiesce,
    /// Where the first min(old, new) bytes of each preserved allocation lie is noted, and the
    /// old heap kept mapped until RestoreAllocations copies them (nothing when no replacement
    /// preserves data).
    PreserveData,
    /// Every allocation is freed.
    ReleaseAllocations,
    /// The runtime is ready to shut down.
    ValidateShutdown,
    /// The runtime shuts down.
    Shutdown,
    /// Root rank 0 creates and distributes a new unique ID.
    Bootstrap,
    /// The new runtime initializes.
    Initialize,
    /// The replacement allocations are made, in request order, and preserved data is copied
    /// into them.
    RestoreAllocations,
    /// A growth only, before the restart's stages: the ranks agree on the largest need and on
    /// the new heap (every check of the growth is done here).
    Agree,
}

impl Stage {
    /// Every stage of a restart, in order.
    pub const RESTART: [Stage; 9] = [
        Stage::Preflight,
        Stage::Quiesce,
        Stage::PreserveData,
        Stage::ReleaseAllocations,
        Stage::ValidateShutdown,
        Stage::Shutdown,
        Stage::Bootstrap,
        Stage::Initialize,
        Stage::RestoreAllocations,
    ];

    /// Every stage of a heap growth, in order: Agree, then a restart's stages.
    pub const GROW: [Stage; 10] = {
        let mut stages = [Stage::Agree; 10];
        let mut index = 0;
        while index < Stage::RESTART.len() {
            stages[index + 1] = Stage::RESTART[index];
            index += 1;
        }
        stages
    };

    /// Whether a failure of this stage leaves everything as it was (retryable, unless the ranks
    /// can no longer agree or the runtime is unusable): the stages before ReleaseAllocations.
    pub fn before_teardown(self) -> bool {
        matches!(
            self,
            Stage::Agree | Stage::Preflight | Stage::Quiesce | Stage::PreserveData
        )
    }

    /// Every stage of the last release, in order.
    pub const RELEASE: [Stage; 3] = [Stage::Preflight, Stage::Quiesce, Stage::Shutdown];

    /// The stage's name as written in errors.
    pub fn name(self) -> &'static str {
        match self {
            Stage::Preflight => "Preflight",
            Stage::Quiesce => "Quiesce",
            Stage::PreserveData => "PreserveData",
            Stage::ReleaseAllocations => "ReleaseAllocations",
            Stage::ValidateShutdown => "ValidateShutdown",
            Stage::Shutdown => "Shutdown",
            Stage::Bootstrap => "Bootstrap",
            Stage::Initialize => "Initialize",
            Stage::RestoreAllocations => "RestoreAllocations",
            Stage::Agree => "Agree",
        }
    }
}

/// How long each stage of a restart (or growth) took, in milliseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StageTimings {
    /// Agree (a growth only; 0 for a restart).
    pub agree_ms: f64,
    /// Preflight.
    pub preflight_ms: f64,
    /// Quiesce.
    pub quiesce_ms: f64,
    /// PreserveData (copying preserved bytes out of the old heap).
    pub preserve_ms: f64,
    /// ReleaseAllocations.
    pub release_ms: f64,
    /// ValidateShutdown and Shutdown.
    pub finalize_ms: f64,
    /// Bootstrap.
    pub bootstrap_ms: f64,
    /// Initialize.
    pub initialize_ms: f64,
    /// RestoreAllocations (copying preserved bytes into the new heap included).
    pub restore_ms: f64,
}

impl StageTimings {
    pub(crate) fn record(&mut self, stage: Stage, started: Instant) {
        let ms = started.elapsed().as_secs_f64() * 1e3;
        let slot = match stage {
            Stage::Preflight => &mut self.preflight_ms,
            Stage::Quiesce => &mut self.quiesce_ms,
            Stage::PreserveData => &mut self.preserve_ms,
            Stage::Agree => &mut self.agree_ms,
            Stage::ReleaseAllocations => &mut self.release_ms,
            Stage::ValidateShutdown | Stage::Shutdown => &mut self.finalize_ms,
            Stage::Bootstrap => &mut self.bootstrap_ms,
            Stage::Initialize => &mut self.initialize_ms,
            Stage::RestoreAllocations => &mut self.restore_ms,
        };
        *slot += ms;
    }

    /// The sum of every stage.
    pub fn total_ms(&self) -> f64 {
        self.agree_ms
            + self.preflight_ms
            + self.quiesce_ms
            + self.preserve_ms
            + self.release_ms
            + self.finalize_ms
            + self.bootstrap_ms
            + self.initialize_ms
            + self.restore_ms
    }

    /// Every stage's time by its key (`agree_ms`, `preflight_ms`, …), in stage order.
    pub fn by_key(&self) -> [(&'static str, f64); 9] {
        [
            ("agree_ms", self.agree_ms),
            ("preflight_ms", self.preflight_ms),
            ("quiesce_ms", self.quiesce_ms),
            ("preserve_ms", self.preserve_ms),
            ("release_ms", self.release_ms),
            ("finalize_ms", self.finalize_ms),
            ("bootstrap_ms", self.bootstrap_ms),
            ("initialize_ms", self.initialize_ms),
            ("restore_ms", self.restore_ms),
        ]
    }
}

/// How a stage failed, before the caller classifies it.
#[derive(Debug)]
pub(crate) enum StageFailure {
    /// Some rank failed (or values differed); `unavailable` if any said the runtime is unusable.
    Failed { error: Error, unavailable: bool },
    /// The exchange failed: the ranks can no longer agree.
    Convergence(Error),
}

/// Runs `local` (unless a fault is injected) and converges its outcome over `channel`.
pub(crate) fn run<T: Serialize + DeserializeOwned + std::fmt::Debug + PartialEq>(
    channel: &dyn GroupChannel,
    operation: &str,
    stage: Stage,
    require_equal: bool,
    local: impl FnOnce() -> Result<T, LocalFailure>,
    differ: impl FnOnce(&mut T),
) -> Result<Vec<T>, StageFailure> {
    let rank = channel.rank();
    // An injected fault replaces the outcome after the local work ran, so the stage's own
    // collective steps (barriers, frees) still happen on every rank — as a real failure found
    // at the end of a stage would.
    let fault = fault::injected(operation, stage, rank);
    let outcome = local();
    let outcome = match fault {
        Some(Fault::Retryable) => Err(LocalFailure {
            error: injected_error(operation, stage, rank),
            unavailable: false,
        }),
        Some(Fault::Unavailable) => Err(LocalFailure {
            error: injected_error(operation, stage, rank),
            unavailable: true,
        }),
        Some(Fault::Differ) => outcome.map(|mut value| {
            differ(&mut value);
            value
        }),
        None => outcome,
    };
    let started = std::time::Instant::now();
    let verdict =
        converge_step(channel, operation, outcome, require_equal).map_err(
            |diverged| match diverged {
                Diverged::Failed { error, unavailable } => {
                    StageFailure::Failed { error, unavailable }
                }
                Diverged::Exchange(error) => StageFailure::Convergence(error),
            },
        );
    match &verdict {
        Ok(_) => tracing::debug!(
            "{operation}: stage {} converged on root rank {rank} ({:?} exchange)",
            stage.name(),
            started.elapsed()
        ),
        Err(failure) => tracing::debug!(
            "{operation}: stage {} failed on root rank {rank}: {failure:?}",
            stage.name()
        ),
    }
    verdict
}

pub(crate) fn injected_error(operation: &str, stage: Stage, rank: usize) -> Error {
    Error::new(
        ErrorKind::Backend,
        operation,
        format!("injected failure at {} on root rank {rank}", stage.name()),
    )
}
