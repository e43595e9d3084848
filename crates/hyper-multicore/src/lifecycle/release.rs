//! Release: dropping a reference; the last one shuts the runtime down collectively.

use std::sync::Arc;

use super::acquire::check_mode;
use super::recovery::{check_valid, usable, with_hint};
use super::stage::Stage;
use super::steps::Steps;
use super::LIFECYCLE;
use crate::control::converge::LocalFailure;
use crate::error::{Error, ErrorKind, Recovery, Result};
use crate::shmem::registry::check_unmanaged;

/// Drops a reference; the last one shuts the runtime down collectively (stages Preflight,
/// Quiesce, Shutdown). The last release excludes every guarded call from its start (Preflight
/// included) to its end.
pub fn release() -> Result<()> {
    check_unmanaged("release")?;
    release_reference()
}

/// [`release`] without the shared-root check (the shared root's own close).
pub(super) fn release_reference() -> Result<()> {
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
