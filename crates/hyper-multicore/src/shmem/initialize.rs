//! Initialize: join the rendezvous of a unique ID, exchange and check the introductions (same
//! heap size, one host, one user, a heap that fits), then root rank 0 creates the heap segment
//! and every PE maps it. Also the local check of a planned heap ([`Shmem::plan_heap`]).

use std::sync::Arc;

use parking_lot::Mutex;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::allocation::AllocationSpec;
use super::allocator::Allocator;
use super::liveness::Liveness;
use super::process;
use super::runtime::{Heap, Shmem, DEFAULT_ALIGNMENT};
use crate::config::Config;
use crate::control::converge::converge;
use crate::control::{BootstrapListener, ControlPlane, UniqueId};
use crate::error::{Error, ErrorKind, Result};
use crate::transport::segment::{max_alignment, Layout, Segment};
use crate::transport::sync;
use crate::transport::{self, Locality, Transports};
use crate::world::World;

/// Everything [`Shmem::join`] needs besides the configuration.
pub(crate) struct Joining<'a> {
    pub(crate) rank: usize,
    pub(crate) size: usize,
    pub(crate) unique_id: &'a UniqueId,
    pub(crate) listener: Option<BootstrapListener>,
    pub(crate) heap_size: u64,
    pub(crate) watch: crate::control::Watch<'a>,
    /// This PE's segment of the previous lifetime, reused if the new heap fits its room.
    pub(crate) previous: Option<&'a Segment>,
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

    /// [`Shmem::initialize_with`] over every rank of `world` (collective over the world): root
    /// rank 0 creates the unique ID and the world's control plane carries it to the others, so
    /// a program launched by `hmrun` needs no channel of its own for it.
    pub fn initialize_over(world: &World, config: Config, heap_size: Option<u64>) -> Result<Shmem> {
        let (bytes, listener) = if world.rank() == 0 {
            let (id, listener) = Shmem::get_unique_id(&config)?;
            (world.control().broadcast(&id.to_bytes())?, Some(listener))
        } else {
            (world.control().broadcast(&[])?, None)
        };
        let id = UniqueId::from_bytes(&bytes)?;
        Shmem::initialize_with(config, world.rank(), world.size(), &id, listener, heap_size)
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
        let heap_size = heap_size.unwrap_or(config.heap_size);
        let joining = Joining {
            rank,
            size,
            unique_id,
            listener,
            heap_size,
            watch,
            previous: None,
        };
        Shmem::join(config, joining)
    }

    /// Initialize as `joining` says (the lifecycle's restart passes the previous segment).
    pub(crate) fn join(config: Config, joining: Joining<'_>) -> Result<Shmem> {
        process::begin_lifetime().inspect_err(|e| process::record_failure(e, "state check"))?;
        let (rank, size, heap_size) = (joining.rank, joining.size, joining.heap_size);
        let unique_id = joining.unique_id;
        let mut phase = "rendezvous";
        let result = (|| {
            let plane = ControlPlane::connect_watched(
                rank,
                size,
                unique_id,
                joining.listener,
                config.timeout,
                joining.watch,
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
                previous: joining.previous,
                net: None,
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
            watched.abort(lost);
        });
        Shmem {
            rank,
            size,
            spin: sync::spins(transport.local_pes()),
            heap: Mutex::new(Heap {
                allocator: Allocator::new(heap_size),
                records: Default::default(),
                next_index: 0,
                checks: 0,
            }),
            live: Liveness::default(),
            config,
            heap_size,
            plane,
            segment,
            transport,
        }
    }

    /// Local check, no side effects: could a runtime of `pes` PEs (on this host) with
    /// `heap_size` bytes per PE be initialized, and would `specs`, allocated in order into its
    /// fresh heap, all fit with their alignments? Fails with the first problem (the spec is
    /// named by its index): alignment not a power of two or above [`max_alignment`], an
    /// overflowing shape, a heap that does not fit the address space or exceeds this host's
    /// memory for `pes` PEs, a spec the heap cannot hold. A restart makes this check in Preflight,
    /// before anything is torn down.
    pub fn plan_heap(pes: usize, heap_size: u64, specs: &[AllocationSpec]) -> Result<()> {
        const OP: &str = "plan heap";
        let invalid = |message: String| Error::new(ErrorKind::InvalidArgument, OP, message);
        if heap_size == 0 {
            return Err(invalid("the heap size must be positive".into()));
        }
        let mut allocator = Allocator::new(heap_size);
        for (index, spec) in specs.iter().enumerate() {
            let alignment = spec.alignment.unwrap_or(DEFAULT_ALIGNMENT);
            let largest = max_alignment(heap_size);
            if !alignment.is_power_of_two() || alignment > largest {
                return Err(invalid(format!(
                    "target {index}: alignment {alignment} must be a power of two no larger \
                     than {largest}, the heap's size rounded up to one (or None for the \
                     default {DEFAULT_ALIGNMENT})"
                )));
            }
            let bytes = spec
                .bytes()
                .map_err(|e| invalid(format!("target {index}: {}", e.message())))?;
            let alignment = alignment.max(super::allocator::MIN_ALIGNMENT);
            allocator.allocate(bytes, alignment).map_err(|exhausted| {
                invalid(format!(
                    "target {index} does not fit a fresh heap of {heap_size} bytes after the \
                     targets before it: {}; raise heap_size_bytes",
                    exhausted.describe()
                ))
            })?;
        }
        heap_fits(pes, heap_size, OP).map(drop)
    }
}

fn introduce(heap_size: u64, transport: crate::config::TransportMode) -> Result<Introduction> {
    Ok(Introduction {
        transport,
        heap_size,
        generation: fresh_generation()?,
        host: transport::host_identity(),
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
    let largest_group = locality.groups.iter().map(Vec::len).max().unwrap_or(1);
    Layout::new(largest_group, sizes[0]).map_err(|e| e.on_rank(rank))?;
    heap_fits(locality.local_pes(rank), sizes[0], OP).map_err(|e| e.on_rank(rank))?;
    Ok(locality)
}

/// The segment layout for `pes` heaps of `heap_size` bytes on this host, or an error if it does
/// not fit this process's address space or one heap exceeds this host's memory (it could never
/// be filled). Heaps whose sum exceeds the memory are allowed — a heap's pages are allocated
/// only where it is written, so 32 PEs of 1 GiB each that use a little of it fit a smaller
/// host — with a warning. Initialize checks it; a restart checks it in Preflight, before
/// anything is torn down.
pub(crate) fn heap_fits(pes: usize, heap_size: u64, operation: &str) -> Result<Layout> {
    let layout = Layout::new(pes, heap_size)
        .map_err(|e| Error::new(e.kind(), operation, e.message().to_string()))?;
    if let Some(memory) = host_memory_bytes() {
        if heap_size > memory {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                operation,
                format!(
                    "a heap of {heap_size} bytes exceeds this host's {memory} bytes of memory; \
                     choose a smaller heap size"
                ),
            ));
        }
        let wanted = heap_size.saturating_mul(pes as u64);
        if wanted > memory {
            tracing::warn!(
                "{pes} PEs × {heap_size} heap bytes = {wanted} bytes exceed this host's {memory} \
                 bytes of memory: fine while the PEs write only part of their heaps (pages are \
                 allocated where written), out of memory if they fill them"
            );
        }
    }
    Ok(layout)
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
