//! Teams: `SHMEM_TEAM_WORLD`, `SHMEM_TEAM_SHARED` (the PEs whose heaps this PE maps: its host's),
//! and the teams split from them (`shmem_team_split_strided`, `shmem_team_split_2d`), with their
//! queries, `shmem_team_translate_pe`, `shmem_team_get_config`, `shmem_team_destroy`.
//!
//! A split team is an ordered list of world PEs with the world's subgroup of those members
//! (`World::subgroup`: its own control plane, formed by the members only, cached by the world).
//! Its barrier and its collectives are the runtime's over that subgroup (`collectives.rs`): where
//! every member shares this host's heap segment the team meets through shared memory, else at
//! the subgroup's control plane, after completing this PE's operations.

use std::collections::BTreeMap;
use std::ffi::{c_int, c_long, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use hyper_multicore::shmem::ReduceSet;
use hyper_multicore::world::{Group, World};
use parking_lot::Mutex;

use crate::failure::{check, fail, record};
use crate::job;

/// The handle of `SHMEM_TEAM_WORLD`.
pub const TEAM_WORLD: usize = 1;
/// The handle of `SHMEM_TEAM_SHARED`.
pub const TEAM_SHARED: usize = 2;
/// `SHMEM_TEAM_INVALID`.
pub(crate) const TEAM_INVALID: usize = 0;

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
static TEAMS: Mutex<BTreeMap<usize, Split>> = Mutex::new(BTreeMap::new());

/// A split team alive: its PEs, and the contexts its creation asked to reserve.
struct Split {
    members: Arc<Members>,
    /// `shmem_team_config_t::num_contexts` as given at the split (0 unless asked):
    /// `shmem_team_get_config` reports it (contexts are never scarce here, nothing is reserved).
    num_contexts: c_int,
}

/// `SHMEM_TEAM_NUM_CONTEXTS`: the config mask bit of `num_contexts`.
const TEAM_NUM_CONTEXTS: c_long = 1;

/// The `num_contexts` a split's `config` and `mask` ask for (0 when the mask leaves it out).
///
/// # Safety
/// `config` must be null or valid for reading one `shmem_team_config_t` when `mask` names a field.
unsafe fn contexts_asked(config: *const c_void, mask: c_long) -> c_int {
    if mask & TEAM_NUM_CONTEXTS == 0 || config.is_null() {
        return 0;
    }
    // SAFETY: readable for one shmem_team_config_t (function contract), whose first member is
    // `int num_contexts`.
    unsafe { config.cast::<c_int>().read() }
}
/// The next handle to give out.
static NEXT: AtomicUsize = AtomicUsize::new(TEAM_SHARED + 1);

/// The team behind `handle`, or `None` for a handle that names no team now: `SHMEM_TEAM_INVALID`,
/// a destroyed team, a team of a runtime since finalized, or any handle while the library is
/// not initialized. Calls with an error return return it for `None` (OpenSHMEM 1.5 §9.4, 1.6
/// for finalized teams). A handle this library never gave out is not a team handle at all
/// (garbage or a cast pointer, undefined behaviour in the standard): that ends the PE, saying so.
pub(crate) fn lookup(call: &str, handle: usize) -> Option<Team> {
    if handle >= NEXT.load(Ordering::Relaxed) {
        fail(
            call,
            format!("{handle:#x} was never a team handle (not SHMEM_TEAM_WORLD, SHMEM_TEAM_SHARED, SHMEM_TEAM_INVALID nor a split team)"),
        );
    }
    if !job::initialized() {
        return None;
    }
    match handle {
        TEAM_INVALID => None,
        TEAM_WORLD => Some(Team::World),
        TEAM_SHARED => {
            let (shared, all) = job::run(call, |shmem| {
                Ok((shmem.shared_pes().to_vec(), shmem.size()))
            });
            Some(if shared.len() == all {
                Team::World
            } else {
                // The PEs whose memory this PE maps (its host's), a team of their own.
                Team::Some(members(call, shared))
            })
        }
        other => TEAMS
            .lock()
            .get(&other)
            .map(|split| Team::Some(Arc::clone(&split.members))),
    }
}

/// Forgets every split team: the runtime they belonged to is finalized (their handles then
/// name no team, see [`lookup`]).
pub(crate) fn retire_all() {
    TEAMS.lock().clear();
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

    /// The number of PEs in the team.
    pub(crate) fn size(&self, call: &str) -> usize {
        match self {
            Team::World => job::n_pes(call),
            Team::Some(members) => members.pes.len(),
        }
    }

    /// The world PE of the team's PE `pe` (below [`Team::size`]).
    pub(crate) fn world_pe(&self, _call: &str, pe: usize) -> usize {
        match self {
            Team::World => pe,
            Team::Some(members) => members.pes[pe],
        }
    }

    /// The team as the runtime's set of PEs.
    pub(crate) fn set(&self) -> ReduceSet<'_> {
        match self {
            Team::World => ReduceSet::Root,
            Team::Some(members) => ReduceSet::Group(&members.group),
        }
    }

    /// Completes this PE's operations and waits for every PE of the team (the runtime's barrier
    /// of the set: in shared memory where every member shares this host's segment).
    pub(crate) fn barrier(&self, call: &str) {
        let set = self.set();
        job::run(call, |shmem| shmem.barrier_set(set));
    }
}

