//! The native side of `hyper_multicore.symm_mem`, torch's symmetric-memory API on CPU tensors:
//! the signal-pad protocol (`put_signal`, `wait_signal`, `barrier` of a handle), peers' buffers
//! seen directly where a peer shares this host's segment, and the kernels of torch's
//! `torch.ops.symm_mem` operators ([`ops`]), which reach every peer through the runtime's routes
//! (shared memory or UCX).
//!
//! Every symm_mem allocation is one heap allocation laid out as torch's CUDA backend lays out
//! its blocks: the signal pad first (`uint32` words, zeroed by `empty` on every PE before a
//! barrier), then the data. The Python side names an allocation by `(index, generation)` and
//! a place in it by its byte offset from the allocation's start; the runtime checks both (a
//! freed allocation or a range past its end is refused) on every call.
//!
//! Signal words count: `put_signal` adds one to the word `world_size * channel + src` of the
//! destination's pad (and wakes it), `wait_signal` waits for that word to be at least one and
//! takes one off. A barrier is a `put_signal` to every other member and a `wait_signal` from
//! every other member on one channel, as torch's CUDA backend does it; where torch's sender waits
//! for the previous signal to be consumed (a 0/1 flag), a sender here never waits, and the
//! receiver consumes the signals one at a time, in the order sent.
//!
//! ```python
//! from hyper_multicore import _native      # private: use hyper_multicore.symm_mem
//! _native.symm_barrier((index, generation), [0, 1], my_index, 0, None)
//! ```

use std::sync::Arc;
use std::time::Duration;

use hyper_multicore::lifecycle;
use hyper_multicore::shmem::{AllocationId, Comparison, Region, Shmem, SignalOp, Symmetric};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::errors::py_result;
use crate::heap::Target;

mod ops;

pub(crate) use ops::register as register_ops;

/// An allocation as the wrapper passes it: `(index, generation)`.
type AllocationArg = (u64, u64);

/// The id of `allocation`.
fn id((index, generation): AllocationArg) -> AllocationId {
    AllocationId { index, generation }
}

/// The `u32` signal word at byte `offset` of `allocation` (its pad).
fn word(
    shmem: &Shmem,
    allocation: AllocationArg,
    offset: u64,
) -> hyper_multicore::Result<Target<u32>> {
    shmem.region(id(allocation), offset, 4).map(Target::new)
}

/// A deadline in seconds as the library's timeout (`None`: the runtime's configured one).
fn timeout(seconds: Option<f64>) -> PyResult<Option<Duration>> {
    seconds
        .map(|seconds| {
            Duration::try_from_secs_f64(seconds).map_err(|_| {
                PyValueError::new_err(format!(
                    "timeout must be a non-negative number of seconds, not {seconds}"
                ))
            })
        })
        .transpose()
}

/// Adds one signal to PE `pe`'s word at byte `offset` of its copy of `allocation`, after every
/// earlier put of this PE to `pe`, and wakes its waiter.
fn put_one(
    shmem: &Shmem,
    allocation: AllocationArg,
    offset: u64,
    pe: usize,
) -> hyper_multicore::Result<()> {
    shmem.signal(&word(shmem, allocation, offset)?, 1, SignalOp::Add, pe)
}

/// Waits until this PE's word at byte `offset` of `allocation` holds a signal, and consumes it.
fn wait_one(
    shmem: &Shmem,
    allocation: AllocationArg,
    offset: u64,
    timeout: Option<Duration>,
) -> hyper_multicore::Result<()> {
    let word = word(shmem, allocation, offset)?;
    shmem.wait_signal(&word, 1, Comparison::Ge, timeout)?;
    // Only this PE takes signals off its own words; senders only add.
    shmem
        .atomic_fetch_add(&word, u32::MAX, shmem.rank())
        .map(drop)
}

/// `put_signal`: one signal into PE `pe`'s pad word at byte `offset` of `allocation`.
#[pyfunction]
pub(crate) fn symm_put_signal(
    py: Python<'_>,
    allocation: AllocationArg,
    offset: u64,
    pe: usize,
) -> PyResult<()> {
    py_result(
        py,
        py.detach(|| {
            lifecycle::guarded("put_signal", |shmem| put_one(shmem, allocation, offset, pe))
        }),
    )
}

