//! The native runtime of one process: the [`Shmem`] handle, its lifetime and shutdown. Its other
//! concerns live next to it: `initialize.rs` (joining a root, checking the introductions, sharing
//! the segment), `registry.rs` (collective allocate/free and the live-allocation registry),
//! `arguments.rs` (the cross-rank argument check of those calls) and `debug.rs` (the snapshot).

use std::sync::Arc;

use parking_lot::Mutex;
use rustc_hash::FxHashMap;

use super::allocation::AllocationRecord;
use super::allocator::Allocator;
use super::liveness::Liveness;
use super::process;
use crate::config::Config;
use crate::control::ControlPlane;
use crate::error::{Error, ErrorKind, Result};
use crate::transport::segment::Segment;
use crate::transport::sync;
use crate::transport::Transports;

/// Default alignment of allocations: one cache line, so separately allocated signal words never
/// share a line.
pub const DEFAULT_ALIGNMENT: u64 = 64;

/// An initialized runtime: this process is `rank` of a root of `size` PEs sharing a symmetric
/// heap. Created by [`Shmem::initialize`] (collective), ended by [`Shmem::shutdown`]
/// (collective). Dropping it without `shutdown` releases this process's resources without any
/// collective step.
#[derive(Debug)]
pub struct Shmem {
    pub(crate) rank: usize,
    pub(crate) size: usize,
    pub(crate) config: Config,
    pub(crate) heap_size: u64,
    pub(crate) plane: ControlPlane,
    pub(crate) segment: Arc<Segment>,
    pub(crate) transport: Transports,
    pub(crate) heap: Mutex<Heap>,
    /// The live allocations' spans, checked by every data-plane call without a lock.
    pub(crate) live: Liveness,
    pub(crate) spin: bool,
}

/// Allocation state, identical on every PE.
#[derive(Debug)]
pub(crate) struct Heap {
    pub(crate) allocator: Allocator,
    /// Live allocations by index. Looked up, never iterated in an order that matters: a hash
    /// map, so a dozen live allocations do not make every allocate split a B-tree node and
    /// every free merge it back; FxHash, as the allocator's live blocks.
    pub(crate) records: FxHashMap<u64, AllocationRecord>,
    pub(crate) next_index: u64,
    /// Number of collective argument checks so far (selects the double-buffered slot).
    pub(crate) checks: u64,
}

/// How a [`Shmem::shutdown`] did not happen.
#[derive(Debug)]
pub enum ShutdownError {
    /// The runtime is not ready to shut down (allocations live); it is handed back intact.
    Refused {
        /// The runtime, still usable.
        runtime: Box<Shmem>,
        /// Why.
        error: Error,
    },
    /// Shutting down failed; resources were released anyway and the process is finalized.
    Failed(Error),
}

impl std::fmt::Display for ShutdownError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ShutdownError::Refused { error, .. } | ShutdownError::Failed(error) => error.fmt(f),
        }
    }
}

impl std::error::Error for ShutdownError {}

impl ShutdownError {
    /// The underlying error.
    pub fn error(&self) -> &Error {
        match self {
            ShutdownError::Refused { error, .. } | ShutdownError::Failed(error) => error,
        }
    }
}

impl Shmem {
    /// This process's rank in the root.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of PEs in the root.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The number of PEs of this root on this host, this one included (what the waiting policy
    /// counts against the cores, also when `HYPER_MULTICORE_SHMEM_TRANSPORT=ucx` routes them
    /// through UCX; the PEs sharing this process's heap segment are [`Shmem::shared_pes`]).
    pub fn local_pes(&self) -> usize {
        self.transport.local_pes()
    }

    /// Whether every PE of this root shares this process's heap segment, so that every
    /// data-plane operation is a load, a store or a fence in shared memory and none waits for
    /// the network: false when a peer is on another host or
    /// `HYPER_MULTICORE_SHMEM_TRANSPORT=ucx` puts every PE alone.
    pub fn shared_memory_only(&self) -> bool {
        self.transport.single_group()
    }

