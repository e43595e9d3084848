//! hmrun running real hyper_multicore PEs: this test binary re-executes itself under hmrun.

use std::os::unix::process::ExitStatusExt;

use hm_testkit::{is_pe, PE_VARIABLE};
use hyper_multicore::world::World;
use hyper_multicore::ErrorKind;

use crate::support::{assert_nothing_left, start};

/// Each PE allgathers in a loop; rank 2 SIGKILLs itself at round 3, so the others are inside
/// an allgather when it dies. A survivor reports the error and exits 1.
fn pe_body() {
    let world = World::from_env().unwrap();
    for round in 0u32.. {
        if round == 3 && world.rank() == 2 {
            let me = rustix::process::getpid();
            rustix::process::kill_process(me, rustix::process::Signal::KILL).unwrap();
        }
        if let Err(error) = world.control().allgather(&round.to_le_bytes()) {
            assert_eq!(error.kind(), ErrorKind::PeerLost);
            println!("LOST peer={:?}", error.peer());
            std::process::exit(1);
        }
    }
}

#[test]
fn a_killed_pe_fails_the_job_and_leaves_nothing_behind() {
    if is_pe() {
        pe_body();
        return;
    }
    let test_binary = std::env::current_exe().unwrap();
    let test_binary = test_binary.to_str().unwrap();
    let args = [
        "-n",
        "4",
        "--",
        test_binary,
        "runtime_job::a_killed_pe_fails_the_job_and_leaves_nothing_behind",
        "--exact",
        "--nocapture",
        "-q",
    ];
    let finished = start("runtime-kill", &args, &[(PE_VARIABLE, "1")]).finish();
    // The first failure is either the killed rank (137) or a survivor that noticed it (1);
    // whichever hmrun saw first, the job failed and every rank is gone.
    assert!(
        matches!(finished.code(), 137 | 1),
        "unexpected exit: {finished:?}"
    );
    assert!(finished.status.signal().is_none());
    assert_nothing_left(&finished.marker);
}
