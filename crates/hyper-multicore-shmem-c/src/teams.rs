//! Teams: `SHMEM_TEAM_WORLD`, `SHMEM_TEAM_SHARED` (the PEs whose heaps this PE maps: its host's),
//! and the teams split from them (`shmem_team_split_strided`, `shmem_team_split_2d`), with their
//! queries, `shmem_team_translate_pe`, `shmem_team_get_config`, `shmem_team_destroy`.
//!
//! A split team is an ordered list of world PEs with the world's subgroup of those members
//! (`World::subgroup`: its own control plane, formed by the members only, cached by the world):
//! its barrier is that control plane's, after completing this PE's operations. Collectives on it
//! are compositions of the runtime's puts and that barrier (`collectives.rs`).

use std::collections::BTreeMap;
use std::ffi::{c_int, c_long, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use hyper_multicore::world::{Group, World};
use parking_lot::Mutex;

use crate::failure::{check, fail};
use crate::job;

/// The handle of `SHMEM_TEAM_WORLD`.
pub const TEAM_WORLD: usize = 1;
/// The handle of `SHMEM_TEAM_SHARED`.
pub const TEAM_SHARED: usize = 2;
/// `SHMEM_TEAM_INVALID`.
const TEAM_INVALID: usize = 0;

/// A team: every PE (the runtime's own collectives), or some PEs with their subgroup.
#[derive(Clone)]
pub(crate) enum Team {
    /// Every PE of the job.
    World,
    /// These world PEs, in team order, and their subgroup.
    Some(Arc<Members>),
}

/// The PEs of a split team.
pub(crate) struct Members {
    /// World PE of each team PE.
    pub(crate) pes: Vec<usize>,
    /// The subgroup of those PEs (its control plane runs the team's barrier).
    pub(crate) group: Arc<Group>,
}

/// Split teams alive, by handle.
static TEAMS: Mutex<BTreeMap<usize, Arc<Members>>> = Mutex::new(BTreeMap::new());
/// The next handle to give out.
static NEXT: AtomicUsize = AtomicUsize::new(TEAM_SHARED + 1);

/// The team behind `handle` (fails for an unknown or destroyed handle).
pub(crate) fn team(call: &str, handle: usize) -> Team {
    match handle {
        TEAM_WORLD => Team::World,
        TEAM_SHARED => {
            let (shared, all) = job::run(call, |shmem| {
                Ok((shmem.shared_pes().to_vec(), shmem.size()))
            });
            if shared.len() == all {
                Team::World
            } else {
                // The PEs whose memory this PE maps (its host's), a team of their own.
                Team::Some(members(call, shared))
            }
        }
        other => match TEAMS.lock().get(&other) {
            Some(members) => Team::Some(Arc::clone(members)),
            None => fail(
                call,
                format!("team handle {other:#x} is not a team (never made, or destroyed)"),
            ),
        },
    }
}

impl Team {
    /// The world PEs of the team, in team order.
    pub(crate) fn pes(&self, call: &str) -> Vec<usize> {
        match self {
            Team::World => (0..job::n_pes(call)).collect(),
            Team::Some(members) => members.pes.clone(),
        }
    }

    /// This PE's number in the team (`None` if it is not a member).
    pub(crate) fn my_pe(&self, call: &str) -> Option<usize> {
        let me = job::my_pe(call);
        match self {
            Team::World => Some(me),
            Team::Some(members) => members.pes.iter().position(|&pe| pe == me),
        }
    }

    /// Completes this PE's operations and waits for every PE of the team.
    pub(crate) fn barrier(&self, call: &str) {
        match self {
            Team::World => job::run(call, |shmem| shmem.barrier()),
            Team::Some(members) => job::run(call, |shmem| {
                shmem.try_quiet()?;
                members.group.control().barrier()
            }),
        }
    }
}

/// The team of world PEs `pes` (this PE among them) with their subgroup: formed on first use
/// (collective over them), then the world's cached one.
pub(crate) fn members(call: &str, pes: Vec<usize>) -> Arc<Members> {
    let world = check(call, World::global());
    let group = check(call, world.subgroup(&pes));
    Arc::new(Members { pes, group })
}

/// Makes the team of world PEs `pes` (this PE among them): forms their subgroup (collective over
/// them) and returns its handle.
fn make_team(call: &str, pes: Vec<usize>) -> usize {
    let handle = NEXT.fetch_add(1, Ordering::Relaxed);
    TEAMS.lock().insert(handle, members(call, pes));
    handle
}

/// Writes `handle` to the caller's `shmem_team_t`.
///
/// # Safety
/// `target` must be null or valid for writing one handle.
unsafe fn deliver(target: *mut usize, handle: usize) {
    if !target.is_null() {
        // SAFETY: non-null and writable (function contract).
        unsafe { target.write(handle) };
    }
}

/// Collective over `parent`: the team of its PEs `start`, `start + stride`, … (`size` PEs);
/// PEs outside it get `SHMEM_TEAM_INVALID`. 0 on success.
///
/// # Safety
/// `new_team` must be valid for writing one `shmem_team_t`; `config` is not read.
#[no_mangle]
pub unsafe extern "C" fn shmem_team_split_strided(
    parent: usize,
    start: c_int,
    stride: c_int,
    size: c_int,
    _config: *const c_void,
    _config_mask: c_long,
    new_team: *mut usize,
) -> c_int {
    const CALL: &str = "shmem_team_split_strided";
    let parent_pes = team(CALL, parent).pes(CALL);
    let picked: Option<Vec<usize>> = (|| {
        let (start, stride, size) = (
            usize::try_from(start).ok()?,
            usize::try_from(stride).ok()?,
            usize::try_from(size).ok().filter(|&s| s > 0)?,
        );
        (0..size)
            .map(|i| parent_pes.get(start + i * stride).copied())
            .collect()
    })();
    let Some(pes) = picked else {
        fail(
            CALL,
            format!(
                "start {start}, stride {stride}, size {size} do not pick PEs of a team of {} PEs",
                parent_pes.len()
            ),
        );
    };
    let me = job::my_pe(CALL);
    let handle = if pes.contains(&me) {
        make_team(CALL, pes)
    } else {
        TEAM_INVALID
    };
    // SAFETY: passed on from this function's contract.
    unsafe { deliver(new_team, handle) };
    0
}

/// Collective over `parent`: its PEs as a grid of rows of `xrange`; this PE's row becomes its
/// x-team, its column its y-team. 0 on success.
///
/// # Safety
/// `xaxis_team` and `yaxis_team` must be valid for writing one `shmem_team_t`; the configs are
/// not read.
#[no_mangle]
pub unsafe extern "C" fn shmem_team_split_2d(
    parent: usize,
    xrange: c_int,
    _xaxis_config: *const c_void,
    _xaxis_mask: c_long,
    xaxis_team: *mut usize,
    _yaxis_config: *const c_void,
    _yaxis_mask: c_long,
    yaxis_team: *mut usize,
) -> c_int {
    const CALL: &str = "shmem_team_split_2d";
    let parent = team(CALL, parent);
    let pes = parent.pes(CALL);
    let Some(xrange) = usize::try_from(xrange).ok().filter(|&x| x > 0) else {
        fail(CALL, format!("xrange {xrange} must be positive"));
    };
    let Some(mine) = parent.my_pe(CALL) else {
        fail(CALL, "this PE is not a member of the parent team");
    };
    let xrange = xrange.min(pes.len());
    let row: Vec<usize> = pes
        .iter()
        .copied()
        .skip(mine / xrange * xrange)
        .take(xrange)
        .collect();
    let column: Vec<usize> = pes
        .iter()
        .copied()
        .skip(mine % xrange)
        .step_by(xrange)
        .collect();
    let x = make_team(CALL, row);
    let y = make_team(CALL, column);
    // SAFETY: passed on from this function's contract.
    unsafe {
        deliver(xaxis_team, x);
        deliver(yaxis_team, y);
    }
    0
}

/// This PE's number in `team`, or -1 if it is not a member.
#[no_mangle]
pub extern "C" fn shmem_team_my_pe(team_handle: usize) -> c_int {
    const CALL: &str = "shmem_team_my_pe";
    team(CALL, team_handle)
        .my_pe(CALL)
        .map_or(-1, |pe| pe as c_int)
}

/// The number of PEs in `team`.
#[no_mangle]
pub extern "C" fn shmem_team_n_pes(team_handle: usize) -> c_int {
    const CALL: &str = "shmem_team_n_pes";
    team(CALL, team_handle).pes(CALL).len() as c_int
}

/// PE `src_pe` of `src_team` as a PE of `dest_team`, or -1 if it is not in it.
#[no_mangle]
pub extern "C" fn shmem_team_translate_pe(
    src_team: usize,
    src_pe: c_int,
    dest_team: usize,
) -> c_int {
    const CALL: &str = "shmem_team_translate_pe";
    let source = team(CALL, src_team).pes(CALL);
    let Some(&world_pe) = usize::try_from(src_pe).ok().and_then(|pe| source.get(pe)) else {
        return -1;
    };
    team(CALL, dest_team)
        .pes(CALL)
        .iter()
        .position(|&pe| pe == world_pe)
        .map_or(-1, |pe| pe as c_int)
}

/// The team's configuration: no contexts are reserved (`num_contexts` 0). 0 on success.
///
/// # Safety
/// `config` must be null or valid for writing one `shmem_team_config_t`.
#[no_mangle]
pub unsafe extern "C" fn shmem_team_get_config(
    team_handle: usize,
    _mask: c_long,
    config: *mut c_int,
) -> c_int {
    team("shmem_team_get_config", team_handle);
    if !config.is_null() {
        // SAFETY: writable for one shmem_team_config_t, whose first member is `int num_contexts`.
        unsafe { config.write(0) };
    }
    0
}

/// Collective over `team`: completes this PE's operations and waits for the team's PEs.
#[no_mangle]
pub extern "C" fn shmem_team_sync(team_handle: usize) -> c_int {
    const CALL: &str = "shmem_team_sync";
    team(CALL, team_handle).barrier(CALL);
    0
}

/// Destroys a split team (the predefined teams cannot be destroyed).
#[no_mangle]
pub extern "C" fn shmem_team_destroy(team_handle: usize) {
    const CALL: &str = "shmem_team_destroy";
    if team_handle == TEAM_WORLD || team_handle == TEAM_SHARED {
        fail(
            CALL,
            "SHMEM_TEAM_WORLD and SHMEM_TEAM_SHARED cannot be destroyed",
        );
    }
    team(CALL, team_handle);
    TEAMS.lock().remove(&team_handle);
}
