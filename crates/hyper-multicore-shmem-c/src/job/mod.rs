//! This process's part of the job as the C API sees it: the runtime reference taken by
//! `shmem_init` (the lifecycle's [`acquire`](hyper_multicore::lifecycle::acquire)), where this
//! PE's heap is mapped, the allocations made through `shmem_malloc` and friends, and the
//! executable's data and bss — the tables that turn a symmetric address into the runtime's
//! (allocation, offset) [`Region`].
//!
//! Global and static variables are symmetric: at `shmem_init` the executable's writable data
//! and bss (past their read-only-after-relocation part) are copied into a heap allocation of
//! their size, made on every PE alike (the same executable), and that allocation's pages are
//! mapped over them at their own addresses (`sys/static_data.rs`). A global variable is then the
//! allocation's memory: a peer's put, get or atomic on it goes through the runtime like any heap
//! access — on every route, since it is the heap. The heap is enlarged by the data's size, so
//! `SHMEM_SYMMETRIC_SIZE` stays available to `shmem_malloc`. A heap restart
//! (`shmemx_restart_heap`, [`restart_heap`]) carries that allocation into the new heap
//! (preserved, first) and maps its pages over the data and bss again.
//!
//! The files: `allocations.rs` holds the table of live allocations, `addresses.rs` turns an
//! address into the runtime's region (through a lock-free cache of the blocks found last),
//! `statics.rs` makes the data and bss symmetric, `restart.rs` restarts the heap.

mod addresses;
mod allocations;
mod restart;
mod statics;

use std::sync::atomic::{AtomicUsize, Ordering};

use hyper_multicore::lifecycle;
use hyper_multicore::shmem::{Element, Region, Shmem, Symmetric};
use parking_lot::RwLock;

use crate::failure::{check, fail};
use crate::sys::{caller_memory, static_data};
use addresses::tables_changed;
pub(crate) use addresses::{
    add_allocation, allocation_at, locate, located, region, region_to_end, remove_allocation,
};
use allocations::Allocations;
pub(crate) use restart::{restart_heap, Resize};
use statics::{share_statics, Statics};

/// What `shmem_init` found, and the live allocations.
#[derive(Debug)]
struct Job {
    heap_address: usize,
    heap_size: u64,
    /// Live allocations made through this API.
    allocations: Allocations,
    /// The executable's data and bss, once symmetric.
    statics: Statics,
}

impl Job {
    /// The heap offset of `address`, if it lies in this PE's heap.
    fn heap_offset(&self, address: usize) -> Option<u64> {
        let offset = address.checked_sub(self.heap_address)? as u64;
        (offset < self.heap_size).then_some(offset)
    }
}

/// This process's job: `None` before `shmem_init` and after `shmem_finalize`.
static JOB: RwLock<Option<Job>> = RwLock::new(None);
/// This PE's rank once initialized (`usize::MAX` before): read by failure messages, which must
/// not take the job's lock.
static RANK: AtomicUsize = AtomicUsize::new(usize::MAX);
/// The number of PEs once initialized (0 before): read by every call's PE check without the
/// job's lock.
static SIZE: AtomicUsize = AtomicUsize::new(0);

/// Why a call made before `shmem_init` fails.
const NOT_INITIALIZED: &str = "the OpenSHMEM library is not initialized; call shmem_init first";

/// A region of the runtime's heap as a symmetric target of any element type.
#[derive(Clone, Copy, Debug)]
pub(crate) struct At(pub(crate) Region);

impl<T: Element> Symmetric<T> for At {
    fn region(&self) -> Region {
        self.0
    }
}

/// This PE's rank, once `shmem_init` has run.
pub(crate) fn rank() -> Option<usize> {
    Some(RANK.load(Ordering::Relaxed)).filter(|&rank| rank != usize::MAX)
}

/// True once `shmem_init` has run (and `shmem_finalize` has not).
pub(crate) fn initialized() -> bool {
    JOB.read().is_some()
}

