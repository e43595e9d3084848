//! From a symmetric address to the runtime's region: the blocks (allocations and the data and
//! bss) found in the job's tables, and a cache of the blocks found last that every call reads
//! without a lock.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use hyper_multicore::lifecycle;
use hyper_multicore::shmem::{AllocationId, AllocationRecord, Located, LocatedCache, Region};

use super::allocations::Allocated;
use super::statics::Statics;
use super::{JOB, NOT_INITIALIZED};
use crate::failure::fail;

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
pub(super) fn tables_changed() {
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
