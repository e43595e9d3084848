//! Keeping data across a restart (`Replacement::preserve`): the first min(old, new) bytes of a
//! preserved allocation are copied out of the old heap into this process's private memory at
//! PreserveData (after Quiesce: every outstanding operation has completed), and into the new
//! allocation at RestoreAllocations, on every PE.
//!
//! Memory cost: the old heap is unmapped before the new one is mapped, so the peak is one heap
//! plus the staged bytes (the sum of min(old, new) over the preserved allocations) per PE.
//! Preflight checks that the PEs of this host can stage them in the memory the host has
//! available (`MemAvailable`), so a restart that cannot hold them fails before teardown,
//! retryable, with nothing changed.

use super::Replacement;
use crate::error::{Error, ErrorKind, Result};
use crate::shmem::{AllocationRecord, Region, Shmem};

/// The bytes a preserved replacement carries over: min(old, new).
fn carried(replacement: &Replacement) -> u64 {
    let target = replacement.target.bytes().unwrap_or(0);
    replacement.current.bytes.min(target)
}

/// Fails unless the PEs of this host (`local_pes`) can stage every preserved byte in the
/// memory the host has available.
pub(super) fn check_host(
    operation: &str,
    local_pes: usize,
    replacements: &[Replacement],
) -> Result<()> {
    let staged: u64 = replacements
        .iter()
        .filter(|r| r.preserve)
        .map(carried)
        .sum();
    if staged == 0 {
        return Ok(());
    }
    let wanted = staged.saturating_mul(local_pes as u64);
    match available_memory_bytes() {
        Some(available) if wanted > available => Err(Error::new(
            ErrorKind::InvalidArgument,
            operation,
            format!(
                "preserving data stages {staged} bytes per PE in private memory between the \
                 heaps ({local_pes} PEs on this host: {wanted} bytes), but this host has only \
                 {available} bytes available; preserve less (preserve=false for buffers whose \
                 contents need not survive) or free memory first"
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

/// PreserveData: this PE's copy of the first min(old, new) bytes of each preserved allocation,
/// in request order (`None` for one not preserved). Fails (retryable: nothing is torn down
/// yet) if the private memory cannot be had.
pub(super) fn copy_out(
    shmem: &Shmem,
    operation: &str,
    replacements: &[Replacement],
) -> Result<Vec<Option<Vec<u8>>>> {
    replacements
        .iter()
        .map(|replacement| {
            if !replacement.preserve {
                return Ok(None);
            }
            let bytes = carried(replacement);
            // Probed first, so that memory that cannot be had is an error (retryable: nothing
            // is torn down yet) rather than an abort; then allocated zeroed, which for a large
            // copy is fresh zero pages (no zeroing pass: the copy touches each page once).
            Vec::<u8>::new()
                .try_reserve_exact(bytes as usize)
                .map_err(|e| {
                    Error::new(
                        ErrorKind::InvalidArgument,
                        operation,
                        format!(
                            "cannot stage {bytes} preserved bytes of allocation {} in private \
                             memory ({e}); preserve less or free memory first",
                            replacement.current.id.index
                        ),
                    )
                })?;
            let mut staged = vec![0u8; bytes as usize];
            let source = Region {
                bytes,
                ..replacement.current
            };
            shmem.get_bytes(&mut staged, source, shmem.rank())?;
            Ok(Some(staged))
        })
        .collect()
}

/// RestoreAllocations: copies each staged prefix into its new allocation on this PE.
pub(super) fn copy_in(
    shmem: &Shmem,
    allocations: &[AllocationRecord],
    staged: &[Option<Vec<u8>>],
) -> Result<()> {
    for (record, staged) in allocations.iter().zip(staged) {
        if let Some(bytes) = staged {
            let target = Region {
                bytes: bytes.len() as u64,
                ..record.region()
            };
            shmem.put_bytes(target, bytes, shmem.rank())?;
        }
    }
    Ok(())
}
