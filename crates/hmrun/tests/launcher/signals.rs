//! Signals sent to hmrun reach every rank; killing hmrun kills the ranks.

use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;

use rustix::fs::{mknodat, FileType, Mode, CWD};
use rustix::process::Signal;

use crate::support::{
    assert_nothing_left, processes_with_marker, ranks_printing, start, wait_until_nothing_left,
    TempDir,
};

/// Creates a FIFO at `path`.
fn make_fifo(path: &Path) {
    mknodat(CWD, path, FileType::Fifo, Mode::from_raw_mode(0o600), 0).expect("mkfifo");
}

/// Starts 3 ranks that trap SIGTERM and SIGINT, sends `signal` to hmrun once all are ready,
/// and checks that every rank got it. The long grace period means a slow rank is never killed
/// before its trap has run.
fn forwards(signal: Signal, name: &str, answer: &str) {
    let script = r#"
        trap 'echo got-term; exit 7' TERM
        trap 'echo got-int; exit 7' INT
        echo ready
        sleep 60 &
        wait
    "#;
    let mut job = start(name, &["-n", "3", "--grace", "30", "sh", "-c", script], &[]);
    job.wait_for_ranks_printing("ready", 3);
    job.signal(signal);
    let finished = job.finish();
    assert_eq!(finished.code(), 7, "{finished:#?}");
    let mut got = ranks_printing(&finished.stdout, answer);
    got.sort_unstable();
    assert_eq!(got, [0, 1, 2], "{finished:#?}");
    assert!(
        finished
            .stderr_text()
            .contains(&format!("hmrun: received {name}; forwarding it to 3 ranks")),
        "{finished:#?}"
    );
    // Everything the ranks started went with them (with SIGINT, the background `sleep`
    // ignores the signal and is killed when its rank ends).
    assert_nothing_left(&finished.marker);
}

#[test]
fn sigterm_is_forwarded_to_every_rank() {
    forwards(Signal::TERM, "SIGTERM", "got-term");
}

#[test]
fn sigint_is_forwarded_to_every_rank() {
    forwards(Signal::INT, "SIGINT", "got-int");
}

#[test]
fn sighup_is_forwarded_to_every_rank() {
    let mut job = start(
        "sighup",
        &["-n", "2", "sh", "-c", "echo ready; exec sleep 60"],
        &[],
    );
    job.wait_for_ranks_printing("ready", 2);
    job.signal(Signal::HUP);
    let finished = job.finish();
    assert_eq!(finished.code(), 128 + 1, "{finished:#?}");
    assert!(
        finished
            .stderr_text()
            .contains("hmrun: received SIGHUP; forwarding it to 2 ranks"),
        "{finished:#?}"
    );
    assert_nothing_left(&finished.marker);
}

#[test]
fn a_rank_handling_a_forwarded_signal_is_not_sent_sigterm() {
    // Rank 0 exits at once on SIGINT; rank 1's handler blocks until the test writes to the
    // FIFO, which it does only after hmrun has reacted to rank 0's failure.
    let dir = TempDir::new("no-term");
    let fifo = dir.path().join("go");
    make_fifo(&fifo);
    let script = r#"
        if [ "$RANK" = 0 ]; then
            trap 'exit 7' INT
        else
            trap 'echo got-term' TERM
            trap 'echo got-int; read go < "$1"; echo done; exit 0' INT
        fi
        echo ready
        sleep 60 &
        wait
    "#;
    let fifo_arg = fifo.to_str().unwrap();
    let args = [
        "-n", "2", "--grace", "30", "sh", "-c", script, "sh", fifo_arg,
    ];
    let mut job = start("no-term", &args, &[]);
    job.wait_for_ranks_printing("ready", 2);
    job.signal(Signal::INT);
    job.wait_for_stderr("hmrun: rank 0 exited with status 7; stopping the other rank");
    // Opened read-write, a FIFO never blocks; the line waits there until rank 1 reads it.
    let mut go = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&fifo)
        .expect("cannot open the FIFO");
    go.write_all(b"go\n").expect("cannot write to the FIFO");
    let finished = job.finish();
    drop(go);
    assert_eq!(finished.code(), 7, "{finished:#?}");
    let rank_1: Vec<_> = finished
        .stdout_lines()
        .into_iter()
        .filter(|l| l.starts_with("[1] "))
        .collect();
    assert_eq!(
        rank_1,
        ["[1] ready", "[1] got-int", "[1] done"],
        "{finished:#?}"
    );
    assert_nothing_left(&finished.marker);
}

#[test]
fn the_ranks_die_with_a_killed_hmrun() {
    // The ranks block opening a FIFO nobody writes: no child process, no exec in flight.
    let dir = TempDir::new("pdeathsig");
    let fifo = dir.path().join("never");
    make_fifo(&fifo);
    let script = r#"echo ready; read never < "$1""#;
    let fifo_arg = fifo.to_str().unwrap();
    let mut job = start(
        "pdeathsig",
        &["-n", "3", "sh", "-c", script, "sh", fifo_arg],
        &[],
    );
    job.wait_for_ranks_printing("ready", 3);
    let marker = job.marker().to_string();
    assert_eq!(
        processes_with_marker(&marker).len(),
        1 + 3,
        "hmrun and its ranks"
    );
    job.signal(Signal::KILL);
    let finished = job.finish();
    assert_eq!(finished.status.signal(), Some(9), "{finished:#?}");
    // The kernel kills the ranks asynchronously once hmrun is gone.
    wait_until_nothing_left(&marker);
}
