//! Test-only fault injection: `HYPER_MULTICORE_TEST_FAULT=<operation>:<Stage>:<root rank>:<action>`
//! makes a lifecycle stage misbehave on one rank. Actions: `retryable` (the stage fails),
//! `unavailable` (fails saying the runtime is unusable), `differ` (the stage's value differs on
//! that rank), `abort` (the process SIGKILLs itself at the start of the stage).
//!
//! `acquire` (first reference) has two injection points, named after the restart stages that
//! do the same work: `acquire:Bootstrap` (root rank 0 creates and distributes the unique ID;
//! `retryable` / `unavailable` fail that rank's part, `abort` kills it) and `acquire:Initialize`
//! (just before the rank joins the new runtime's rendezvous; only `abort` applies).
//!
//! Compiled in only with the `fault-injection` cargo feature; without it, [`injected`] always
//! answers `None` and the variable is ignored.

use super::stage::Stage;

/// The variable that selects a fault.
pub const FAULT_VARIABLE: &str = "HYPER_MULTICORE_TEST_FAULT";

/// What to do to a stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
// Without the feature nothing is injected, so no variant is ever built.
#[cfg_attr(not(feature = "fault-injection"), allow(dead_code))]
pub(crate) enum Fault {
    Retryable,
    Unavailable,
    Differ,
}

/// The fault to inject into `stage` of `operation` on root rank `rank`, if any. `abort`
/// faults never return: the process kills itself here.
#[cfg(feature = "fault-injection")]
pub(crate) fn injected(operation: &str, stage: Stage, rank: usize) -> Option<Fault> {
    let spec = std::env::var(FAULT_VARIABLE).ok()?;
    let mut parts = spec.split(':');
    let (op, stage_name, target, action) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if op != operation || stage_name != stage.name() || target.parse::<usize>().ok()? != rank {
        return None;
    }
    match action {
        "retryable" => Some(Fault::Retryable),
        "unavailable" => Some(Fault::Unavailable),
        "differ" => Some(Fault::Differ),
        "abort" => {
            let me = rustix::process::getpid();
            let _ = rustix::process::kill_process(me, rustix::process::Signal::KILL);
            unreachable!("SIGKILL cannot be caught")
        }
        other => panic!("{FAULT_VARIABLE}: unknown action {other:?}"),
    }
}

/// Without the `fault-injection` feature nothing is ever injected.
#[cfg(not(feature = "fault-injection"))]
pub(crate) fn injected(_operation: &str, _stage: Stage, _rank: usize) -> Option<Fault> {
    None
}
