//! The debug snapshot of a runtime ([`DebugState`]), safe to take in any state.

use serde::{Deserialize, Serialize};

use super::process::{self, FailureRecord, RuntimeState};
use super::runtime::Shmem;
use crate::config::Config;

impl Shmem {
    /// A snapshot of this runtime.
    pub fn debug_state(&self) -> DebugState {
        let heap = self.heap.lock();
        let usage = heap.allocator.usage();
        debug_assert_eq!(
            usage.allocated_bytes + usage.free_bytes,
            heap.allocator.capacity()
        );
        let mut allocations: Vec<AllocationSummary> = heap
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
            .collect();
        allocations.sort_unstable_by_key(|a| a.id);
        DebugState {
            allocated_bytes: usage.allocated_bytes,
            remaining_bytes: usage.free_bytes,
            max_allocated_bytes: usage.peak_allocated_bytes,
            active_allocations: allocations.iter().map(SeedAllocation::from).collect(),
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
            allocations,
            latest_failure: process::latest_failure(),
            transport: Some(self.transport.state()),
        }
    }
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
    /// The original runtime's name of `heap_size`.
    pub heap_size_bytes: u64,
    /// The original runtime's name of `timeout_sec`.
    pub timeout_seconds: f64,
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
            heap_size_bytes: heap_size,
            timeout_seconds: config.timeout.as_secs_f64(),
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

/// One live allocation under the original runtime's key names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeedAllocation {
    /// Its id.
    pub allocation_id: u64,
    /// Its address in this process.
    pub allocation_base: usize,
    /// Its size in bytes.
    pub allocation_bytes: u64,
}

impl From<&AllocationSummary> for SeedAllocation {
    fn from(a: &AllocationSummary) -> Self {
        SeedAllocation {
            allocation_id: a.id,
            allocation_base: a.base_address,
            allocation_bytes: a.bytes,
        }
    }
}

/// A snapshot of the runtime, safe to take in any state. Besides its own fields it offers the
/// original runtime's keys (`allocated_bytes`, `remaining_bytes`, `max_allocated_bytes`,
/// `active_allocations`, `config.heap_size_bytes`, `config.timeout_seconds`), so tools written
/// for it keep working.
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
    /// Bytes held by live allocations (0 when not initialized; the original runtime's key).
    pub allocated_bytes: u64,
    /// Bytes still free (the original runtime's key).
    pub remaining_bytes: u64,
    /// Most bytes ever allocated at once in this lifetime (the original runtime's key).
    pub max_allocated_bytes: u64,
    /// Live allocations sorted by id, under the original runtime's key names.
    pub active_allocations: Vec<SeedAllocation>,
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
        allocated_bytes: 0,
        remaining_bytes: 0,
        max_allocated_bytes: 0,
        active_allocations: Vec::new(),
    }
}