/// The team of world PEs `pes` (this PE among them) with their subgroup: formed on first use
/// (collective over them), then the world's cached one.
pub(crate) fn members(call: &str, pes: Vec<usize>) -> Arc<Members> {
    let world = check(call, World::global());
    let group = check(call, world.subgroup(&pes));
    Arc::new(Members { pes, group })
}

/// Makes the team of world PEs `pes` (this PE among them), asking for `num_contexts`: forms
/// their subgroup (collective over them) and returns its handle.
fn make_team(call: &str, pes: Vec<usize>, num_contexts: c_int) -> usize {
    let handle = NEXT.fetch_add(1, Ordering::Relaxed);
    let members = members(call, pes);
    TEAMS.lock().insert(
        handle,
        Split {
            members,
            num_contexts,
        },
    );
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

/// The world PEs that `start`, `start + stride`, … (`size` of them) pick from `parent_pes`, or
/// `None` if that triplet is not valid: a PE outside the parent team, `size` below 1, `stride`
/// 0 with `size` above 1.
fn strided_pes(
    parent_pes: &[usize],
    start: c_int,
    stride: c_int,
    size: c_int,
) -> Option<Vec<usize>> {
    if size < 1 || (stride == 0 && size > 1) {
        return None;
    }
    (0..i64::from(size))
        .map(|i| {
            let index = i64::from(start) + i * i64::from(stride);
            usize::try_from(index)
                .ok()
                .and_then(|at| parent_pes.get(at).copied())
        })
        .collect()
}

/// Collective over `parent`: the team of its PEs `start`, `start + stride`, … (`size` PEs; a
/// negative stride numbers them in reverse). PEs outside it get `SHMEM_TEAM_INVALID` and 0. An
/// invalid parent or triplet gives `SHMEM_TEAM_INVALID` and nonzero (on every PE alike: they
/// pass the same arguments), with the reason for `shmemx_last_error`.
///
/// # Safety
/// `new_team` must be valid for writing one `shmem_team_t`; `config` null or valid for reading
/// one `shmem_team_config_t` when `config_mask` names a field.
#[no_mangle]
pub unsafe extern "C" fn shmem_team_split_strided(
    parent: usize,
    start: c_int,
    stride: c_int,
    size: c_int,
    config: *const c_void,
    config_mask: c_long,
    new_team: *mut usize,
) -> c_int {
    const CALL: &str = "shmem_team_split_strided";
    // SAFETY: passed on from this function's contract.
    let contexts = unsafe { contexts_asked(config, config_mask) };
    let (handle, status) = split_strided(CALL, parent, [start, stride, size], contexts);
    // SAFETY: passed on from this function's contract.
    unsafe { deliver(new_team, handle) };
    status
}

/// [`shmem_team_split_strided`]'s new handle and return value.
fn split_strided(
    call: &str,
    parent: usize,
    [start, stride, size]: [c_int; 3],
    contexts: c_int,
) -> (usize, c_int) {
    let Some(parent) = lookup(call, parent) else {
        record(
            call,
            "the parent team is SHMEM_TEAM_INVALID (or names no team)",
        );
        return (TEAM_INVALID, -1);
    };
    let parent_pes = parent.pes(call);
    let Some(pes) = strided_pes(&parent_pes, start, stride, size) else {
        record(
            call,
            &format!(
                "start {start}, stride {stride}, size {size} do not pick PEs of a team of {} PEs",
                parent_pes.len()
            ),
        );
        return (TEAM_INVALID, -1);
    };
    let me = job::my_pe(call);
    if pes.contains(&me) {
        (make_team(call, pes, contexts), 0)
    } else {
        (TEAM_INVALID, 0)
    }
}

/// Collective over `parent`: its PEs as a grid of rows of `xrange` (at most the team's size);
/// this PE's row becomes its x-team, its column its y-team. 0 on success; an invalid parent or
/// an `xrange` below 1 gives `SHMEM_TEAM_INVALID` for both and nonzero.
///
/// # Safety
/// `xaxis_team` and `yaxis_team` must be valid for writing one `shmem_team_t`; each config null
/// or valid for reading one `shmem_team_config_t` when its mask names a field.
#[no_mangle]
pub unsafe extern "C" fn shmem_team_split_2d(
    parent: usize,
    xrange: c_int,
    xaxis_config: *const c_void,
    xaxis_mask: c_long,
    xaxis_team: *mut usize,
    yaxis_config: *const c_void,
    yaxis_mask: c_long,
    yaxis_team: *mut usize,
) -> c_int {
    const CALL: &str = "shmem_team_split_2d";
    // SAFETY: passed on from this function's contract.
    let contexts = unsafe {
        [
            contexts_asked(xaxis_config, xaxis_mask),
            contexts_asked(yaxis_config, yaxis_mask),
        ]
    };
    let ((x, y), status) = split_2d(CALL, parent, xrange, contexts);
    // SAFETY: passed on from this function's contract.
    unsafe {
        deliver(xaxis_team, x);
        deliver(yaxis_team, y);
    }
    status
}

/// [`shmem_team_split_2d`]'s new handles and return value.
fn split_2d(
    call: &str,
    parent: usize,
    xrange: c_int,
    [x, y]: [c_int; 2],
) -> ((usize, usize), c_int) {
    const NONE: ((usize, usize), c_int) = ((TEAM_INVALID, TEAM_INVALID), -1);
    let Some(parent) = lookup(call, parent) else {
        record(
            call,
            "the parent team is SHMEM_TEAM_INVALID (or names no team)",
        );
        return NONE;
    };
    let pes = parent.pes(call);
    let Some(xrange) = usize::try_from(xrange).ok().filter(|&x| x > 0) else {
        record(call, &format!("xrange {xrange} must be positive"));
        return NONE;
    };
    let Some(mine) = parent.my_pe(call) else {
        fail(call, "this PE is not a member of the parent team");
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
    ((make_team(call, row, x), make_team(call, column, y)), 0)
}

/// This PE's number in `team`, or -1 if it is not a member or `team` names no team.
#[no_mangle]
pub extern "C" fn shmem_team_my_pe(team_handle: usize) -> c_int {
    const CALL: &str = "shmem_team_my_pe";
    lookup(CALL, team_handle)
        .and_then(|team| team.my_pe(CALL))
        .map_or(-1, |pe| pe as c_int)
}

/// The number of PEs in `team`, or -1 if `team` names no team.
#[no_mangle]
pub extern "C" fn shmem_team_n_pes(team_handle: usize) -> c_int {
    const CALL: &str = "shmem_team_n_pes";
    lookup(CALL, team_handle).map_or(-1, |team| team.pes(CALL).len() as c_int)
}

/// PE `src_pe` of `src_team` as a PE of `dest_team`, or -1 if it is not in both or either
/// handle names no team.
#[no_mangle]
pub extern "C" fn shmem_team_translate_pe(
    src_team: usize,
    src_pe: c_int,
    dest_team: usize,
) -> c_int {
    const CALL: &str = "shmem_team_translate_pe";
    let (Some(source), Some(dest)) = (lookup(CALL, src_team), lookup(CALL, dest_team)) else {
        return -1;
    };
    let source = source.pes(CALL);
    let Some(&world_pe) = usize::try_from(src_pe).ok().and_then(|pe| source.get(pe)) else {
        return -1;
    };
    dest.pes(CALL)
        .iter()
        .position(|&pe| pe == world_pe)
        .map_or(-1, |pe| pe as c_int)
}

/// The team's configuration: `num_contexts` as its split asked (0 for the predefined teams and
/// when not asked; nothing is reserved, contexts are never scarce here), written when `mask`
/// names it. 0 on success; nonzero, writing nothing, if `team` names no team.
///
/// # Safety
/// `config` must be null or valid for writing one `shmem_team_config_t`.
#[no_mangle]
pub unsafe extern "C" fn shmem_team_get_config(
    team_handle: usize,
    mask: c_long,
    config: *mut c_int,
) -> c_int {
    if lookup("shmem_team_get_config", team_handle).is_none() {
        return -1;
    }
    let contexts = TEAMS
        .lock()
        .get(&team_handle)
        .map_or(0, |split| split.num_contexts);
    if mask & TEAM_NUM_CONTEXTS != 0 && !config.is_null() {
        // SAFETY: writable for one shmem_team_config_t, whose first member is `int num_contexts`.
        unsafe { config.write(contexts) };
    }
    0
}

/// Collective over `team`: completes this PE's operations and waits for the team's PEs. 0 on
/// success; nonzero, doing nothing, if `team` names no team.
#[no_mangle]
pub extern "C" fn shmem_team_sync(team_handle: usize) -> c_int {
    const CALL: &str = "shmem_team_sync";
    match lookup(CALL, team_handle) {
        Some(team) => {
            team.barrier(CALL);
            0
        }
        None => -1,
    }
}

/// Deprecated active-set form of `shmem_sync` (`shmem.h` maps the C11 one-argument
/// `shmem_sync(team)` to [`shmem_team_sync`]): waits for the active set's PEs, after completing
/// this PE's operations (stronger than required); `pSync` is not needed.
#[no_mangle]
pub extern "C" fn shmem_sync(start: c_int, log_stride: c_int, size: c_int, _p_sync: *mut c_long) {
    const CALL: &str = "shmem_sync";
    crate::collectives::active_set(CALL, start, log_stride, size).barrier(CALL);
}

/// Destroys a split team; `SHMEM_TEAM_INVALID` (or a team already gone) does nothing. The
/// predefined teams cannot be destroyed (undefined in the standard: this ends the PE, saying so).
#[no_mangle]
pub extern "C" fn shmem_team_destroy(team_handle: usize) {
    const CALL: &str = "shmem_team_destroy";
    if team_handle == TEAM_WORLD || team_handle == TEAM_SHARED {
        fail(
            CALL,
            "SHMEM_TEAM_WORLD and SHMEM_TEAM_SHARED cannot be destroyed",
        );
    }
    if lookup(CALL, team_handle).is_some() {
        TEAMS.lock().remove(&team_handle);
    }
}

/// A local address of team PE `pe`'s copy of the symmetric `dest` (OpenSHMEM 1.6), as
/// `shmem_ptr` gives; null if `team` names no team or `pe` is not one of its PEs.
#[no_mangle]
pub extern "C" fn shmem_team_ptr(
    team_handle: usize,
    dest: *const c_void,
    pe: c_int,
) -> *mut c_void {
    const CALL: &str = "shmem_team_ptr";
    let Some(team) = lookup(CALL, team_handle) else {
        return std::ptr::null_mut();
    };
    let pes = team.pes(CALL);
    match usize::try_from(pe).ok().and_then(|pe| pes.get(pe)) {
        Some(&world_pe) => crate::setup::shmem_ptr(dest, world_pe as c_int),
        None => {
            record(
                CALL,
                &format!("PE {pe} is not a PE of the team's {}", pes.len()),
            );
            std::ptr::null_mut()
        }
    }
}
