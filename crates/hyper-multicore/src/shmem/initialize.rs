//! Initialize: join the rendezvous of a unique ID, exchange and check the introductions (same
//! heap size, one host, one user, a heap that fits), then root rank 0 creates the heap segment
//! and every PE maps it. Also the local check of a planned heap ([`Shmem::plan_heap`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::Mutex;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::allocation::AllocationSpec;
use super::allocator::Allocator;
use super::converge::converge;
use super::handoff;
use super::liveness::Liveness;
use super::process;
use super::runtime::{Heap, Shmem, DEFAULT_ALIGNMENT};
use super::segment::{Layout, Segment, MAX_ALIGNMENT};
use super::sync;
use crate::config::Config;
use crate::control::{BootstrapListener, ControlPlane, UniqueId};
use crate::error::{Error, ErrorKind, Result};

/// What each rank tells the others at initialize.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Introduction {
    heap_size: u64,
    host: String,
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
            let introductions = converge(&plane, "initialize", introduce(heap_size))?;
            let layout = check_introductions(&introductions, rank)?;
            phase = "segment";
            let pids: Vec<u32> = introductions.iter().map(|i| i.pid).collect();
            let segment = share_segment(&plane, unique_id, layout, &pids, config.timeout)?;
            Ok(Shmem::assemble(
                config, rank, size, heap_size, plane, segment,
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
        segment: Segment,
    ) -> Shmem {
        let segment = Arc::new(segment);
        let watched = Arc::clone(&segment);
        plane.on_break(move |_, peer, _| {
            let lost = peer.unwrap_or(size) as u32;
            let control = watched.control();
            sync::abort(&control.abort, lost, &control.barrier, watched.doorbells());
        });
        Shmem {
            rank,
            size,
            spin: sync::WaitPolicy::new(size, Instant::now()).spin,
            heap: Mutex::new(Heap {
                allocator: Allocator::new(heap_size),
                records: BTreeMap::new(),
                next_index: 0,
                checks: 0,
            }),
            live: Liveness::default(),
            config,
            heap_size,
            plane,
            segment,
        }
    }

    /// Local check, no side effects: could a runtime of `pes` PEs (on this host) with
    /// `heap_size` bytes per PE be initialized, and would `specs`, allocated in order into its
    /// fresh heap, all fit with their alignments? Fails with the first problem (the spec is
    /// named by its index): alignment not a power of two or above [`MAX_ALIGNMENT`], an
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
            if !alignment.is_power_of_two() || alignment > MAX_ALIGNMENT {
                return Err(invalid(format!(
                    "target {index}: alignment {alignment} must be a power of two no larger \
                     than {MAX_ALIGNMENT} (or None for the default {DEFAULT_ALIGNMENT})"
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

fn introduce(heap_size: u64) -> Result<Introduction> {
    let host = host_identity();
    Ok(Introduction {
        heap_size,
        host,
        uid: rustix::process::getuid().as_raw(),
        pid: std::process::id(),
    })
}

/// This host's identity: its boot ID (distinct per machine and boot) and name.
fn host_identity() -> String {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let name = rustix::system::uname();
    format!("{}@{}", name.nodename().to_string_lossy(), boot.trim())
}

/// The checks every rank makes on the same introductions, so all reach the same verdict.
fn check_introductions(all: &[Introduction], rank: usize) -> Result<Layout> {
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
    let hosts: Vec<&str> = all.iter().map(|i| i.host.as_str()).collect();
    if hosts.iter().any(|h| *h != hosts[0]) {
        return Err(fail(
            ErrorKind::Unsupported,
            format!(
                "multi-node is not supported yet: the root spans several hosts ({}); run every \
                 PE of a root on one host",
                group_by_value(&hosts)
            ),
        ));
    }
    if all.iter().any(|i| i.uid != all[0].uid) {
        return Err(fail(
            ErrorKind::Unsupported,
            "the PEs of a root run as different users; the heap is only shared between \
             processes of one user"
                .into(),
        ));
    }
    heap_fits(all.len(), sizes[0], OP).map_err(|e| e.on_rank(rank))
}

/// The segment layout for `pes` heaps of `heap_size` bytes on this host, or an error if it does
/// not fit this process's address space or the PEs' heaps together exceed this host's memory.
/// Initialize checks it; a restart checks it in Preflight, before anything is torn down.
pub(crate) fn heap_fits(pes: usize, heap_size: u64, operation: &str) -> Result<Layout> {
    let layout = Layout::new(pes, heap_size)
        .map_err(|e| Error::new(e.kind(), operation, e.message().to_string()))?;
    if let Some(memory) = host_memory_bytes() {
        let wanted = heap_size.saturating_mul(pes as u64);
        if wanted > memory {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                operation,
                format!(
                    "{pes} PEs × {heap_size} heap bytes = {wanted} bytes exceed this host's \
                     {memory} bytes of memory; choose a smaller heap size"
                ),
            ));
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

/// Root rank 0 creates the segment and hands it to every PE; each maps and checks it.
fn share_segment(
    plane: &ControlPlane,
    id: &UniqueId,
    layout: Layout,
    pids: &[u32],
    timeout: std::time::Duration,
) -> Result<Segment> {
    const OP: &str = "initialize";
    let rank = plane.rank();
    let deadline = Instant::now() + timeout;
    let created = if rank == 0 {
        let generation = fresh_generation()?;
        Segment::create(layout, generation).and_then(|(segment, fd)| {
            let listener =
                handoff::HandoffListener::bind(&handoff::socket_name(id.secret(), generation))?;
            Ok((generation, Some((segment, fd, listener))))
        })
    } else {
        Ok((0, None))
    };
    let (local_created, root_parts) = match created {
        Ok((generation, parts)) => (Ok(generation), parts),
        Err(error) => (Err(error.on_rank(rank)), None),
    };
    let generations = converge(plane, OP, local_created)?;
    let generation = generations[0];
    let attached = match root_parts {
        Some((segment, fd, listener)) => {
            let still_alive = || plane.broken().map_or(Ok(()), Err);
            listener
                .serve(
                    std::os::fd::AsFd::as_fd(&fd),
                    &pids[1..],
                    deadline,
                    still_alive,
                )
                .map(|()| segment)
        }
        None => handoff::receive(
            &handoff::socket_name(id.secret(), generation),
            pids[0],
            deadline,
        )
        .and_then(|fd| Segment::attach(&fd, layout, generation)),
    };
    let (local, segment) = match attached {
        Ok(segment) => (Ok(()), Some(segment)),
        Err(error) => (Err(error.on_rank(rank)), None),
    };
    converge(plane, OP, local)?;
    Ok(segment.expect("every rank attached"))
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
