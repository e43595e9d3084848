//! One heap for several consumers: [`SharedRoot`] holds the process's single lifecycle
//! reference on behalf of every [`Consumer`] declared on it (the MoE layers' dispatch/combine
//! buffers, an attention workspace, a pipeline stage's send buffers), bills each consumer's
//! allocations to its declared budget, lets only the owner free an allocation, and serialises
//! the consumers' communication through an execution [`Lease`](super::Lease) (one holder per process, each
//! claim a new generation). The heap grows for all of them at once, keeping their data
//! ([`Lease::grow`](super::Lease::grow), [`super::GrowableBuffer`]).
//!
//! ```no_run
//! use hyper_multicore::lifecycle::{ConsumerSpec, RootGroup, SharedRoot};
//!
//! let root = SharedRoot::new(RootGroup::World, None);
//! let moe = root.reserve(ConsumerSpec::new("moe0", "moe-dispatch", 8 << 20, "2 buffers"))?;
//! let attn = root.reserve(ConsumerSpec::new("attn", "workspace", 4 << 20, "1 buffer"))?;
//! root.activate()?; // collective: every rank declared the same consumers
//! let lease = moe.claim()?;
//! let buffer = lease.allocate::<f32>(1024, None)?; // billed to moe0
//! lease.run("barrier", |shmem| shmem.barrier())?;
//! lease.free(buffer.id())?;
//! lease.release()?;
//! moe.close()?;
//! attn.close()?;
//! root.close()?; // the last release, collectively
//! # Ok::<(), hyper_multicore::Error>(())
//! ```
//!
//! Every check of a consumer's allocate and free (the lease, the budget, the owner) is made
//! locally and then exchanged over the root's channel before any collective work, so a refusal
//! on one rank is the same error on every rank, naming the ranks it was found on.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};
use serde::{Deserialize, Serialize};

use super::acquire::{acquire_reference, RootGroup};
use super::consumer::Consumer;
use super::growth::{GrowthRecord, DEFAULT_GROWTH_FACTOR};
use super::hook;
use super::release::release_reference;
use super::root_channel;
use crate::config::{Config, HEAP_SIZE};
use crate::control::converge::converge;
use crate::control::GroupChannel;
use crate::error::{Error, ErrorKind, Recovery, Result};
use crate::shmem::allocator::{Allocator, MIN_ALIGNMENT};
use crate::shmem::registry::set_managed;
use crate::shmem::{AllocationId, AllocationRecord, AllocationSpec, DebugState, DEFAULT_ALIGNMENT};
use crate::world::World;

/// The heap of a shared root is the sum of its consumers' budgets rounded up to this (2 MiB).
pub const HEAP_ROUNDING: u64 = 2 << 20;

/// What a consumer declares: its name (unique in the root), kind, budget and layout (a
/// description of what it keeps in its budget), compared across ranks at activation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConsumerSpec {
    /// Unique name in the root.
    pub name: String,
    /// What kind of module it is (`"moe-dispatch"`, `"workspace"`, …).
    pub kind: String,
    /// Bytes of the heap it may hold at once, alignment padding included (see
    /// [`allocation_budget`]).
    pub budget_bytes: u64,
    /// A description of its layout (compared across ranks as is).
    pub layout: String,
    /// The largest budget a growth may give it (`None`: no cap but the host's memory).
    pub max_budget_bytes: Option<u64>,
}

impl ConsumerSpec {
    /// A consumer without a growth cap.
    pub fn new(
        name: impl Into<String>,
        kind: impl Into<String>,
        budget_bytes: u64,
        layout: impl Into<String>,
    ) -> Self {
        ConsumerSpec {
            name: name.into(),
            kind: kind.into(),
            budget_bytes,
            layout: layout.into(),
            max_budget_bytes: None,
        }
    }