    /// The PEs of this root whose heaps are mapped in this process (so [`Shmem::ptr`] reaches
    /// them), this PE among them, ascending: its host's PEs, or only itself when
    /// `HYPER_MULTICORE_SHMEM_TRANSPORT=ucx` puts every PE alone. OpenSHMEM's
    /// `SHMEM_TEAM_SHARED`.
    pub fn shared_pes(&self) -> &[usize] {
        self.transport.group()
    }

    /// Heap bytes per PE.
    pub fn heap_size(&self) -> u64 {
        self.heap_size
    }

    /// The runtime lifetime (every handle of this lifetime carries it).
    pub fn generation(&self) -> u64 {
        self.segment.generation()
    }

    /// A handle that keeps this runtime's shared mapping (every PE's heap) mapped for as long as
    /// it lives, even after this runtime is shut down, dropped or restarted. Fronts that hand out
    /// raw views of the heap (the Python front's tensors, from addresses given by
    /// [`Shmem::ptr`]) hold one per view, so a stale view reads stale bytes instead of faulting
    /// (zeros, once a restart keeping data has grown the heap in place: the old mapping is then
    /// detached from the memfd the new heap reuses).
    pub fn mapping_keepalive(&self) -> Arc<dyn std::any::Any + Send + Sync> {
        Arc::clone(self.segment.mapping()) as Arc<dyn std::any::Any + Send + Sync>
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The root's control plane (small messages; see [`ControlPlane`]).
    pub fn control(&self) -> &ControlPlane {
        &self.plane
    }

    /// Local check, no side effects: succeeds if no allocation is live.
    pub fn validate_shutdown(&self) -> Result<()> {
        let heap = self.heap.lock();
        if heap.records.is_empty() {
            return Ok(());
        }
        let mut ids: Vec<u64> = heap.records.keys().copied().collect();
        ids.sort_unstable();
        Err(Error::new(
            ErrorKind::InvalidState,
            "shutdown",
            format!(
                "{} allocations are still live (ids {ids:?}); free them before shutting down",
                ids.len()
            ),
        )
        .on_rank(self.rank))
    }

    /// Collective: waits for every PE, then releases the heap and the control plane. Refused
    /// (runtime handed back) while allocations are live; a failure of the final barrier still
    /// releases everything but finalizes the process.
    pub fn shutdown(self) -> std::result::Result<(), ShutdownError> {
        if let Err(error) = self.validate_shutdown() {
            process::record_failure(&error, "validate");
            return Err(ShutdownError::Refused {
                runtime: Box::new(self),
                error,
            });
        }
        self.quiet();
        let outcome = self.plane.barrier().map_err(|e| {
            Error::new(
                e.kind(),
                "shutdown",
                format!("the final barrier failed: {}", e.message()),
            )
            .on_rank(self.rank)
            .caused_by(e)
        });
        // Releases the heap mapping and the control plane (see `Drop`).
        drop(self);
        outcome.map_err(|error| {
            process::record_failure(&error, "barrier");
            process::end_lifetime(Some(&error));
            ShutdownError::Failed(error)
        })
    }

    pub(crate) fn error(
        &self,
        kind: ErrorKind,
        operation: &str,
        message: impl Into<String>,
    ) -> Error {
        Error::new(kind, operation, message).on_rank(self.rank)
    }
}

impl Drop for Shmem {
    fn drop(&mut self) {
        // No collective work here: release local resources only. A loss this PE saw through a
        // transport (its abort word names the rank) and root rank 0's plane has not heard of
        // yet is passed on first, so members waiting on root learn it rather than time out.
        if let Some(lost) = sync::aborted(self.transport.abort_word()) {
            if (lost as usize) < self.size {
                let error = Error::peer_lost(
                    "shutdown",
                    lost as usize,
                    "root rank 0 saw the rank lost through a transport before shutting down",
                );
                self.plane.announce_loss(&error);
            }
        }
        self.plane.close();
        process::end_lifetime(None);
    }
}
