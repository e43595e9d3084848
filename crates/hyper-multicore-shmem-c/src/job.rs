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

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use hyper_multicore::lifecycle::{self, Replacement};
use hyper_multicore::shmem::{
    AllocationId, AllocationRecord, AllocationSpec, Dtype, Element, Located, LocatedCache, Region,
    Shmem, Symmetric,
};
use parking_lot::RwLock;

use crate::failure::{check, fail, record};
use crate::sys::{caller_memory, static_data};

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

/// What became of the executable's data and bss.
#[derive(Debug)]
enum Statics {
    /// Symmetric: `start..start + record.bytes` is mapped onto allocation `record`.
    Symmetric {
        start: usize,
        record: AllocationRecord,
    },
    /// Not symmetric, for this reason.
    Private(String),
}

/// One live allocation made through this API: what the calls need of its record.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Allocated {
    pub(crate) id: AllocationId,
    /// Heap offset of its first byte.
    pub(crate) offset: u64,
    pub(crate) bytes: u64,
    /// The alignment it was asked for (a restart asks for the same).
    alignment: Option<u64>,
}

impl Allocated {
    fn of(record: &AllocationRecord) -> Allocated {
        Allocated {
            id: record.id,
            offset: record.offset,
            bytes: record.bytes,
            alignment: record.spec.alignment,
        }
    }

    fn region(&self) -> Region {
        Region {
            id: self.id,
            heap_offset: self.offset,
            bytes: self.bytes,
        }
    }
}

/// The live allocations by heap offset: a vector sorted by offset while few are live (it keeps
/// its room when the last block is freed, where a B-tree allocated and freed a node on every
/// `shmem_malloc` + `shmem_free` of a program with nothing else live: 364 against 407 ns per
/// pair), a B-tree once many are (a vector's free moves every later block: 14.3 µs at 50,000
/// live, against 0.58 µs).
#[derive(Debug)]
enum Allocations {
    /// Sorted by offset, searched by bisection.
    Few(Vec<Allocated>),
    /// By offset.
    Many(BTreeMap<u64, Allocated>),
}

/// Past this many live blocks [`Allocations`] moves to a B-tree; below [`FEW`], back.
const MANY: usize = 1024;
/// See [`MANY`] (apart, so that a program hovering at the limit does not convert on every call).
const FEW: usize = 256;

impl Default for Allocations {
    fn default() -> Self {
        Allocations::Few(Vec::new())
    }
}

impl Allocations {
    fn insert(&mut self, allocated: Allocated) {
        match self {
            Allocations::Few(sorted) if sorted.len() < MANY => {
                let at = sorted.partition_point(|a| a.offset < allocated.offset);
                sorted.insert(at, allocated);
            }
            Allocations::Few(sorted) => {
                let mut tree: BTreeMap<u64, Allocated> =
                    sorted.drain(..).map(|a| (a.offset, a)).collect();
                tree.insert(allocated.offset, allocated);
                *self = Allocations::Many(tree);
            }
            Allocations::Many(tree) => {
                tree.insert(allocated.offset, allocated);
            }
        }
    }

    /// The allocation starting at heap offset `offset`.
    fn get(&self, offset: u64) -> Option<Allocated> {
        match self {
            Allocations::Few(sorted) => sorted
                .binary_search_by_key(&offset, |a| a.offset)
                .ok()
                .map(|at| sorted[at]),
            Allocations::Many(tree) => tree.get(&offset).copied(),
        }
    }

    /// Takes out the allocation starting at heap offset `offset`.
    fn remove(&mut self, offset: u64) -> Option<Allocated> {
        match self {
            Allocations::Few(sorted) => {
                let at = sorted.binary_search_by_key(&offset, |a| a.offset).ok()?;
                Some(sorted.remove(at))
            }
            Allocations::Many(tree) => {
                let removed = tree.remove(&offset);
                if tree.len() < FEW {
                    *self = Allocations::Few(std::mem::take(tree).into_values().collect());
                }
                removed
            }
        }
    }

