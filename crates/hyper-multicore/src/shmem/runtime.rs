//! The native runtime of one process: initialize over a root group, the heap, collective
//! allocate/free, shutdown, and the debug snapshot.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::allocation::{
    Allocation, AllocationId, AllocationRecord, AllocationSpec, Dtype, Element,
};
use super::allocator::Allocator;
use super::converge::converge;
use super::process::{self, FailureRecord, RuntimeState};
use super::segment::{Layout, Segment, MAX_ALIGNMENT};
use super::sync;
use super::transport::{self, Locality, Transports};
use crate::config::Config;
use crate::control::{lock_unpoisoned, BootstrapListener, ControlPlane, UniqueId};
use crate::error::{Error, ErrorKind, Result};

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
    pub(crate) spin: bool,
}

/// Allocation state, identical on every PE.
#[derive(Debug)]
pub(crate) struct Heap {
    allocator: Allocator,
    records: BTreeMap<u64, AllocationRecord>,
    next_index: u64,
    /// Number of collective argument checks so far (selects the double-buffered slot).
    checks: u64,
}

/// What each rank tells the others at initialize.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Introduction {
    heap_size: u64,
    /// A fresh runtime generation; root rank 0's is the root's.
    generation: u64,
    host: String,
    /// `HYPER_MULTICORE_SHMEM_TRANSPORT` on this rank (must agree).
    transport: crate::config::TransportMode,
    uid: u32,
    pid: u32,
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
    /// Creates a unique ID for a new root (root rank 0 only); pass the listener to
    /// [`Shmem::initialize`] on rank 0 and the ID to every other rank.
    pub fn get_unique_id(config: &Config) -> Result<(UniqueId, BootstrapListener)> {
        UniqueId::create(config)
    }

    /// Collective over the root: joins the rendezvous of `unique_id` as `rank` of `size`, checks
    /// that every rank asked for the same heap size on the same host, and maps every PE's heap.
    /// `heap_size` defaults to `HYPER_MULTICORE_SHMEM_HEAP_SIZE`, else 1 GiB. A failure leaves
    /// nothing behind and may be retried.
    pub fn initialize(
        rank: usize,
        size: usize,
        unique_id: &UniqueId,
        listener: Option<BootstrapListener>,
        heap_size: Option<u64>,
    ) -> Result<Shmem> {
        let config =
            Config::from_env().inspect_err(|e| process::record_failure(e, "configuration"))?;
        Shmem::initialize_with(config, rank, size, unique_id, listener, heap_size)
    }

    /// [`Shmem::initialize`] with an explicit configuration.
    pub fn initialize_with(
        config: Config,
        rank: usize,
        size: usize,
        unique_id: &UniqueId,
        listener: Option<BootstrapListener>,
        heap_size: Option<u64>,
    ) -> Result<Shmem> {
        let watch = crate::control::unwatched;
        Shmem::initialize_watched(config, rank, size, unique_id, listener, heap_size, &watch)
    }

    /// [`Shmem::initialize_with`] whose rendezvous also gives up as soon as `watch` fails (the
    /// lifecycle watches its group channel, which notices a dead member first).
    pub fn initialize_watched(
        config: Config,
        rank: usize,
        size: usize,
        unique_id: &UniqueId,
        listener: Option<BootstrapListener>,
        heap_size: Option<u64>,
        watch: crate::control::Watch<'_>,
    ) -> Result<Shmem> {
        process::begin_lifetime().inspect_err(|e| process::record_failure(e, "state check"))?;
        let heap_size = heap_size.unwrap_or(config.heap_size);
        let mut phase = "rendezvous";
        let result = (|| {
            let plane = ControlPlane::connect_watched(
                rank,
                size,
                unique_id,
                listener,
                config.timeout,
                watch,
            )?;
            phase = "introduction";
            let introductions =
                converge(&plane, "initialize", introduce(heap_size, config.transport))?;
            let locality = check_introductions(&introductions, rank)?;
            phase = "transport";
            let pids: Vec<u32> = introductions.iter().map(|i| i.pid).collect();
            let transport = Transports::start(&transport::Start {
                mode: config.transport,
                plane: &plane,
                secret: unique_id.secret(),
                locality: &locality,
                pids: &pids,
                generation: introductions[0].generation,
                heap_size,
                deadline: Instant::now() + config.timeout,
                shm: None,
            })?;
            Ok(Shmem::assemble(
                config, rank, size, heap_size, plane, transport,
            ))
        })();
        match result {
            Ok(shmem) => Ok(shmem),
            Err(error) => {
                process::record_failure(&error, phase);
                process::end_lifetime(None);
                Err(error)
            }
        }
    }

    fn assemble(
        config: Config,
        rank: usize,
        size: usize,
        heap_size: u64,
        plane: ControlPlane,
        transport: Transports,
    ) -> Shmem {
        let segment = Arc::clone(transport.segment());
        let watched = Arc::clone(&segment);
        plane.on_break(move |_, peer, _| {
            let lost = peer.unwrap_or(size) as u32;
            let control = watched.control();
            sync::abort(&control.abort, lost, &control.barrier, watched.doorbells());
        });
        Shmem {
            rank,
            size,
            spin: sync::WaitPolicy::new(transport.local_pes(), Instant::now()).spin,
            heap: Mutex::new(Heap {
                allocator: Allocator::new(heap_size),
                records: BTreeMap::new(),
                next_index: 0,
                checks: 0,
            }),
            config,
            heap_size,
            plane,
            segment,
            transport,
        }
    }

    /// This process's rank in the root.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of PEs in the root.
    pub fn size(&self) -> usize {
        self.size
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
    /// [`Shmem::ptr`]) hold one per view, so a stale view reads stale bytes instead of faulting.
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
        let heap = lock_unpoisoned(&self.heap);
        if heap.records.is_empty() {
            return Ok(());
        }
        let ids: Vec<u64> = heap.records.keys().copied().collect();
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

    /// Collective: allocates `len` elements of `T` (alignment `None` = 64 bytes). Every rank
    /// must make the same call; arguments that differ across ranks fail on every rank.
    pub fn allocate<T: Element>(
        &self,
        len: usize,
        alignment: Option<u64>,
    ) -> Result<Allocation<T>> {
        self.allocate_spec(&AllocationSpec::of::<T>(len, alignment))
            .map(Allocation::new)
    }

    /// Collective: allocates by spec (shape, dtype, alignment) and returns the record.
    pub fn allocate_spec(&self, spec: &AllocationSpec) -> Result<AllocationRecord> {
        const OP: &str = "allocate";
        let mut heap = lock_unpoisoned(&self.heap);
        let bytes = spec.bytes();
        let alignment = spec.alignment.unwrap_or(DEFAULT_ALIGNMENT);
        let call = HeapCall::Allocate {
            bytes: bytes.as_ref().copied().unwrap_or(u64::MAX),
            alignment,
            dtype: spec.dtype,
        };
        self.check_same_call(&mut heap, OP, call)
            .inspect_err(|e| process::record_failure(e, "argument check"))?;
        let result = (|| {
            let bytes = bytes?;
            if !alignment.is_power_of_two() || alignment > MAX_ALIGNMENT {
                return Err(self.error(
                    ErrorKind::InvalidArgument,
                    OP,
                    format!(
                        "alignment {alignment} must be a power of two no larger than \
                         {MAX_ALIGNMENT} (or None for the default {DEFAULT_ALIGNMENT})"
                    ),
                ));
            }
            let alignment = alignment.max(super::allocator::MIN_ALIGNMENT);
            let offset = heap
                .allocator
                .allocate(bytes, alignment)
                .map_err(|exhausted| {
                    self.error(
                        ErrorKind::InvalidArgument,
                        OP,
                        format!("the heap is exhausted: {}", exhausted.describe()),
                    )
                })?;
            let index = heap.next_index;
            heap.next_index += 1;
            let record = AllocationRecord {
                id: AllocationId {
                    index,
                    generation: self.generation(),
                },
                offset,
                bytes,
                alignment,
                spec: spec.clone(),
            };
            heap.records.insert(index, record.clone());
            Ok(record)
        })();
        result.inspect_err(|e| process::record_failure(e, "allocate"))
    }

    /// Collective: frees an allocation (consumed, so it cannot be used again).
    pub fn free<T: Element>(&self, allocation: Allocation<T>) -> Result<()> {
        self.free_id(allocation.into_record().id)
    }

    /// Collective: frees the allocation `id`. Freeing twice, or an id of another lifetime, is
    /// an error on every rank.
    pub fn free_id(&self, id: AllocationId) -> Result<()> {
        const OP: &str = "free";
        let mut heap = lock_unpoisoned(&self.heap);
        self.check_same_call(&mut heap, OP, HeapCall::Free(id))
            .inspect_err(|e| process::record_failure(e, "argument check"))?;
        let result = (|| {
            self.check_generation(OP, id)?;
            let record = heap.records.remove(&id.index).ok_or_else(|| {
                self.error(
                    ErrorKind::DoubleFree,
                    OP,
                    format!("allocation {} was already freed (double free)", id.index),
                )
            })?;
            heap.allocator.free(record.offset).map_err(|e| {
                self.error(
                    ErrorKind::Protocol,
                    OP,
                    format!("the allocator has no block at offset {}", e.offset),
                )
            })?;
            Ok(())
        })();
        result.inspect_err(|e| process::record_failure(e, "free"))
    }

    /// The record of live allocation `id` (fails if freed or of another lifetime).
    pub fn resolve(&self, id: AllocationId) -> Result<AllocationRecord> {
        self.check_generation("resolve", id)?;
        let heap = lock_unpoisoned(&self.heap);
        heap.records.get(&id.index).cloned().ok_or_else(|| {
            self.error(
                ErrorKind::DoubleFree,
                "resolve",
                format!(
                    "allocation {} has been freed; it cannot be used any more",
                    id.index
                ),
            )
        })
    }

    /// Every live allocation, by id.
    pub fn allocations(&self) -> Vec<AllocationRecord> {
        lock_unpoisoned(&self.heap)
            .records
            .values()
            .cloned()
            .collect()
    }

    pub(crate) fn check_generation(&self, operation: &str, id: AllocationId) -> Result<()> {
        if id.generation == self.generation() {
            return Ok(());
        }
        Err(self.error(
            ErrorKind::InvalidArgument,
            operation,
            format!(
                "allocation {} belongs to another runtime lifetime (generation {:#x}, current \
                 {:#x}); it was released by a shutdown or restart — allocate again",
                id.index,
                id.generation,
                self.generation()
            ),
        ))
    }

    pub(crate) fn error(
        &self,
        kind: ErrorKind,
        operation: &str,
        message: impl Into<String>,
    ) -> Error {
        Error::new(kind, operation, message).on_rank(self.rank)
    }

    /// Publishes this rank's `call`, waits for every rank, and compares: every rank reads the
    /// same slots, so a mismatch fails everywhere alike (and nothing is allocated or freed).
    fn check_same_call(&self, heap: &mut Heap, operation: &str, call: HeapCall) -> Result<()> {
        heap.checks += 1;
        let slot = (heap.checks % 2) as usize;
        let stamped = call.encode(heap.checks);
        let all: Vec<[u64; 4]> = if self.transport.single_group() {
            let mine = &self.transport.own_pe_words().arguments[slot];
            for (word, value) in mine.iter().zip(stamped) {
                word.store(value, std::sync::atomic::Ordering::Relaxed);
            }
            self.data_barrier(operation)?;
            (0..self.size)
                .map(|pe| {
                    let words = &self.segment.pe_words(pe).arguments[slot];
                    std::array::from_fn(|i| words[i].load(std::sync::atomic::Ordering::Relaxed))
                })
                .collect()
        } else {
            // The argument slots are not shared by every rank: over the control plane.
            self.gather_call_words(operation, stamped)?
        };
        if all.iter().all(|words| *words == stamped) {
            return Ok(());
        }
        let mut groups: Vec<(String, Vec<usize>)> = Vec::new();
        for (pe, words) in all.iter().enumerate() {
            let described = if words[0] == heap.checks {
                HeapCall::describe(words)
            } else {
                format!(
                    "a different collective (call #{} instead of #{})",
                    words[0], heap.checks
                )
            };
            match groups.iter_mut().find(|(c, _)| *c == described) {
                Some((_, ranks)) => ranks.push(pe),
                None => groups.push((described, vec![pe])),
            }
        }
        let listing: Vec<String> = groups
            .iter()
            .map(|(call, ranks)| format!("root ranks {ranks:?} called {call}"))
            .collect();
        Err(self.error(
            ErrorKind::InvalidArgument,
            operation,
            format!(
                "arguments differ across ranks: {}; every rank must make the same allocate and \
                 free calls in the same order (nothing was allocated or freed)",
                listing.join(", ")
            ),
        ))
    }

    /// A snapshot of this runtime.
    pub fn debug_state(&self) -> DebugState {
        let heap = lock_unpoisoned(&self.heap);
        let usage = heap.allocator.usage();
        debug_assert_eq!(
            usage.allocated_bytes + usage.free_bytes,
            heap.allocator.capacity()
        );
        DebugState {
            state: RuntimeState::Ready,
            root_rank: Some(self.rank),
            root_size: Some(self.size),
            device: "cpu".into(),
            config: EffectiveConfig::from(&self.config, self.heap_size),
            reference_count: None,
            heap: Some(HeapUsage {
                allocated_bytes: usage.allocated_bytes,
                remaining_bytes: usage.free_bytes,
                peak_allocated_bytes: usage.peak_allocated_bytes,
                allocation_count: usage.allocation_count,
            }),
            allocations: heap
                .records
                .values()
                .map(|r| AllocationSummary {
                    id: r.id.index,
                    base_address: self
                        .transport
                        .local_ptr(self.rank, r.offset as usize)
                        .map_or(0, |p| p.as_ptr() as usize),
                    bytes: r.bytes,
                })
                .collect(),
            latest_failure: process::latest_failure(),
            transport: Some(self.transport.state()),
        }
    }
}

