//! Running the ranks of one job: start them, watch them, stop them, reap them.
//!
//! Every wait blocks. The main thread owns the children and is the only one that signals or
//! reaps them; it sleeps in `recv_timeout` on one event channel, fed by
//!
//! - one *waiter* thread per rank, blocked in `waitid(WEXITED | WNOWAIT)`: it reports that the
//!   rank has exited *without* reaping it, so the main thread never signals a pid that may
//!   already belong to another process,
//! - the [`SignalRelay`], which reports SIGINT, SIGTERM and SIGHUP sent to hmrun.
//!
//! The channel's deadline is the `--timeout` while the job runs, then the end of the grace
//! period while it is being stopped. Stopping means SIGTERM, then SIGKILL `--grace` seconds
//! later; after hmrun has forwarded a signal, that signal stands for the SIGTERM. Output is
//! copied by the [`crate::output`] threads.
//!
//! Each rank runs in its own process group, so a signal reaches everything the rank started
//! (the shell of an `sh -c` script and its commands alike), and when a rank's main process has
//! ended, whatever it left running in its group is killed before it is reaped. The ranks die
//! with hmrun (`PR_SET_PDEATHSIG`, arranged by [`JobPlan`]); for that, they are spawned from the
//! main thread, which lives until hmrun exits.
//!
//! ```text
//! $ hmrun -n 4 sh -c '[ $RANK = 2 ] && exit 3; sleep 60'
//! hmrun: rank 2 exited with status 3; stopping the other 3 ranks
//! $ echo $?
//! 3
//! ```

use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use hyper_multicore::config::Config;
use hyper_multicore::launch::{JobPlan, NodePlacement, PeChild, PeStdio};
use rustix::io::Errno;
use rustix::process::{kill_process_group, waitid, Pid, Signal, WaitId, WaitIdOptions};
use signal_hook::low_level::signal_name;

use crate::output::{self, Destination};
use crate::signals::SignalRelay;

/// Exit code of hmrun when the job ran into its `--timeout` (as with `timeout(1)`).
pub const TIMEOUT_EXIT_CODE: u8 = 124;

/// What to run, how many times, and how to stop it.
#[derive(Debug)]
pub struct JobSpec {
    /// Number of ranks.
    pub processes: usize,
    /// The resolved program to execute.
    pub program: PathBuf,
    /// The program's name as the user gave it, passed as `argv[0]`.
    pub arg0: OsString,
    /// The arguments after the program.
    pub args: Vec<OsString>,
    /// Stop the job if it still runs after this long.
    pub timeout: Option<Duration>,
    /// Time between SIGTERM and SIGKILL when ranks are stopped.
    pub grace: Duration,
    /// Where this host's ranks sit when the job spans hosts (hmrun as a per-host agent).
    pub nodes: Option<NodePlacement>,
}

impl JobSpec {
    /// The world rank of this host's rank `local` (they differ only across hosts).
    fn world_rank(&self, local: usize) -> usize {
        self.nodes.as_ref().map_or(0, |n| n.node_rank) * self.processes + local
    }
}

/// Runs the job to its end and returns hmrun's exit code: 0 if every rank exited 0, else the
/// first failure's code (128 + signal number for a rank killed by a signal), or
/// [`TIMEOUT_EXIT_CODE`]. Every rank is reaped before this returns, also on error.
pub fn run(spec: &JobSpec, config: &Config) -> Result<u8> {
    let (events, inbox) = mpsc::channel();
    // Catch signals before the first rank starts, so none is lost during the start.
    let relay_events = events.clone();
    let relay = SignalRelay::start(move |signal| relay_events.send(Event::Signal(signal)).is_ok())
        .context("cannot install the signal handlers")?;
    let result = Job::start(spec, config, &events).and_then(|mut job| {
        let outcome = job.supervise(spec, &inbox);
        job.finish();
        outcome
    });
    relay.stop();
    result
}

/// What the main thread waits for.
#[derive(Debug)]
enum Event {
    /// The rank's process has exited and can be reaped without blocking.
    Exited(usize),
    /// hmrun received this signal.
    Signal(Signal),
}

