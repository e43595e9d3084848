//! The one process-wide state machine of the runtime, across lifetimes: whether a runtime is
//! active, whether a failed shutdown finalized the process or the managed lifecycle invalidated
//! it (and why), and the latest failure of any runtime operation — all behind one lock, so no
//! two flags can disagree.
//!
//! ```text
//! Uninitialized ──initialize──▶ Ready ──shutdown / drop──▶ Uninitialized
//!                                 │ failed shutdown ──▶ Finalized   (terminal)
//!        any state ──lifecycle gives up──▶ Invalidated (terminal: the runtime is released)
//! ```
//!
//! The process's runtime as the managed lifecycle holds it ([`RUNTIME`]) lives here too: its
//! gate word carries an atomic mirror of "invalidated" (written only under the lock together
//! with the state) and of "a shared root manages the heap" (`registry.rs`), so that one load
//! admits a guarded call; and, beside it, whether that runtime reaches every peer through this
//! host's shared memory, so that a fence or a quiet is made without entering it
//! ([`ordering_only`]).

use std::sync::atomic::{fence, AtomicBool, Ordering};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use super::runtime::Shmem;
use crate::error::{Error, ErrorKind, Recovery, Result};
use crate::sys::gate::{Exclusive, Gated, FIRST_HOLD};

/// The native runtime's state in this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RuntimeState {
    /// No runtime is active; `initialize` may be called.
    Uninitialized,
    /// A runtime is active (or being initialized).
    Ready,
    /// A shutdown failed: nothing works in this process any more.
    Finalized,
    /// The managed lifecycle gave up after a terminal or convergence failure: the runtime was
    /// released and nothing may start one in this process any more.
    Invalidated,
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
    /// Why the state is terminal (Finalized or Invalidated), and for Invalidated the recovery
    /// the lifecycle's errors name.
    terminal_because: Option<(Recovery, String)>,
    latest_failure: Option<FailureRecord>,
}

static PROCESS: Mutex<ProcessState> = Mutex::new(ProcessState {
    state: RuntimeState::Uninitialized,
    terminal_because: None,
    latest_failure: None,
});

/// The process's runtime under the managed lifecycle (`lifecycle`): guarded calls pass its
/// gate, acquire/release/restart and invalidation hold it exclusively (`sys/gate.rs`). Its gate
/// word holds [`INVALIDATED`] and [`LEASED`] besides the gate's own bits.
pub(crate) static RUNTIME: Gated<Option<Shmem>> = Gated::new(None);

/// [`RUNTIME`]'s hold while the state is terminal ([`RuntimeState::Finalized`] or
/// [`RuntimeState::Invalidated`]): a mirror of the state for fast paths, set under the lock.
const INVALIDATED: u32 = FIRST_HOLD;

/// [`RUNTIME`]'s hold while a shared root manages the heap (the registry's lease word is not
/// zero): guarded calls then check the calling thread's lease.
pub(crate) const LEASED: u32 = FIRST_HOLD << 1;

/// Whether the runtime past [`RUNTIME`]'s gate reaches every peer through this host's shared
/// memory, where a fence or a quiet is a memory fence and nothing more. Written by
/// [`HeldRuntime`]'s drop, before the gate opens again.
static SHARED_MEMORY_ONLY: AtomicBool = AtomicBool::new(false);

