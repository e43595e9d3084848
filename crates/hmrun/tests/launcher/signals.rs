//! Signals sent to hmrun reach every rank; killing hmrun kills the ranks.

use std::os::unix::process::ExitStatusExt;

use rustix::process::Signal;

use crate::support::{
    assert_nothing_left, processes_with_marker, ranks_printing, start, wait_until_nothing_left,
};

/// Starts 3 ranks that trap SIGTERM and SIGINT, sends `signal` to hmrun once all are ready,
/// and checks that every rank got it.
fn forwards(signal: Signal, name: &str) {
    let script = r#"
        trap 'echo got-term; exit 7' TERM
        trap 'echo got-int; exit 7' INT
        echo ready
        sleep 60 &
        wait
    "#;
    let mut job = start(name, &["-n", "3", "sh", "-c", script], &[]);
    job.wait_for_ranks_printing("ready", 3);
    job.signal(signal);
    let finished = job.finish();
    assert_eq!(finished.code(), 7, "{finished:#?}");
    let expected = if signal == Signal::TERM {
        "got-term"
    } else {
        "got-int"
    };
    let mut got = ranks_printing(&finished.stdout, expected);
    got.sort_unstable();
    assert_eq!(got, [0, 1, 2], "{finished:#?}");
    assert!(
        finished
            .stderr_text()
            .contains(&format!("hmrun: received {name}; forwarding it to 3 ranks")),
        "{finished:#?}"
    );
    // Everything the ranks started went with them (the trap does not stop `sleep`).
    assert_nothing_left(&finished.marker);
}

#[test]
fn sigterm_is_forwarded_to_every_rank() {
    forwards(Signal::TERM, "SIGTERM");
}

#[test]
fn sigint_is_forwarded_to_every_rank() {
    forwards(Signal::INT, "SIGINT");
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
fn the_ranks_die_with_a_killed_hmrun() {
    let mut job = start(
        "pdeathsig",
        &["-n", "3", "sh", "-c", "echo ready; exec sleep 60"],
        &[],
    );
    job.wait_for_ranks_printing("ready", 3);
    let marker = job.marker().to_string();
    assert_eq!(processes_with_marker(&marker).len(), 4);
    job.signal(Signal::KILL);
    let finished = job.finish();
    assert_eq!(finished.status.signal(), Some(9), "{finished:#?}");
    // The kernel kills the ranks asynchronously once hmrun is gone.
    wait_until_nothing_left(&marker);
}
