//! What a process holds, read from `/proc/self`: open descriptors (with what they point at),
//! live threads, mappings of runtime memory, and memory use — and the monotonic clock every
//! process of the machine shares, for timestamps that compare across processes.
//!
//! A PE takes a [`Snapshot`] before its first `acquire` and another after it has released (or
//! lost) the runtime; [`Snapshot::leaks_since`] lists what the second holds beyond the first.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// Nanoseconds on `CLOCK_MONOTONIC`, which every process of the machine reads alike.
pub fn monotonic_ns() -> u64 {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

/// What this process holds at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// Open descriptors: number → what `/proc/self/fd/N` links to.
    pub fds: BTreeMap<i32, String>,
    /// Thread IDs of live (not exiting) threads.
    pub threads: BTreeSet<u32>,
    /// Mappings of runtime memory (heap segments, memfds, `/dev/shm` files), as maps lines.
    pub runtime_maps: Vec<String>,
    /// Resident set size, KiB.
    pub rss_kib: u64,
    /// Peak resident set size, KiB.
    pub hwm_kib: u64,
}

/// What a process holds beyond an earlier snapshot.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Leaks {
    /// Descriptors open now that were not then (`fd -> target`).
    pub fds: Vec<String>,
    /// Threads alive now that were not then.
    pub threads: usize,
    /// Runtime memory mapped now that was not then.
    pub maps: Vec<String>,
}

impl Leaks {
    /// True if nothing leaked.
    pub fn is_empty(&self) -> bool {
        self.fds.is_empty() && self.threads == 0 && self.maps.is_empty()
    }

    /// Sockets among the leaked descriptors.
    pub fn sockets(&self) -> usize {
        self.fds.iter().filter(|f| f.contains("socket:")).count()
    }
}

impl Snapshot {
    /// Reads `/proc/self`.
    pub fn take() -> Snapshot {
        let (rss_kib, hwm_kib) = memory_kib();
        Snapshot {
            fds: open_fds(),
            threads: live_threads(),
            runtime_maps: runtime_maps(),
            rss_kib,
            hwm_kib,
        }
    }

    /// What `self` (later) holds that `baseline` did not.
    pub fn leaks_since(&self, baseline: &Snapshot) -> Leaks {
        Leaks {
            fds: self
                .fds
                .iter()
                .filter(|(fd, target)| baseline.fds.get(fd) != Some(*target))
                .map(|(fd, target)| format!("{fd} -> {target}"))
                .collect(),
            threads: self.threads.difference(&baseline.threads).count(),
            maps: self
                .runtime_maps
                .iter()
                .filter(|line| !baseline.runtime_maps.contains(line))
                .cloned()
                .collect(),
        }
    }
}

/// Open descriptors and their targets, without the one `read_dir` itself holds.
fn open_fds() -> BTreeMap<i32, String> {
    let Ok(entries) = std::fs::read_dir("/proc/self/fd") else {
        return BTreeMap::new();
    };
    let mut fds = BTreeMap::new();
    for entry in entries.flatten() {
        let Some(fd) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        // A descriptor closed since the listing has no link any more: it is not held.
        let Ok(target) = std::fs::read_link(entry.path()) else {
            continue;
        };
        let target = target.to_string_lossy().into_owned();
        if target.starts_with("/proc/") && target.ends_with("/fd") {
            continue; // the directory being listed
        }
        fds.insert(fd, target);
    }
    fds
}

/// Threads of this process that are alive. A thread that was joined may stay listed for a
/// moment while the kernel releases it; it is then in state `X` or `Z` and is not counted.
fn live_threads() -> BTreeSet<u32> {
    let Ok(entries) = std::fs::read_dir("/proc/self/task") else {
        return BTreeSet::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let tid = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            // "tid (comm) S …": the state follows the last ')'.
            let state = stat.rsplit_once(')')?.1.trim_start().chars().next()?;
            (state != 'X' && state != 'Z').then_some(tid)
        })
        .collect()
}

/// Lines of `/proc/self/maps` that map runtime memory.
fn runtime_maps() -> Vec<String> {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("hyper_multicore") || l.contains("memfd:") || l.contains("/dev/shm"))
        .map(str::to_string)
        .collect()
}

/// `VmRSS` and `VmHWM` of `/proc/<pid>/status` (`self` for this process), in KiB.
fn memory_kib_of(pid: &str) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

fn memory_kib() -> (u64, u64) {
    memory_kib_of("self")
}
