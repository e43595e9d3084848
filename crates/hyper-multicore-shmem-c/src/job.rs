//! This process's part of the job as the C API sees it: the runtime reference taken by
//! `shmem_init` (the lifecycle's [`acquire`](hyper_multicore::lifecycle::acquire)), where this
//! PE's heap is mapped, and the allocations made through `shmem_malloc` and friends — the table
//! that turns a symmetric address into the runtime's (allocation, offset) [`Region`].

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use hyper_multicore::lifecycle;
use hyper_multicore::shmem::{AllocationRecord, Element, Region, Shmem, Symmetric};
use parking_lot::RwLock;

use crate::failure::{check, fail};

/// What `shmem_init` found, and the live allocations.
#[derive(Debug)]
struct Job {
    size: usize,
    heap_address: usize,
    heap_size: u64,
    /// Live allocations made through this API, by heap offset.
    allocations: BTreeMap<u64, AllocationRecord>,
}

static JOB: RwLock<Option<Job>> = RwLock::new(None);
/// This PE's rank once initialized (`usize::MAX` before): read by failure messages, which must
/// not take the job's lock.
static RANK: AtomicUsize = AtomicUsize::new(usize::MAX);

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

/// Collective: joins the job (hmrun's world) and takes a reference to the runtime with a heap of
/// `heap_size` bytes (`None`: the runtime's configured size). A second call is a no-op.
pub(crate) fn start(call: &str, heap_size: Option<u64>) {
    let mut job = JOB.write();
    if job.is_some() {
        return;
    }
    check(call, lifecycle::acquire(None, heap_size));
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
    *job = Some(Job {
        size,
        heap_address,
        heap_size,
        allocations: BTreeMap::new(),
    });
}

/// Collective: frees every allocation still live (in heap order, the same on every PE) and
/// drops the runtime reference. A call without `shmem_init` is a no-op.
pub(crate) fn finish(call: &str) {
    let mut job = JOB.write();
    let Some(state) = job.take() else {
        return;
    };
    run(call, |shmem| {
        shmem.barrier()?;
        state
            .allocations
            .values()
            .try_for_each(|record| shmem.free_id(record.id))
    });
    check(call, lifecycle::release());
    RANK.store(usize::MAX, Ordering::Relaxed);
}

/// Runs `f` on the runtime (a guarded call); any error ends the PE naming `call`.
pub(crate) fn run<R>(call: &str, f: impl FnOnce(&Shmem) -> hyper_multicore::Result<R>) -> R {
    if rank().is_none() {
        fail(
            call,
            "the OpenSHMEM library is not initialized; call shmem_init first",
        );
    }
    check(call, lifecycle::guarded(call, f))
}

/// The number of PEs (fails before `shmem_init`).
pub(crate) fn n_pes(call: &str) -> usize {
    match JOB.read().as_ref() {
        Some(job) => job.size,
        None => fail(
            call,
            "the OpenSHMEM library is not initialized; call shmem_init first",
        ),
    }
}

/// This PE's rank (fails before `shmem_init`).
pub(crate) fn my_pe(call: &str) -> usize {
    rank().unwrap_or_else(|| {
        fail(
            call,
            "the OpenSHMEM library is not initialized; call shmem_init first",
        )
    })
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

/// Where the symmetric `bytes` bytes at `address` are: the runtime region of the live
/// allocation holding them, or `Err` with the reason.
pub(crate) fn locate(address: usize, bytes: usize) -> Result<Region, String> {
    let job = JOB.read();
    let Some(job) = job.as_ref() else {
        return Err("the OpenSHMEM library is not initialized; call shmem_init first".into());
    };
    let heap_end = job.heap_address + job.heap_size as usize;
    if address < job.heap_address || address >= heap_end {
        return Err(format!(
            "address {address:#x} is not symmetric: it lies outside this PE's symmetric heap \
             ({:#x}..{heap_end:#x}); static and global variables are not symmetric yet (see \
             docs/c-api.md, deviations): allocate it with shmem_malloc",
            job.heap_address
        ));
    }
    let offset = (address - job.heap_address) as u64;
    let record = job
        .allocations
        .range(..=offset)
        .next_back()
        .map(|(_, record)| record)
        .filter(|record| offset + bytes as u64 <= record.offset + record.bytes);
    match record {
        Some(record) => Ok(Region {
            id: record.id,
            heap_offset: offset,
            bytes: bytes as u64,
        }),
        None => Err(format!(
            "bytes {address:#x}..{:#x} of the symmetric heap are not inside one live \
             shmem_malloc allocation (freed, never allocated, or past its end)",
            address + bytes
        )),
    }
}

/// [`locate`], ending the PE on failure.
pub(crate) fn region(call: &str, address: usize, bytes: usize) -> Region {
    locate(address, bytes).unwrap_or_else(|why| fail(call, why))
}

/// The address of heap offset `offset` on this PE.
pub(crate) fn address_of(offset: u64) -> usize {
    JOB.read()
        .as_ref()
        .map_or(0, |job| job.heap_address + offset as usize)
}

/// Records a new allocation.
pub(crate) fn add_allocation(record: AllocationRecord) {
    if let Some(job) = JOB.write().as_mut() {
        job.allocations.insert(record.offset, record);
    }
}

/// Forgets the allocation starting at `address`, returning it (fails if there is none).
pub(crate) fn remove_allocation(call: &str, address: usize) -> AllocationRecord {
    let region = region(call, address, 0);
    let mut job = JOB.write();
    let removed = job
        .as_mut()
        .and_then(|job| job.allocations.remove(&region.heap_offset));
    match removed {
        Some(record) => record,
        None => {
            drop(job);
            fail(
                call,
                format!(
                    "address {address:#x} is inside an allocation but not at its start; pass \
                     the pointer shmem_malloc returned"
                ),
            )
        }
    }
}

/// The live allocation starting at `address`.
pub(crate) fn allocation_at(call: &str, address: usize) -> AllocationRecord {
    let region = region(call, address, 0);
    let job = JOB.read();
    match job
        .as_ref()
        .and_then(|job| job.allocations.get(&region.heap_offset))
    {
        Some(record) => record.clone(),
        None => {
            drop(job);
            fail(
                call,
                format!(
                    "address {address:#x} is inside an allocation but not at its start; pass \
                     the pointer shmem_malloc returned"
                ),
            )
        }
    }
}
