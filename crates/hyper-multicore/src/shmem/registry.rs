//! The registry of live allocations: collective allocate and free (after the cross-rank
//! argument check), resolve, and the data plane's region check against the liveness table.
//!
//! While a shared root (`lifecycle::SharedRoot`) manages the heap, a bare allocate or free is
//! refused before any collective work; the shared root's consumers make theirs
//! [`on_behalf_of_consumer`]. Every call through `lifecycle::guarded` is admitted then only
//! on a thread acting for the consumer holding the lease ([`check_leased`]).

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

use super::allocation::{
    Allocation, AllocationId, AllocationRecord, AllocationSpec, Element, Region,
};
use super::arguments::HeapCall;
use super::process;
use super::runtime::{Shmem, DEFAULT_ALIGNMENT};
use crate::error::{Error, ErrorKind, Result};
use crate::sys::mapping::SharedMapping;
use crate::transport::segment::max_alignment;

/// What manages the heap (a description naming the shared root), if anything does.
static MANAGED_BY: parking_lot::Mutex<Option<String>> = parking_lot::const_mutex(None);

/// The lease word: 0 while nothing manages the heap; else [`MANAGED`] with the generation of
/// the lease held (none held: `MANAGED` alone). A guarded call is admitted when it is 0 or
/// equals the calling thread's [`THREAD_LEASE`]: one load and one compare on the fast path.
static LEASE_WORD: AtomicU64 = AtomicU64::new(0);

/// The lease word's bit for "a shared root manages the heap" (generations stay below it).
const MANAGED: u64 = 1 << 63;

thread_local! {
    /// True while this thread allocates or frees on behalf of a shared root's consumer.
    static ON_BEHALF: Cell<bool> = const { Cell::new(false) };
    /// The lease word this thread acts under (0: none).
    static THREAD_LEASE: Cell<u64> = const { Cell::new(0) };
}

/// Records that `description` (a shared root) manages the heap with the lease of `lease`
/// held (a generation, or none), or that nothing manages it (`None`).
pub(crate) fn set_managed(description: Option<String>, lease: Option<u64>) {
    let mut managed = MANAGED_BY.lock();
    LEASE_WORD.store(
        match description {
            Some(_) => MANAGED | lease.unwrap_or(0),
            None => 0,
        },
        Ordering::Release,
    );
    match description {
        Some(_) => process::RUNTIME.word().hold(process::LEASED),
        None => process::RUNTIME.word().release(process::LEASED),
    }
    *managed = description;
}

/// Records that the lease of `generation` is held now (`None`: no lease is held), if a shared
/// root manages the heap.
pub(crate) fn set_lease(generation: Option<u64>) {
    let _managed = MANAGED_BY.lock();
    if LEASE_WORD.load(Ordering::Acquire) != 0 {
        LEASE_WORD.store(MANAGED | generation.unwrap_or(0), Ordering::Release);
    }
}

/// Runs `f` with this thread acting under the lease of `generation`: its guarded calls are
/// admitted while that lease is held.
pub(crate) fn under_lease<R>(generation: u64, f: impl FnOnce() -> R) -> R {
    struct Reset(u64);
    impl Drop for Reset {
        fn drop(&mut self) {
            THREAD_LEASE.with(|word| word.set(self.0));
        }
    }
    let _reset = Reset(THREAD_LEASE.with(|word| word.replace(MANAGED | generation)));
    f()
}

/// Makes this thread act under the lease of `generation` from now on (until another lease is
/// bound or run on it): a front whose data-plane calls reach guarded directly.
pub(crate) fn bind_lease(generation: u64) {
    THREAD_LEASE.with(|word| word.set(MANAGED | generation));
}

/// Calls admitted without a lease while a shared root manages the heap: the queries of this
/// PE's rank and of the PE count, which touch neither the heap nor a peer.
const UNLEASED: [&str; 3] = ["my_pe", "n_pes", GROWTH_CHECK];

/// The operation name of a shared root's quick check that no rank needs a growth: every rank
/// takes part whoever holds the lease (a rank that does not hold it still publishes its
/// verdict, so the ranks fall through to the growth's Agree stage together and it reports the
/// lease there).
pub(crate) const GROWTH_CHECK: &str = "grow (quick check)";

/// Refuses a guarded call (`operation`) while a shared root manages the heap and this thread
/// does not act under the lease held now (see [`under_lease`], [`bind_lease`]).
#[inline]
pub(crate) fn check_leased(operation: &str) -> Result<()> {
    let word = LEASE_WORD.load(Ordering::Acquire);
    if word == 0 {
        return Ok(());
    }
    check_thread_lease(operation, word)
}

/// [`check_leased`] while a shared root manages the heap: compares the lease word with this
/// thread's. Out of line so that the thread-local access stays here: inlined, the compiler may
/// compute the thread-local's address before the test of the lease word, and in a shared
/// library (libhmshmem) that is a call into the dynamic loader on every guarded call.
#[inline(never)]
fn check_thread_lease(operation: &str, word: u64) -> Result<()> {
    if THREAD_LEASE.with(Cell::get) == word {
        return Ok(());
    }
    unleased(operation, word)
}