/// Where the job is in its life.
#[derive(Debug, Clone, Copy)]
enum Phase {
    /// Every rank so far has succeeded; the deadline is the `--timeout`.
    Running,
    /// A rank failed or the timeout passed: hmrun will exit with `exit_code`, and the ranks
    /// still running get SIGKILL at `kill_at` (`None` once it has been sent).
    Stopping {
        exit_code: u8,
        kill_at: Option<Instant>,
    },
}

/// One started rank.
#[derive(Debug)]
struct Rank {
    /// The process, until it is reaped.
    child: Option<PeChild>,
    /// The rank's process group (its own pid).
    group: Pid,
}

/// The started ranks and the threads serving them.
#[derive(Debug)]
struct Job {
    ranks: Vec<Rank>,
    /// Output copiers and waiters; all end once every rank is reaped.
    threads: Vec<JoinHandle<()>>,
    /// Whether a signal of hmrun's has been forwarded to the ranks: they were asked to stop.
    asked_to_stop: bool,
}

impl Job {
    /// Starts every rank of `spec`. If one cannot be started, the ones already running are
    /// killed and reaped, and the error names the rank.
    fn start(spec: &JobSpec, config: &Config, events: &Sender<Event>) -> Result<Job> {
        let plan = match &spec.nodes {
            None => JobPlan::new(spec.processes, config),
            Some(nodes) => JobPlan::across_nodes(spec.processes, nodes.clone(), config),
        }
        .context("cannot plan the job")?;
        let mut job = Job {
            ranks: Vec::with_capacity(spec.processes),
            threads: Vec::with_capacity(3 * spec.processes),
            asked_to_stop: false,
        };
        // Every rank is spawned before any thread serves one, so the spawns (each holds this
        // thread until its rank executes the program) do not compete for the cores with three
        // threads per rank already started.
        let started = (0..spec.processes)
            .try_for_each(|rank| job.spawn_rank(&plan, rank, spec).map_err(|e| (rank, e)))
            .and_then(|()| {
                (0..spec.processes)
                    .try_for_each(|rank| job.serve_rank(rank, spec, events).map_err(|e| (rank, e)))
            });
        if let Err((rank, err)) = started {
            let started = job.ranks.len();
            job.finish();
            let mut context = format!(
                "cannot start rank {} of {} ('{}')",
                spec.world_rank(rank),
                plan.world_size(),
                spec.program.display()
            );
            if started > 0 {
                context += &format!("; killed the {} already started", ranks(started));
            }
            return Err(err.context(context));
        }
        // `plan` drops here, closing hmrun's copy of rank 0's listener.
        Ok(job)
    }

    /// Spawns rank `rank` (its output piped, to be served by [`Job::serve_rank`]).
    fn spawn_rank(&mut self, plan: &JobPlan, rank: usize, spec: &JobSpec) -> Result<()> {
        let mut command = plan.command(rank, &spec.program);
        command
            .arg0(&spec.arg0)
            .args(&spec.args)
            .process_group(true)
            .stdin(PeStdio::Null)
            .stdout(PeStdio::Piped)
            .stderr(PeStdio::Piped);
        let child = command.spawn()?;
        let group = child.pid();
        // Recorded before anything else can fail, so `finish` cleans it up.
        self.ranks.push(Rank {
            child: Some(child),
            group,
        });
        Ok(())
    }

    /// Starts rank `rank`'s output copiers and its waiter.
    fn serve_rank(&mut self, rank: usize, spec: &JobSpec, events: &Sender<Event>) -> Result<()> {
        let entry = &mut self.ranks[rank];
        let group = entry.group;
        let child = entry
            .child
            .as_mut()
            .expect("a rank being served is not reaped yet");
        let stdout = child.stdout.take().expect("stdout is piped");
        let stderr = child.stderr.take().expect("stderr is piped");
        let label = spec.world_rank(rank);
        self.threads
            .push(output::spawn_prefixer(label, stdout, Destination::Stdout)?);
        self.threads
            .push(output::spawn_prefixer(label, stderr, Destination::Stderr)?);
        let events = events.clone();
        let waiter = thread::Builder::new()
            .name(format!("rank {rank} waiter"))
            .spawn(move || {
                wait_until_exited(group);
                // The receiver is gone only when hmrun is cleaning up after an error.
                let _ = events.send(Event::Exited(rank));
            })?;
        self.threads.push(waiter);
        Ok(())
    }

