//! Collectives over every PE (`SHMEM_TEAM_WORLD`): the barrier and sync, on the runtime's
//! shared-memory barrier.

/// Collective: completes this PE's outstanding operations and waits for every PE.
#[no_mangle]
pub extern "C" fn shmem_barrier_all() {
    crate::job::run("shmem_barrier_all", |shmem| shmem.barrier());
}

/// Collective: waits for every PE (the runtime's barrier also completes outstanding
/// operations, which the standard allows).
#[no_mangle]
pub extern "C" fn shmem_sync_all() {
    crate::job::run("shmem_sync_all", |shmem| shmem.barrier());
}