    /// The same consumer, whose growth is capped at `bytes` of budget.
    pub fn with_max_budget(mut self, bytes: u64) -> Self {
        self.max_budget_bytes = Some(bytes);
        self
    }
}

/// What one allocation of `spec` costs a consumer's budget: its size rounded as the heap's
/// allocator rounds it, plus the worst-case alignment padding.
pub fn allocation_budget(spec: &AllocationSpec) -> Result<u64> {
    let bytes = spec.bytes()?;
    let alignment = spec.alignment.unwrap_or(DEFAULT_ALIGNMENT);
    if !alignment.is_power_of_two() {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            "allocation_budget",
            format!("alignment {alignment} is not a power of two"),
        ));
    }
    Ok(Allocator::footprint(bytes, alignment.max(MIN_ALIGNMENT)))
}

/// `bytes` for people: `6 MiB`, `640 bytes`, `6291519 bytes (6.0 MiB)`.
pub(super) fn show_bytes(bytes: u64) -> String {
    const MIB: u64 = 1 << 20;
    match bytes {
        b if b < MIB => format!("{b} bytes"),
        b if b % MIB == 0 => format!("{} MiB", b / MIB),
        b => format!("{b} bytes ({:.1} MiB)", b as f64 / MIB as f64),
    }
}

/// Where a shared root is in its life.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) enum Phase {
    /// Consumers are declared; no runtime yet.
    Planning,
    /// The runtime runs on behalf of the consumers.
    Active,
    /// Closed (the runtime was released).
    Closed,
    /// A failure after teardown (or a lost peer) ended it: restart the process.
    Failed(String),
}

/// One allocation a consumer owns.
#[derive(Clone, Debug)]
pub(super) struct Owned {
    pub(super) record: AllocationRecord,
    /// What it costs the budget.
    pub(super) billed: u64,
}

/// A declared consumer's bookkeeping.
#[derive(Debug)]
pub(super) struct Entry {
    pub(super) spec: ConsumerSpec,
    /// The budget now (the declared one, raised by growths).
    pub(super) budget: u64,
    pub(super) open: bool,
    /// Its allocations by allocation index.
    pub(super) owned: BTreeMap<u64, Owned>,
}

impl Entry {
    pub(super) fn used(&self) -> u64 {
        self.owned.values().map(|o| o.billed).sum()
    }
}

/// The shared root's state, behind one lock (never held across collective work).
#[derive(Debug)]
pub(super) struct Inner {
    pub(super) root: Option<RootGroup>,
    pub(super) heap_size_bytes: Option<u64>,
    pub(super) growth_factor: f64,
    pub(super) phase: Phase,
    pub(super) consumers: Vec<Entry>,
    /// (consumer index, generation) of the lease holder.
    pub(super) lease: Option<(usize, u64)>,
    pub(super) generations: u64,
    pub(super) heap_size: u64,
    pub(super) timeout: Duration,
    pub(super) growths: Vec<GrowthRecord>,
    /// (index, generation) of an allocation replaced by a growth -> its replacement.
    pub(super) moved: BTreeMap<(u64, u64), AllocationId>,
}

impl Inner {
    /// Where allocation `id` is now, after every growth since it was made.
    pub(super) fn follow(&self, mut id: AllocationId) -> AllocationId {
        while let Some(next) = self.moved.get(&(id.index, id.generation)) {
            id = *next;
        }
        id
    }

    pub(super) fn describe(&self) -> String {
        let names: Vec<&str> = self
            .consumers
            .iter()
            .map(|c| c.spec.name.as_str())
            .collect();
        format!("the shared root of consumers {names:?}")
    }

