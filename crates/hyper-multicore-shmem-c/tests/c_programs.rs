//! The C API end to end: every C program of `tests/c/` is compiled with `hmcc` and run under the
//! real `hmrun` on 1, 2 and 4 PEs. A program passes when hmrun exits 0 and every PE printed its
//! `PASS <program>` line (so a program that did not run, or a PE that skipped its checks, fails
//! the test). The failure programs check the job ends fast, non-zero, with the expected line.
//!
//! `hmrun` is found next to `hmcc` (`target/<profile>/`): `cargo test --workspace` builds it;
//! alone, run `cargo build -p hmrun` first.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// Longest a job may run before the test kills it (the runtime's own deadline is shorter).
const WATCHDOG: Duration = Duration::from_secs(180);

fn profile_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_hmcc"))
        .parent()
        .expect("hmcc lives in a directory")
        .to_path_buf()
}

fn hmrun() -> PathBuf {
    let hmrun = profile_dir().join("hmrun");
    assert!(
        hmrun.is_file(),
        "no hmrun at {}: build it first (cargo build -p hmrun), or run cargo test --workspace",
        hmrun.display()
    );
    hmrun
}

/// Compiles `tests/c/<name>.c` with hmcc into a fresh directory; returns the executable.
fn compile(name: &str) -> PathBuf {
    let source = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/c")
        .join(format!("{name}.c"));
    let out_dir = std::env::temp_dir().join(format!("hmshmem-c-tests-{}", std::process::id()));
    std::fs::create_dir_all(&out_dir).unwrap();
    let binary = out_dir.join(name);
    let output = Command::new(env!("CARGO_BIN_EXE_hmcc"))
        .args(["-std=c11", "-O1", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&binary)
        .arg(&source)
        .output()
        .expect("run hmcc");
    assert!(
        output.status.success(),
        "hmcc {} failed:\n{}",
        source.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    binary
}

/// What a finished job printed.
#[derive(Debug)]
struct Finished {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Runs `hmrun -n PES -- BINARY ARGS`, killing it after the watchdog.
fn run(binary: &Path, pes: usize, args: &[&str]) -> Finished {
    let mut child = Command::new(hmrun())
        .args(["-n", &pes.to_string(), "--"])
        .arg(binary)
        .args(args)
        .env("SHMEM_SYMMETRIC_SIZE", "32M")
        .env("HYPER_MULTICORE_SHMEM_TIMEOUT_SEC", "60")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start hmrun");
    let pid = child.id();
    let (done, finished) = mpsc::channel();
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let errors = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stdout.read_to_string(&mut text);
        let status = child.wait();
        let _ = done.send((status, text));
    });
    let (status, stdout) = match finished.recv_timeout(WATCHDOG) {
        Ok(result) => result,
        Err(_) => {
            let pid = rustix::process::Pid::from_raw(pid as i32).expect("a child pid");
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            panic!("{} on {pes} PEs outlived the watchdog", binary.display());
        }
    };
    Finished {
        code: status.expect("wait for hmrun").code(),
        stdout,
        stderr: errors.join().unwrap(),
    }
}

/// Compiles `name` and runs it on 1, 2 and 4 PEs; each run must succeed with every PE passing.
fn passes_on_1_2_4_pes(name: &str) {
    let binary = compile(name);
    for pes in [1, 2, 4] {
        let finished = run(&binary, pes, &[]);
        let passed = finished
            .stdout
            .lines()
            .filter(|line| line.ends_with(&format!("PASS {name}")))
            .count();
        assert!(
            finished.code == Some(0) && passed == pes,
            "{name} on {pes} PEs: exit {:?}, {passed} of {pes} PEs passed\nstdout:\n{}\nstderr:\n{}",
            finished.code,
            finished.stdout,
            finished.stderr
        );
    }
}

#[test]
fn setup_and_queries() {
    passes_on_1_2_4_pes("setup_queries");
}

#[test]
fn symmetric_heap() {
    passes_on_1_2_4_pes("memory");
}

#[test]
fn rma_every_type() {
    passes_on_1_2_4_pes("rma_types");
}

#[test]
fn atomics_every_type() {
    passes_on_1_2_4_pes("atomics_types");
}

#[test]
fn point_to_point_sync_every_type() {
    passes_on_1_2_4_pes("sync_types");
}
