//! Running one job under a watchdog and collecting what its PEs reported.
//!
//! Jobs run through the real launcher, `hmrun -n N --timeout T --grace G -- hm-chaos pe '<json>'`,
//! whose exit status is part of the verdict. The driver reads hmrun's output on threads of its
//! own (lines `[rank] {json}`) and waits for hmrun on a channel with a deadline: past the
//! watchdog, hmrun is SIGKILLed (its ranks die with it, `PR_SET_PDEATHSIG`) and the job counts
//! as a hang. hmrun's own `--timeout` is shorter, so a stuck job normally ends as exit 124.
//!
//! Around each job, [`SystemView`] records what the machine holds that the job could leave
//! behind: files in `/dev/shm`, in `/tmp` and in the job's own `TMPDIR`, and processes still
//! carrying the job's tag in their environment. The machine is shared (other builds and
//! benchmarks run), so a new file in `/dev/shm` or `/tmp` counts against the job only if its
//! name could be the runtime's; others are listed as unattributed. The job's own `TMPDIR`
//! must simply stay empty.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use hyper_multicore::config::TIMEOUT_SEC;
use rustix::process::{kill_process, Pid, Signal};

use crate::scenario::{Record, Scenario};

/// The variable that tags every process of one job (to find leftovers).
pub const JOB_TAG: &str = "HM_CHAOS_JOB";

/// How the driver launches jobs.
#[derive(Debug, Clone)]
pub struct Launcher {
    /// The hmrun binary.
    pub hmrun: PathBuf,
    /// This binary (the PE program).
    pub program: PathBuf,
    /// `HYPER_MULTICORE_SHMEM_TIMEOUT_SEC` given to the PEs.
    pub runtime_timeout: Duration,
    /// Where each job's `TMPDIR` is created.
    pub scratch: PathBuf,
}

/// What one job did.
#[derive(Debug)]
pub struct JobRun {
    /// hmrun's exit code (`None`: it was killed by the watchdog).
    pub exit: Option<i32>,
    /// True if the job had to be killed, or hmrun reported its `--timeout` (124).
    pub hung: bool,
    /// Every record, with the rank that printed it and when the driver read it.
    pub records: Vec<(usize, Record)>,
    /// Lines that were not records (for failure reports).
    pub other_lines: Vec<String>,
    /// hmrun's stderr (its own messages and the ranks' stderr).
    pub stderr: String,
    /// What the job left on the machine.
    pub left_behind: Vec<String>,
    /// Files that appeared in `/tmp` or `/dev/shm` during the job under names the runtime
    /// would not use (another program's, on this shared machine).
    pub unattributed: Vec<String>,
    /// Wall time.
    pub elapsed: Duration,
}

impl JobRun {
    /// Records of rank `rank`.
    pub fn of(&self, rank: usize) -> impl Iterator<Item = &Record> {
        self.records
            .iter()
            .filter(move |(r, _)| *r == rank)
            .map(|(_, record)| record)
    }

    /// hmrun's output, for failure reports.
    pub fn describe(&self) -> String {
        let mut text = String::new();
        for (rank, record) in &self.records {
            text.push_str(&format!(
                "  [{rank}] {}\n",
                serde_json::to_string(record).unwrap_or_default()
            ));
        }
        for line in &self.other_lines {
            text.push_str(&format!("  {line}\n"));
        }
        for line in self.stderr.lines() {
            text.push_str(&format!("  stderr: {line}\n"));
        }
        text
    }
}

static JOBS: AtomicUsize = AtomicUsize::new(0);

