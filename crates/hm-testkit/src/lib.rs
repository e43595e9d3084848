//! Multi-process tests for hyper_multicore: a test re-executes its own binary once per PE
//! (ipc-channel's pattern), with the same environment `hmrun` gives, and a watchdog so a broken
//! runtime fails the test instead of hanging CI.
//!
//! ```no_run
//! use hm_testkit::{is_pe, Job};
//! #[test]
//! fn barrier_on_four_pes() {
//!     if is_pe() {
//!         let world = hyper_multicore::world::World::from_env().unwrap();
//!         world.control().barrier().unwrap();
//!         return;
//!     }
//!     Job::launch("barrier_on_four_pes", 4).wait().assert_all_succeeded();
//! }
//! ```

pub mod namespace_hosts;

use std::collections::HashSet;
use std::io::Read;
use std::process::ExitStatus;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use hyper_multicore::config::{Config, TIMEOUT_SEC};
use hyper_multicore::launch::{JobPlan, PeChild, PeStdio};
use hyper_multicore::shmem::{AllocationSpec, Dtype};
use hyper_multicore::world::World;
use rustix::process::{kill_process, Pid, Signal};

/// Set in the environment of every PE a test launches.
pub const PE_VARIABLE: &str = "HM_TEST_PE";

/// Longest a whole job may run before the watchdog kills it and fails the test.
pub const WATCHDOG: Duration = Duration::from_secs(150);

/// Runtime timeout given to PEs unless the test sets its own (keeps failures quick).
pub const PE_TIMEOUT_SEC: &str = "30";

/// True inside a PE launched by [`Job::launch`].
pub fn is_pe() -> bool {
    std::env::var_os(PE_VARIABLE).is_some()
}

/// Counts this process's open file descriptors.
pub fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Counts this process's mappings of hyper_multicore heap segments.
pub fn heap_mappings() -> usize {
    heap_segment_inodes().len()
}

/// The inode of each of this process's mappings of hyper_multicore heap segments (one memfd
/// keeps its inode for its whole life: a heap grown in place keeps it).
pub fn heap_segment_inodes() -> Vec<u64> {
    std::fs::read_to_string("/proc/self/maps")
        .map(|maps| {
            maps.lines()
                .filter(|l| l.contains("hyper_multicore-heap"))
                .filter_map(|l| l.split_whitespace().nth(4)?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Waits (yielding, up to 10 s) until every thread of process `pid` is stopped: SIGSTOP takes
/// effect thread by thread, after `kill` returned. Panics after 10 s.
pub fn wait_until_stopped(pid: i32) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let state = |stat: String| {
        stat.rsplit(')')
            .next()
            .and_then(|rest| rest.trim().chars().next())
    };
    loop {
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).unwrap();
        let stopped = tasks.flatten().all(|task| {
            let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
            matches!(state(stat), Some('T' | 't'))
        });
        if stopped {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "process {pid} did not stop"
        );
        std::thread::yield_now();
    }
}

/// Joins the world from the environment and initializes a runtime over all of it with
/// `heap_size` bytes per PE: root rank 0 creates the unique ID, the world's control plane
/// carries it to the others.
pub fn start_runtime(
    heap_size: Option<u64>,
) -> hyper_multicore::Result<(World, hyper_multicore::shmem::Shmem)> {
    let world = World::from_env()?;
    let shmem = initialize_over(&world, heap_size)?;
    Ok((world, shmem))
}

/// Initializes a runtime over every rank of `world` (a collective call), configured from the
/// environment.
pub fn initialize_over(
    world: &World,
    heap_size: Option<u64>,
) -> hyper_multicore::Result<hyper_multicore::shmem::Shmem> {
    hyper_multicore::shmem::Shmem::initialize_over(world, Config::from_env()?, heap_size)
}

/// Counts this process's threads.
pub fn thread_count() -> usize {
    std::fs::read_dir("/proc/self/task")
        .map(|d| d.count())
        .unwrap_or(0)
}

/// [`thread_count`] once it is down to `expected`, or after 5 s: a joined thread stays listed
/// for a moment after `join` returned (the kernel wakes the joiner before it releases the
/// task), longer on a busy machine — a leak check that counts at once sees it now and then.
pub fn thread_count_settled(expected: usize) -> usize {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let count = thread_count();
        if count <= expected || std::time::Instant::now() >= deadline {
            return count;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// This process's resident memory (`VmRSS`), KiB.
pub fn resident_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
            line.split_whitespace().nth(1)?.parse().ok()
        })
        .expect("VmRSS in /proc/self/status")
}

/// How to launch a job.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Extra environment for every PE.
    pub env: Vec<(String, String)>,
    /// Extra environment for one PE: (rank, name, value).
    pub rank_env: Vec<(usize, String, String)>,
    /// Ranks not to start at all (to test members that never arrive).
    pub absent: Vec<usize>,
}

