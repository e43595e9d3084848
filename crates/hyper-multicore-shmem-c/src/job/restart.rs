//! `shmemx_restart_heap`: the lifecycle's restart to a new heap size, every live allocation
//! replaced (the data and bss first, always preserved, and mapped again afterwards).

use hyper_multicore::lifecycle::{self, Replacement};
use hyper_multicore::shmem::{AllocationSpec, Dtype};

use super::allocations::{Allocated, Allocations};
use super::statics::Statics;
use super::{rank, run, tables_changed, JOB, NOT_INITIALIZED};
use crate::failure::{check, fail, record};
use crate::sys::{caller_memory, static_data};

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
                        "replacement {index}: address {:#x} is not the start of a live \
                         shmem_malloc allocation; pass the pointers shmem_malloc returned",
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
