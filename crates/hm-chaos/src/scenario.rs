//! What a PE is asked to do ([`Scenario`], passed as JSON on its command line) and what it
//! reports back ([`Record`], one JSON line each on stdout).

use serde::{Deserialize, Serialize};

/// Heap bytes per PE in every job (small: the suite tests failures, not capacity).
pub const HEAP: u64 = 4 << 20;

/// The lifecycle operations with fault points.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Operation {
    /// A first `acquire`.
    Acquire,
    /// The last `release`.
    Release,
    /// A `restart` with one allocation replaced.
    Restart,
    /// A shared root's heap growth (three consumers, one growable buffer, data preserved).
    Grow,
}

impl Operation {
    /// The name used in `HYPER_MULTICORE_TEST_FAULT`.
    pub fn name(self) -> &'static str {
        match self {
            Operation::Acquire => "acquire",
            Operation::Release => "release",
            Operation::Restart => "restart",
            Operation::Grow => "grow",
        }
    }
}

/// What happens to the victim rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// SIGKILL (the `abort` fault, or the PE killing itself at the point).
    Kill,
    /// The stage fails on the victim with a plain (retryable) failure.
    Retryable,
    /// The stage fails on the victim saying the runtime is unusable.
    Unavailable,
}

impl Action {
    /// The action's name in `HYPER_MULTICORE_TEST_FAULT`.
    pub fn fault_name(self) -> &'static str {
        match self {
            Action::Kill => "abort",
            Action::Retryable => "retryable",
            Action::Unavailable => "unavailable",
        }
    }

    /// Short name for reports.
    pub fn name(self) -> &'static str {
        match self {
            Action::Kill => "kill",
            Action::Retryable => "retryable",
            Action::Unavailable => "unavailable",
        }
    }
}

/// The root of the broadcast under test.
pub const BROADCAST_ROOT: usize = 0;

/// The blocking data-plane operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DataOp {
    /// `Shmem::barrier`.
    Barrier,
    /// `Shmem::wait_signal` on a word only the victim would set.
    WaitSignal,
    /// `Shmem::all_gather`.
    AllGather,
    /// `Shmem::broadcast` from [`BROADCAST_ROOT`].
    Broadcast,
    /// `Shmem::all_to_all`.
    AllToAll,
    /// `Shmem::all_reduce` (sum, in place).
    AllReduce,
    /// `Shmem::allocate` (a barrier inside its argument check).
    Allocate,
    /// `Shmem::free` (a barrier inside its argument check).
    Free,
}

impl DataOp {
    /// Every blocking data-plane operation.
    pub const ALL: [DataOp; 8] = [
        DataOp::Barrier,
        DataOp::WaitSignal,
        DataOp::AllGather,
        DataOp::Broadcast,
        DataOp::AllToAll,
        DataOp::AllReduce,
        DataOp::Allocate,
        DataOp::Free,
    ];

    /// The method's name.
    pub fn name(self) -> &'static str {
        match self {
            DataOp::Barrier => "barrier",
            DataOp::WaitSignal => "wait_signal",
            DataOp::AllGather => "all_gather",
            DataOp::Broadcast => "broadcast",
            DataOp::AllToAll => "all_to_all",
            DataOp::AllReduce => "all_reduce",
            DataOp::Allocate => "allocate",
            DataOp::Free => "free",
        }
    }
}

/// One job's instructions to its PEs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "scenario", rename_all = "snake_case")]
pub enum Scenario {
    /// A lifecycle operation with a fault at `stage` on root rank `victim`. `stage` is a
    /// [`hyper_multicore::lifecycle::Stage`] name, or `"Entry"`: the victim kills itself just
    /// before calling the operation (no library hook needed).
    Lifecycle {
        /// The operation.
        operation: Operation,
        /// The stage name.
        stage: String,
        /// The root rank that fails or dies.
        victim: usize,
        /// What happens to it.
        action: Action,
    },
    /// A data-plane operation whose peer `victim` kills itself just before calling it.
    DataPlane {
        /// The operation.
        op: DataOp,
        /// The PE that dies.
        victim: usize,
    },
    /// Cycles of acquire → allocate → restart → free → release.
    Soak {
        /// How many cycles.
        cycles: usize,
        /// Cycles before the first sample that counts (allocator and arena warm-up).
        warmup: usize,
        /// A sample every this many cycles.
        sample_every: usize,
    },
    /// A job whose rendezvous are attacked by strangers; see `abuse.rs`.
    Bootstrap,
    /// A job across namespace hosts, one of which the driver takes away (link cut, processes
    /// killed, host frozen); see `host_faults.rs`. Every PE puts to its right neighbour and
    /// passes a barrier until a call fails.
    HostFault,
}

/// One line a PE reports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Record {
    /// The PE is about to SIGKILL itself.
    Dying {
        /// When ([`crate::probe::monotonic_ns`]).
        t_ns: u64,
    },
    /// A call failed (what the suite expects of survivors).
    Failed {
        /// The call.
        call: String,
        /// `ErrorKind` name.
        kind: String,
        /// `Recovery` name, if the error has one.
        recovery: Option<String>,
        /// The stage the error names.
        stage: Option<String>,
        /// The peer the error names.
        peer: Option<usize>,
        /// The whole message.
        message: String,
        /// How long the call blocked, ms.
        wait_ms: f64,
        /// When it returned.
        t_ns: u64,
    },
    /// A call succeeded.
    Succeeded {
        /// The call.
        call: String,
    },
    /// A check after the failure (recovered, refused …).
    After {
        /// What was checked.
        what: String,
        /// Whether it held.
        ok: bool,
        /// Details.
        detail: String,
    },
    /// What this PE holds beyond its baseline (taken before `acquire`), once it has released or
    /// lost the runtime.
    Resources {
        /// The leaks.
        leaks: crate::probe::Leaks,
        /// Sockets among the leaked descriptors.
        sockets: usize,
        /// VmRSS, KiB.
        rss_kib: u64,
        /// VmHWM, KiB.
        hwm_kib: u64,
    },
    /// A soak sample.
    Sample {
        /// Cycles completed.
        cycle: usize,
        /// Open descriptors.
        fds: usize,
        /// Live threads.
        threads: usize,
        /// Runtime mappings (0 between lifetimes).
        runtime_maps: usize,
        /// VmRSS, KiB.
        rss_kib: u64,
        /// Mean cycle time since the previous sample, ms.
        cycle_ms: f64,
    },
    /// Something the driver needs from a PE (a unique ID, a phase reached …).
    Note {
        /// What.
        what: String,
        /// Its value.
        value: String,
    },
}
