//! Symmetric memory: the native runtime of one process ([`Shmem`]), its heap, data plane and
//! collectives.
//!
//! ```no_run
//! use hyper_multicore::shmem::{Shmem, SignalOp, Comparison};
//! use hyper_multicore::world::World;
//!
//! let world = World::from_env()?;
//! // Root rank 0 creates the unique ID; the world's control plane distributes it (without a
//! // world from `hmrun`: `Shmem::get_unique_id` on rank 0, then `Shmem::initialize` on every rank).
//! let config = hyper_multicore::config::Config::from_env()?;
//! let shmem = Shmem::initialize_over(&world, config, Some(64 << 20))?;
//! let data = shmem.allocate::<u64>(8, None)?;
//! let flag = shmem.allocate::<u64>(1, None)?;
//! shmem.barrier()?;
//! let next = (shmem.rank() + 1) % shmem.size();
//! shmem.put_signal(&data, &[shmem.rank() as u64; 8], &flag, 1, SignalOp::Set, next)?;
//! shmem.wait_signal(&flag, 1, Comparison::Eq, None)?;
//! shmem.barrier()?;
//! shmem.free(flag)?;
//! shmem.free(data)?;
//! shmem.shutdown().map_err(|e| e.error().to_string()).unwrap();
//! # Ok::<(), hyper_multicore::Error>(())
//! ```
//!
//! Protocol facts: signal words written concurrently should be at least 64 bytes apart (the
//! default alignment of every allocation is 64, so separately allocated words are); every rank
//! must initialise a slot and pass a barrier before any peer writes into it remotely.

mod allocation;
pub(crate) mod allocator;
pub(crate) mod arguments;
mod atomics;
mod collectives;
mod data;
mod debug;
mod foreign;
mod initialize;
mod liveness;
pub(crate) mod process;
mod reduce;
pub(crate) mod registry;
mod runtime;
mod spanning;
mod team;
pub(crate) mod team_sync;

pub use crate::sys::copies::{copy_count, count_bounced, CopyCount};
pub use crate::sys::mapping::{LocalSource, LocalTarget, Strides};
pub use crate::transport::segment::max_alignment;
pub(crate) use crate::transport::segment::Segment;
pub use crate::transport::SignalOp;
pub use allocation::{
    Allocation, AllocationId, AllocationRecord, AllocationSpec, Dtype, Element, Region, Symmetric,
    View,
};
pub use collectives::{RootTarget, BROADCAST_PULL_MIN_BYTES};
pub use data::{AtomicOp, AtomicWord, Comparison, Located, LocatedCache};
pub(crate) use initialize::Joining;
pub use process::{latest_failure, runtime_state, FailureRecord, RuntimeState};
pub use reduce::{
    ReduceOp, ReduceSet, Reducible, HIERARCHICAL_REDUCE_MIN_BYTES, REDUCE_LOCAL_MAX_BYTES,
};
pub use team::Contribution;
/// True if the byte range `address..address + len` of this process overlaps any symmetric heap
/// mapping alive in this process: a running runtime's (every PE's heap and the control block),
/// or one kept mapped by [`Shmem::mapping_keepalive`] after a shutdown or restart. A
/// zero-length range overlaps nothing.
///
/// Fronts that turn a caller's buffer address into a Rust slice (the Python front's local
/// tensors and arrays) check it first: a slice over memory other processes write is undefined
/// behaviour, so such a buffer must be copied through the data plane's raw copies instead.
///
/// ```
/// let local = vec![0u8; 64];
/// assert!(!hyper_multicore::shmem::overlaps_shared_memory(local.as_ptr() as usize, local.len()));
/// ```
pub fn overlaps_shared_memory(address: usize, len: usize) -> bool {
    crate::sys::mapping::overlaps_any(address, len)
}

pub use crate::transport::{TransportState, TEST_HOST_VARIABLE};
pub use debug::{
    debug_state_inactive, AllocationSummary, DebugState, EffectiveConfig, HeapUsage, SeedAllocation,
};
pub use runtime::{Shmem, ShutdownError, DEFAULT_ALIGNMENT};