impl Options {
    /// Adds a variable for every PE.
    pub fn env(mut self, name: &str, value: impl ToString) -> Self {
        self.env.push((name.to_string(), value.to_string()));
        self
    }

    /// Adds a variable for PE `rank` only.
    pub fn rank_env(mut self, rank: usize, name: &str, value: impl ToString) -> Self {
        self.rank_env
            .push((rank, name.to_string(), value.to_string()));
        self
    }

    /// Does not start PE `rank`.
    pub fn absent(mut self, rank: usize) -> Self {
        self.absent.push(rank);
        self
    }
}

/// A running job of PEs.
#[derive(Debug)]
pub struct Job {
    test: String,
    pids: Vec<Option<Pid>>,
    exits: mpsc::Receiver<(usize, ExitStatus)>,
    waiters: Vec<JoinHandle<()>>,
    outputs: Vec<Option<(JoinHandle<String>, JoinHandle<String>)>>,
}

/// What one PE did.
#[derive(Debug)]
pub struct PeResult {
    /// Its rank.
    pub rank: usize,
    /// How it ended.
    pub status: ExitStatus,
    /// Everything it wrote to stdout.
    pub stdout: String,
    /// Everything it wrote to stderr.
    pub stderr: String,
}

impl PeResult {
    /// The lines of stdout that start with `prefix`, with the prefix removed.
    pub fn lines_with(&self, prefix: &str) -> Vec<String> {
        self.stdout
            .lines()
            .filter_map(|l| l.strip_prefix(prefix).map(str::to_string))
            .collect()
    }
}

/// One mebibyte: the unit the lifecycle tests size heaps in.
pub const MIB: u64 = 1 << 20;

/// Prints `error` on one line for the parent process to read: `{label} {kind:?} {recovery:?} |
/// {error}` (a PE's verdict on a failed lifecycle call).
pub fn print_error(label: &str, error: &hyper_multicore::Error) {
    println!(
        "{label} {:?} {:?} | {error}",
        error.kind(),
        error.recovery()
    );
}

/// What to allocate for `shape` bytes (`u8` elements, the default alignment).
pub fn u8_spec(shape: Vec<usize>) -> AllocationSpec {
    AllocationSpec {
        shape,
        dtype: Dtype::U8,
        alignment: None,
    }
}

/// The results of a whole job, by rank (absent ranks are missing).
#[derive(Debug)]
pub struct JobResult {
    /// Per-PE results, in rank order.
    pub pes: Vec<PeResult>,
}

impl JobResult {
    /// Panics with every PE's output unless all exited successfully.
    pub fn assert_all_succeeded(&self) -> &Self {
        let failed: Vec<&PeResult> = self.pes.iter().filter(|p| !p.status.success()).collect();
        assert!(failed.is_empty(), "PEs failed:\n{}", self.describe());
        self
    }

    /// Panics unless every PE ran exactly one test, the one named `test`: a child started with
    /// a name that matches no test (or an `#[ignore]`d one) runs nothing and exits 0, which would
    /// let a job pass vacuously. libtest announces `running N tests` before the test starts (a line on a pipe,
    /// so it is out even when the PE is killed afterwards).
    fn assert_each_ran(&self, test: &str) {
        let idle: Vec<String> = self
            .pes
            .iter()
            .filter(|p| {
                // An `#[ignore]`d test is announced too, but then not run.
                !p.stdout.lines().any(|l| l.trim() == "running 1 test")
                    || p.stdout.contains(" 1 ignored;")
            })
            .map(|p| {
                let announced = p
                    .stdout
                    .lines()
                    .find(|l| l.starts_with("running "))
                    .unwrap_or("no test run announced");
                format!("rank {} ({announced})", p.rank)
            })
            .collect();
        assert!(
            idle.is_empty(),
            "PEs ran no test named {test:?} (or more than one): {}; name the child test by the \
             test function itself (stringify!) so it cannot drift\n{}",
            idle.join(", "),
            self.describe()
        );
    }

    /// The PEs that a fault point did not kill (every rank but `killed`), each asserted to have
    /// exited successfully and printed `RECOVERY Some(ConvergenceFailure)`: what every survivor
    /// of a rank killed during a converged stage must conclude. `fault` names the case in a
    /// failure's message.
    pub fn survivors_of(&self, killed: usize, fault: &str) -> Vec<&PeResult> {
        let survivors: Vec<&PeResult> = self.pes.iter().filter(|p| p.rank != killed).collect();
        for pe in &survivors {
            assert!(pe.status.success(), "{fault}\n{}", self.describe());
            assert_eq!(
                pe.lines_with("RECOVERY "),
                ["Some(ConvergenceFailure)"],
                "{fault}\n{}",
                self.describe()
            );
        }
        survivors
    }

