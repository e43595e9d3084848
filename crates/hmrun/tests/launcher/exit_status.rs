//! hmrun's exit status follows the first failing rank, and a failure, a timeout or a rank
//! ignoring SIGTERM ends the whole job with nothing left running.

use std::os::unix::fs::PermissionsExt;

use rustix::fs::{mknodat, FileType, Mode, CWD};

use crate::support::{assert_nothing_left, run, start_wrapped, TempDir};

#[test]
fn a_job_whose_ranks_all_succeed_exits_zero() {
    let finished = run("success", &["-n", "4", "sh", "-c", "exit 0"]);
    assert_eq!(finished.code(), 0, "{finished:#?}");
    assert!(finished.stderr.is_empty(), "{finished:#?}");
}

#[test]
fn the_first_failure_sets_the_exit_code_and_stops_the_others() {
    // The other ranks would sleep for a minute; the shell and its `sleep` both must go.
    let script = r#"[ "$RANK" = 2 ] && exit 3; echo sleeping; sleep 60"#;
    let finished = run("fail-fast", &["-n", "4", "sh", "-c", script]);
    assert_eq!(finished.code(), 3, "{finished:#?}");
    assert_eq!(
        finished.stderr_lines(),
        ["hmrun: rank 2 exited with status 3; stopping the other 3 ranks"]
    );
    assert_nothing_left(&finished.marker);
}

#[test]
fn a_rank_killed_by_a_signal_gives_128_plus_its_number() {
    let script = r#"[ "$RANK" = 1 ] && kill -9 $$; sleep 60"#;
    let finished = run("killed-rank", &["-n", "2", "sh", "-c", script]);
    assert_eq!(finished.code(), 137, "{finished:#?}");
    assert_eq!(
        finished.stderr_lines(),
        ["hmrun: rank 1 was killed by signal 9 (SIGKILL); stopping the other rank"]
    );
    assert_nothing_left(&finished.marker);
}

#[test]
fn the_timeout_stops_the_job_with_124() {
    let finished = run("timeout", &["-n", "2", "--timeout", "1", "sleep", "60"]);
    assert_eq!(finished.code(), 124, "{finished:#?}");
    assert_eq!(
        finished.stderr_lines(),
        ["hmrun: job exceeded --timeout 1 s; stopping 2 ranks"]
    );
    assert_nothing_left(&finished.marker);
}

#[test]
fn a_rank_ignoring_sigterm_is_killed_after_the_grace_period() {
    // Rank 0 fails only once rank 1 ignores SIGTERM: rank 1 writes to the FIFO after `trap`,
    // and rank 0 blocks reading it.
    let dir = TempDir::new("grace");
    let fifo = dir.path().join("rank1-ignores-term");
    mknodat(CWD, &fifo, FileType::Fifo, Mode::from_raw_mode(0o600), 0).expect("mkfifo");
    let script = r#"
        if [ "$RANK" = 0 ]; then read ready < "$1"; exit 5; fi
        trap '' TERM
        echo ignoring > "$1"
        sleep 60
    "#;
    let fifo = fifo.to_str().unwrap();
    let finished = run(
        "grace",
        &["-n", "2", "--grace", "0.2", "sh", "-c", script, "sh", fifo],
    );
    assert_eq!(finished.code(), 5, "{finished:#?}");
    assert_eq!(
        finished.stderr_lines(),
        [
            "hmrun: rank 0 exited with status 5; stopping the other rank",
            "hmrun: 1 rank still running after the 0.2 s grace period; sending SIGKILL",
        ]
    );
    assert_nothing_left(&finished.marker);
}

#[test]
fn a_program_that_cannot_be_executed_fails_before_anything_runs() {
    // Executable, so it passes the up-front check, but its interpreter does not exist.
    let dir = TempDir::new("bad-interpreter");
    let script = dir.path().join("script");
    std::fs::write(&script, "#!/nonexistent/interpreter\n").unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let finished = run("bad-interpreter", &["-n", "2", script.to_str().unwrap()]);
    assert_eq!(finished.code(), 1, "{finished:#?}");
    let expected = format!("hmrun: cannot start rank 0 of 2 ('{}'): ", script.display());
    assert!(
        finished.stderr_text().starts_with(&expected),
        "{finished:#?}"
    );
}

#[test]
fn a_rank_that_cannot_be_started_midway_takes_the_started_ones_down() {
    // With 16 descriptors hmrun runs out of pipes after a few of the 10 ranks.
    let job = start_wrapped(
        "spawn-midway",
        &["sh", "-c", r#"ulimit -n 16 && exec "$@""#, "sh"],
        &["-n", "10", "sleep", "60"],
        &[],
    );
    let finished = job.finish();
    assert_eq!(finished.code(), 1, "{finished:#?}");
    let stderr = finished.stderr_text();
    let failed_rank: usize = stderr
        .strip_prefix("hmrun: cannot start rank ")
        .and_then(|rest| rest.split_once(' '))
        .and_then(|(rank, _)| rank.parse().ok())
        .unwrap_or_else(|| panic!("unexpected message: {finished:#?}"));
    assert!(failed_rank > 0, "no rank was started before: {finished:#?}");
    let started = match failed_rank {
        1 => "1 rank".to_string(),
        n => format!("{n} ranks"),
    };
    assert!(
        stderr.contains(&format!("; killed the {started} already started: ")),
        "{finished:#?}"
    );
    assert!(stderr.contains("Too many open files"), "{finished:#?}");
    assert_nothing_left(&finished.marker);
}