/// [`RUNTIME`] held exclusively (no guarded call runs meanwhile); its drop records whether the
/// runtime it leaves behind is shared-memory only, then opens the gate.
pub(crate) struct HeldRuntime(Exclusive<'static, Option<Shmem>>);

/// [`RUNTIME`] held exclusively, once every thread inside has left it.
pub(crate) fn hold_runtime() -> HeldRuntime {
    HeldRuntime(RUNTIME.exclusive())
}

/// [`RUNTIME`] held exclusively if no writer holds it and no thread is inside now.
pub(crate) fn try_hold_runtime() -> Option<HeldRuntime> {
    RUNTIME.try_exclusive().map(HeldRuntime)
}

impl std::ops::Deref for HeldRuntime {
    type Target = Option<Shmem>;

    fn deref(&self) -> &Option<Shmem> {
        &self.0
    }
}

impl std::ops::DerefMut for HeldRuntime {
    fn deref_mut(&mut self) -> &mut Option<Shmem> {
        &mut self.0
    }
}

impl Drop for HeldRuntime {
    fn drop(&mut self) {
        // Before the gate opens (the `Exclusive` field drops after this): a call that sees it
        // open (an acquire load) sees this store too.
        let only = self.0.as_ref().is_some_and(Shmem::shared_memory_only);
        SHARED_MEMORY_ONLY.store(only, Ordering::Relaxed);
    }
}

/// Makes the memory fence `order` and returns true when that is all a fence or a quiet of the
/// runtime needs now: its gate admits calls at once (open, not invalidated, no shared root) and
/// every peer is in this host's shared memory. False: make the call through the runtime.
///
/// A quiet racing a release or restart on another thread may take either side of it; a thread
/// that reached the runtime after the gate last opened sees the flag of that runtime.
#[inline]
pub(crate) fn ordering_only(order: Ordering) -> bool {
    if !RUNTIME.word().is_clear() || !SHARED_MEMORY_ONLY.load(Ordering::Relaxed) {
        return false;
    }
    fence(order);
    true
}

/// The runtime state of this process.
pub fn runtime_state() -> RuntimeState {
    PROCESS.lock().state
}

/// The latest failure of a runtime operation in this process, if any.
pub fn latest_failure() -> Option<FailureRecord> {
    PROCESS.lock().latest_failure.clone()
}

/// One load: is this process terminal (finalized or invalidated)?
#[inline]
pub(crate) fn is_invalidated() -> bool {
    RUNTIME.word().holds(INVALIDATED)
}

/// The recovery and cause that made the process terminal, if it is.
pub(crate) fn invalidation() -> Option<(Recovery, String)> {
    let process = PROCESS.lock();
    match process.state {
        RuntimeState::Finalized | RuntimeState::Invalidated => process.terminal_because.clone(),
        _ => None,
    }
}

/// Moves the process to [`RuntimeState::Invalidated`] unless it is terminal already (the first
/// cause is kept). The caller releases the runtime.
pub(crate) fn invalidate(recovery: Recovery, cause: &Error) {
    let mut process = PROCESS.lock();
    if !matches!(
        process.state,
        RuntimeState::Finalized | RuntimeState::Invalidated
    ) {
        process.state = RuntimeState::Invalidated;
        process.terminal_because = Some((recovery, cause.to_string()));
    }
    RUNTIME.word().hold(INVALIDATED);
}

/// Claims the process for a new runtime lifetime.
pub(crate) fn begin_lifetime() -> Result<()> {
    let mut process = PROCESS.lock();
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
        RuntimeState::Finalized | RuntimeState::Invalidated => Err(Error::new(
            ErrorKind::InvalidState,
            "initialize",
            format!(
                "the runtime of this process is {} after an earlier failure ({}); restart the \
                 process",
                match process.state {
                    RuntimeState::Finalized => "finalized",
                    _ => "invalidated",
                },
                process
                    .terminal_because
                    .as_ref()
                    .map_or("unknown cause", |(_, cause)| cause.as_str())
            ),
        )),
    }
}

/// Ends the current lifetime: back to `Uninitialized`, or `Finalized` if `failure` is given.
pub(crate) fn end_lifetime(failure: Option<&Error>) {
    let mut process = PROCESS.lock();
    if matches!(
        process.state,
        RuntimeState::Finalized | RuntimeState::Invalidated
    ) {
        return;
    }
    match failure {
        None => process.state = RuntimeState::Uninitialized,
        Some(error) => {
            process.state = RuntimeState::Finalized;
            process.terminal_because = Some((Recovery::Terminal, error.to_string()));
            RUNTIME.word().hold(INVALIDATED);
        }
    }
}

/// Records `error` as the latest failure, at `phase` of its operation.
pub(crate) fn record_failure(error: &Error, phase: &str) {
    PROCESS.lock().latest_failure = Some(FailureRecord {
        operation: error.operation().to_string(),
        phase: phase.to_string(),
        root_rank: error.rank(),
        kind: error.kind(),
        message: error.to_string(),
    });
}
