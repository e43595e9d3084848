//! The harness itself: a job whose PEs did not run the named test fails, whatever their exit
//! status says.

use hm_testkit::{is_pe, Job};

/// A PE that ran the named test passes the check.
#[test]
fn a_job_whose_pes_ran_the_test_passes() {
    if is_pe() {
        return;
    }
    Job::launch(stringify!(a_job_whose_pes_ran_the_test_passes), 2)
        .wait()
        .assert_all_succeeded();
}

/// A child test name that matches nothing makes every PE run zero tests and exit 0: the job
/// must fail instead of passing vacuously.
#[test]
#[should_panic(expected = "PEs ran no test named")]
fn a_wrong_child_test_name_fails_the_job() {
    if is_pe() {
        return;
    }
    Job::launch("no_test_has_this_name", 2).wait();
}

/// An `#[ignore]`d test is announced by libtest but not run: a job of it fails too.
#[test]
#[should_panic(expected = "PEs ran no test named")]
fn a_child_test_that_is_ignored_fails_the_job() {
    if is_pe() {
        return;
    }
    Job::launch(stringify!(ignored_child), 2).wait();
}

/// Never run by the harness itself (ignored): the child of the test above.
#[test]
#[ignore = "the child of a_child_test_that_is_ignored_fails_the_job"]
fn ignored_child() {}
