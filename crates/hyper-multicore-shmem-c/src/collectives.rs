//! Collectives, each one of the runtime's own over every PE: barrier and sync, broadcast,
//! fcollect (the runtime's all-gather), alltoall and the sum/min/max reductions, in the team
//! forms (`SHMEM_TEAM_WORLD`, and `SHMEM_TEAM_SHARED` when every PE shares this host) and the
//! legacy active-set forms (`pSync`/`pWrk`) when the active set is every PE. Other teams and
//! active sets are refused with an error naming what is missing.

use std::ffi::{c_int, c_long};

use hyper_multicore::shmem::{ReduceOp, Reducible};

use crate::failure::fail;
use crate::job::{self, At};
use crate::sys::caller_memory::CallerBuffer;

/// The handle of `SHMEM_TEAM_WORLD`.
pub const TEAM_WORLD: usize = 1;
/// The handle of `SHMEM_TEAM_SHARED`.
pub const TEAM_SHARED: usize = 2;

/// Checks that `team` is a team this library runs collectives on (every PE).
pub(crate) fn check_team(call: &str, team: usize) {
    match team {
        TEAM_WORLD => {}
        TEAM_SHARED => {
            let whole = job::run(call, |shmem| Ok(shmem.local_pes() == shmem.size()));
            if !whole {
                fail(
                    call,
                    "SHMEM_TEAM_SHARED spans only this host's PEs, and teams other than every PE \
                     are not supported yet (docs/c-api.md); use SHMEM_TEAM_WORLD",
                );
            }
        }
        other => fail(
            call,
            format!(
                "team handle {other:#x} is not SHMEM_TEAM_WORLD or SHMEM_TEAM_SHARED; other \
                 teams are not supported yet (docs/c-api.md)"
            ),
        ),
    }
}

/// Checks that a legacy active set (`PE_start`, `logPE_stride`, `PE_size`) is every PE.
pub(crate) fn check_active_set(call: &str, start: c_int, log_stride: c_int, size: c_int) {
    let n = job::n_pes(call);
    let every_pe = start == 0 && usize::try_from(size).is_ok_and(|s| s == n);
    if !every_pe || !(0..31).contains(&log_stride) {
        fail(
            call,
            format!(
                "the active set (PE_start {start}, logPE_stride {log_stride}, PE_size {size}) is \
                 not every PE (0, any stride, {n}); active sets of some PEs are not supported yet \
                 (docs/c-api.md)"
            ),
        );
    }
}

/// Copies `source` (`bytes` bytes, on PE `root`) into every PE's `dest`.
pub(crate) fn broadcast(call: &str, dest: usize, source: CallerBuffer, root: c_int) {
    let root = job::target_pe(call, root);
    source.with_source(|bytes| {
        let target = At(job::region(call, dest, bytes.len()));
        job::run(call, |shmem| shmem.broadcast::<u8>(&target, bytes, root));
    });
}

/// The legacy broadcast: as [`broadcast`], but the root's `dest` keeps its contents (the
/// active-set form never writes it).
pub(crate) fn broadcast_keeping_root(call: &str, dest: usize, source: CallerBuffer, root: c_int) {
    let root_pe = job::target_pe(call, root);
    let me = job::my_pe(call);
    let kept = (me == root_pe).then(|| {
        let mut bytes = Vec::new();
        source.with_source(|s| bytes.resize(s.len(), 0));
        let region = job::region(call, dest, bytes.len());
        job::run(call, |shmem| shmem.get_bytes(&mut bytes, region, me));
        (region, bytes)
    });
    broadcast(call, dest, source, root);
    if let Some((region, bytes)) = kept {
        job::run(call, |shmem| shmem.put_bytes(region, &bytes, me));
    }
}

/// Gathers every PE's `source` into every PE's `dest`, in PE order.
pub(crate) fn fcollect(call: &str, dest: usize, source: CallerBuffer) {
    source.with_source(|bytes| {
        let size = job::n_pes(call);
        let target = At(job::region(call, dest, bytes.len() * size));
        job::run(call, |shmem| shmem.all_gather::<u8>(&target, bytes));
    });
}