/// A collective heap call, as published for the cross-rank argument check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum HeapCall {
    Allocate {
        bytes: u64,
        alignment: u64,
        dtype: Dtype,
    },
    Free(AllocationId),
}

impl HeapCall {
    const ALLOCATE: u64 = 1;
    const FREE: u64 = 2;

    /// Four words: call number, kind (high byte) and dtype, then two arguments.
    fn encode(self, sequence: u64) -> [u64; 4] {
        match self {
            HeapCall::Allocate {
                bytes,
                alignment,
                dtype,
            } => {
                let dtype = Dtype::ALL.iter().position(|d| *d == dtype).unwrap_or(0) as u64;
                [sequence, Self::ALLOCATE << 56 | dtype, bytes, alignment]
            }
            HeapCall::Free(id) => [sequence, Self::FREE << 56, id.index, id.generation],
        }
    }

    /// Words published by some rank, described for an error message.
    fn describe(words: &[u64; 4]) -> String {
        match words[1] >> 56 {
            Self::ALLOCATE => {
                let dtype = Dtype::ALL
                    .get((words[1] & 0xff) as usize)
                    .map_or("?", |d| d.name());
                format!(
                    "allocate({} bytes of {dtype}, alignment {})",
                    words[2], words[3]
                )
            }
            Self::FREE => format!(
                "free(allocation {} of generation {:#x})",
                words[2], words[3]
            ),
            _ => "an unknown heap call".into(),
        }
    }
}

