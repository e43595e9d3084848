//! Running `hmrun` as a real process under a watchdog, and looking for what a job left behind.
//!
//! Every [`Job`] carries a unique marker in its environment, which the ranks and everything they
//! start inherit; [`processes_with_marker`] finds them by scanning `/proc`. Every wait ends at the
//! job's watchdog deadline: hmrun is then killed (its ranks die with it) and the test fails with
//! the output so far. No test asserts how fast anything is.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::thread;
use std::time::{Duration, Instant};

use rustix::io::Errno;
use rustix::process::{kill_process, waitid, Pid, Signal, WaitId, WaitIdOptions};

/// How long any one test may take before the watchdog ends it.
pub const WATCHDOG: Duration = Duration::from_secs(60);

/// The variable that marks every process of one test's job.
const MARKER_VARIABLE: &str = "HMRUN_TEST_MARKER";

/// A unique marker per job: test binary pid, a counter and a name.
fn new_marker(name: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{name}-{}-{n}", std::process::id())
}

/// What the reader and waiter threads report.
enum Report {
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    StreamClosed,
    /// hmrun has exited; it is reaped by the test thread, so its pid stays valid until then.
    Exited,
}

/// A running `hmrun`.
pub struct Job {
    child: Option<std::process::Child>,
    pid: Pid,
    reports: Receiver<Report>,
    deadline: Instant,
    marker: String,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    open_streams: usize,
    exited: bool,
}

/// A finished `hmrun`: its status and everything it printed.
pub struct Finished {
    /// hmrun's exit status.
    pub status: ExitStatus,
    /// hmrun's stdout, bytes as written.
    pub stdout: Vec<u8>,
    /// hmrun's stderr, bytes as written.
    pub stderr: Vec<u8>,
    /// The marker of the job's processes.
    pub marker: String,
}

impl std::fmt::Debug for Finished {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "hmrun {} (marker {})\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.status,
            self.marker,
            String::from_utf8_lossy(&self.stdout),
            String::from_utf8_lossy(&self.stderr)
        )
    }
}

impl Finished {
    /// hmrun's exit code (panics if a signal killed it).
    pub fn code(&self) -> i32 {
        self.status
            .code()
            .unwrap_or_else(|| panic!("hmrun died of a signal: {self:#?}"))
    }

    /// stdout as lines (lossy UTF-8, newlines removed).
    pub fn stdout_lines(&self) -> Vec<String> {
        lines(&self.stdout)
    }

    /// stderr as lines (lossy UTF-8, newlines removed).
    pub fn stderr_lines(&self) -> Vec<String> {
        lines(&self.stderr)
    }

    /// stderr as text.
    pub fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }
}

fn lines(bytes: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(bytes)
        .lines()
        .map(str::to_string)
        .collect()
}

/// Starts `hmrun ARGS` with `envs` added to its environment; `name` goes into the marker.
pub fn start(name: &str, args: &[&str], envs: &[(&str, &str)]) -> Job {
    start_wrapped(name, &[], args, envs)
}

/// Starts `WRAPPER... hmrun ARGS`, where the wrapper command must end by `exec`-ing hmrun, so
/// that the process the watchdog kills is hmrun.
pub fn start_wrapped(name: &str, wrapper: &[&str], args: &[&str], envs: &[(&str, &str)]) -> Job {
    let marker = new_marker(name);
    let hmrun = env!("CARGO_BIN_EXE_hmrun");
    let mut command = match wrapper.split_first() {
        None => Command::new(hmrun),
        Some((program, wrapper_args)) => {
            let mut command = Command::new(program);
            command.args(wrapper_args).arg(hmrun);
            command
        }
    };
    command
        .args(args)
        .env(MARKER_VARIABLE, &marker)
        .envs(envs.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command.spawn().expect("cannot start hmrun");
    let pid = Pid::from_child(&child);
    let (reports, inbox) = mpsc::channel();
    read_lines(
        child.stdout.take().unwrap(),
        reports.clone(),
        Report::Stdout,
    );
    read_lines(
        child.stderr.take().unwrap(),
        reports.clone(),
        Report::Stderr,
    );
    thread::spawn(move || {
        // Wait without reaping, so the pid cannot be reused before the test thread reaps it.
        while let Err(Errno::INTR) = waitid(
            WaitId::Pid(pid),
            WaitIdOptions::EXITED | WaitIdOptions::NOWAIT,
        ) {}
        let _ = reports.send(Report::Exited);
    });
    Job {
        child: Some(child),
        pid,
        reports: inbox,
        deadline: Instant::now() + WATCHDOG,
        marker,
        stdout: Vec::new(),
        stderr: Vec::new(),
        open_streams: 2,
        exited: false,
    }
}

/// Runs `hmrun ARGS` to its end.
pub fn run(name: &str, args: &[&str]) -> Finished {
    start(name, args, &[]).finish()
}

fn read_lines(
    pipe: impl Read + Send + 'static,
    reports: Sender<Report>,
    wrap: fn(Vec<u8>) -> Report,
) {
    thread::spawn(move || {
        let mut pipe = BufReader::new(pipe);
        loop {
            let mut line = Vec::new();
            match pipe.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    if reports.send(wrap(line)).is_err() {
                        return;
                    }
                }
            }
        }
        let _ = reports.send(Report::StreamClosed);
    });
}