    /// Fails unless the root is active (naming what ended it otherwise).
    pub(super) fn check_active(&self, operation: &str) -> Result<()> {
        let (kind, message) = match &self.phase {
            Phase::Active => return Ok(()),
            Phase::Planning => (
                ErrorKind::InvalidState,
                "the shared root is not active yet; call activate first".to_string(),
            ),
            Phase::Closed => (
                ErrorKind::InvalidState,
                "the shared root is closed".to_string(),
            ),
            Phase::Failed(cause) => {
                return Err(Error::new(
                    ErrorKind::InvalidState,
                    operation,
                    format!(
                        "the shared root failed and its consumers cannot be used any more \
                         ({cause}); restart the process"
                    ),
                )
                .with_recovery(Recovery::Terminal))
            }
        };
        Err(Error::new(kind, operation, message))
    }

    /// Fails unless `consumer` holds the lease of `generation` now.
    pub(super) fn check_lease(
        &self,
        operation: &str,
        consumer: usize,
        generation: u64,
    ) -> Result<()> {
        self.check_active(operation)?;
        let name = &self.consumers[consumer].spec.name;
        match self.lease {
            Some((holder, current)) if holder == consumer && current == generation => Ok(()),
            Some((holder, current)) => Err(Error::new(
                ErrorKind::InvalidState,
                operation,
                format!(
                    "this lease of consumer {name} (generation {generation}) is stale: the lease \
                     is now held by consumer {} (generation {current}); claim the lease again",
                    self.consumers[holder].spec.name
                ),
            )),
            None => Err(Error::new(
                ErrorKind::InvalidState,
                operation,
                format!(
                    "this lease of consumer {name} (generation {generation}) is stale: it was \
                     released; claim the lease again"
                ),
            )),
        }
    }
}

pub(super) struct Shared {
    pub(super) inner: Mutex<Inner>,
    pub(super) lease_freed: Condvar,
    /// Serialises this process's collective consumer calls (allocate, free, grow), so that a
    /// check and its billing cannot interleave with another thread's.
    pub(super) collective: Mutex<()>,
}

/// A heap shared by declared consumers (see the module documentation). Cloning gives another
/// handle to the same root.
#[derive(Clone)]
pub struct SharedRoot {
    shared: Arc<Shared>,
}

/// One consumer in [`SharedRootState`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ConsumerState {
    /// Its declaration.
    pub spec: ConsumerSpec,
    /// Its budget now (raised by growths).
    pub budget_bytes: u64,
    /// Bytes billed to it.
    pub used_bytes: u64,
    /// Its allocations' indices.
    pub allocations: Vec<u64>,
    /// Still open.
    pub open: bool,
    /// It holds the lease.
    pub holds_lease: bool,
}

/// A snapshot of a shared root: the runtime's [`DebugState`] (with the original runtime's keys)
/// plus every consumer, the lease and each growth.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SharedRootState {
    /// `planning`, `active`, `closed` or `failed: <cause>`.
    pub phase: String,
    /// The heap size it asked for (or has).
    pub heap_size_bytes: u64,
    /// The growth factor.
    pub growth_factor: f64,
    /// Growths so far.
    pub epoch: usize,
    /// The consumers in declaration order.
    pub consumers: Vec<ConsumerState>,
    /// The name of the consumer holding the lease.
    pub lease_holder: Option<String>,
    /// The generation of the latest lease.
    pub lease_generation: u64,
    /// Each growth.
    pub growths: Vec<GrowthRecord>,
    /// The runtime and lifecycle.
    #[serde(flatten)]
    pub runtime: DebugState,
}

impl SharedRoot {
    /// A shared root over `root`, in the planning state. `heap_size_bytes`: `None` = the sum of
    /// the budgets rounded up to 2 MiB (or `HYPER_MULTICORE_SHMEM_HEAP_SIZE` if set, which must
    /// cover it).
    pub fn new(root: RootGroup, heap_size_bytes: Option<u64>) -> Self {
        let timeout = Config::from_env().unwrap_or_default().timeout;
        SharedRoot {
            shared: Arc::new(Shared {
                inner: Mutex::new(Inner {
                    root: Some(root),
                    heap_size_bytes,
                    growth_factor: DEFAULT_GROWTH_FACTOR,
                    phase: Phase::Planning,
                    consumers: Vec::new(),
                    lease: None,
                    generations: 0,
                    heap_size: 0,
                    timeout,
                    growths: Vec::new(),
                    moved: BTreeMap::new(),
                }),
                lease_freed: Condvar::new(),
                collective: Mutex::new(()),
            }),
        }
    }