#[cold]
#[inline(never)]
fn unleased(operation: &str, word: u64) -> Result<()> {
    if UNLEASED.contains(&operation) {
        return Ok(());
    }
    let root = managed_by().unwrap_or_else(|| "a shared root".into());
    let held = match word & !MANAGED {
        0 => "no consumer holds the lease".to_string(),
        generation => {
            format!("this call is not made under the lease held (generation {generation})")
        }
    };
    Err(Error::new(
        ErrorKind::InvalidState,
        operation,
        format!(
            "{operation} is refused while the heap is managed by {root}: {held}, and a \
             consumer's data-plane and collective calls are made under its lease \
             (Lease::run; in Python inside `with consumer.lease():`)"
        ),
    ))
}

/// The description of the shared root managing the heap, if one does.
fn managed_by() -> Option<String> {
    MANAGED_BY.lock().clone()
}

/// Runs `f` with this thread's allocate and free made on behalf of a shared root's consumer.
pub(crate) fn on_behalf_of_consumer<R>(f: impl FnOnce() -> R) -> R {
    struct Reset(bool);
    impl Drop for Reset {
        fn drop(&mut self) {
            ON_BEHALF.with(|flag| flag.set(self.0));
        }
    }
    let _reset = Reset(ON_BEHALF.with(|flag| flag.replace(true)));
    f()
}

/// Refuses a bare call (allocate, free, and the lifecycle's acquire, release and restart)
/// while a shared root manages the heap: a local check, made on every rank alike (each has the
/// same shared root).
pub(crate) fn check_unmanaged(operation: &str) -> Result<()> {
    // Nothing manages the heap: the lease word says so without the description's lock.
    if LEASE_WORD.load(Ordering::Acquire) == 0 || ON_BEHALF.with(Cell::get) {
        return Ok(());
    }
    match managed_by() {
        None => Ok(()),
        Some(root) => Err(Error::new(
            ErrorKind::InvalidState,
            operation,
            format!(
                "{operation} is refused while the heap is managed by {root}: use its consumers \
                 (their allocate, free and grow, under their lease), or close the shared root \
                 first"
            ),
        )),
    }
}

impl Shmem {
    /// Collective: allocates `len` elements of `T` (alignment `None` = 64 bytes). Every rank
    /// must make the same call; arguments that differ across ranks fail on every rank.
    #[track_caller]
    pub fn allocate<T: Element>(
        &self,
        len: usize,
        alignment: Option<u64>,
    ) -> Result<Allocation<T>> {
        self.allocate_spec(&AllocationSpec::of::<T>(len, alignment))
            .map(Allocation::new)
    }

    /// Collective: allocates by spec (shape, dtype, alignment) and returns the record.
    #[track_caller]
    pub fn allocate_spec(&self, spec: &AllocationSpec) -> Result<AllocationRecord> {
        const OP: &str = "allocate";
        let site = std::panic::Location::caller();
        check_unmanaged(OP)?;
        let mut heap = self.heap.lock();
        let bytes = spec.bytes();
        let alignment = spec.alignment.unwrap_or(DEFAULT_ALIGNMENT);
        let call = HeapCall::Allocate {
            bytes: bytes.as_ref().copied().unwrap_or(u64::MAX),
            alignment,
            dtype: spec.dtype,
        };
        self.check_same_call(&mut heap, OP, call)
            .inspect_err(|e| process::record_failure(e, "argument check"))?;
        let result = (|| {
            let bytes = bytes?;
            let largest = max_alignment(self.heap_size());
            if !alignment.is_power_of_two() || alignment > largest {
                return Err(self.error(
                    ErrorKind::InvalidArgument,
                    OP,
                    format!(
                        "alignment {alignment} must be a power of two no larger than \
                         {largest}, this heap's size rounded up to one (or None for the \
                         default {DEFAULT_ALIGNMENT})"
                    ),
                ));
            }
            let alignment = alignment.max(super::allocator::MIN_ALIGNMENT);
            let offset = heap
                .allocator
                .allocate(bytes, alignment)
                .map_err(|exhausted| {
                    self.error(
                        ErrorKind::InvalidArgument,
                        OP,
                        format!("the heap is exhausted: {}", exhausted.describe()),
                    )
                })?;
            let index = heap.next_index;
            heap.next_index += 1;
            let record = AllocationRecord {
                id: AllocationId {
                    index,
                    generation: self.generation(),
                },
                offset,
                bytes,
                alignment,
                spec: spec.clone(),
            };
            heap.records.insert(index, record.clone());
            self.live.insert(index, offset, bytes);
            tracing::debug!(
                allocation = index,
                offset,
                bytes,
                alignment,
                "allocated at {}:{}",
                site.file(),
                site.line()
            );
            Ok(record)
        })();
        result.inspect_err(|e| process::record_failure(e, "allocate"))
    }