/// `wait_signal`: waits for a signal in this PE's pad word at byte `offset` of `allocation`
/// (at most `timeout` seconds; `None`: the runtime's deadline) and consumes it.
#[pyfunction]
#[pyo3(signature = (allocation, offset, timeout=None))]
pub(crate) fn symm_wait_signal(
    py: Python<'_>,
    allocation: AllocationArg,
    offset: u64,
    timeout: Option<f64>,
) -> PyResult<()> {
    let timeout = self::timeout(timeout)?;
    py_result(
        py,
        py.detach(|| {
            lifecycle::guarded("wait_signal", |shmem| {
                wait_one(shmem, allocation, offset, timeout)
            })
        }),
    )
}

/// `barrier`: the member `me` of `pes` (the members' PEs, in group order) signals every other
/// member's pad word `row + 4 * me`, then waits for and consumes a signal in each of its own
/// words `row + 4 * i` (`row`: the byte offset of the channel's row of words).
#[pyfunction]
#[pyo3(signature = (allocation, pes, me, row, timeout=None))]
pub(crate) fn symm_barrier(
    py: Python<'_>,
    allocation: AllocationArg,
    pes: Vec<usize>,
    me: usize,
    row: u64,
    timeout: Option<f64>,
) -> PyResult<()> {
    let timeout = self::timeout(timeout)?;
    py_result(
        py,
        py.detach(|| {
            lifecycle::guarded("barrier", |shmem| {
                meet(shmem, allocation, &pes, me, row, timeout)
            })
        }),
    )
}

/// The barrier of [`symm_barrier`] (and of every operator's kernel): member `me` of `pes`
/// signals every other member's word `row + 4 * me` of `allocation`, then waits for and
/// consumes a signal in each of its own words `row + 4 * i`.
fn meet(
    shmem: &Shmem,
    allocation: AllocationArg,
    pes: &[usize],
    me: usize,
    row: u64,
    timeout: Option<Duration>,
) -> hyper_multicore::Result<()> {
    let others = || pes.iter().enumerate().filter(|&(i, _)| i != me);
    for (_, &pe) in others() {
        put_one(shmem, allocation, row + 4 * me as u64, pe)?;
    }
    for (i, _) in others() {
        wait_one(shmem, allocation, row + 4 * i as u64, timeout)?;
    }
    Ok(())
}

/// The whole of `allocation`, as a region.
fn whole(shmem: &Shmem, allocation: AllocationArg) -> hyper_multicore::Result<Target<u8>> {
    let record = shmem.resolve(id(allocation))?;
    Ok(Target::new(Region {
        id: record.id,
        heap_offset: record.offset,
        bytes: record.bytes,
    }))
}

/// The address of the start of each PE's copy of `allocation` in this process, or 0 for a PE
/// whose heap is not mapped here (another host, or the UCX route).
#[pyfunction]
pub(crate) fn symm_addresses(
    py: Python<'_>,
    allocation: AllocationArg,
    pes: Vec<usize>,
) -> PyResult<Vec<usize>> {
    py_result(
        py,
        py.detach(|| {
            lifecycle::guarded("rendezvous", |shmem| {
                let whole = whole(shmem, allocation)?;
                Ok(pes
                    .iter()
                    .map(|&pe| shmem.ptr(&whole, pe).map_or(0, |p| p.as_ptr() as usize))
                    .collect())
            })
        }),
    )
}

/// A DLPack capsule of `dims` elements of `dtype` at byte `offset` of PE `pe`'s copy of
/// `allocation`, for `torch._C._from_dlpack`: a tensor over that memory, which keeps the heap
/// mapped while it lives. Only for a PE whose heap is mapped here (else an error), and only
/// inside the allocation (checked).
#[pyfunction]
pub(crate) fn symm_peer_capsule<'py>(
    py: Python<'py>,
    allocation: AllocationArg,
    pe: usize,
    offset: u64,
    dims: Vec<usize>,
    dtype: &str,
) -> PyResult<Bound<'py, PyAny>> {
    let dtype = crate::allocation::parse_dtype(dtype)?;
    let found = py.detach(|| {
        lifecycle::guarded("get_buffer", |shmem| {
            let whole = whole(shmem, allocation)?;
            // The range check (`offset` inside the allocation) is the runtime's.
            let rest = shmem.region(id(allocation), offset, 0)?;
            let base = shmem.ptr(&whole, pe)?.as_ptr() as usize;
            let span = whole.region().bytes - (rest.heap_offset - whole.region().heap_offset);
            Ok((
                base + offset as usize,
                span as usize,
                shmem.mapping_keepalive(),
            ))
        })
    });
    let (address, span, mapping) = py_result(py, found)?;
    let owner: Arc<dyn Send + Sync> = Arc::new(mapping);
    crate::memory::heap_capsule(py, [address, span], &dims, dtype, owner)
}