/// Gathers every PE's `source` (its own length on each PE) into every PE's `dest`, in PE order:
/// the lengths go round the control plane, then each PE puts its block at its place in every
/// PE's `dest` and all meet at the barrier.
pub(crate) fn collect(call: &str, dest: usize, source: CallerBuffer) {
    source.with_source(|bytes| {
        let lengths: Vec<usize> = job::run(call, |shmem| {
            let parts = shmem
                .control()
                .allgather(&(bytes.len() as u64).to_le_bytes())?;
            Ok(parts
                .iter()
                .map(|part| {
                    let word: [u8; 8] = part.as_slice().try_into().unwrap_or_default();
                    u64::from_le_bytes(word) as usize
                })
                .collect())
        });
        let me = job::my_pe(call);
        let before: usize = lengths[..me].iter().sum();
        job::region(call, dest, lengths.iter().sum());
        let block = job::region(call, dest + before, bytes.len());
        job::run(call, |shmem| {
            (0..shmem.size()).try_for_each(|pe| shmem.put_bytes(block, bytes, pe))?;
            shmem.barrier()
        });
    });
}

/// Strided all-to-all: for every PE `j`, the `nelems` elements of `size` bytes of block `j` of
/// `source` (`sst` elements apart) go to block `my_pe` of PE `j`'s `dest` (`dst` apart).
pub(crate) fn alltoalls(
    call: &str,
    dest: usize,
    source: CallerBuffer,
    [dst, sst]: [isize; 2],
    size: usize,
    nelems: usize,
) {
    let me = job::my_pe(call);
    let block = crate::rma::strided_bytes(call, nelems, sst, size);
    for pe in 0..job::n_pes(call) {
        let first = pe * nelems * sst as usize * size;
        let part = source.part(first, block);
        let target = dest + me * nelems * dst as usize * size;
        crate::rma::iput(call, target, part, [dst, sst], size, nelems, pe as c_int);
    }
    job::run(call, |shmem| shmem.barrier());
}

/// Sends block `j` of `source` to PE `j`, which stores it as block `my_pe` of its `dest`.
pub(crate) fn alltoall(call: &str, dest: usize, source: CallerBuffer) {
    source.with_source(|bytes| {
        let target = At(job::region(call, dest, bytes.len()));
        job::run(call, |shmem| shmem.all_to_all::<u8>(&target, bytes));
    });
}

/// Combines every PE's `nreduce` elements at `source` with `op` into every PE's `dest`.
pub(crate) fn reduce<T: Reducible>(
    call: &str,
    dest: usize,
    source: usize,
    nreduce: usize,
    op: ReduceOp,
) {
    let bytes = crate::rma::bytes(call, nreduce, std::mem::size_of::<T>());
    let target = At(job::region(call, dest, bytes));
    let source = At(job::region(call, source, bytes));
    job::run(call, |shmem| shmem.all_reduce::<T>(&target, &source, op));
}

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

/// Collective over `team`: [`shmem_sync_all`].
#[no_mangle]
pub extern "C" fn shmem_team_sync(team: usize) -> c_int {
    const CALL: &str = "shmem_team_sync";
    check_team(CALL, team);
    job::run(CALL, |shmem| shmem.barrier());
    0
}

/// This PE's number in `team`.
#[no_mangle]
pub extern "C" fn shmem_team_my_pe(team: usize) -> c_int {
    const CALL: &str = "shmem_team_my_pe";
    check_team(CALL, team);
    job::my_pe(CALL) as c_int
}

/// The number of PEs in `team`.
#[no_mangle]
pub extern "C" fn shmem_team_n_pes(team: usize) -> c_int {
    const CALL: &str = "shmem_team_n_pes";
    check_team(CALL, team);
    job::n_pes(CALL) as c_int
}

/// Legacy barrier over an active set (every PE only); `pSync` is not needed.
#[no_mangle]
pub extern "C" fn shmem_barrier(
    start: c_int,
    log_stride: c_int,
    size: c_int,
    _p_sync: *mut c_long,
) {
    const CALL: &str = "shmem_barrier";
    check_active_set(CALL, start, log_stride, size);
    job::run(CALL, |shmem| shmem.barrier());
}