    /// Collective: frees an allocation (consumed, so it cannot be used again).
    pub fn free<T: Element>(&self, allocation: Allocation<T>) -> Result<()> {
        self.free_id(allocation.into_record().id)
    }

    /// Collective: frees the allocation `id`. Freeing twice, or an id of another lifetime, is
    /// an error on every rank.
    pub fn free_id(&self, id: AllocationId) -> Result<()> {
        const OP: &str = "free";
        check_unmanaged(OP)?;
        let mut heap = self.heap.lock();
        self.check_same_call(&mut heap, OP, HeapCall::Free(id))
            .inspect_err(|e| process::record_failure(e, "argument check"))?;
        let result = (|| {
            self.check_generation(OP, id)?;
            let record = heap.records.remove(&id.index).ok_or_else(|| {
                self.error(
                    ErrorKind::DoubleFree,
                    OP,
                    format!("allocation {} was already freed (double free)", id.index),
                )
            })?;
            self.live.remove(id.index);
            heap.allocator.free(record.offset).map_err(|e| {
                self.error(
                    ErrorKind::Protocol,
                    OP,
                    format!("the allocator has no block at offset {}", e.offset),
                )
            })?;
            Ok(())
        })();
        result.inspect_err(|e| process::record_failure(e, "free"))
    }

    /// The record of live allocation `id` (fails if freed or of another lifetime).
    pub fn resolve(&self, id: AllocationId) -> Result<AllocationRecord> {
        self.check_generation("resolve", id)?;
        let heap = self.heap.lock();
        heap.records.get(&id.index).cloned().ok_or_else(|| {
            self.error(
                ErrorKind::DoubleFree,
                "resolve",
                format!(
                    "allocation {} has been freed; it cannot be used any more",
                    id.index
                ),
            )
        })
    }

    /// Every live allocation, by id.
    pub fn allocations(&self) -> Vec<AllocationRecord> {
        let mut records: Vec<AllocationRecord> =
            self.heap.lock().records.values().cloned().collect();
        records.sort_unstable_by_key(|record| record.id.index);
        records
    }

    /// Where this PE's copy of `region` lies in its heap segment: the mapping (the `Arc` keeps
    /// it mapped, also past this runtime's shutdown) and the byte offset in it. For copies
    /// from one runtime's heap into the next (a restart's preserved data).
    pub(crate) fn own_bytes(
        &self,
        operation: &str,
        region: Region,
    ) -> Result<(std::sync::Arc<SharedMapping>, usize)> {
        self.check_region(operation, region)?;
        let mapping = std::sync::Arc::clone(self.segment.mapping());
        let pointer = self
            .transport
            .local_ptr(self.rank, region.heap_offset as usize)
            .ok_or_else(|| {
                self.error(
                    ErrorKind::Protocol,
                    operation,
                    "this PE's own heap is not mapped in this process",
                )
            })?;
        let offset = (pointer.as_ptr() as usize)
            .checked_sub(mapping.address(0) as usize)
            .ok_or_else(|| {
                self.error(
                    ErrorKind::Protocol,
                    operation,
                    "this PE's own heap lies outside its heap segment",
                )
            })?;
        Ok((mapping, offset))
    }

    /// The data plane's check of every region it is given: of this lifetime, its allocation
    /// live, the range inside it. A generation compare and a lock-free lookup; the reason is
    /// only worked out when the check fails.
    #[inline]
    pub(crate) fn check_region(&self, operation: &str, region: Region) -> Result<()> {
        if region.id.generation == self.segment.generation() && self.live.contains(region) {
            return Ok(());
        }
        Err(self.region_error(operation, region))
    }

    #[cold]
    #[inline(never)]
    fn region_error(&self, operation: &str, region: Region) -> Error {
        if let Err(error) = self.check_generation(operation, region.id) {
            return error;
        }
        let index = region.id.index;
        if !self.live.is_live(index) {
            return self.error(
                ErrorKind::DoubleFree,
                operation,
                format!(
                    "allocation {index} has been freed (or was never allocated in this runtime \
                     lifetime); a handle or region of it cannot be used after free — allocate \
                     again"
                ),
            );
        }
        let (start, end) = self
            .heap
            .lock()
            .records
            .get(&index)
            .map_or((0, 0), |r| (r.offset, r.offset + r.bytes));
        self.error(
            ErrorKind::InvalidArgument,
            operation,
            format!(
                "heap bytes {}..{} lie outside allocation {index} (heap bytes {start}..{end}); \
                 pass a view inside the allocation",
                region.heap_offset,
                region.heap_offset.saturating_add(region.bytes)
            ),
        )
    }

    pub(crate) fn check_generation(&self, operation: &str, id: AllocationId) -> Result<()> {
        if id.generation == self.generation() {
            return Ok(());
        }
        Err(self.error(
            ErrorKind::InvalidArgument,
            operation,
            format!(
                "allocation {} belongs to another runtime lifetime (generation {:#x}, current \
                 {:#x}); it was released by a shutdown or restart — allocate again",
                id.index,
                id.generation,
                self.generation()
            ),
        ))
    }
}