/// Collective: joins the job (hmrun's world), takes a reference to the runtime with a heap of
/// `heap_size` bytes (`None`: the runtime's configured size) plus the executable's data and
/// bss, and makes those symmetric. A second call is a no-op.
pub(crate) fn start(call: &str, heap_size: Option<u64>) {
    let mut job = JOB.write();
    if job.is_some() {
        return;
    }
    let statics = static_data::writable_range();
    // Linked statically, this library's own state lives in that range: it cannot be remapped
    // while in use.
    let own_state = &JOB as *const _ as usize;
    let statics = match statics {
        Some((start, end)) if (start..end).contains(&own_state) => Err(
            "libhmshmem is linked statically into the executable, so its data cannot be made \
             symmetric; link it dynamically (hmcc does)"
                .to_string(),
        ),
        Some(range) => Ok(range),
        None => Err("the executable has no writable data".to_string()),
    };
    let static_bytes = statics
        .as_ref()
        .map_or(0, |(start, end)| (end - start) as u64);
    let heap_size = match heap_size {
        Some(size) => size,
        None => check(call, hyper_multicore::config::Config::from_env()).heap_size,
    };
    caller_memory::mappings_changed();
    check(
        call,
        lifecycle::acquire(None, Some(heap_size.saturating_add(static_bytes))),
    );
    caller_memory::mappings_changed();
    let (rank, size, heap_address, heap_size) = check(
        call,
        lifecycle::guarded(call, |shmem| {
            Ok((
                shmem.rank(),
                shmem.size(),
                shmem.heap_address(),
                shmem.heap_size(),
            ))
        }),
    );
    RANK.store(rank, Ordering::Relaxed);
    SIZE.store(size, Ordering::Relaxed);
    let statics = match statics {
        Ok((start, end)) => share_statics(call, start, end, heap_address),
        Err(why) => Statics::Private(why),
    };
    *job = Some(Job {
        heap_address,
        heap_size,
        allocations: Allocations::default(),
        statics,
    });
    tables_changed();
}

/// Collective: frees every allocation still live (in heap order, the same on every PE) and
/// drops the runtime reference. A call without `shmem_init` is a no-op.
pub(crate) fn finish(call: &str) {
    let mut job = JOB.write();
    let Some(state) = job.take() else {
        return;
    };
    tables_changed();
    run(call, |shmem| {
        shmem.barrier()?;
        state
            .allocations
            .iter()
            .try_for_each(|allocated| shmem.free_id(allocated.id))?;
        // The data and bss stay mapped onto the freed allocation's pages: the mapping keeps
        // them alive, and nothing else uses them once the runtime is gone.
        match &state.statics {
            Statics::Symmetric { record, .. } => shmem.free_id(record.id),
            Statics::Private(_) => Ok(()),
        }
    });
    check(call, lifecycle::release());
    caller_memory::mappings_changed();
    RANK.store(usize::MAX, Ordering::Relaxed);
    SIZE.store(0, Ordering::Relaxed);
}

/// Runs `f` on the runtime (a guarded call); any error ends the PE naming `call`.
///
/// The word-sized calls pass a closure that captures one reference (to a tuple of their
/// arguments): the guard moves `f`, and a closure of several captures, just stored word by
/// word, is copied in 16-byte halves, which stalls store-to-load forwarding on every call.
/// (`rma::g` does better with a closure whose whole body is an `#[inline(always)]` function:
/// see `rma::get_word`.)
#[inline(always)]
pub(crate) fn run<R>(call: &str, f: impl FnOnce(&Shmem) -> hyper_multicore::Result<R>) -> R {
    if rank().is_none() {
        fail(call, NOT_INITIALIZED);
    }
    check(call, lifecycle::guarded(call, f))
}

/// `shmem_fence` or `shmem_quiet` (`call`): `order_puts`, the lifecycle's `fence` or `quiet`
/// (a memory fence alone when every PE is in this host's shared memory); fails before
/// `shmem_init`.
#[inline]
pub(crate) fn order(call: &str, order_puts: fn() -> hyper_multicore::Result<()>) {
    my_pe(call);
    check(call, order_puts());
}

/// The number of PEs (fails before `shmem_init`).
pub(crate) fn n_pes(call: &str) -> usize {
    match SIZE.load(Ordering::Relaxed) {
        0 => fail(call, NOT_INITIALIZED),
        size => size,
    }
}

/// This PE's rank (fails before `shmem_init`).
pub(crate) fn my_pe(call: &str) -> usize {
    rank().unwrap_or_else(|| fail(call, NOT_INITIALIZED))
}

/// Checks that `pe` names a PE of the job and returns it as an index.
pub(crate) fn target_pe(call: &str, pe: std::ffi::c_int) -> usize {
    let size = n_pes(call);
    match usize::try_from(pe) {
        Ok(pe) if pe < size => pe,
        _ => fail(
            call,
            format!("PE {pe} does not exist: the job has PEs 0..{size}"),
        ),
    }
}