impl Drop for Shmem {
    fn drop(&mut self) {
        // No collective work here: release local resources only.
        self.plane.close();
        process::end_lifetime(None);
    }
}

fn introduce(heap_size: u64, transport: crate::config::TransportMode) -> Result<Introduction> {
    let host = transport::host_identity();
    Ok(Introduction {
        transport,
        heap_size,
        generation: fresh_generation()?,
        host,
        uid: rustix::process::getuid().as_raw(),
        pid: std::process::id(),
    })
}

/// The checks every rank makes on the same introductions, so all reach the same verdict.
fn check_introductions(all: &[Introduction], rank: usize) -> Result<Locality> {
    const OP: &str = "initialize";
    let fail = |kind, message: String| Error::new(kind, OP, message).on_rank(rank);
    let sizes: Vec<u64> = all.iter().map(|i| i.heap_size).collect();
    if sizes.iter().any(|&s| s != sizes[0]) {
        return Err(fail(
            ErrorKind::InvalidArgument,
            format!(
                "heap sizes differ across root ranks ({}); pass the same heap size (or the same \
                 {}) on every rank",
                group_by_value(&sizes),
                crate::config::HEAP_SIZE
            ),
        ));
    }
    if sizes[0] == 0 {
        return Err(fail(
            ErrorKind::InvalidArgument,
            "the heap size must be positive".into(),
        ));
    }
    let modes: Vec<&str> = all.iter().map(|i| i.transport.name()).collect();
    if modes.iter().any(|m| *m != modes[0]) {
        return Err(fail(
            ErrorKind::InvalidConfig,
            format!(
                "{} differs across root ranks ({}); set the same value on every rank",
                crate::config::TRANSPORT,
                group_by_value(&modes)
            ),
        ));
    }
    let hosts: Vec<&str> = all.iter().map(|i| i.host.as_str()).collect();
    if all[0].transport == crate::config::TransportMode::Shm && hosts.iter().any(|h| *h != hosts[0])
    {
        return Err(fail(
            ErrorKind::Unsupported,
            format!(
                "{}=shm, but the root spans several hosts ({}); run every PE of a root on one \
                 host, or use auto (the default) to reach other hosts through UCX",
                crate::config::TRANSPORT,
                group_by_value(&hosts)
            ),
        ));
    }
    let locality = Locality::new(all[0].transport, &hosts);
    if all
        .iter()
        .enumerate()
        .any(|(pe, i)| i.uid != all[locality.members_of(pe)[0]].uid)
    {
        return Err(fail(
            ErrorKind::Unsupported,
            "the PEs of a root run as different users; the heap is only shared between \
             processes of one user (on one host)"
                .into(),
        ));
    }
    let local_pes = locality.local_pes(rank);
    let largest_group = locality.groups.iter().map(Vec::len).max().unwrap_or(1);
    Layout::new(largest_group, sizes[0]).map_err(|e| e.on_rank(rank))?;
    let host_memory = host_memory_bytes();
    if let Some(memory) = host_memory {
        let wanted = sizes[0].saturating_mul(local_pes as u64);
        if wanted > memory {
            return Err(fail(
                ErrorKind::InvalidArgument,
                format!(
                    "{} PEs × {} heap bytes = {wanted} bytes exceed this host's {memory} bytes \
                     of memory; choose a smaller heap size",
                    local_pes, sizes[0]
                ),
            ));
        }
    }
    Ok(locality)
}