    /// The result of PE `rank`.
    pub fn pe(&self, rank: usize) -> &PeResult {
        self.pes
            .iter()
            .find(|p| p.rank == rank)
            .expect("no such PE")
    }

    /// Every PE's status and output, for failure messages.
    pub fn describe(&self) -> String {
        self.pes
            .iter()
            .map(|p| {
                format!(
                    "--- rank {} ({}) ---\nstdout:\n{}\nstderr:\n{}",
                    p.rank, p.status, p.stdout, p.stderr
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Job {
    /// Launches `size` PEs, each running the test named `test` of the current test binary.
    pub fn launch(test: &str, size: usize) -> Job {
        Job::launch_with(test, size, Options::default())
    }

    /// [`Job::launch`] with options.
    pub fn launch_with(test: &str, size: usize, options: Options) -> Job {
        let plan = JobPlan::new(size, &Config::default()).expect("plan the job");
        Job::launch_plan(test, &plan, options)
    }

    /// Launches the PEs of an existing plan (so the test can use its endpoint first).
    pub fn launch_plan(test: &str, plan: &JobPlan, options: Options) -> Job {
        let program = std::env::current_exe().expect("find the test binary");
        let (sender, exits) = mpsc::channel();
        let absent: HashSet<usize> = options.absent.iter().copied().collect();
        let mut job = Job {
            test: test.to_string(),
            pids: Vec::new(),
            exits,
            waiters: Vec::new(),
            outputs: Vec::new(),
        };
        for rank in 0..plan.size() {
            if absent.contains(&rank) {
                job.pids.push(None);
                job.outputs.push(None);
                continue;
            }
            let mut command = plan.command(rank, &program);
            command
                .args([test, "--exact", "--nocapture", "--test-threads=1", "-q"])
                .env(PE_VARIABLE, "1")
                .env(TIMEOUT_SEC, PE_TIMEOUT_SEC)
                .envs(options.env.iter().map(|(n, v)| (n, v)))
                .envs(
                    options
                        .rank_env
                        .iter()
                        .filter(|(r, _, _)| *r == rank)
                        .map(|(_, n, v)| (n, v)),
                )
                .stdin(PeStdio::Null)
                .stdout(PeStdio::Piped)
                .stderr(PeStdio::Piped);
            let mut child: PeChild = command.spawn().expect("spawn a PE");
            job.pids.push(Some(child.pid()));
            let stdout = child.stdout.take().expect("piped");
            let stderr = child.stderr.take().expect("piped");
            job.outputs.push(Some((collect(stdout), collect(stderr))));
            let sender = sender.clone();
            job.waiters.push(std::thread::spawn(move || {
                let status = child.wait().expect("wait for a PE");
                let _ = sender.send((rank, status));
            }));
        }
        job
    }

    /// The process ID of PE `rank`.
    pub fn pid(&self, rank: usize) -> Pid {
        self.pids[rank].expect("the PE was started")
    }

    /// Sends SIGKILL to PE `rank`.
    pub fn kill(&self, rank: usize) {
        let _ = kill_process(self.pid(rank), Signal::KILL);
    }

    /// Waits for every PE; the watchdog kills the job and panics after [`WATCHDOG`].
    pub fn wait(mut self) -> JobResult {
        let deadline = Instant::now() + WATCHDOG;
        let started = self.pids.iter().flatten().count();
        let mut statuses: Vec<Option<ExitStatus>> = vec![None; self.pids.len()];
        for _ in 0..started {
            let remaining = deadline.saturating_duration_since(Instant::now());
            match self.exits.recv_timeout(remaining) {
                Ok((rank, status)) => statuses[rank] = Some(status),
                Err(_) => {
                    self.kill_all();
                    panic!(
                        "watchdog: job {:?} still running after {WATCHDOG:?}; killed it",
                        self.test
                    );
                }
            }
        }
        for waiter in self.waiters.drain(..) {
            let _ = waiter.join();
        }
        let mut pes = Vec::new();
        for (rank, output) in self.outputs.drain(..).enumerate() {
            if let Some((stdout, stderr)) = output {
                pes.push(PeResult {
                    rank,
                    status: statuses[rank].expect("every started PE exited"),
                    stdout: stdout.join().unwrap_or_default(),
                    stderr: stderr.join().unwrap_or_default(),
                });
            }
        }
        let result = JobResult { pes };
        result.assert_each_ran(&self.test);
        result
    }

    fn kill_all(&self) {
        for pid in self.pids.iter().flatten() {
            let _ = kill_process(*pid, Signal::KILL);
        }
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        // A panicking test must not leave PEs behind.
        if !self.waiters.is_empty() {
            self.kill_all();
        }
    }
}

fn collect(mut source: impl Read + Send + 'static) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = source.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    })
}