impl Job {
    /// The marker of this job's processes.
    pub fn marker(&self) -> &str {
        &self.marker
    }

    /// Sends `signal` to hmrun itself.
    pub fn signal(&self, signal: Signal) {
        assert!(!self.exited, "hmrun already exited");
        // hmrun is not reaped before `finish`, so the pid is still hmrun's.
        kill_process(self.pid, signal).expect("cannot signal hmrun");
    }

    /// Waits until hmrun's stdout holds `count` lines equal to `line` for some rank, that is
    /// `[r] line`. Returns the ranks that printed it.
    pub fn wait_for_ranks_printing(&mut self, line: &str, count: usize) -> Vec<usize> {
        loop {
            let ranks = ranks_printing(&self.stdout, line);
            if ranks.len() >= count {
                return ranks;
            }
            if !self.next_report() {
                self.fail(&format!(
                    "hmrun ended before {count} ranks printed {line:?}"
                ));
            }
        }
    }

    /// Waits until hmrun's stderr contains `text`.
    pub fn wait_for_stderr(&mut self, text: &str) {
        while !String::from_utf8_lossy(&self.stderr).contains(text) {
            if !self.next_report() {
                self.fail(&format!("hmrun ended before printing {text:?}"));
            }
        }
    }

    /// Waits for hmrun to exit and close its output, then reaps it.
    pub fn finish(mut self) -> Finished {
        while !self.exited || self.open_streams > 0 {
            if !self.next_report() {
                self.fail("the report channel closed early");
            }
        }
        let status = self
            .child
            .take()
            .unwrap()
            .wait()
            .expect("cannot reap hmrun");
        Finished {
            status,
            stdout: std::mem::take(&mut self.stdout),
            stderr: std::mem::take(&mut self.stderr),
            marker: self.marker.clone(),
        }
    }

    /// Takes the next report; false if none can come any more. Fails the test at the deadline.
    fn next_report(&mut self) -> bool {
        let left = self.deadline.saturating_duration_since(Instant::now());
        match self.reports.recv_timeout(left) {
            Ok(Report::Stdout(bytes)) => self.stdout.extend_from_slice(&bytes),
            Ok(Report::Stderr(bytes)) => self.stderr.extend_from_slice(&bytes),
            Ok(Report::StreamClosed) => self.open_streams -= 1,
            Ok(Report::Exited) => self.exited = true,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                self.fail(&format!("watchdog: hmrun still running after {WATCHDOG:?}"))
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => return false,
        }
        true
    }

    /// Kills hmrun (and so its ranks) and fails the test with what hmrun printed so far.
    fn fail(&mut self, why: &str) -> ! {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!(
            "{why}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            String::from_utf8_lossy(&self.stdout),
            String::from_utf8_lossy(&self.stderr)
        );
    }
}

impl Drop for Job {
    /// A test that panics midway must not leave hmrun behind.
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The ranks r whose output holds the line `[r] line`, in order of appearance.
pub fn ranks_printing(output: &[u8], line: &str) -> Vec<usize> {
    lines(output)
        .iter()
        .filter_map(|l| {
            let (prefix, rest) = l.strip_prefix('[')?.split_once("] ")?;
            (rest == line).then(|| prefix.parse().ok()).flatten()
        })
        .collect()
}

/// The pids and command lines of the live processes carrying `marker` in their environment.
pub fn processes_with_marker(marker: &str) -> Vec<(u32, String)> {
    let wanted = format!("{MARKER_VARIABLE}={marker}");
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc")
        .expect("cannot read /proc")
        .flatten()
    {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        // Processes that vanish meanwhile, and zombies, have no readable environment.
        let Ok(environ) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        if environ
            .split(|&b| b == 0)
            .any(|var| var == wanted.as_bytes())
        {
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            found.push((pid, cmdline));
        }
    }
    found
}

/// Asserts that no process of the job is alive.
pub fn assert_nothing_left(marker: &str) {
    let left = processes_with_marker(marker);
    assert!(left.is_empty(), "processes of the job are left: {left:?}");
}

/// Waits until no process of the job is alive, for events the kernel delivers asynchronously
/// (checked every 10 ms, up to `WATCHDOG`).
pub fn wait_until_nothing_left(marker: &str) {
    let deadline = Instant::now() + WATCHDOG;
    loop {
        let left = processes_with_marker(marker);
        if left.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "processes of the job are still alive after {WATCHDOG:?}: {left:?}"
        );
        thread::sleep(Duration::from_millis(10));
    }
}

/// A directory of its own for one test, removed at the end.
pub struct TempDir(PathBuf);

impl TempDir {
    /// Creates a fresh directory named after `name`.
    pub fn new(name: &str) -> TempDir {
        let path = std::env::temp_dir().join(format!("hmrun-test-{}", new_marker(name)));
        std::fs::create_dir_all(&path).expect("cannot create a temporary directory");
        TempDir(path)
    }

    /// The directory's path.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
