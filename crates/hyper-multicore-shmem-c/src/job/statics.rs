//! The executable's data and bss made symmetric at `shmem_init`: copied into a heap allocation
//! whose pages are then mapped over them, or left private (saying why) when some PE cannot.

use hyper_multicore::shmem::{AllocationRecord, AllocationSpec, Dtype};

use super::run;
use crate::failure::fail;
use crate::sys::{caller_memory, static_data};

/// What became of the executable's data and bss.
#[derive(Debug)]
pub(super) enum Statics {
    /// Symmetric: `start..start + record.bytes` is mapped onto allocation `record`.
    Symmetric {
        start: usize,
        record: AllocationRecord,
    },
    /// Not symmetric, for this reason.
    Private(String),
}

/// Collective: copies `start..end` (the executable's data and bss) into a new allocation and
/// maps the allocation over it. Every PE learns whether every PE could: if one could not (under
/// valgrind, which cannot duplicate a shared mapping with `mremap`, for one), every PE puts its
/// data back into private memory and frees the allocation, and global variables are not
/// symmetric in this job — a call that names one fails, saying why.
pub(super) fn share_statics(call: &str, start: usize, end: usize, heap_address: usize) -> Statics {
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