fn host_memory_bytes() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// `ranks [0, 1] = 64, ranks [2] = 128`.
fn group_by_value<T: PartialEq + std::fmt::Display>(values: &[T]) -> String {
    let mut groups: Vec<(&T, Vec<usize>)> = Vec::new();
    for (rank, value) in values.iter().enumerate() {
        match groups.iter_mut().find(|(v, _)| *v == value) {
            Some((_, ranks)) => ranks.push(rank),
            None => groups.push((value, vec![rank])),
        }
    }
    groups
        .iter()
        .map(|(v, ranks)| format!("root ranks {ranks:?}: {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn fresh_generation() -> Result<u64> {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes).map_err(|e| {
        Error::new(
            ErrorKind::Backend,
            "initialize",
            format!("the OS random source failed: {e}"),
        )
    })?;
    Ok(u64::from_le_bytes(bytes) | 1)
}

/// The effective configuration, as reported by [`DebugState`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EffectiveConfig {
    /// Heap bytes per PE in force.
    pub heap_size: u64,
    /// Deadline of blocking waits, in seconds.
    pub timeout_sec: f64,
    /// Bootstrap endpoint (`tcp://host:port`, or `default` for loopback/ephemeral).
    pub bootstrap_endpoint: String,
    /// Log level.
    pub log_level: String,
}