/// Collective: `nelems` bytes of `source` on PE `root` into every PE's `dest` (0: success).
///
/// # Safety
/// `dest` symmetric; `source` valid for `nelems` bytes.
#[no_mangle]
pub unsafe extern "C" fn shmem_broadcastmem(
    team: usize,
    dest: *mut std::ffi::c_void,
    source: *const std::ffi::c_void,
    nelems: usize,
    root: c_int,
) -> c_int {
    const CALL: &str = "shmem_broadcastmem";
    check_team(CALL, team);
    // SAFETY: `source` holds `nelems` bytes (function contract).
    let source = unsafe { CallerBuffer::new(source.cast(), nelems) };
    broadcast(CALL, dest as usize, source, root);
    0
}

/// Collective: every PE's `nelems` bytes of `source` into every PE's `dest`, in PE order.
///
/// # Safety
/// `dest` symmetric, `n_pes × nelems` bytes; `source` valid for `nelems` bytes.
#[no_mangle]
pub unsafe extern "C" fn shmem_fcollectmem(
    team: usize,
    dest: *mut std::ffi::c_void,
    source: *const std::ffi::c_void,
    nelems: usize,
) -> c_int {
    const CALL: &str = "shmem_fcollectmem";
    check_team(CALL, team);
    // SAFETY: `source` holds `nelems` bytes (function contract).
    let source = unsafe { CallerBuffer::new(source.cast(), nelems) };
    fcollect(CALL, dest as usize, source);
    0
}

/// Collective: every PE's `nelems` bytes (its own count) of `source` into every PE's `dest`,
/// in PE order (0: success).
///
/// # Safety
/// `dest` symmetric and large enough for every PE's block; `source` valid for `nelems` bytes.
#[no_mangle]
pub unsafe extern "C" fn shmem_collectmem(
    team: usize,
    dest: *mut std::ffi::c_void,
    source: *const std::ffi::c_void,
    nelems: usize,
) -> c_int {
    const CALL: &str = "shmem_collectmem";
    check_team(CALL, team);
    // SAFETY: `source` holds `nelems` bytes (function contract).
    let source = unsafe { CallerBuffer::new(source.cast(), nelems) };
    collect(CALL, dest as usize, source);
    0
}

/// Collective: strided alltoall of bytes (`sst` apart in `source`, `dst` apart in `dest`).
///
/// # Safety
/// `dest` symmetric; `source` valid for `n_pes × nelems` bytes `sst` apart.
#[no_mangle]
pub unsafe extern "C" fn shmem_alltoallsmem(
    team: usize,
    dest: *mut std::ffi::c_void,
    source: *const std::ffi::c_void,
    dst: isize,
    sst: isize,
    nelems: usize,
) -> c_int {
    const CALL: &str = "shmem_alltoallsmem";
    check_team(CALL, team);
    let elements = crate::rma::bytes(CALL, nelems, job::n_pes(CALL));
    let bytes = crate::rma::strided_bytes(CALL, elements, sst, 1);
    // SAFETY: `source` holds the strided bytes (function contract).
    let source = unsafe { CallerBuffer::new(source.cast(), bytes) };
    alltoalls(CALL, dest as usize, source, [dst, sst], 1, nelems);
    0
}

/// Collective: block `j` (`nelems` bytes) of `source` to PE `j`'s `dest` block `my_pe`.
///
/// # Safety
/// `dest` symmetric, `source` valid; both `n_pes × nelems` bytes.
#[no_mangle]
pub unsafe extern "C" fn shmem_alltoallmem(
    team: usize,
    dest: *mut std::ffi::c_void,
    source: *const std::ffi::c_void,
    nelems: usize,
) -> c_int {
    const CALL: &str = "shmem_alltoallmem";
    check_team(CALL, team);
    let bytes = crate::rma::bytes(CALL, nelems, job::n_pes(CALL));
    // SAFETY: `source` holds `n_pes × nelems` bytes (function contract).
    let source = unsafe { CallerBuffer::new(source.cast(), bytes) };
    alltoall(CALL, dest as usize, source);
    0
}