    /// The allocations in offset order.
    fn iter(&self) -> Box<dyn Iterator<Item = &Allocated> + '_> {
        match self {
            Allocations::Few(sorted) => Box::new(sorted.iter()),
            Allocations::Many(tree) => Box::new(tree.values()),
        }
    }

    /// The allocation with the highest offset at or below `offset`.
    fn at_or_below(&self, offset: u64) -> Option<&Allocated> {
        match self {
            Allocations::Few(sorted) => {
                let after = sorted.partition_point(|a| a.offset <= offset);
                after.checked_sub(1).map(|at| &sorted[at])
            }
            Allocations::Many(tree) => tree.range(..=offset).next_back().map(|(_, a)| a),
        }
    }
}

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

/// Collective: copies `start..end` (the executable's data and bss) into a new allocation and
/// maps the allocation over it. Every PE learns whether every PE could: if one could not (under
/// valgrind, which cannot duplicate a shared mapping with `mremap`, for one), every PE puts its
/// data back into private memory and frees the allocation, and global variables are not
/// symmetric in this job — a call that names one fails, saying why.
fn share_statics(call: &str, start: usize, end: usize, heap_address: usize) -> Statics {
    let spec = AllocationSpec {
        shape: vec![end - start],
        dtype: Dtype::U8,
        alignment: Some(rustix::param::page_size() as u64),
    };
    let record = run(call, |shmem| {
        let record = shmem.allocate_spec(&spec)?;
        let rank = shmem.rank();
        shmem.put_bytes(
            record.region(),
            &static_data::snapshot(start, end - start),
            rank,
        )?;
        Ok(record)
    });
    let shared = heap_address + record.offset as usize;
    // SAFETY: at shmem_init, before the program uses symmetric data; this library's state is not
    // in the range (checked by `start`); the range's bytes were just copied into the allocation.
    let aliased = unsafe { static_data::alias_onto(shared, start, end - start) };
    if let Err(error) = &aliased {
        // A failed fixed mremap may already have unmapped the range: private pages with the
        // bytes again (the allocation holds them), before anything touches a global.
        // SAFETY: as above; `shared` holds the range's bytes.
        if let Err(again) = unsafe { static_data::make_private(start, end - start, shared) } {
            fail(
                call,
                format!(
                    "cannot map the executable's data and bss onto the symmetric heap \
                     ({error}), nor back to private memory: {again}"
                ),
            );
        }
    }
    // Every PE's outcome (empty: mapped). Peers write into this PE's data only once every PE
    // has mapped it, which this exchange also waits for.
    let outcome = aliased.as_ref().err().map(ToString::to_string);
    let outcomes = run(call, |shmem| {
        shmem
            .control()
            .allgather(outcome.as_deref().unwrap_or("").as_bytes())
    });
    let Some((pe, error)) = outcomes
        .iter()
        .enumerate()
        .find(|(_, error)| !error.is_empty())
    else {
        caller_memory::statics_are_shared(start, end, shared);
        return Statics::Symmetric { start, record };
    };
    if aliased.is_ok() {
        // SAFETY: still inside shmem_init, and no peer writes the range (every PE learnt that
        // the data stay private); this library's state is not in the range; the range is
        // `shared`'s pages, so `shared` holds its bytes.
        if let Err(error) = unsafe { static_data::make_private(start, end - start, shared) } {
            fail(
                call,
                format!("cannot map the executable's data and bss back to private memory: {error}"),
            );
        }
    }
    run(call, |shmem| shmem.free_id(record.id));
    Statics::Private(format!(
        "PE {pe} could not map its data and bss onto the symmetric heap ({}), so in this job \
         only memory from shmem_malloc is symmetric (valgrind, for one, cannot make the \
         mapping this needs)",
        String::from_utf8_lossy(error)
    ))
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

/// One block of a heap restart: the live allocation starting at `address` is replaced by one
/// of `bytes` bytes (its alignment kept), holding the first min(old, new) bytes of the old one
/// if `preserve`, else zeros.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Resize {
    pub(crate) address: usize,
    pub(crate) bytes: usize,
    pub(crate) preserve: bool,
}