impl EffectiveConfig {
    pub(crate) fn from(config: &Config, heap_size: u64) -> Self {
        EffectiveConfig {
            heap_size,
            timeout_sec: config.timeout.as_secs_f64(),
            bootstrap_endpoint: config
                .bootstrap_endpoint
                .map_or_else(|| "default".to_string(), |e| format!("tcp://{e}")),
            log_level: config.log_level.clone(),
        }
    }
}

/// Heap usage of this PE (identical on every PE of the root).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct HeapUsage {
    /// Bytes held by live allocations (including alignment rounding).
    pub allocated_bytes: u64,
    /// Bytes still free.
    pub remaining_bytes: u64,
    /// Most bytes ever allocated at once in this lifetime.
    pub peak_allocated_bytes: u64,
    /// Live allocations.
    pub allocation_count: usize,
}

/// One live allocation, as reported by [`DebugState`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocationSummary {
    /// Its id.
    pub id: u64,
    /// Its address in this process.
    pub base_address: usize,
    /// Its size in bytes.
    pub bytes: u64,
}

/// A snapshot of the runtime, safe to take in any state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DebugState {
    /// The state.
    pub state: RuntimeState,
    /// This process's rank in the root (None when not initialized).
    pub root_rank: Option<usize>,
    /// The root's size.
    pub root_size: Option<usize>,
    /// The device the heap lives on.
    pub device: String,
    /// The effective configuration.
    pub config: EffectiveConfig,
    /// References held by the managed lifecycle (None for the native runtime alone).
    pub reference_count: Option<usize>,
    /// Heap usage.
    pub heap: Option<HeapUsage>,
    /// Live allocations sorted by id.
    pub allocations: Vec<AllocationSummary>,
    /// The latest failure of a runtime operation in this process.
    pub latest_failure: Option<FailureRecord>,
    /// The transport mode and each peer's route (None when not initialized).
    pub transport: Option<super::TransportState>,
}

/// A snapshot when no runtime is active (state, configuration and the latest failure).
pub fn debug_state_inactive() -> DebugState {
    let config = Config::from_env().unwrap_or_default();
    DebugState {
        state: process::runtime_state(),
        root_rank: None,
        root_size: None,
        device: "cpu".into(),
        config: EffectiveConfig::from(&config, config.heap_size),
        reference_count: None,
        heap: None,
        allocations: Vec::new(),
        latest_failure: process::latest_failure(),
        transport: None,
    }
}
