//! Collectives: barrier and sync, broadcast, collect, fcollect, alltoall(s) and the reductions,
//! in the team forms and the legacy active-set forms (`pSync`/`pWrk`, not needed).
//!
//! On every PE (`SHMEM_TEAM_WORLD`) each is the runtime's own collective (collect and alltoalls,
//! which the runtime lacks, are its puts and barrier). On a split team, and on a legacy active
//! set of some PEs (a team of its own: [`active_set`]), each is the runtime's puts into the
//! members' copies followed by the team's barrier (`teams.rs`); reductions are the runtime's
//! `Shmem::reduce` over the whole root or over the team's subgroup.

use std::ffi::{c_int, c_long};

use hyper_multicore::shmem::{ReduceOp, ReduceSet, Reducible};

use crate::failure::fail;
use crate::job::{self, At};
use crate::sys::caller_memory::CallerBuffer;
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

/// This PE's block `bytes` at `target` (a region of its own `dest`) into the same place of every
/// PE of `pes`, then the team's barrier.
fn put_to_all(call: &str, team: &Team, target: usize, bytes: &[u8]) {
    if bytes.is_empty() {
        return team.barrier(call);
    }
    let block = job::region(call, target, bytes.len());
    let pes = team.pes(call);
    job::run(call, |shmem| {
        pes.iter()
            .try_for_each(|&pe| shmem.put_bytes(block, bytes, pe))
    });
    team.barrier(call);
}

/// This PE's number in `team` (fails if it is not a member).
fn member(call: &str, team: &Team) -> usize {
    team.my_pe(call)
        .unwrap_or_else(|| fail(call, "this PE is not a member of the team"))
}

/// Copies `source` (on the team's PE `root`) into every team PE's `dest`. Zero bytes: nothing
/// (every PE passes the same count), whatever the pointers — as for every collective here.
pub(crate) fn broadcast(call: &str, team: &Team, dest: usize, source: CallerBuffer, root: c_int) {
    let root = root_pe(call, team, root);
    if source.len() == 0 {
        return;
    }
    source.with_source(|bytes| match team {
        Team::World => {
            let target = At(job::region(call, dest, bytes.len()));
            job::run(call, |shmem| shmem.broadcast::<u8>(&target, bytes, root));
        }
        Team::Some(_) if job::my_pe(call) == root => put_to_all(call, team, dest, bytes),
        Team::Some(_) => {
            job::region(call, dest, bytes.len());
            team.barrier(call);
        }
    });
}

/// The world PE of the team's PE `root` (fails if there is none).
fn root_pe(call: &str, team: &Team, root: c_int) -> usize {
    let pes = team.pes(call);
    match usize::try_from(root).ok().and_then(|r| pes.get(r)) {
        Some(&pe) => pe,
        None => fail(
            call,
            format!("root {root} is not a PE of the team's {}", pes.len()),
        ),
    }
}

/// The legacy broadcast: as [`broadcast`], but the root's `dest` keeps its contents (the
/// active-set form never writes it).
pub(crate) fn broadcast_keeping_root(
    call: &str,
    team: &Team,
    dest: usize,
    source: CallerBuffer,
    root: c_int,
) {
    let root_pe = root_pe(call, team, root);
    if source.len() == 0 {
        return;
    }
    let me = job::my_pe(call);
    let kept = (me == root_pe).then(|| {
        let mut bytes = Vec::new();
        source.with_source(|s| bytes.resize(s.len(), 0));
        let region = job::region(call, dest, bytes.len());
        job::run(call, |shmem| shmem.get_bytes(&mut bytes, region, me));
        (region, bytes)
    });
    broadcast(call, team, dest, source, root);
    if let Some((region, bytes)) = kept {
        job::run(call, |shmem| shmem.put_bytes(region, &bytes, me));
    }
}

/// Gathers every team PE's `source` (the same length on each) into every team PE's `dest`, in
/// team order.
pub(crate) fn fcollect(call: &str, team: &Team, dest: usize, source: CallerBuffer) {
    if source.len() == 0 {
        return;
    }
    source.with_source(|bytes| match team {
        Team::World => {
            let size = job::n_pes(call);
            let target = At(job::region(call, dest, bytes.len() * size));
            job::run(call, |shmem| shmem.all_gather::<u8>(&target, bytes));
        }
        Team::Some(_) => {
            let at = dest + member(call, team) * bytes.len();
            put_to_all(call, team, at, bytes);
        }
    });
}