    /// Sets the growth factor (default 2×; more than 1) while planning.
    pub fn set_growth_factor(&self, factor: f64) -> Result<()> {
        let mut inner = self.shared.inner.lock();
        if !(factor.is_finite() && factor > 1.0) {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                "growth factor",
                format!("the growth factor must be a number above 1, not {factor}"),
            ));
        }
        if inner.phase != Phase::Planning {
            return Err(planning_only("growth factor"));
        }
        inner.growth_factor = factor;
        Ok(())
    }

    /// Declares a consumer (planning state only; names are unique, budgets positive).
    pub fn reserve(&self, spec: ConsumerSpec) -> Result<Consumer> {
        const OP: &str = "reserve";
        let mut inner = self.shared.inner.lock();
        if inner.phase != Phase::Planning {
            return Err(planning_only(OP));
        }
        let invalid = |message: String| Error::new(ErrorKind::InvalidArgument, OP, message);
        if spec.name.is_empty() {
            return Err(invalid("a consumer needs a non-empty name".into()));
        }
        if spec.budget_bytes == 0 {
            return Err(invalid(format!(
                "consumer {}: budget_bytes must be positive",
                spec.name
            )));
        }
        if spec.max_budget_bytes.is_some_and(|m| m < spec.budget_bytes) {
            return Err(invalid(format!(
                "consumer {}: max_budget_bytes ({}) is below budget_bytes ({})",
                spec.name,
                spec.max_budget_bytes.unwrap_or_default(),
                spec.budget_bytes
            )));
        }
        if inner.consumers.iter().any(|c| c.spec.name == spec.name) {
            return Err(invalid(format!(
                "a consumer named {} is already declared; names are unique in a root",
                spec.name
            )));
        }
        let name = spec.name.clone();
        inner.consumers.push(Entry {
            budget: spec.budget_bytes,
            spec,
            open: true,
            owned: BTreeMap::new(),
        });
        Ok(Consumer {
            shared: Arc::clone(&self.shared),
            index: inner.consumers.len() - 1,
            name,
        })
    }

    /// Collective over the root group: freezes the declarations, checks that every rank
    /// declared the same consumers (a difference names the consumer and the ranks, on every
    /// rank), sizes the heap, and takes the process's single lifecycle reference.
    pub fn activate(&self) -> Result<()> {
        const OP: &str = "activate";
        let (declared, root, explicit) = {
            let inner = self.shared.inner.lock();
            if inner.phase != Phase::Planning {
                return Err(planning_only(OP));
            }
            let declared: Vec<ConsumerSpec> =
                inner.consumers.iter().map(|c| c.spec.clone()).collect();
            (
                declared,
                inner.root.clone().expect("a planning root has its group"),
                inner.heap_size_bytes,
            )
        };
        let channel = activation_channel(&root)?;
        let local = activation_checks(&declared, explicit);
        let rank = channel.rank();
        let values = converge(channel.as_ref(), OP, local.map_err(|e| e.on_rank(rank)))?;
        if let Some(message) = declaration_difference(&values) {
            return Err(Error::new(ErrorKind::InvalidArgument, OP, message).on_rank(rank));
        }
        let heap = values[rank].heap_size;
        acquire_reference(root, Some(heap))?;
        let mut inner = self.shared.inner.lock();
        inner.heap_size = heap;
        inner.phase = Phase::Active;
        set_managed(Some(inner.describe()), None);
        Ok(())
    }

    /// Collective: releases the runtime (the normal release stages) once every consumer is
    /// closed and no lease is held (checked on every rank before any collective work).
    /// Idempotent: closing a closed root does nothing.
    pub fn close(&self) -> Result<()> {
        const OP: &str = "close";
        let _collective = self.shared.collective.lock();
        let local = {
            let inner = self.shared.inner.lock();
            match &inner.phase {
                Phase::Closed => return Ok(()),
                Phase::Planning => {
                    drop(inner);
                    self.shared.inner.lock().phase = Phase::Closed;
                    return Ok(());
                }
                Phase::Active | Phase::Failed(_) => inner.check_active(OP)?,
            }
            close_checks(&inner)
        };
        let channel = root_channel(OP)?;
        let rank = channel.rank();
        converge(channel.as_ref(), OP, local.map_err(|e| e.on_rank(rank)))?;
        set_managed(None, None);
        let outcome = release_reference();
        let mut inner = self.shared.inner.lock();
        match &outcome {
            Ok(()) => inner.phase = Phase::Closed,
            Err(e) if e.recovery() == Some(Recovery::Retryable) => {
                set_managed(Some(inner.describe()), inner.lease.map(|(_, g)| g));
            }
            Err(e) => inner.phase = Phase::Failed(e.to_string()),
        }
        outcome
    }

    /// A snapshot: the runtime's debug state with the original runtime's keys, every
    /// consumer's budget, use and allocations, the lease holder, and each growth.
    pub fn debug_state(&self) -> SharedRootState {
        let runtime = super::debug_state();
        let inner = self.shared.inner.lock();
        let phase = match &inner.phase {
            Phase::Planning => "planning".to_string(),
            Phase::Active => "active".to_string(),
            Phase::Closed => "closed".to_string(),
            Phase::Failed(cause) => format!("failed: {cause}"),
        };
        SharedRootState {
            phase,
            heap_size_bytes: if inner.heap_size > 0 {
                inner.heap_size
            } else {
                inner.heap_size_bytes.unwrap_or(0)
            },
            growth_factor: inner.growth_factor,
            epoch: inner.growths.len(),
            consumers: inner
                .consumers
                .iter()
                .enumerate()
                .map(|(index, c)| ConsumerState {
                    spec: c.spec.clone(),
                    budget_bytes: c.budget,
                    used_bytes: c.used(),
                    allocations: c.owned.keys().copied().collect(),
                    open: c.open,
                    holds_lease: inner.lease.is_some_and(|(holder, _)| holder == index),
                })
                .collect(),
            lease_holder: inner
                .lease
                .map(|(holder, _)| inner.consumers[holder].spec.name.clone()),
            lease_generation: inner.generations,
            growths: inner.growths.clone(),
            runtime,
        }
    }
}