    /// Waits for every rank to end, forwarding signals, enforcing the timeout and stopping the
    /// others after the first failure; returns hmrun's exit code.
    fn supervise(&mut self, spec: &JobSpec, inbox: &Receiver<Event>) -> Result<u8> {
        // `checked_add` fails only for absurd durations, which then never expire.
        let timeout_at = spec
            .timeout
            .and_then(|timeout| Instant::now().checked_add(timeout));
        let mut phase = Phase::Running;
        while self.running() > 0 {
            let deadline = match phase {
                Phase::Running => timeout_at,
                Phase::Stopping { kill_at, .. } => kill_at,
            };
            let event = match deadline {
                None => Some(inbox.recv().context("the rank waiters are gone")?),
                Some(at) => {
                    match inbox.recv_timeout(at.saturating_duration_since(Instant::now())) {
                        Ok(event) => Some(event),
                        Err(RecvTimeoutError::Timeout) => None,
                        Err(RecvTimeoutError::Disconnected) => {
                            anyhow::bail!("the rank waiters are gone")
                        }
                    }
                }
            };
            match (event, &phase) {
                (Some(Event::Exited(rank)), _) => {
                    let status = self.reap(rank)?;
                    if let (Phase::Running, Some(code)) = (&phase, failure_code(status)) {
                        let others = stopping_the_others(self.running());
                        phase = self.stop(code, spec.grace);
                        let rank = spec.world_rank(rank);
                        eprintln!("hmrun: rank {rank} {}{others}", describe(status));
                    }
                }
                (Some(Event::Signal(signal)), _) => {
                    eprintln!(
                        "hmrun: received {}; forwarding it to {}",
                        name_of(signal.as_raw()),
                        ranks(self.running())
                    );
                    self.signal_all(signal);
                    self.asked_to_stop = true;
                }
                (None, Phase::Running) => {
                    phase = self.stop(TIMEOUT_EXIT_CODE, spec.grace);
                    eprintln!(
                        "hmrun: job exceeded --timeout {} s; stopping {}",
                        spec.timeout.map_or(0.0, |timeout| timeout.as_secs_f64()),
                        ranks(self.running())
                    );
                }
                (None, Phase::Stopping { exit_code, .. }) => {
                    eprintln!(
                        "hmrun: {} still running after the {} s grace period; sending SIGKILL",
                        ranks(self.running()),
                        spec.grace.as_secs_f64()
                    );
                    self.signal_all(Signal::KILL);
                    phase = Phase::Stopping {
                        exit_code: *exit_code,
                        kill_at: None,
                    };
                }
            }
        }
        Ok(match phase {
            Phase::Running => 0,
            Phase::Stopping { exit_code, .. } => exit_code,
        })
    }

    /// Starts stopping the job: SIGTERM to every rank now, SIGKILL after `grace`. Ranks that
    /// got a forwarded signal are stopping already; a SIGTERM could cut their own shutdown short
    /// (a Ctrl-C handler writing a checkpoint), so they only get the grace period.
    fn stop(&self, exit_code: u8, grace: Duration) -> Phase {
        if !self.asked_to_stop {
            self.signal_all(Signal::TERM);
        }
        Phase::Stopping {
            exit_code,
            kill_at: Instant::now().checked_add(grace),
        }
    }

    /// The number of ranks not reaped yet.
    fn running(&self) -> usize {
        self.ranks.iter().filter(|r| r.child.is_some()).count()
    }

    /// Reaps an exited rank, first killing whatever it left running in its process group.
    fn reap(&mut self, rank: usize) -> Result<ExitStatus> {
        let entry = &mut self.ranks[rank];
        let mut child = entry.child.take().context("a rank was reported twice")?;
        // The unreaped leader keeps the group id reserved, so this cannot hit another group.
        signal_group(rank, entry.group, Signal::KILL);
        child
            .wait()
            .with_context(|| format!("cannot collect the exit status of rank {rank}"))
    }

