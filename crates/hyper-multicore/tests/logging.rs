//! The runtime's log output across real processes: at `debug`, every line carries the PE's
//! rank, and lifecycle stages, restarts and allocation call sites are logged.

use hm_testkit::{is_pe, Job, Options};
use hyper_multicore::config::LOG_LEVEL;
use hyper_multicore::lifecycle::{self, Replacement};
use hyper_multicore::shmem::{AllocationSpec, Dtype, Symmetric};

const MIB: u64 = 1 << 20;

#[test]
fn debug_logs_name_the_rank_the_stages_and_the_allocation_sites() {
    if is_pe() {
        lifecycle::acquire(None, Some(4 * MIB)).unwrap();
        let data = lifecycle::guarded("allocate", |shmem| shmem.allocate::<u64>(8, None)).unwrap();
        let target = AllocationSpec {
            shape: vec![16],
            dtype: Dtype::U64,
            alignment: None,
        };
        let replacement = Replacement {
            current: data.region(),
            target,
            preserve: false,
        };
        let result = lifecycle::restart(8 * MIB, &[replacement], None).unwrap();
        lifecycle::guarded("free", |shmem| shmem.free_id(result.allocations[0].id)).unwrap();
        lifecycle::release().unwrap();
        return;
    }
    let options = Options::default().env(LOG_LEVEL, "debug");
    let job = Job::launch_with(
        stringify!(debug_logs_name_the_rank_the_stages_and_the_allocation_sites),
        2,
        options,
    )
    .wait();
    job.assert_all_succeeded();
    for pe in &job.pes {
        let prefix = format!("[pe {}] ", pe.rank);
        let lines: Vec<&str> = pe.stderr.lines().filter(|l| l.contains("DEBUG")).collect();
        assert!(!lines.is_empty(), "{}", job.describe());
        assert!(
            lines.iter().all(|l| l.starts_with(&prefix)),
            "{}",
            job.describe()
        );
        let has = |needle: &str| lines.iter().any(|l| l.contains(needle));
        assert!(
            has("restart: stage Preflight converged"),
            "{}",
            job.describe()
        );
        assert!(
            has("release: stage Shutdown converged"),
            "{}",
            job.describe()
        );
        assert!(
            has("restart to a heap of 8388608 bytes"),
            "{}",
            job.describe()
        );
        assert!(has("tests/logging.rs:"), "{}", job.describe());
    }
}