fn planning_only(operation: &str) -> Error {
    Error::new(
        ErrorKind::InvalidState,
        operation,
        "the shared root is no longer planning: consumers are declared (and the growth factor \
         set) before activate",
    )
}

/// The channel of the root group (a member list forms its subgroup, as acquire would).
fn activation_channel(root: &RootGroup) -> Result<Arc<dyn GroupChannel>> {
    Ok(match root {
        RootGroup::World => World::global()?,
        RootGroup::Members(members) => World::global()?.subgroup(members)?,
        RootGroup::Channel(channel) => Arc::clone(channel),
    })
}

/// What each rank brings to activation.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Declaration {
    consumers: Vec<ConsumerSpec>,
    heap_size: u64,
}

/// Activation's local checks: a consumer at least, no reference held yet, a heap that covers
/// the budgets.
fn activation_checks(declared: &[ConsumerSpec], explicit: Option<u64>) -> Result<Declaration> {
    const OP: &str = "activate";
    if declared.is_empty() {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            OP,
            "no consumer is declared; reserve at least one before activate",
        ));
    }
    let references = super::reference_count();
    if references > 0 {
        return Err(Error::new(
            ErrorKind::InvalidState,
            OP,
            format!(
                "{references} lifecycle reference(s) are held already; the shared root takes \
                 the process's single reference: release them first"
            ),
        ));
    }
    let budgets = declared
        .iter()
        .fold(0u64, |sum, c| sum.saturating_add(c.budget_bytes));
    let needed = budgets
        .div_ceil(HEAP_ROUNDING)
        .saturating_mul(HEAP_ROUNDING);
    let from_env = std::env::var_os(HEAP_SIZE)
        .is_some()
        .then(|| Config::from_env().map(|c| c.heap_size))
        .transpose()?;
    let heap_size = match (explicit, from_env) {
        (Some(heap), _) | (None, Some(heap)) if heap < needed => {
            let source = if explicit.is_some() {
                "heap_size_bytes".to_string()
            } else {
                HEAP_SIZE.to_string()
            };
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                OP,
                format!(
                    "the heap is too small: {source} gives {heap} bytes, but the consumers' \
                     budgets add up to {budgets} bytes ({needed} rounded up to 2 MiB); raise \
                     it or leave it unset"
                ),
            ));
        }
        (Some(heap), _) | (None, Some(heap)) => heap,
        (None, None) => needed,
    };
    Ok(Declaration {
        consumers: declared.to_vec(),
        heap_size,
    })
}