/// Gathers every team PE's `source` (its own length on each PE) into every team PE's `dest`, in
/// team order: the lengths go round the control plane (the world's or the team's), then each PE
/// puts its block at its place in every team PE's `dest` and all meet at the team's barrier.
pub(crate) fn collect(call: &str, team: &Team, dest: usize, source: CallerBuffer) {
    source.with_source(|bytes| {
        let length = (bytes.len() as u64).to_le_bytes();
        let parts = match team {
            Team::World => job::run(call, |shmem| shmem.control().allgather(&length)),
            Team::Some(members) => job::run(call, |_| members.group.control().allgather(&length)),
        };
        let lengths: Vec<usize> = parts
            .iter()
            .map(|part| u64::from_le_bytes(part.as_slice().try_into().unwrap_or_default()) as usize)
            .collect();
        let before: usize = lengths[..member(call, team)].iter().sum();
        if lengths.iter().sum::<usize>() == 0 {
            return;
        }
        job::region(call, dest, lengths.iter().sum());
        put_to_all(call, team, dest + before, bytes);
    });
}

/// Strided all-to-all: for every team PE `j`, the `nelems` elements of `size` bytes of block `j`
/// of `source` (`sst` elements apart) go to block `my_pe` of PE `j`'s `dest` (`dst` apart).
pub(crate) fn alltoalls(
    call: &str,
    team: &Team,
    dest: usize,
    source: CallerBuffer,
    [dst, sst]: [isize; 2],
    size: usize,
    nelems: usize,
) {
    let me = member(call, team);
    if nelems == 0 {
        return;
    }
    let block = crate::rma::strided_bytes(call, nelems, sst, size);
    let pes = team.pes(call);
    // Round the team from this PE on, as the runtime's all_to_all does (no hot spot).
    for j in (0..pes.len()).map(|step| (me + step) % pes.len()) {
        let pe = pes[j];
        let part = source.part(j * nelems * sst as usize * size, block);
        let target = dest + me * nelems * dst as usize * size;
        crate::rma::iput(call, target, part, [dst, sst], size, nelems, pe as c_int);
    }
    team.barrier(call);
}

/// Sends block `j` of `source` to team PE `j`, which stores it as block `my_pe` of its `dest`.
pub(crate) fn alltoall(call: &str, team: &Team, dest: usize, source: CallerBuffer) {
    if source.len() == 0 {
        return;
    }
    match team {
        Team::World => source.with_source(|bytes| {
            let target = At(job::region(call, dest, bytes.len()));
            job::run(call, |shmem| shmem.all_to_all::<u8>(&target, bytes));
        }),
        Team::Some(members) => {
            let n = members.pes.len();
            let block = source.len() / n.max(1);
            let me = member(call, team);
            let region = job::region(call, dest + me * block, block);
            // Round the team from this PE on, as the runtime's all_to_all does (no hot spot).
            for j in (0..n).map(|step| (me + step) % n) {
                let pe = members.pes[j];
                source.part(j * block, block).with_source(|bytes| {
                    job::run(call, |shmem| shmem.put_bytes(region, bytes, pe))
                });
            }
            team.barrier(call);
        }
    }
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
    let set = match team {
        Team::World => ReduceSet::Root,
        Team::Some(members) => ReduceSet::Group(&members.group),
    };
    job::run(call, |shmem| shmem.reduce::<T>(set, target, source, op));
}

/// [`reduce`] of C `long double` values (sum, prod, min, max), which the runtime cannot
/// combine: after the team's barrier (every member's `source` is ready) this PE reads every
/// member's `source` in team order with the runtime's gets, the team's barrier again (no member
/// overwrites its `source` — `dest` may be the same array — while another still reads it), and
/// the C helper (`sys/long_double.rs`) combines them in team order into this PE's `dest`: every
/// member computes the same bits.
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