    /// Sends `signal` to the process group of every rank not reaped yet.
    fn signal_all(&self, signal: Signal) {
        for (rank, entry) in self.ranks.iter().enumerate() {
            if entry.child.is_some() {
                signal_group(rank, entry.group, signal);
            }
        }
    }

    /// Kills and reaps the ranks still running (none after a normal end), then joins the
    /// waiters and output copiers, so all output is written before hmrun exits.
    fn finish(&mut self) {
        for (rank, entry) in self.ranks.iter_mut().enumerate() {
            if let Some(mut child) = entry.child.take() {
                signal_group(rank, entry.group, Signal::KILL);
                if let Err(err) = child.wait() {
                    eprintln!("hmrun: cannot collect the exit status of rank {rank}: {err}");
                }
            }
        }
        for thread in self.threads.drain(..) {
            // These threads do not panic; a panic would already have been printed.
            let _ = thread.join();
        }
    }
}

/// Blocks until process `pid` has exited, leaving it unreaped (a zombie) for the main thread.
fn wait_until_exited(pid: Pid) {
    loop {
        match waitid(
            WaitId::Pid(pid),
            WaitIdOptions::EXITED | WaitIdOptions::NOWAIT,
        ) {
            Err(Errno::INTR) => continue,
            // On any other error the main thread's blocking `wait` takes over.
            _ => return,
        }
    }
}

/// Sends `signal` to process group `group` of rank `rank`; a group that is already empty is fine.
fn signal_group(rank: usize, group: Pid, signal: Signal) {
    match kill_process_group(group, signal) {
        Ok(()) | Err(Errno::SRCH) => {}
        Err(err) => eprintln!(
            "hmrun: cannot send {} to rank {rank}: {err}",
            name_of(signal.as_raw())
        ),
    }
}

/// hmrun's exit code for a rank that ended with `status`, or `None` if it succeeded.
fn failure_code(status: ExitStatus) -> Option<u8> {
    if status.success() {
        return None;
    }
    // Exit codes are 0..=255 and signal numbers at most 64, so both fit.
    let code = match (status.code(), status.signal()) {
        (Some(code), _) => code,
        (None, Some(signal)) => 128 + signal,
        (None, None) => 1,
    };
    Some(u8::try_from(code).unwrap_or(1))
}

/// "exited with status 3" or "was killed by signal 9 (SIGKILL)".
fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(signal)) => format!("was killed by signal {signal} ({})", name_of(signal)),
        (None, None) => format!("ended with {status}"),
    }
}

/// The conventional name of a signal number, such as `SIGTERM`.
fn name_of(signal: i32) -> String {
    signal_name(signal).map_or_else(|| format!("signal {signal}"), str::to_string)
}

/// "1 rank" or "3 ranks".
fn ranks(count: usize) -> String {
    if count == 1 {
        "1 rank".to_string()
    } else {
        format!("{count} ranks")
    }
}

/// "; stopping the other 3 ranks", or nothing when no other rank is left.
fn stopping_the_others(running: usize) -> String {
    match running {
        0 => String::new(),
        1 => "; stopping the other rank".to_string(),
        _ => format!("; stopping the other {running} ranks"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failure_codes_follow_the_shell_convention() {
        assert_eq!(failure_code(ExitStatus::from_raw(0)), None);
        // Raw wait statuses: exit code in the second byte, signal number in the first.
        assert_eq!(failure_code(ExitStatus::from_raw(3 << 8)), Some(3));
        assert_eq!(failure_code(ExitStatus::from_raw(255 << 8)), Some(255));
        assert_eq!(failure_code(ExitStatus::from_raw(9)), Some(137));
        assert_eq!(failure_code(ExitStatus::from_raw(15)), Some(143));
    }

    #[test]
    fn statuses_are_described_for_humans() {
        assert_eq!(
            describe(ExitStatus::from_raw(3 << 8)),
            "exited with status 3"
        );
        assert_eq!(
            describe(ExitStatus::from_raw(9)),
            "was killed by signal 9 (SIGKILL)"
        );
        assert_eq!(stopping_the_others(0), "");
        assert_eq!(stopping_the_others(1), "; stopping the other rank");
        assert_eq!(stopping_the_others(3), "; stopping the other 3 ranks");
    }
}