/// The first consumer whose declaration differs across ranks, with each group of ranks'
/// version; or a heap size that differs. `None` when every rank declared the same.
fn declaration_difference(values: &[Declaration]) -> Option<String> {
    let count = values.iter().map(|v| v.consumers.len()).max().unwrap_or(0);
    for position in 0..count {
        let at: Vec<Option<&ConsumerSpec>> =
            values.iter().map(|v| v.consumers.get(position)).collect();
        let groups = hook::group_ranks(&at, |a, b| a == b);
        if groups.len() > 1 {
            let name = at.iter().flatten().next().map_or("?", |c| c.name.as_str());
            let listing: Vec<String> = groups
                .iter()
                .map(|(ranks, first)| match at[*first] {
                    Some(c) => format!(
                        "root_ranks={ranks:?}: {} (kind {}, budget {} bytes, layout {:?}, max \
                         budget {:?})",
                        c.name, c.kind, c.budget_bytes, c.layout, c.max_budget_bytes
                    ),
                    None => format!("root_ranks={ranks:?}: no consumer"),
                })
                .collect();
            return Some(format!(
                "consumer {name} (declaration {position}) differs across root ranks: {}; every \
                 rank must declare the same consumers in the same order",
                listing.join("; ")
            ));
        }
    }
    let heaps = hook::group_ranks(values, |a, b| a.heap_size == b.heap_size);
    if heaps.len() > 1 {
        let listing: Vec<String> = heaps
            .iter()
            .map(|(ranks, first)| format!("root_ranks={ranks:?}: {}", values[*first].heap_size))
            .collect();
        return Some(format!(
            "the heap size differs across root ranks: {}; pass the same heap_size_bytes (and \
             {HEAP_SIZE}) on every rank",
            listing.join("; ")
        ));
    }
    None
}

/// Close's local checks: every consumer closed, no lease held.
fn close_checks(inner: &Inner) -> Result<()> {
    const OP: &str = "close";
    let open: Vec<&str> = inner
        .consumers
        .iter()
        .filter(|c| c.open)
        .map(|c| c.spec.name.as_str())
        .collect();
    if !open.is_empty() {
        return Err(Error::new(
            ErrorKind::InvalidState,
            OP,
            format!("consumers {open:?} are still open; close them first"),
        ));
    }
    if let Some((holder, _)) = inner.lease {
        return Err(Error::new(
            ErrorKind::InvalidState,
            OP,
            format!(
                "consumer {} holds the lease; release it first",
                inner.consumers[holder].spec.name
            ),
        ));
    }
    Ok(())
}
