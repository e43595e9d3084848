//! Running a job of PEs of this very binary and collecting the JSON lines they print.
//!
//! The driver plans the job with [`JobPlan`] (the environment `hmrun` would give), starts each
//! PE as `hm-bench <pe-subcommand> …`, and reads every PE's stdout on a thread of its own that
//! timestamps each line as it arrives. The driver waits on one channel with a deadline: the job
//! is killed when it outlives [`WATCHDOG`] (or the watchdog given to [`run_job_within`]), and a
//! PE that fails ends the run with its stderr. PEs report with [`emit`].
//!
//! ```ignore
//! // Driver side:
//! let job = launch::run_job(4, &["pe-control", "--rendezvous-only"])?;
//! for (rank, at, message) in job.messages::<PeMessage>()? { /* … */ }
//! // PE side:
//! launch::emit(&PeMessage::Ready { rank, from_env_ns })?;
//! ```

use std::io::{BufRead, BufReader, Read, Write};
use std::process::ExitStatus;
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use hyper_multicore::config::{Config, TIMEOUT_SEC};
use hyper_multicore::launch::{JobPlan, PeChild, PeStdio};
use rustix::process::{kill_process, Pid, Signal};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// Longest a whole job may run before the driver kills it.
pub const WATCHDOG: Duration = Duration::from_secs(120);

/// The runtime's own deadline given to PEs unless the caller set [`TIMEOUT_SEC`]: shorter than
/// [`WATCHDOG`], so a stuck collective fails with the runtime's error naming the missing ranks
/// before the watchdog has to kill anything.
const PE_TIMEOUT_SEC: &str = "60";

/// Prints one JSON line on stdout and flushes it, so the driver timestamps it on arrival.
pub fn emit(message: &impl Serialize) -> Result<()> {
    let line = serde_json::to_string(message).context("serialize a PE report")?;
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{line}")
        .and_then(|()| stdout.flush())
        .context("write a PE report to stdout")
}

/// One line a PE printed, and when the driver read it.
#[derive(Debug)]
pub struct TimedLine {
    /// When the driver's reader thread received the line.
    pub at: Instant,
    /// The line, without its newline.
    pub text: String,
}

/// What a successful job printed.
#[derive(Debug)]
pub struct JobOutput {
    /// Just before the first PE was spawned.
    pub started: Instant,
    /// Just after the last PE was spawned.
    pub spawned: Instant,
    /// Each PE's stdout lines, indexed by rank.
    pub lines: Vec<Vec<TimedLine>>,
}

impl JobOutput {
    /// Every line of every PE parsed as a `T`, as (rank, arrival, message), in rank order.
    pub fn messages<T: DeserializeOwned>(&self) -> Result<Vec<(usize, Instant, T)>> {
        let mut messages = Vec::new();
        for (rank, lines) in self.lines.iter().enumerate() {
            for line in lines {
                let message = serde_json::from_str(&line.text).with_context(|| {
                    format!("PE {rank} printed an unexpected line: {:?}", line.text)
                })?;
                messages.push((rank, line.at, message));
            }
        }
        Ok(messages)
    }
}

/// What the reader threads tell the driver.
enum Event {
    /// PE `rank` printed a line.
    Line {
        /// The PE's rank.
        rank: usize,
        /// The line.
        line: TimedLine,
    },
    /// PE `rank` closed its stdout and exited (or could not be waited for).
    Exited {
        /// The PE's rank.
        rank: usize,
        /// How it ended.
        status: std::io::Result<ExitStatus>,
    },
}

/// Launches `size` PEs running this binary with `args`, waits for all of them (at most
/// [`WATCHDOG`]) and returns their output; fails with a PE's stderr if any PE fails.
pub fn run_job(size: usize, args: &[&str]) -> Result<JobOutput> {
    run_job_within(size, args, WATCHDOG)
}

/// [`run_job`] with a watchdog of its own: the job is killed once it has run for `watchdog`.
pub fn run_job_within(size: usize, args: &[&str], watchdog: Duration) -> Result<JobOutput> {
    let config = Config::from_env().context("read the runtime configuration")?;
    let plan = JobPlan::new(size, &config).context("plan the job")?;
    let program = std::env::current_exe().context("find the hm-bench binary")?;
    let (sender, events) = mpsc::channel();
    let mut job = RunningJob::default();
    let started = Instant::now();
    // Every PE is spawned before any thread reads one (as hmrun does), so the spawns do not
    // compete for the cores with the readers of the PEs already started.
    let mut children = Vec::with_capacity(size);
    for rank in 0..size {
        let mut command = plan.command(rank, &program);
        command
            .args(args)
            .stdin(PeStdio::Null)
            .stdout(PeStdio::Piped)
            .stderr(PeStdio::Piped);
        if std::env::var_os(TIMEOUT_SEC).is_none() {
            command.env(TIMEOUT_SEC, PE_TIMEOUT_SEC);
        }
        let child = command
            .spawn()
            .with_context(|| format!("spawn PE {rank} of {size} ({})", program.display()))?;
        // Recorded at once: dropping `job` on a later failure kills it.
        job.pids.push(Some(child.pid()));
        children.push(child);
    }
    let spawned = Instant::now();
    for (rank, child) in children.into_iter().enumerate() {
        job.adopt(rank, child, sender.clone());
    }
    // The PEs hold what they need; rank 0 has its own copy of the world listener.
    drop(plan);
    drop(sender);
    let lines = job.wait(size, started, watchdog, events)?;
    Ok(JobOutput {
        started,
        spawned,
        lines,
    })
}

