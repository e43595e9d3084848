//! Collectives: barrier and sync, broadcast, collect, fcollect, alltoall(s) and the sum/min/max
//! reductions, in the team forms and the legacy active-set forms (`pSync`/`pWrk`, when the active
//! set is every PE).
//!
//! On every PE (`SHMEM_TEAM_WORLD`) each is the runtime's own collective (collect and alltoalls,
//! which the runtime lacks, are its puts and barrier). On a split team each is the runtime's puts
//! into the members' copies followed by the team's barrier (`teams.rs`); reductions on split
//! teams, and active sets of some PEs, are refused with an error naming what is missing.

use std::ffi::{c_int, c_long};

use hyper_multicore::shmem::{ReduceOp, Reducible};

use crate::failure::fail;
use crate::job::{self, At};
use crate::sys::caller_memory::CallerBuffer;
use crate::teams::{self, Team, TEAM_WORLD};

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

/// This PE's block `bytes` at `target` (a region of its own `dest`) into the same place of every
/// PE of `pes`, then the team's barrier.
fn put_to_all(call: &str, team: &Team, target: usize, bytes: &[u8]) {
    let block = job::region(call, target, bytes.len());
    let pes = team.pes(call);
    job::run(call, |shmem| {
        pes.iter()
            .try_for_each(|&pe| shmem.put_bytes(block, bytes, pe))
    });
    team.barrier(call);
}

/// The number of PEs of team `team`.
pub(crate) fn team_size(call: &str, team: usize) -> usize {
    teams::team(call, team).pes(call).len()
}

/// This PE's number in `team` (fails if it is not a member).
fn member(call: &str, team: &Team) -> usize {
    team.my_pe(call)
        .unwrap_or_else(|| fail(call, "this PE is not a member of the team"))
}

/// Copies `source` (on the team's PE `root`) into every team PE's `dest`.
pub(crate) fn broadcast(call: &str, team: usize, dest: usize, source: CallerBuffer, root: c_int) {
    let team = teams::team(call, team);
    let pes = team.pes(call);
    let Some(&root) = usize::try_from(root).ok().and_then(|r| pes.get(r)) else {
        fail(
            call,
            format!("root {root} is not a PE of the team's {}", pes.len()),
        );
    };
    source.with_source(|bytes| match &team {
        Team::World => {
            let target = At(job::region(call, dest, bytes.len()));
            job::run(call, |shmem| shmem.broadcast::<u8>(&target, bytes, root));
        }
        Team::Some(_) if job::my_pe(call) == root => put_to_all(call, &team, dest, bytes),
        Team::Some(_) => {
            job::region(call, dest, bytes.len());
            team.barrier(call);
        }
    });
}

/// The legacy broadcast (every PE): as [`broadcast`], but the root's `dest` keeps its contents
/// (the active-set form never writes it).
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
    broadcast(call, TEAM_WORLD, dest, source, root);
    if let Some((region, bytes)) = kept {
        job::run(call, |shmem| shmem.put_bytes(region, &bytes, me));
    }
}

/// Gathers every team PE's `source` (the same length on each) into every team PE's `dest`, in
/// team order.
pub(crate) fn fcollect(call: &str, team: usize, dest: usize, source: CallerBuffer) {
    let team = teams::team(call, team);
    source.with_source(|bytes| match &team {
        Team::World => {
            let size = job::n_pes(call);
            let target = At(job::region(call, dest, bytes.len() * size));
            job::run(call, |shmem| shmem.all_gather::<u8>(&target, bytes));
        }
        Team::Some(_) => {
            let at = dest + member(call, &team) * bytes.len();
            put_to_all(call, &team, at, bytes);
        }
    });
}

/// Gathers every team PE's `source` (its own length on each PE) into every team PE's `dest`, in
/// team order: the lengths go round the control plane (the world's or the team's), then each PE
/// puts its block at its place in every team PE's `dest` and all meet at the team's barrier.
pub(crate) fn collect(call: &str, team: usize, dest: usize, source: CallerBuffer) {
    let team = teams::team(call, team);
    source.with_source(|bytes| {
        let length = (bytes.len() as u64).to_le_bytes();
        let parts = match &team {
            Team::World => job::run(call, |shmem| shmem.control().allgather(&length)),
            Team::Some(members) => job::run(call, |_| members.group.control().allgather(&length)),
        };
        let lengths: Vec<usize> = parts
            .iter()
            .map(|part| u64::from_le_bytes(part.as_slice().try_into().unwrap_or_default()) as usize)
            .collect();
        let before: usize = lengths[..member(call, &team)].iter().sum();
        job::region(call, dest, lengths.iter().sum());
        put_to_all(call, &team, dest + before, bytes);
    });
}

/// Strided all-to-all: for every team PE `j`, the `nelems` elements of `size` bytes of block `j`
/// of `source` (`sst` elements apart) go to block `my_pe` of PE `j`'s `dest` (`dst` apart).
pub(crate) fn alltoalls(
    call: &str,
    team: usize,
    dest: usize,
    source: CallerBuffer,
    [dst, sst]: [isize; 2],
    size: usize,
    nelems: usize,
) {
    let team = teams::team(call, team);
    let me = member(call, &team);
    let block = crate::rma::strided_bytes(call, nelems, sst, size);
    for (j, pe) in team.pes(call).into_iter().enumerate() {
        let part = source.part(j * nelems * sst as usize * size, block);
        let target = dest + me * nelems * dst as usize * size;
        crate::rma::iput(call, target, part, [dst, sst], size, nelems, pe as c_int);
    }
    team.barrier(call);
}

/// Sends block `j` of `source` to team PE `j`, which stores it as block `my_pe` of its `dest`.
pub(crate) fn alltoall(call: &str, team: usize, dest: usize, source: CallerBuffer) {
    let team = teams::team(call, team);
    match &team {
        Team::World => source.with_source(|bytes| {
            let target = At(job::region(call, dest, bytes.len()));
            job::run(call, |shmem| shmem.all_to_all::<u8>(&target, bytes));
        }),
        Team::Some(members) => {
            let n = members.pes.len();
            let block = source.len() / n.max(1);
            let at = dest + member(call, &team) * block;
            let region = job::region(call, at, block);
            for (j, &pe) in members.pes.iter().enumerate() {
                source.part(j * block, block).with_source(|bytes| {
                    job::run(call, |shmem| shmem.put_bytes(region, bytes, pe))
                });
            }
            team.barrier(call);
        }
    }
}

/// Combines every PE's `nreduce` elements at `source` with `op` into every PE's `dest` (every
/// PE only: the runtime's all-reduce spans the job).
pub(crate) fn reduce<T: Reducible>(
    call: &str,
    team: usize,
    dest: usize,
    source: usize,
    nreduce: usize,
    op: ReduceOp,
) {
    if let Team::Some(_) = teams::team(call, team) {
        fail(
            call,
            "reductions on split teams are not supported yet (docs/c-api.md); reduce on \
             SHMEM_TEAM_WORLD",
        );
    }
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
