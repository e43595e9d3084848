//! Collectives: barrier and sync, broadcast, collect, fcollect, alltoall(s) and the reductions,
//! in the team forms and the legacy active-set forms (`pSync`/`pWrk`, not needed).
//!
//! Each is the runtime's collective over the team's PEs ([`ReduceSet`]: the whole root for
//! `SHMEM_TEAM_WORLD`, else the world subgroup of a split team or of a legacy active set of some
//! PEs, a team of its own: [`active_set`]). The source goes to the runtime as the symmetric
//! range it is (`sys/collective_source.rs`), so on one host the bytes move once, heap to heap,
//! and the team meets in shared memory (see the runtime's `shmem/collectives.rs` and
//! `shmem/reduce.rs` for the algorithms).

use std::ffi::{c_int, c_long};

use hyper_multicore::shmem::{
    AllocationId, Contribution, ReduceOp, ReduceSet, Reducible, Region, RootTarget,
};
use hyper_multicore::{Error, ErrorKind};

use crate::failure::fail;
use crate::job;
use crate::sys::collective_source::CollectiveSource;
use crate::sys::long_double;
use crate::teams::{self, Team};

/// The team of a legacy active set (`PE_start`, `logPE_stride`, `PE_size`): PEs `PE_start`,
/// `PE_start + 2^logPE_stride`, … (`PE_size` of them); this PE must be one. Every PE in order
/// is `SHMEM_TEAM_WORLD`; any other set is the world's subgroup of those PEs (formed on first
/// use by them, reused afterwards).
pub(crate) fn active_set(call: &str, start: c_int, log_stride: c_int, size: c_int) -> Team {
    let n = job::n_pes(call);
    let picked: Option<Vec<usize>> = (|| {
        let start = usize::try_from(start).ok()?;
        let stride = 1usize.checked_shl(u32::try_from(log_stride).ok().filter(|&l| l < 31)?)?;
        let size = usize::try_from(size).ok().filter(|&s| s > 0)?;
        (0..size)
            .map(|i| Some(start + i * stride).filter(|&pe| pe < n))
            .collect()
    })();
    let Some(pes) = picked else {
        fail(
            call,
            format!(
                "the active set (PE_start {start}, logPE_stride {log_stride}, PE_size {size}) \
                 does not pick PEs of the job's {n}: PE_start must be at least 0, PE_size at least 1, \
                 logPE_stride within 0..31 and the last PE below {n}"
            ),
        );
    };
    if !pes.contains(&job::my_pe(call)) {
        fail(
            call,
            format!(
                "this PE is not in the active set (PE_start {start}, logPE_stride {log_stride}, \
                 PE_size {size}); only its PEs call the collective"
            ),
        );
    }
    if pes.len() == n {
        return Team::World;
    }
    Team::Some(teams::members(call, pes))
}

/// This PE's number in `team` (fails if it is not a member).
fn member(call: &str, team: &Team) -> usize {
    team.my_pe(call)
        .unwrap_or_else(|| fail(call, "this PE is not a member of the team"))
}

/// The world PE of the team's PE `root` (fails if there is none).
fn root_pe(call: &str, team: &Team, root: c_int) -> usize {
    let size = team.size(call);
    match usize::try_from(root).ok().filter(|&r| r < size) {
        Some(root) => team.world_pe(call, root),
        None => fail(
            call,
            format!("root {root} is not a PE of the team's {size}"),
        ),
    }
}

/// Copies `source` (on the team's PE `root`) into every team PE's `dest`, the root's own too.
/// Zero bytes: nothing (every PE passes the same count), whatever the pointers — as for every
/// collective here.
pub(crate) fn broadcast(
    call: &str,
    team: &Team,
    dest: usize,
    source: CollectiveSource,
    root: c_int,
) {
    broadcast_to(call, team, dest, source, root, RootTarget::Receives);
}

/// The legacy broadcast: as [`broadcast`], but the root's `dest` keeps its contents (the
/// active-set form never writes it).
pub(crate) fn broadcast_keeping_root(
    call: &str,
    team: &Team,
    dest: usize,
    source: CollectiveSource,
    root: c_int,
) {
    broadcast_to(call, team, dest, source, root, RootTarget::Keeps);
}

/// [`broadcast`] doing `root_target` with the root's `dest`. Only the root reads its `source`.
fn broadcast_to(
    call: &str,
    team: &Team,
    dest: usize,
    source: CollectiveSource,
    root: c_int,
    root_target: RootTarget,
) {
    let root = root_pe(call, team, root);
    member(call, team);
    if source.len() == 0 {
        return;
    }
    let target = job::region(call, dest, source.len());
    let set = team.set();
    let run = |source: Contribution<'_>| {
        job::run(call, |shmem| {
            shmem.broadcast_bytes(set, target, source, root, root_target)
        })
    };
    if job::my_pe(call) == root {
        source.with(run);
    } else {
        run(Contribution::Local(&[]));
    }
}

/// Gathers every team PE's `source` (the same length on each) into every team PE's `dest`, in
/// team order.
pub(crate) fn fcollect(call: &str, team: &Team, dest: usize, source: CollectiveSource) {
    member(call, team);
    if source.len() == 0 {
        return;
    }
    let total = crate::rma::bytes(call, source.len(), team.size(call));
    let target = job::region(call, dest, total);
    let set = team.set();
    source.with(|source| job::run(call, |shmem| shmem.all_gather_bytes(set, target, source)));
}

