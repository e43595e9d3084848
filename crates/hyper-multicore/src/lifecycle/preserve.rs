//! Keeping data across a restart (`Replacement::preserve`): the first min(old, new) bytes of a
//! preserved allocation are copied straight from the old heap into the new allocation at
//! RestoreAllocations, on every PE. PreserveData (after Quiesce: every outstanding operation
//! has completed) keeps this PE's mapping of the old heap segment alive past Shutdown, and
//! notes where each preserved prefix lies in it; RestoreAllocations makes the destination
//! pages present in one call each (`MADV_POPULATE_WRITE`, instead of a page fault per 4 KiB),
//! copies, and then lets the old heap go.
//!
//! Memory cost: the old heap's pages stay until the copy is done, so while the new heap is
//! filled the host holds both: the old heaps' pages plus the preserved bytes of every PE in the
//! new ones (a staging copy would cost the same: the preserved bytes, on top of one heap).
//! Preflight checks that the PEs of this host can hold the preserved bytes again in the memory
//! the host has available (`MemAvailable`), so a restart that cannot fails before teardown,
//! retryable, with nothing changed.

use std::sync::Arc;

use super::Replacement;
use crate::error::{Error, ErrorKind, Result};
use crate::shmem::{AllocationRecord, Region, Shmem};
use crate::sys::mapping::SharedMapping;

/// The bytes a preserved replacement carries over: min(old, new).
fn carried(replacement: &Replacement) -> u64 {
    let target = replacement.target.bytes().unwrap_or(0);
    replacement.current.bytes.min(target)
}

/// Fails unless the PEs of this host (`local_pes`) can hold every preserved byte a second time
/// in the memory the host has available.
pub(super) fn check_host(
    operation: &str,
    local_pes: usize,
    replacements: &[Replacement],
) -> Result<()> {
    let copied: u64 = replacements
        .iter()
        .filter(|r| r.preserve)
        .map(carried)
        .sum();
    if copied == 0 {
        return Ok(());
    }
    let wanted = copied.saturating_mul(local_pes as u64);
    match available_memory_bytes() {
        Some(available) if wanted > available => Err(Error::new(
            ErrorKind::InvalidArgument,
            operation,
            format!(
                "preserving data copies {copied} bytes per PE into the new heap while the old \
                 one is still mapped ({local_pes} PEs on this host: {wanted} bytes more), but \
                 this host has only {available} bytes available; preserve less \
                 (preserve=false for buffers whose contents need not survive) or free memory \
                 first"
            ),
        )),
        _ => Ok(()),
    }
}

fn available_memory_bytes() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// A preserved prefix of the old heap: its mapping (kept alive) and where the prefix lies.
pub(super) struct Kept {
    mapping: Arc<SharedMapping>,
    offset: usize,
    bytes: usize,
}

/// PreserveData: where this PE's first min(old, new) bytes of each preserved allocation lie in
/// the old heap, in request order (`None` for one not preserved); holding them keeps the old
/// heap mapped.
pub(super) fn keep(
    shmem: &Shmem,
    operation: &str,
    replacements: &[Replacement],
) -> Result<Vec<Option<Kept>>> {
    replacements
        .iter()
        .map(|replacement| {
            if !replacement.preserve {
                return Ok(None);
            }
            let bytes = carried(replacement);
            let source = Region {
                bytes,
                ..replacement.current
            };
            let (mapping, offset) = shmem.own_bytes(operation, source)?;
            Ok(Some(Kept {
                mapping,
                offset,
                bytes: bytes as usize,
            }))
        })
        .collect()
}

/// RestoreAllocations: copies each kept prefix into its new allocation on this PE (its pages
/// made present first), then lets the old heap go.
pub(super) fn copy_in(
    shmem: &Shmem,
    operation: &str,
    allocations: &[AllocationRecord],
    kept: Vec<Option<Kept>>,
) -> Result<()> {
    for (record, kept) in allocations.iter().zip(kept) {
        let Some(kept) = kept else { continue };
        let target = Region {
            bytes: kept.bytes as u64,
            ..record.region()
        };
        let (mapping, offset) = shmem.own_bytes(operation, target)?;
        // Best effort: without it the copy faults the pages in one by one.
        let _ = mapping.populate_write(offset, kept.bytes);
        kept.mapping
            .copy_to(kept.offset, &mapping, offset, kept.bytes);
    }
    Ok(())
}
