//! Bad arguments and configuration end in exit code 2 and one clear message, before anything
//! starts; good ones reach the ranks verbatim.

use crate::support::{run, start};

#[test]
fn zero_processes_are_refused() {
    let finished = run("zero", &["-n", "0", "true"]);
    assert_eq!(finished.code(), 2, "{finished:#?}");
    assert!(
        finished
            .stderr_text()
            .contains("a job needs at least one process"),
        "{finished:#?}"
    );
}

#[test]
fn a_missing_program_is_refused() {
    let finished = run("no-program", &["-n", "2"]);
    assert_eq!(finished.code(), 2, "{finished:#?}");
    assert!(
        finished.stderr_text().contains("<PROGRAM>"),
        "{finished:#?}"
    );
}

#[test]
fn a_program_not_in_path_is_refused() {
    let finished = run("not-in-path", &["-n", "2", "hmrun-test-no-such-program"]);
    assert_eq!(finished.code(), 2, "{finished:#?}");
    assert_eq!(
        finished.stderr_lines(),
        ["hmrun: program 'hmrun-test-no-such-program' not found in PATH"]
    );
    assert!(finished.stdout.is_empty(), "{finished:#?}");
}

#[test]
fn a_program_path_that_does_not_exist_is_refused() {
    let finished = run("bad-path", &["-n", "2", "./no/such/program"]);
    assert_eq!(finished.code(), 2, "{finished:#?}");
    assert_eq!(
        finished.stderr_lines(),
        ["hmrun: program './no/such/program' does not exist"]
    );
}

#[test]
fn a_bad_timeout_is_refused() {
    for bad in ["0", "-1", "soon"] {
        let timeout = format!("--timeout={bad}");
        let finished = run("bad-timeout", &["-n", "1", &timeout, "true"]);
        assert_eq!(finished.code(), 2, "--timeout {bad}: {finished:#?}");
        assert!(
            finished.stderr_text().contains("--timeout"),
            "{finished:#?}"
        );
    }
}

#[test]
fn an_invalid_runtime_configuration_is_refused() {
    let job = start(
        "bad-config",
        &["-n", "1", "true"],
        &[("HYPER_MULTICORE_SHMEM_TIMEOUT_SEC", "soon")],
    );
    let finished = job.finish();
    assert_eq!(finished.code(), 2, "{finished:#?}");
    assert!(
        finished
            .stderr_text()
            .contains("HYPER_MULTICORE_SHMEM_TIMEOUT_SEC"),
        "{finished:#?}"
    );
}

#[test]
fn arguments_after_the_program_belong_to_it() {
    let finished = run(
        "verbatim",
        &[
            "-n",
            "1",
            "sh",
            "-c",
            r#"printf '%s|' "$@""#,
            "sh",
            "--timeout",
            "-n",
            "3",
            "--",
        ],
    );
    assert_eq!(finished.code(), 0, "{finished:#?}");
    assert_eq!(finished.stdout_lines(), ["[0] --timeout|-n|3|--|"]);
}

#[test]
fn a_multi_host_job_needs_the_master_address_and_a_node_rank_inside_it() {
    for (args, needle) in [
        (
            &["-n", "1", "--nnodes", "2", "true"][..],
            "needs --master-addr",
        ),
        (
            &[
                "-n",
                "1",
                "--nnodes",
                "2",
                "--node-rank",
                "2",
                "--master-addr",
                "127.0.0.1",
                "true",
            ][..],
            "--node-rank 2 is outside 0..2",
        ),
    ] {
        let finished = run("multi-host-arguments", args);
        assert_eq!(finished.code(), 2, "{finished:#?}");
        assert!(finished.stderr_text().contains(needle), "{finished:#?}");
    }
}