/// The PEs of a job being run; dropping it kills those not known to have exited.
#[derive(Default)]
struct RunningJob {
    /// Process IDs by rank; `None` once the PE has exited.
    pids: Vec<Option<Pid>>,
    /// Threads collecting each PE's stderr, by rank.
    stderr: Vec<Option<JoinHandle<String>>>,
    /// Threads reading each PE's stdout and then waiting for it.
    readers: Vec<JoinHandle<()>>,
}

impl RunningJob {
    /// Starts the threads that read PE `rank`'s output and report its exit on `events` (its pid
    /// is already recorded).
    fn adopt(&mut self, rank: usize, mut child: PeChild, events: Sender<Event>) {
        let stderr = child.stderr.take().expect("stderr is piped");
        self.stderr.push(Some(std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = BufReader::new(stderr).read_to_end(&mut bytes);
            String::from_utf8_lossy(&bytes).into_owned()
        })));
        let stdout = child.stdout.take().expect("stdout is piped");
        self.readers.push(std::thread::spawn(move || {
            let mut stdout = BufReader::new(stdout);
            let mut bytes = Vec::new();
            while matches!(stdout.read_until(b'\n', &mut bytes), Ok(n) if n > 0) {
                let at = Instant::now();
                let text = String::from_utf8_lossy(&bytes).trim_end().to_string();
                bytes.clear();
                if events
                    .send(Event::Line {
                        rank,
                        line: TimedLine { at, text },
                    })
                    .is_err()
                {
                    break;
                }
            }
            let _ = events.send(Event::Exited {
                rank,
                status: child.wait(),
            });
        }));
    }

    /// Collects each PE's lines until every PE has exited, the first failure, or the watchdog
    /// (`watchdog` after `started`).
    fn wait(
        mut self,
        size: usize,
        started: Instant,
        watchdog: Duration,
        events: mpsc::Receiver<Event>,
    ) -> Result<Vec<Vec<TimedLine>>> {
        let deadline = started + watchdog;
        let mut lines: Vec<Vec<TimedLine>> = (0..size).map(|_| Vec::new()).collect();
        while self.pids.iter().any(Option::is_some) {
            let remaining = deadline.saturating_duration_since(Instant::now());
            match events.recv_timeout(remaining) {
                Ok(Event::Line { rank, line }) => lines[rank].push(line),
                Ok(Event::Exited { rank, status }) => {
                    self.pids[rank] = None;
                    let status = status.with_context(|| format!("wait for PE {rank}"))?;
                    if !status.success() {
                        self.kill_all();
                        let stderr = self.stderr_of(rank);
                        bail!(
                            "PE {rank} of {size} failed ({status}); the job was stopped. \
                             Its stderr:\n{stderr}"
                        );
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    let stuck: Vec<usize> = (0..size).filter(|&r| self.pids[r].is_some()).collect();
                    self.kill_all();
                    bail!(
                        "watchdog: PEs {stuck:?} of a job of {size} still ran after \
                         {watchdog:?}; killed the job"
                    );
                }
                Err(RecvTimeoutError::Disconnected) => {
                    bail!("the PE reader threads stopped before every PE exited")
                }
            }
        }
        for reader in self.readers.drain(..) {
            reader
                .join()
                .map_err(|_| anyhow!("a PE reader thread panicked"))?;
        }
        for rank in 0..size {
            let stderr = self.stderr_of(rank);
            for line in stderr.lines() {
                eprintln!("[pe {rank}/{size}] {line}");
            }
        }
        Ok(lines)
    }

    /// Everything PE `rank` wrote to stderr (it has exited, so its pipe is closed).
    fn stderr_of(&mut self, rank: usize) -> String {
        self.stderr[rank]
            .take()
            .map(|collector| collector.join().unwrap_or_default())
            .unwrap_or_default()
    }

    /// Sends SIGKILL to every PE not known to have exited.
    fn kill_all(&mut self) {
        for pid in self.pids.iter_mut().filter_map(Option::take) {
            let _ = kill_process(pid, Signal::KILL);
        }
    }
}

impl Drop for RunningJob {
    fn drop(&mut self) {
        // An error on the way (a failed spawn, a failed wait) must not leave PEs behind.
        self.kill_all();
    }
}