/// Gathers every team PE's `source` (its own length on each PE) into every team PE's `dest`, in
/// team order: the lengths go through the team PEs' shared words where the team is on one host
/// (round the control plane otherwise), then each PE copies its block to its place in every
/// team PE's `dest` and all meet.
pub(crate) fn collect(call: &str, team: &Team, dest: usize, source: CollectiveSource) {
    member(call, team);
    // From `dest` to the end of its block: the most the gathered bytes may fill (a total of
    // zero touches nothing, so `dest` may be anything then).
    let found = job::region_to_end(dest);
    let target = found.unwrap_or(Region {
        id: AllocationId {
            index: u64::MAX,
            generation: 0,
        },
        heap_offset: 0,
        bytes: 0,
    });
    let set = team.set();
    source.with(|source| {
        job::run(call, |shmem| {
            shmem.collect_bytes(set, target, source).map_err(|error| {
                match (found, error.kind(), error.rank()) {
                    (None, ErrorKind::InvalidArgument, Some(rank)) => Error::new(
                        error.kind(),
                        error.operation(),
                        format!(
                            "{}; dest {dest:#x} is not symmetric (memory from shmem_malloc, or \
                             a global or static variable)",
                            error.message()
                        ),
                    )
                    .on_rank(rank),
                    _ => error,
                }
            })
        })
    });
}

/// Strided all-to-all: for every team PE `j`, the `nelems` elements of `size` bytes of block `j`
/// of `source` (`sst` elements apart) go to block `my_pe` of PE `j`'s `dest` (`dst` apart).
pub(crate) fn alltoalls(
    call: &str,
    team: &Team,
    dest: usize,
    source: CollectiveSource,
    [dst, sst]: [isize; 2],
    size: usize,
    nelems: usize,
) {
    member(call, team);
    if nelems == 0 {
        return;
    }
    let count = crate::rma::bytes(call, nelems, team.size(call));
    let target = job::region(
        call,
        dest,
        crate::rma::strided_bytes(call, count, dst, size),
    );
    // Both strides are positive (`strided_bytes` checked them).
    let strides = [dst as usize, sst as usize];
    let set = team.set();
    source.with(|source| {
        job::run(call, |shmem| {
            shmem.all_to_all_strided(set, target, source, strides, size, nelems)
        })
    });
}

/// Sends block `j` of `source` to team PE `j`, which stores it as block `my_pe` of its `dest`.
pub(crate) fn alltoall(call: &str, team: &Team, dest: usize, source: CollectiveSource) {
    member(call, team);
    if source.len() == 0 {
        return;
    }
    let target = job::region(call, dest, source.len());
    let set = team.set();
    source.with(|source| job::run(call, |shmem| shmem.all_to_all_bytes(set, target, source)));
}

/// Combines every team PE's `nreduce` elements at `source` with `op` into every team PE's
/// `dest`: the runtime's reduction over the whole root or over the team's subgroup.
pub(crate) fn reduce<T: Reducible>(
    call: &str,
    team: &Team,
    dest: usize,
    source: usize,
    nreduce: usize,
    op: ReduceOp,
) {
    let bytes = crate::rma::bytes(call, nreduce, std::mem::size_of::<T>());
    if bytes == 0 {
        return;
    }
    let target = job::region(call, dest, bytes);
    let source = job::region(call, source, bytes);
    let set: ReduceSet<'_> = team.set();
    job::run(call, |shmem| shmem.reduce::<T>(set, target, source, op));
}

/// [`reduce`] of C `long double` values (sum, prod, min, max), which the runtime cannot
/// combine: after the team's barrier (every member's `source` is ready) this PE reads every
/// member's `source` in team order with the runtime's gets (copies straight from the mapped
/// heaps on one host), the team's barrier again (no member overwrites its `source` — `dest`
/// may be the same array — while another still reads it), and the C helper
/// (`sys/long_double.rs`) combines them in team order into this PE's `dest`: every member
/// computes the same bits.
pub(crate) fn reduce_long_double(
    call: &str,
    team: &Team,
    dest: usize,
    source: usize,
    nreduce: usize,
    op: ReduceOp,
) {
    let bytes = crate::rma::bytes(call, nreduce, long_double::LONG_DOUBLE_BYTES);
    if bytes == 0 {
        return;
    }
    let target = job::region(call, dest, bytes);
    let source = job::region(call, source, bytes);
    let pes = team.pes(call);
    member(call, team);
    team.barrier(call);
    let mut parts = vec![0u8; bytes * pes.len()];
    job::run(call, |shmem| {
        parts
            .chunks_mut(bytes)
            .zip(&pes)
            .try_for_each(|(part, &pe)| shmem.get_bytes(part, source, pe))
    });
    team.barrier(call);
    let combined = long_double::combine(op, &parts, nreduce).unwrap_or_else(|| {
        fail(
            call,
            format!("{op:?} is not a reduction of long double (sum, prod, min and max are)"),
        )
    });
    let me = job::my_pe(call);
    job::run(call, |shmem| shmem.put_bytes(target, &combined, me));
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

/// Legacy barrier over an active set: completes this PE's operations and waits for the set's
/// PEs; `pSync` is not needed.
#[no_mangle]
pub extern "C" fn shmem_barrier(
    start: c_int,
    log_stride: c_int,
    size: c_int,
    _p_sync: *mut c_long,
) {
    const CALL: &str = "shmem_barrier";
    active_set(CALL, start, log_stride, size).barrier(CALL);
}