impl Launcher {
    /// Runs `pes` PEs of `scenario` under hmrun with `env` added; `watchdog` bounds the job.
    pub fn run(
        &self,
        pes: usize,
        scenario: &Scenario,
        env: &[(String, String)],
        watchdog: Duration,
    ) -> Result<JobRun> {
        let tag = format!(
            "{}-{}",
            std::process::id(),
            JOBS.fetch_add(1, Ordering::Relaxed)
        );
        let tmpdir = self.scratch.join(&tag);
        std::fs::create_dir_all(&tmpdir).context("create the job's TMPDIR")?;
        let before = SystemView::take(&tag, &tmpdir);
        // hmrun stops at its own timeout a little before the watchdog; survivors get most of
        // that as grace after a rank dies, so a slow error is measured rather than cut off.
        let hmrun_timeout = watchdog
            .saturating_sub(Duration::from_secs(5))
            .max(Duration::from_secs(5));
        let grace = hmrun_timeout
            .saturating_sub(Duration::from_secs(5))
            .max(Duration::from_secs(2));
        let json = serde_json::to_string(scenario)?;
        let mut command = Command::new(&self.hmrun);
        command
            .arg("-n")
            .arg(pes.to_string())
            .arg("--timeout")
            .arg(format!("{}", hmrun_timeout.as_secs_f64()))
            .arg("--grace")
            .arg(format!("{}", grace.as_secs_f64()))
            .arg("--")
            .arg(&self.program)
            .arg("pe")
            .arg(json)
            .env(
                TIMEOUT_SEC,
                format!("{}", self.runtime_timeout.as_secs_f64()),
            )
            .env(JOB_TAG, &tag)
            .env("TMPDIR", &tmpdir)
            .envs(env.iter().map(|(n, v)| (n, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let started = Instant::now();
        let mut child = command
            .spawn()
            .with_context(|| format!("start {}", self.hmrun.display()))?;
        let pid = Pid::from_child(&child);
        let stdout = lines_of(child.stdout.take().expect("piped"));
        let stderr = lines_of(child.stderr.take().expect("piped"));
        let (exited, status) = mpsc::channel::<std::io::Result<ExitStatus>>();
        let waiter = std::thread::spawn(move || {
            let _ = exited.send(child.wait());
        });
        let (exit, killed) = match status.recv_timeout(watchdog) {
            Ok(status) => (status.context("wait for hmrun")?.code(), false),
            Err(_) => {
                let _ = kill_process(pid, Signal::KILL);
                let status = status.recv().context("wait for the killed hmrun")?;
                (status.ok().and_then(|s| s.code()), true)
            }
        };
        let _ = waiter.join();
        let elapsed = started.elapsed();
        let mut records = Vec::new();
        let mut other_lines = Vec::new();
        for line in stdout.join().unwrap_or_default() {
            match parse_line(&line) {
                Some(parsed) => records.push(parsed),
                None => other_lines.push(line),
            }
        }
        let stderr = stderr.join().unwrap_or_default().join("\n");
        let after = SystemView::take(&tag, &tmpdir);
        let (left_behind, unattributed) = after.compare(&before);
        let _ = std::fs::remove_dir(&tmpdir);
        Ok(JobRun {
            exit,
            hung: killed || exit == Some(124),
            records,
            other_lines,
            stderr,
            left_behind,
            unattributed,
            elapsed,
        })
    }
}

/// `[rank] {json}` → (rank, record).
pub(crate) fn parse_line(line: &str) -> Option<(usize, Record)> {
    let rest = line.strip_prefix('[')?;
    let (rank, json) = rest.split_once("] ")?;
    Some((rank.parse().ok()?, serde_json::from_str(json).ok()?))
}

/// Collects a pipe's lines on a thread of its own.
pub fn lines_of(source: impl Read + Send + 'static) -> JoinHandle<Vec<String>> {
    std::thread::spawn(move || {
        BufReader::new(source)
            .lines()
            .map_while(std::io::Result::ok)
            .collect()
    })
}

/// What the machine holds that a job could leave behind.
#[derive(Debug)]
pub struct SystemView {
    dev_shm: BTreeSet<OsString>,
    tmp: BTreeSet<OsString>,
    job_tmp: BTreeSet<OsString>,
    processes: Vec<String>,
}

fn entries(dir: &Path) -> BTreeSet<OsString> {
    std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default()
}

/// Names a file of the runtime could have (it creates none; this is the check that it does not).
fn ours(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    ["hyper", "hm-", "hm_", "hmcp", "shmem", "memfd"]
        .iter()
        .any(|p| name.contains(p))
}

impl SystemView {
    /// Reads the machine's state for the job tagged `tag`, whose `TMPDIR` is `tmpdir`.
    pub fn take(tag: &str, tmpdir: &Path) -> SystemView {
        SystemView {
            dev_shm: entries(Path::new("/dev/shm")),
            tmp: entries(Path::new("/tmp")),
            job_tmp: entries(tmpdir),
            processes: tagged_processes(tag),
        }
    }

    /// (left behind by the job, appeared but unattributable).
    pub fn compare(&self, before: &SystemView) -> (Vec<String>, Vec<String>) {
        let mut left = Vec::new();
        let mut unattributed = Vec::new();
        for name in self.dev_shm.difference(&before.dev_shm) {
            let name = name.to_string_lossy();
            if ours(&name) {
                left.push(format!("/dev/shm/{name}"));
            } else {
                unattributed.push(format!("/dev/shm/{name}"));
            }
        }
        for name in self.job_tmp.difference(&before.job_tmp) {
            left.push(format!("$TMPDIR/{}", name.to_string_lossy()));
        }
        for name in self.tmp.difference(&before.tmp) {
            let name = name.to_string_lossy();
            if ours(&name) {
                left.push(format!("/tmp/{name}"));
            } else {
                unattributed.push(format!("/tmp/{name}"));
            }
        }
        for process in &self.processes {
            left.push(format!("process {process} still running"));
        }
        (left, unattributed)
    }
}

/// Processes whose environment carries `JOB_TAG=tag`, as `pid (comm)`.
pub fn tagged_processes(tag: &str) -> Vec<String> {
    tagged_pids(tag)
        .into_iter()
        .map(|pid| {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            format!("{pid} ({})", comm.trim())
        })
        .collect()
}

/// The pids of the processes whose environment carries `JOB_TAG=tag`.
pub fn tagged_pids(tag: &str) -> Vec<u32> {
    let needle = format!("{JOB_TAG}={tag}");
    let Ok(proc_dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    proc_dir
        .flatten()
        .filter_map(|entry| {
            let pid = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let environ = std::fs::read(entry.path().join("environ")).ok()?;
            let tagged = environ
                .split(|&b| b == 0)
                .any(|var| var == needle.as_bytes());
            tagged.then_some(pid)
        })
        .collect()
}
