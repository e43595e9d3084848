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
use std::sync::atomic::{AtomicUsize, Ordering};
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

/// A compiled test program in a directory of its own, removed when dropped.
struct Program {
    dir: PathBuf,
    binary: PathBuf,
}

impl Drop for Program {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Compiles `tests/c/<name>.c` with hmcc into a fresh directory (one per call: tests run in
/// parallel and may compile the same program).
fn compile(name: &str) -> Program {
    static COMPILED: AtomicUsize = AtomicUsize::new(0);
    let call = COMPILED.fetch_add(1, Ordering::Relaxed);
    let source = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/c")
        .join(format!("{name}.c"));
    let out_dir =
        std::env::temp_dir().join(format!("hmshmem-c-tests-{}-{call}", std::process::id()));
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
    Program {
        dir: out_dir,
        binary,
    }
}

/// What a finished job printed.
#[derive(Debug)]
struct Finished {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// The runtime's deadline for the passing programs (seconds): shorter than the watchdog, so a
/// stuck wait fails with the runtime's own error first.
const RUNTIME_TIMEOUT: &str = "60";

/// Runs `hmrun -n PES -- BINARY ARGS` with the runtime deadline `timeout` (seconds), killing it
/// after the watchdog.
fn run(binary: &Path, pes: usize, args: &[&str], timeout: &str) -> Finished {
    run_with(binary, pes, args, timeout, &[])
}

/// [`run`] with `envs` added to the job's environment.
fn run_with(
    binary: &Path,
    pes: usize,
    args: &[&str],
    timeout: &str,
    envs: &[(&str, &str)],
) -> Finished {
    run_launched(binary, pes, &[], args, timeout, envs)
}

/// [`run_with`] with `options` for hmrun itself (before the program).
fn run_launched(
    binary: &Path,
    pes: usize,
    options: &[&str],
    args: &[&str],
    timeout: &str,
    envs: &[(&str, &str)],
) -> Finished {
    let mut child = Command::new(hmrun())
        .args(["-n", &pes.to_string()])
        .args(options)
        .arg("--")
        .arg(binary)
        .args(args)
        .env("SHMEM_SYMMETRIC_SIZE", "32M")
        .env("HYPER_MULTICORE_SHMEM_TIMEOUT_SEC", timeout)
        .envs(envs.iter().copied())
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
    passes(name, &[1, 2, 4], &[]);
}

/// Compiles `name` and runs it on each of `pe_counts` PEs with `envs`; each run must succeed with
/// every PE passing.
fn passes(name: &str, pe_counts: &[usize], envs: &[(&str, &str)]) {
    passes_with_args(name, pe_counts, &[], envs);
}

/// [`passes`] with `args` on the program's command line.
fn passes_with_args(name: &str, pe_counts: &[usize], args: &[&str], envs: &[(&str, &str)]) {
    passes_launched(name, pe_counts, None, args, envs);
}

/// [`passes_with_args`], each PE started as `wrapper[0] wrapper[1..] PROGRAM ARGS` when a
/// wrapper (a tool such as valgrind) is given.
fn passes_launched(
    name: &str,
    pe_counts: &[usize],
    wrapper: Option<&[&str]>,
    args: &[&str],
    envs: &[(&str, &str)],
) {
    let program = compile(name);
    let binary = program.binary.to_str().expect("a UTF-8 temporary path");
    let (command, args) = match wrapper {
        Some([tool, flags @ ..]) => (
            PathBuf::from(tool),
            flags.iter().chain([&binary]).chain(args).copied().collect(),
        ),
        _ => (program.binary.clone(), args.to_vec()),
    };
    for &pes in pe_counts {
        let finished = run_with(&command, pes, &args, RUNTIME_TIMEOUT, envs);
        let passed = finished
            .stdout
            .lines()
            .filter(|line| line.ends_with(&format!("PASS {name}")))
            .count();
        assert!(
            finished.code == Some(0) && passed == pes,
            "{name} {args:?} on {pes} PEs: exit {:?}, {passed} of {pes} PEs passed\nstdout:\n{}\nstderr:\n{}",
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

/// Invalid team and context handles, invalid splits, zero-length calls with null pointers,
/// alignments above 2 MiB and bad ones, `shmem_pcontrol`, and OpenSHMEM 1.6's paired
/// initialization, finalized teams and re-initialization: each gets the standard's return.
#[test]
fn the_standard_error_returns_instead_of_aborts() {
    passes(
        "error_returns",
        &[1, 2, 4],
        &[("SHMEM_SYMMETRIC_SIZE", "32M")],
    );
}

/// The deprecated atomic names of every standard atomic type, typed and type-generic, both
/// forms of `shmem_sync`, and the C11 bitwise reductions of the signed fixed-width types.
#[test]
fn deprecated_and_alternative_names() {
    passes("deprecated_names", &[1, 2, 3, 4], &[]);
}

#[test]
fn symmetric_heap() {
    passes_on_1_2_4_pes("memory");
}

#[test]
fn rma_every_type() {
    passes_on_1_2_4_pes("rma_types");
}

/// Heap-to-heap put, get, put_signal, their `_nbi` forms and `iput`/`iget` move their bytes
/// once (the library's test-only copy counter: no bounce copy), with the local side in the heap
/// or in the data and bss, also overlapping on one PE; over shared memory and over UCX.
#[test]
fn heap_to_heap_rma_moves_the_bytes_once() {
    passes_on_1_2_4_pes("rma_one_copy");
    passes(
        "rma_one_copy",
        &[2, 3],
        &[("HYPER_MULTICORE_SHMEM_TRANSPORT", "ucx")],
    );
}

#[test]
fn atomics_every_type() {
    passes_on_1_2_4_pes("atomics_types");
}

#[test]
fn point_to_point_sync_every_type() {
    passes_on_1_2_4_pes("sync_types");
}

#[test]
fn locks_under_contention() {
    passes_on_1_2_4_pes("locks");
}

/// Runs `failures MODE` on one PE and checks that it exits with status 1 saying `text`.
fn alone_fails_saying(mode: &str, text: &str) {
    let program = compile("failures");
    let finished = run(&program.binary, 1, &[mode], "600");
    assert!(
        finished.code == Some(1) && finished.stderr.contains(text),
        "{mode}: {finished:?}"
    );
}

/// The process ids the PEs of a `failures` run printed.
fn pids(stdout: &str) -> Vec<u32> {
    stdout
        .lines()
        .filter_map(|line| line.split("PID ").nth(1))
        .map(|pid| pid.trim().parse().expect("a process id"))
        .collect()
}

/// Runs `failures MODE` on `pes` PEs with a runtime deadline far beyond the watchdog (so the job
/// can only end in time through the failure itself, never through a timeout); checks that it
/// failed with `code`, that every PE started, that no PE reached the end, and that no PE process
/// is left.
fn fails_fast(mode: &str, pes: usize, code: impl Fn(i32) -> bool, stderr_has_one_of: &[&str]) {
    let program = compile("failures");
    let finished = run(&program.binary, pes, &[mode], "600");
    let context = format!("{mode} on {pes} PEs: {finished:?}");
    assert!(
        finished.code.is_some_and(&code),
        "unexpected exit: {context}"
    );
    assert!(
        stderr_has_one_of
            .iter()
            .any(|text| finished.stderr.contains(text)),
        "{context}"
    );
    assert!(!finished.stdout.contains("reached the end"), "{context}");
    let pids = pids(&finished.stdout);
    assert_eq!(pids.len(), pes, "every PE must have started: {context}");
    for pid in pids {
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "PE process {pid} is still there: {context}"
        );
    }
}

#[test]
fn global_exit_from_one_pe_ends_the_job() {
    for pes in [1, 2, 4] {
        // The last PE ends every PE with 7 while the others wait in a barrier.
        fails_fast(
            "global_exit",
            pes,
            |code| code == 7,
            &["shmem_global_exit(7)"],
        );
    }
}

/// Runs `global_exit EXITER STATUS OTHERS` on `pes` PEs under `hmrun --timeout 60` (a runtime
/// deadline far beyond it, so only the global exit can end the job in time) and checks that
/// hmrun exited with `status`, that every PE ended having flushed the line it left in stdio's
/// buffer, that no PE went past its part or reported a failure (a lost peer, a timeout: only
/// the exiter's own line is on stderr), and that no PE process is left.
fn global_exit_ends_every_pe(
    pes: usize,
    exiter: usize,
    status: i32,
    others: &str,
    envs: &[(&str, &str)],
) {
    let program = compile("global_exit");
    let (exiter_arg, status_arg) = (exiter.to_string(), status.to_string());
    let args = [exiter_arg.as_str(), status_arg.as_str(), others];
    let options = ["--timeout", "60"];
    let finished = run_launched(&program.binary, pes, &options, &args, "600", envs);
    let context = format!("global_exit {args:?} on {pes} PEs, {envs:?}: {finished:?}");
    assert_eq!(finished.code, Some(status), "{context}");
    for pe in 0..pes {
        let line = format!("PE {pe} BUFFERED");
        assert!(
            finished.stdout.lines().any(|l| l.ends_with(&line)),
            "PE {pe} ended without flushing its output: {context}"
        );
    }
    assert!(!finished.stdout.contains("reached the end"), "{context}");
    let reports: Vec<&str> = finished
        .stderr
        .lines()
        .filter(|line| line.contains("hmshmem: "))
        .collect();
    let own = format!("hmshmem: PE {exiter}: shmem_global_exit({status}): ending the job");
    assert!(
        reports.len() == 1 && reports[0].ends_with(&own),
        "only the exiter's line: {context}"
    );
    let pids = pids(&finished.stdout);
    assert_eq!(pids.len(), pes, "every PE must have started: {context}");
    for pid in pids {
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "PE process {pid} is still there: {context}"
        );
    }
}

#[test]
fn global_exit_from_root_rank_0_ends_pes_waiting_in_a_barrier_with_its_status() {
    for pes in [2, 4] {
        global_exit_ends_every_pe(pes, 0, 0, "barrier", &[]);
    }
}

#[test]
fn global_exit_from_a_member_ends_pes_computing_without_calls_with_its_status() {
    for pes in [2, 4] {
        global_exit_ends_every_pe(pes, 1, 7, "compute", &[]);
    }
}

#[test]
fn global_exit_ends_every_pe_on_the_ucx_route() {
    // Every pair of PEs through UCX, as between hosts: no shared-memory abort word joins them.
    let ucx = [("HYPER_MULTICORE_SHMEM_TRANSPORT", "ucx")];
    global_exit_ends_every_pe(3, 1, 7, "barrier", &ucx);
    global_exit_ends_every_pe(2, 0, 0, "compute", &ucx);
}

#[test]
fn a_pe_killed_mid_wait_fails_the_job() {
    for pes in [2, 4] {
        // hmrun reports the first failure: the killed PE (137) or PE 0 leaving its wait (1).
        let lost = format!("peer lost: peer rank {} was lost", pes - 1);
        fails_fast(
            "kill",
            pes,
            |code| code == 137 || code == 1,
            &["killed by signal 9", &lost],
        );
    }
}

#[test]
fn a_non_symmetric_address_is_named() {
    for pes in [1, 2] {
        fails_fast(
            "not_symmetric",
            pes,
            |code| code == 1,
            &["shmem_int_put: address 0x"],
        );
    }
}

/// Every PE under valgrind's memcheck: no memory error in the library (valgrind exits 97 on
/// one), on both routes; the data and bss stay private on every PE (valgrind cannot make the
/// mapping), which the program checks the library reports. scripts/install_system_packages.sh
/// installs valgrind.
#[test]
fn runs_clean_under_valgrind_memcheck() {
    let valgrind = ["valgrind", "-q", "--error-exitcode=97"];
    let found = Command::new(valgrind[0]).arg("--version").output();
    assert!(
        found.is_ok_and(|output| output.status.success()),
        "valgrind is not installed: run scripts/install_system_packages.sh"
    );
    for transport in ["shm", "ucx"] {
        passes_launched(
            "under_valgrind",
            &[1, 2, 3],
            Some(&valgrind),
            &[],
            &[("HYPER_MULTICORE_SHMEM_TRANSPORT", transport)],
        );
    }
}

#[test]
fn global_and_static_variables_are_symmetric() {
    passes_on_1_2_4_pes("static_data");
}

#[test]
fn collectives_team_and_legacy_forms() {
    passes_on_1_2_4_pes("collectives");
}

#[test]
fn contexts_every_type() {
    passes_on_1_2_4_pes("contexts");
}

#[test]
fn shmem_malloc_sizes_that_differ_fail_every_pe() {
    fails_fast(
        "malloc_sizes",
        2,
        |code| code == 1,
        &["PE 0: shmem_malloc: ", "PE 1: shmem_malloc: "],
    );
}

#[test]
fn an_active_set_past_the_last_pe_fails_every_pe() {
    // PE_start 0, logPE_stride 1, PE_size n reaches PE 2(n-1): past the last PE from 2 PEs on.
    fails_fast(
        "active_set",
        2,
        |code| code == 1,
        &[
            "PE 0: shmem_barrier: the active set (PE_start 0, logPE_stride 1, PE_size 2)",
            "PE 1: shmem_barrier: the active set (PE_start 0, logPE_stride 1, PE_size 2)",
        ],
    );
}

#[test]
fn a_heap_restart_naming_no_block_start_fails_every_pe() {
    // A program bug found by each PE before any collective work: each ends with its own line.
    fails_fast(
        "restart_block",
        2,
        |code| code == 1,
        &[
            "PE 0: shmemx_restart_heap: replacement 0: address 0x",
            "PE 1: shmemx_restart_heap: replacement 0: address 0x",
        ],
    );
}

#[test]
fn freeing_what_shmem_malloc_did_not_return_fails_every_pe() {
    // An address inside a block: named, and the block's start asked for.
    fails_fast(
        "free_inside",
        2,
        |code| code == 1,
        &[
            "PE 0: shmem_free: address 0x",
            "PE 1: shmem_free: address 0x",
        ],
    );
    alone_fails_saying(
        "free_inside",
        "is not the start of a shmem_malloc allocation; pass the pointer",
    );
    // Private memory: said to be neither heap nor data and bss.
    alone_fails_saying("free_private", "is not symmetric");
}

#[test]
fn a_freed_block_used_again_fails_every_pe() {
    // The block was located (and cached) by the first add; the second is refused.
    fails_fast(
        "freed",
        2,
        |code| code == 1,
        &[
            "PE 0: shmem_long_atomic_fetch_add: bytes 0x",
            "PE 1: shmem_long_atomic_fetch_add: bytes 0x",
        ],
    );
    alone_fails_saying(
        "freed",
        "are not inside one live shmem_malloc allocation (freed",
    );
}

#[test]
fn bytes_past_a_block_and_a_pe_past_the_last_fail_every_pe() {
    fails_fast(
        "past_end",
        2,
        |code| code == 1,
        &[
            "PE 0: shmem_putmem: bytes 0x",
            "PE 1: shmem_putmem: bytes 0x",
        ],
    );
    alone_fails_saying(
        "past_end",
        "run past the end of the symmetric block they start in",
    );
    fails_fast(
        "bad_pe",
        2,
        |code| code == 1,
        &[
            "PE 0: shmem_long_p: PE 2 does not exist: the job has PEs 0..2",
            "PE 1: shmem_long_p: PE 2 does not exist: the job has PEs 0..2",
        ],
    );
}

#[test]
fn a_misaligned_word_fails_every_pe_naming_its_alignment() {
    // The aligned add located (and cached) the block; the misaligned one is in the same block.
    fails_fast(
        "misaligned",
        2,
        |code| code == 1,
        &[
            "PE 0: shmem_long_atomic_fetch_add: atomic_fetch_add failed on rank 0: invalid \
             argument: the 8-byte word at heap offset",
            "PE 1: shmem_long_atomic_fetch_add: atomic_fetch_add failed on rank 1: invalid \
             argument: the 8-byte word at heap offset",
        ],
    );
    alone_fails_saying("misaligned", "is not naturally aligned");
    alone_fails_saying("misaligned_wait", "is not naturally aligned");
}

#[test]
fn reductions_every_operator_and_type_on_teams_and_active_sets() {
    passes_on_1_2_4_pes("reductions");
}

/// Every collective (team, split-team and active-set forms) at odd sizes — 0, 1 and 7 bytes,
/// and past the runtime's size thresholds — on 1 to 5 PEs, against references the program
/// computes; and with every pair over UCX (peers not mapped).
#[test]
fn every_collective_at_odd_sizes_and_pe_counts() {
    passes("collectives_sizes", &[1, 2, 3, 4, 5], &[]);
    let ucx = [("HYPER_MULTICORE_SHMEM_TRANSPORT", "ucx")];
    passes("collectives_sizes", &[3], &ucx);
}

#[test]
fn legacy_collectives_on_active_sets_of_some_pes() {
    passes_on_1_2_4_pes("active_sets");
}

#[test]
fn teams_split_and_their_collectives() {
    passes_on_1_2_4_pes("teams");
}

#[test]
fn the_shared_team_is_the_pes_whose_memory_is_mapped() {
    passes_with_args("team_shared", &[1, 2, 4], &["all"], &[]);
    // Every pair through UCX, as between hosts: each PE is a team of one.
    let ucx = [("HYPER_MULTICORE_SHMEM_TRANSPORT", "ucx")];
    passes_with_args("team_shared", &[2], &["alone"], &ucx);
}

/// The heap of `restart_heap` before its restarts (MiB).
const RESTART_FROM: &str = "8M";

#[test]
fn heap_restart_grown_in_place_keeps_heap_and_static_data() {
    // 8 → 16 MiB (plus the data and bss on both): within twice the old heap, the runtime grows
    // it in the same memfd.
    let from = [("SHMEM_SYMMETRIC_SIZE", RESTART_FROM)];
    passes_with_args("restart_heap", &[1, 2, 4], &["16"], &from);
}

#[test]
fn heap_restart_into_a_new_segment_keeps_heap_and_static_data() {
    // 8 → 64 MiB: beyond twice the old heap, the runtime makes a new memfd and copies.
    let from = [("SHMEM_SYMMETRIC_SIZE", RESTART_FROM)];
    passes_with_args("restart_heap", &[2], &["64"], &from);
    let ucx = [from[0], ("HYPER_MULTICORE_SHMEM_TRANSPORT", "ucx")];
    passes_with_args("restart_heap", &[2], &["64"], &ucx);
}

#[test]
fn every_family_on_the_ucx_route() {
    // Every pair of PEs through UCX, as between hosts: heap and static data alike (the static
    // data is a heap allocation, registered with the heap).
    let ucx = [("HYPER_MULTICORE_SHMEM_TRANSPORT", "ucx")];
    for name in [
        "rma_types",
        "atomics_types",
        "sync_types",
        "static_data",
        "collectives",
        "reductions",
        "locks",
    ] {
        passes(name, &[2], &ucx);
    }
}

/// The output of `pkg-config ARGS hmshmem` against the build's `pkgconfig/hmshmem.pc`, split
/// into flags.
fn pkg_config(args: &[&str]) -> Vec<String> {
    let output = Command::new("pkg-config")
        .args(args)
        .arg("hmshmem")
        .env("PKG_CONFIG_PATH", profile_dir().join("pkgconfig"))
        .output()
        .expect("run pkg-config (install it: apt-get install pkg-config)");
    assert!(
        output.status.success(),
        "pkg-config {args:?} hmshmem failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout)
        .expect("pkg-config prints text")
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

#[test]
fn a_static_link_through_pkg_config_runs() {
    // `pkg-config --static --libs` with `-lhmshmem` asking for the archive (`-l:libhmshmem.a`,
    // as docs/c-api.md shows): the .pc file's Libs.private must name every system library the
    // archive needs, or the link fails.
    let cflags = pkg_config(&["--cflags"]);
    let libs: Vec<String> = pkg_config(&["--static", "--libs"])
        .into_iter()
        .map(|flag| match flag.as_str() {
            "-lhmshmem" => "-l:libhmshmem.a".to_string(),
            _ => flag,
        })
        .collect();
    assert!(
        libs.iter().any(|flag| flag == "-l:libhmshmem.a"),
        "{libs:?}"
    );
    let out_dir = std::env::temp_dir().join(format!("hmshmem-c-static-{}", std::process::id()));
    std::fs::create_dir_all(&out_dir).unwrap();
    let program = Program {
        binary: out_dir.join("static_link"),
        dir: out_dir,
    };
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/static_link.c");
    let output = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(["-std=c11", "-Wall", "-Werror", "-o"])
        .arg(&program.binary)
        .arg(&source)
        .args(&cflags)
        .args(&libs)
        .output()
        .expect("run cc");
    assert!(
        output.status.success(),
        "cc {} {cflags:?} {libs:?} failed:\n{}",
        source.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    // Linked statically: the program does not load the shared library.
    let binary = std::fs::read(&program.binary).unwrap();
    assert!(
        !binary.windows(13).any(|w| w == b"libhmshmem.so"),
        "the program still names libhmshmem.so"
    );
    let pes = 2;
    let finished = run(&program.binary, pes, &[], RUNTIME_TIMEOUT);
    let passed = finished
        .stdout
        .lines()
        .filter(|line| line.ends_with("PASS static_link"))
        .count();
    assert!(
        finished.code == Some(0) && passed == pes,
        "static_link on {pes} PEs: {finished:?}"
    );
}

/// `CC=hmcc ./configure` (how autotools suites are built) exports `CC=hmcc` to the build: hmcc
/// must not then run itself as the compiler (it recursed forever), and `HMCC_CC` picks one.
#[test]
fn hmcc_never_runs_itself_as_the_compiler() {
    let hmcc = env!("CARGO_BIN_EXE_hmcc");
    let first_word = |envs: &[(&str, &str)]| {
        let output = Command::new(hmcc)
            .args(["--showme", "prog.c"])
            .env_remove("HMCC_CC")
            .envs(envs.iter().copied())
            .output()
            .expect("run hmcc --showme");
        assert!(output.status.success(), "{output:?}");
        let line = String::from_utf8(output.stdout).expect("UTF-8");
        line.split_whitespace()
            .next()
            .unwrap_or_default()
            .to_string()
    };
    assert_eq!(first_word(&[("CC", hmcc)]), "cc");
    assert_eq!(first_word(&[("CC", "hmcc")]), "cc");
    assert_eq!(first_word(&[("CC", "gcc")]), "gcc");
    assert_eq!(first_word(&[("CC", hmcc), ("HMCC_CC", "clang")]), "clang");
}
