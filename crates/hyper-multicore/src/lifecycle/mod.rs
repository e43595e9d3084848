//! The managed lifecycle: one process-wide runtime, shared by independent consumers through
//! reference counting, that is started, resized ("restarted") and shut down *collectively*:
//! every rank of the root group either succeeds at each stage, or all fail with the same
//! diagnosis naming the failing ranks, classified by what recovery is possible
//! ([`Recovery`](crate::error::Recovery)).
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
//!
//! Where each part lives: `acquire.rs`, `release.rs` and `restart.rs` (with `preserve.rs`, the
//! data a restart keeps, and `hook.rs`, the caller's preflight snapshot) are the three
//! operations; `steps.rs` runs a release's or restart's stages with the runtime held
//! exclusively, each one a converged `stage.rs` step, and `recovery.rs` classifies their
//! failures and invalidates; `guard.rs` is the way every call reaches the runtime; the shared
//! root is `shared_root.rs` (declaration, activation, close), `consumer.rs`, `lease.rs` and
//! `growth.rs`; `exit.rs` is the global exit and `fault.rs` the test-only fault injection. A
//! new lifecycle stage is a [`Stage`] and a step in the operation that runs it.

mod acquire;
mod consumer;
mod exit;
mod fault;
mod growth;
mod guard;
mod hook;
mod lease;
mod preserve;
mod recovery;
mod release;
mod restart;
mod shared_root;
mod stage;
mod steps;

use std::cell::RefCell;
use std::sync::Arc;

use parking_lot::{const_reentrant_mutex, ReentrantMutex};

pub use acquire::{acquire, acquire_root, RootGroup};
pub use consumer::Consumer;
pub use exit::{end_if_global_exit, global_exit, global_exit_status};
pub use fault::FAULT_VARIABLE;
pub use growth::{GrowableBuffer, Growth, GrowthRecord, DEFAULT_GROWTH_FACTOR};
pub use guard::{fence, guarded, quiet, try_guarded};
pub use hook::{PreflightHook, DESCRIBE_LIMIT};
pub use lease::Lease;
pub use release::release;
pub use restart::{restart, Replacement, RestartResult};
pub use shared_root::{
    allocation_budget, ConsumerSpec, ConsumerState, SharedRoot, SharedRootState, HEAP_ROUNDING,
};
pub use stage::{Stage, StageTimings};

use crate::control::{ChannelMode, GroupChannel};
use crate::error::{Error, ErrorKind, Result};
use crate::shmem::process::RUNTIME;
use crate::shmem::{debug_state_inactive, DebugState};
use crate::world::World;
use recovery::check_valid;
use steps::STAGES_SNAPSHOT;

/// The device the heap lives on (host memory; GPUs come later).
pub const DEVICE: &str = "cpu";

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