/// Collective: the lifecycle's [`restart`](lifecycle::restart) to a heap of `heap_size` bytes
/// for `shmem_malloc` (plus the data and bss, as at `shmem_init`), replacing every live
/// allocation as `resizes` says (in the same order on every PE); returns the new blocks'
/// addresses in request order.
///
/// The executable's data and bss are one more replacement, always preserved and first (so a
/// heap grown in place keeps them at their heap offset throughout), and their pages are mapped
/// again over the same addresses onto the new allocation afterwards: until then they are still
/// a view of the old heap's pages (the old memfd, or the same one grown in place), which keeps
/// their values. A program bug found here (an address that is not the start of a live
/// allocation, a size of 0) ends the PE; a failure the runtime classifies as retryable
/// (refused before any teardown: a block left out, a heap too small, requests that differ
/// across PEs) is recorded for `shmemx_last_error` and returned, with nothing changed; any
/// other failure ends the PE.
pub(crate) fn restart_heap(
    call: &str,
    heap_size: u64,
    resizes: &[Resize],
) -> Result<Vec<usize>, hyper_multicore::Error> {
    if rank().is_none() {
        fail(call, NOT_INITIALIZED);
    }
    if heap_size == 0 {
        fail(call, "new_size must be positive (bytes for shmem_malloc)");
    }
    let mut guard = JOB.write();
    let job = guard
        .as_mut()
        .unwrap_or_else(|| fail(call, NOT_INITIALIZED));
    let mut replacements = Vec::with_capacity(resizes.len() + 1);
    let static_bytes = match &job.statics {
        Statics::Symmetric { record, .. } => {
            replacements.push(Replacement {
                current: record.region(),
                target: record.spec.clone(),
                preserve: true,
            });
            record.bytes
        }
        Statics::Private(_) => 0,
    };
    for (index, resize) in resizes.iter().enumerate() {
        let record = job
            .heap_offset(resize.address)
            .and_then(|offset| job.allocations.get(offset))
            .unwrap_or_else(|| {
                fail(
                    call,
                    format!(
                        "replacement {index}: address {:#x} is not the start of a live                          shmem_malloc allocation; pass the pointers shmem_malloc returned",
                        resize.address
                    ),
                )
            });
        if resize.bytes == 0 {
            fail(
                call,
                format!("replacement {index}: new_bytes must be positive"),
            );
        }
        replacements.push(Replacement {
            current: record.region(),
            target: AllocationSpec {
                shape: vec![resize.bytes.next_multiple_of(4)],
                dtype: Dtype::U8,
                alignment: record.alignment,
            },
            preserve: resize.preserve,
        });
    }
    tables_changed();
    caller_memory::mappings_changed();
    let outcome = lifecycle::restart(heap_size.saturating_add(static_bytes), &replacements, None);
    caller_memory::mappings_changed();
    let result = match outcome {
        Ok(result) => result,
        Err(error) if error.recovery() == Some(hyper_multicore::Recovery::Retryable) => {
            record(call, &error.to_string());
            return Err(error);
        }
        Err(error) => fail(call, error),
    };
    let (heap_address, new_heap_size) = check(
        call,
        lifecycle::guarded(call, |shmem| Ok((shmem.heap_address(), shmem.heap_size()))),
    );
    job.heap_address = heap_address;
    job.heap_size = new_heap_size;
    let mut records = result.allocations.into_iter();
    if let Statics::Symmetric { start, record } = &mut job.statics {
        let moved = records
            .next()
            .expect("the data and bss were replaced first");
        let shared = heap_address + moved.offset as usize;
        // SAFETY: inside shmemx_restart_heap, a collective call: the program is not using its
        // symmetric data meanwhile; this library's state is not in the range (checked at
        // shmem_init); the restart preserved the range's bytes into the new allocation.
        if let Err(error) = unsafe { static_data::alias_onto(shared, *start, moved.bytes as usize) }
        {
            fail(
                call,
                format!(
                    "cannot map the executable's data and bss onto the restarted heap: {error}"
                ),
            );
        }
        caller_memory::statics_are_shared(*start, *start + moved.bytes as usize, shared);
        *record = moved;
    }
    job.allocations = Allocations::default();
    let mut addresses = Vec::with_capacity(resizes.len());
    for record in records {
        addresses.push(heap_address + record.offset as usize);
        job.allocations.insert(Allocated::of(&record));
    }
    tables_changed();
    caller_memory::mappings_changed();
    drop(guard);
    // Peers write into this PE's data only once every PE has mapped it again.
    run(call, |shmem| shmem.barrier());
    Ok(addresses)
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

/// A block of symmetric memory: `start..end` in this process, allocation `id` whose first byte
/// is at heap offset `offset`.
#[derive(Clone, Copy, Debug)]
struct Block {
    start: usize,
    end: usize,
    id: AllocationId,
    offset: u64,
}

impl Block {
    /// The whole block as a runtime region.
    fn region(&self) -> Region {
        Region {
            id: self.id,
            heap_offset: self.offset,
            bytes: (self.end - self.start) as u64,
        }
    }
}

/// Bumped whenever a block may leave the tables (an allocation freed, init, finalize, a
/// restart): a cached block of an older epoch is looked up again. A new allocation does not bump
/// it: it takes free heap, which no cached (live) block covers.
static TABLE_EPOCH: AtomicU64 = AtomicU64::new(0);

/// The blocks located last (by any thread), readable without a lock: each entry the
/// runtime's [`Located`] of a whole block (checked once, when it was found in the tables), keyed
/// by the block's start and end in this process and the table epoch it was found in.
/// Consecutive calls on the same few buffers (the common case: a ping-pong's data and signal
/// words, a put-with-signal's two) skip the job's lock, the table and the runtime's full region
/// check, and, unlike a thread-local cache, pay no thread-local lookup (a call into the dynamic
/// loader in a shared library).
static CACHE: [LocatedCache; CACHED_BLOCKS] = [const { LocatedCache::new() }; CACHED_BLOCKS];

/// How many blocks [`CACHE`] holds: a program that works on more buffers in turn (a halo
/// exchange's, a few arrays') takes the tables' path on every call.
const CACHED_BLOCKS: usize = 16;

/// The entry of [`CACHE`] that held the block found last (looked at first).
static LAST_HIT: AtomicUsize = AtomicUsize::new(0);

/// The entry of [`CACHE`] the next block found in the tables replaces (round robin).
static NEXT_FILL: AtomicUsize = AtomicUsize::new(0);

/// Voids every cached block. Every caller holds [`JOB`]'s write lock (the tables change only
/// under it), so the bump is a plain store, not a locked read-modify-write.
fn tables_changed() {
    let epoch = TABLE_EPOCH.load(Ordering::Relaxed);
    TABLE_EPOCH.store(epoch + 1, Ordering::Release);
}

/// Where the symmetric `bytes` bytes at `address` are: the runtime's [`Located`] range of the
/// live allocation holding them (for the data plane's `_located` entries, which check only
/// that the allocation is still live in the same runtime lifetime), or `Err` with the reason.
pub(crate) fn locate(address: usize, bytes: usize) -> Result<Located, String> {
    let epoch = TABLE_EPOCH.load(Ordering::Acquire);
    match cached(address, bytes, epoch) {
        Some(at) => Ok(at),
        None => locate_in_tables(address, bytes, epoch),
    }
}

/// The part of a cached block holding the `bytes` bytes at `address`, if the cache holds that
/// block as of table epoch `epoch`: the entry that held the last block found first.
#[inline(always)]
fn cached(address: usize, bytes: usize, epoch: u64) -> Option<Located> {
    let first = LAST_HIT.load(Ordering::Relaxed) % CACHED_BLOCKS;
    match cached_in(first, address, bytes, epoch) {
        Some(at) => Some(at),
        None => cached_elsewhere(first, address, bytes, epoch),
    }
}

/// [`cached`] in the entries but `first`; the entry that holds the block becomes the one
/// looked at first.
#[inline(never)]
fn cached_elsewhere(first: usize, address: usize, bytes: usize, epoch: u64) -> Option<Located> {
    (1..CACHED_BLOCKS).find_map(|step| {
        let entry = (first + step) % CACHED_BLOCKS;
        // Two loads rule most entries out before the sequence-locked read of all of them.
        let [start, end] = CACHE[entry].key_hint();
        if !(start as usize <= address && address < end as usize) {
            return None;
        }
        let at = cached_in(entry, address, bytes, epoch)?;
        LAST_HIT.store(entry, Ordering::Relaxed);
        Some(at)
    })
}

/// [`cached`] in entry `entry` of the cache.
#[inline(always)]
fn cached_in(entry: usize, address: usize, bytes: usize, epoch: u64) -> Option<Located> {
    let ([start, end, seen], block) = CACHE[entry].load()?;
    let (start, end) = (start as usize, end as usize);
    if seen == epoch && start <= address && address < end {
        // `part` also checks that the bytes end inside the block.
        return block.part((address - start) as u64, bytes as u64);
    }
    None
}

/// Caches `whole`, the block `start..end` found in the tables as of table epoch `epoch`, in
/// the next entry round robin.
fn cache(start: usize, end: usize, epoch: u64, whole: Located) {
    let entry = NEXT_FILL.fetch_add(1, Ordering::Relaxed) % CACHED_BLOCKS;
    CACHE[entry].store([start as u64, end as u64, epoch], whole);
    LAST_HIT.store(entry, Ordering::Relaxed);
}

/// [`locate`] past the cached block: looks the block up in the tables (under the job's
/// lock), has the runtime check it, and caches it; or explains why the bytes are not
/// symmetric.
#[cold]
#[inline(never)]
fn locate_in_tables(address: usize, bytes: usize, epoch: u64) -> Result<Located, String> {
    let block = find_block(address, bytes)?;
    let whole = lifecycle::guarded("locate", |shmem| {
        shmem.locate_region("locate", block.region())
    })
    .map_err(|error| {
        format!(
            "the symmetric block {:#x}..{:#x} holding address {address:#x} is not usable: \
             {error}",
            block.start, block.end
        )
    })?;
    cache(block.start, block.end, epoch, whole);
    if address.saturating_add(bytes) > block.end {
        return Err(format!(
            "bytes {address:#x}..{:#x} run past the end of the symmetric block they start in \
             ({:#x}..{:#x}: a shmem_malloc allocation, or the program's data and bss)",
            address.saturating_add(bytes),
            block.start,
            block.end
        ));
    }
    whole
        .part((address - block.start) as u64, bytes as u64)
        .ok_or_else(|| "bytes past the block's end".to_string())
}

/// The block holding `address` (`bytes` long: an address just past a block's end is in it only
/// for zero bytes), found in the tables.
fn find_block(address: usize, bytes: usize) -> Result<Block, String> {
    let job = JOB.read();
    let Some(job) = job.as_ref() else {
        return Err(NOT_INITIALIZED.into());
    };
    if let Statics::Symmetric { start, record } = &job.statics {
        let end = start + record.bytes as usize;
        if (*start..end).contains(&address) {
            return Ok(Block {
                start: *start,
                end,
                id: record.id,
                offset: record.offset,
            });
        }
    }
    let Some(offset) = job.heap_offset(address) else {
        let heap_end = job.heap_address + job.heap_size as usize;
        let statics = match &job.statics {
            Statics::Symmetric { start, record } => format!(
                "nor in the program's data and bss ({start:#x}..{:#x}); pass a global or static \
                 variable, or memory from shmem_malloc",
                start + record.bytes as usize
            ),
            Statics::Private(why) => format!(
                "and global variables are not symmetric: {why}; pass memory from shmem_malloc"
            ),
        };
        return Err(format!(
            "address {address:#x} is not symmetric: it is neither in this PE's symmetric heap \
             ({:#x}..{heap_end:#x}) {statics}",
            job.heap_address
        ));
    };
    let record = job.allocations.at_or_below(offset).filter(|record| {
        offset < record.offset + record.bytes
            || (bytes == 0 && offset == record.offset + record.bytes)
    });
    match record {
        Some(record) => Ok(Block {
            start: job.heap_address + record.offset as usize,
            end: job.heap_address + (record.offset + record.bytes) as usize,
            id: record.id,
            offset: record.offset,
        }),
        None => Err(format!(
            "bytes {address:#x}..{:#x} of the symmetric heap are not inside one live \
             shmem_malloc allocation (freed, never allocated, or past its end)",
            address + bytes
        )),
    }
}

/// [`locate`], ending the PE on failure.
///
/// The cached block's path is inlined and hands the range back by value, with no `Result` in
/// between: moving a just-built range through a `Result` (stored as words, reloaded as 16-byte
/// halves) stalled store-to-load forwarding on every call.
#[inline(always)]
pub(crate) fn located(call: &str, address: usize, bytes: usize) -> Located {
    let epoch = TABLE_EPOCH.load(Ordering::Acquire);
    if let Some(at) = cached(address, bytes, epoch) {
        return at;
    }
    located_in_tables(call, address, bytes, epoch)
}

/// [`located`] past the cached block.
#[cold]
#[inline(never)]
fn located_in_tables(call: &str, address: usize, bytes: usize, epoch: u64) -> Located {
    locate_in_tables(address, bytes, epoch).unwrap_or_else(|why| fail(call, why))
}

/// The symmetric range from `address` to the end of the block holding it (a `shmem_malloc`
/// allocation, or the program's data and bss), or `None` if `address` is in none: the most a
/// collective of a length not known in advance (collect) may write there.
pub(crate) fn region_to_end(address: usize) -> Option<Region> {
    let block = find_block(address, 0).ok()?;
    Some(Region {
        id: block.id,
        heap_offset: block.offset + (address - block.start) as u64,
        bytes: (block.end - address) as u64,
    })
}

/// [`located`] as a region (for the runtime's checked entries).
pub(crate) fn region(call: &str, address: usize, bytes: usize) -> Region {
    located(call, address, bytes).region()
}

/// Records a new allocation; returns its address on this PE. The cache stays valid (see
/// [`TABLE_EPOCH`]).
pub(crate) fn add_allocation(record: &AllocationRecord) -> usize {
    JOB.write().as_mut().map_or(0, |job| {
        job.allocations.insert(Allocated::of(record));
        job.heap_address + record.offset as usize
    })
}

/// Forgets the allocation starting at `address`, returning it (fails if there is none).
pub(crate) fn remove_allocation(call: &str, address: usize) -> Allocated {
    let removed = JOB.write().as_mut().and_then(|job| {
        let removed = job.allocations.remove(job.heap_offset(address)?)?;
        tables_changed();
        Some(removed)
    });
    removed.unwrap_or_else(|| not_an_allocation(call, address))
}

/// The live allocation starting at `address` (fails if there is none).
pub(crate) fn allocation_at(call: &str, address: usize) -> Allocated {
    let found = JOB
        .read()
        .as_ref()
        .and_then(|job| job.allocations.get(job.heap_offset(address)?));
    found.unwrap_or_else(|| not_an_allocation(call, address))
}

/// Fails `call` for an `address` where no allocation starts, saying why.
#[cold]
fn not_an_allocation(call: &str, address: usize) -> ! {
    // Not symmetric memory at all (or no shmem_init), or not a block's start.
    if let Err(why) = find_block(address, 0) {
        fail(call, why);
    }
    fail(
        call,
        format!(
            "address {address:#x} is not the start of a shmem_malloc allocation; pass the \
             pointer shmem_malloc returned"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(index: u64, offset: u64) -> Allocated {
        Allocated {
            id: AllocationId {
                index,
                generation: 1,
            },
            offset,
            bytes: 64,
            alignment: None,
        }
    }

    /// Inserts, finds and removes blocks across both forms of the table: the answers are those
    /// of a plain sorted list, and the table turns into a B-tree past [`MANY`] blocks and back
    /// below [`FEW`].
    #[test]
    fn allocations_answer_alike_in_both_forms() {
        let mut table = Allocations::default();
        // Offsets 0, 128, ..., inserted out of order (every odd one first).
        let offsets: Vec<u64> = (1..=MANY as u64 + 8)
            .step_by(2)
            .chain((0..=MANY as u64 + 8).step_by(2))
            .map(|i| i * 128)
            .collect();
        for (index, &offset) in offsets.iter().enumerate() {
            table.insert(block(index as u64, offset));
            let few = matches!(table, Allocations::Few(_));
            assert_eq!(few, index < MANY, "after {} blocks", index + 1);
        }
        let check = |table: &Allocations, live: &[u64]| {
            let listed: Vec<u64> = table.iter().map(|a| a.offset).collect();
            assert_eq!(listed, live);
            for probe in [0, 1, 127, 128, 200, 4096, 4160, u64::MAX] {
                let below = live.iter().rev().find(|&&o| o <= probe).copied();
                assert_eq!(table.at_or_below(probe).map(|a| a.offset), below, "{probe}");
                let exact = live.contains(&probe).then_some(probe);
                assert_eq!(table.get(probe).map(|a| a.offset), exact, "{probe}");
            }
        };
        let mut live: Vec<u64> = offsets.clone();
        live.sort_unstable();
        check(&table, &live);
        // Free from the front (oldest offsets first) until the table is a vector again.
        while live.len() >= FEW {
            let offset = live.remove(0);
            assert_eq!(table.remove(offset).map(|a| a.offset), Some(offset));
            assert!(table.remove(offset).is_none(), "freed twice");
        }
        assert!(matches!(table, Allocations::Few(_)));
        check(&table, &live);
    }
}
