//! The native kernels of torch's `torch.ops.symm_mem` operators on CPU tensors: each operator
//! is one call here, made by its thin Python kernel (`hyper_multicore/symm_mem/_ops.py`, which
//! checks the arguments as torch does and is what torch's dispatcher calls).
//!
//! Every kernel runs as torch's CUDA kernel does: a barrier on the input's signal pad (every
//! member's input is ready), the work, a barrier again (no member changes its input before
//! every member has read it). Reductions combine the members' values in rank order with the
//! runtime's reduction kernels ([`Shmem::combine_sources`]: members on this host read where
//! their values lie, a chunk at a time into a buffer that stays in the first-level cache; the
//! others through their route), rounding to the dtype after each addition as torch's CPU
//! arithmetic does, so every member ends with the same bits. The all-to-alls read every
//! member's published splits, then move every chunk heap to heap, once.
//!
//! A symmetric tensor comes in as [`Place`]: its allocation, the byte offset of its first
//! element and its length in bytes; a private tensor (an output) as `(address, nbytes)`
//! ([`LocalBuffer`]'s contract).
//!
//! ```python
//! from hyper_multicore import _native      # private: use torch.ops.symm_mem
//! _native.symm_one_shot(((index, generation), offset, nbytes), "float32", [0, 1], 0, 0,
//!                       (out.data_ptr(), nbytes))
//! ```

use hyper_multicore::lifecycle;
use hyper_multicore::shmem::{ReduceOp, Reducible, Region, Shmem};
use hyper_multicore::{Error, ErrorKind};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;

use super::{id, meet, AllocationArg};
use crate::errors::py_result;
use crate::memory::LocalBuffer;

/// A symmetric tensor: `(allocation, byte offset in it, bytes)`.
type Place = (AllocationArg, u64, u64);

/// A private tensor: `(address, bytes)`.
type Private = (usize, usize);

/// Who meets, and where: the block whose signal pad the barriers use, the members' PEs in
/// group order, this PE's rank among them, and the byte offset of the pad row (channel 0).
type Members = (AllocationArg, Vec<usize>, usize, u64);

/// The barrier of `members` (see [`meet`]), with the runtime's deadline.
fn barrier(shmem: &Shmem, (block, pes, me, row): &Members) -> hyper_multicore::Result<()> {
    meet(shmem, *block, pes, *me, *row, None)
}

/// The elements combined at a time: 8 KiB of `f64`, in a buffer on the stack.
const CHUNK_WORDS: usize = 1024;

/// Runs `$body` with `$T` the element type of the float dtype named `$dtype` (the dtypes the
/// reductions take).
macro_rules! with_float {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            "float32" => { type $T = f32; $body }
            "float64" => { type $T = f64; $body }
            "bfloat16" => { type $T = half::bf16; $body }
            "float16" => { type $T = half::f16; $body }
            other => Err(PyTypeError::new_err(format!(
                "the symm_mem reductions take float32, float64, bfloat16 and float16, not {other}"
            ))),
        }
    };
}

/// The region of a [`Place`].
fn region(shmem: &Shmem, (allocation, offset, bytes): Place) -> hyper_multicore::Result<Region> {
    shmem.region(id(allocation), offset, bytes)
}

/// For each `(first, count, at)` of `segments`: elements `first..first + count` of `source`,
/// summed over the members `pes` in their order, written as bytes at element `at` of `into`.
fn sum_segments<T: Reducible>(
    shmem: &Shmem,
    pes: &[usize],
    source: Region,
    segments: impl Iterator<Item = (usize, usize, usize)>,
    into: &mut [u8],
) -> hyper_multicore::Result<()> {
    let width = std::mem::size_of::<T>();
    let mut words = [0u64; CHUNK_WORDS];
    let buffer: &mut [T] = bytemuck::cast_slice_mut(&mut words);
    let step = buffer.len();
    for (first, count, at) in segments {
        for done in (0..count).step_by(step) {
            let chunk = &mut buffer[..(count - done).min(step)];
            shmem.combine_sources(pes, source, first + done, chunk, ReduceOp::Sum)?;
            let start = (at + done) * width;
            into[start..start + std::mem::size_of_val(chunk)]
                .copy_from_slice(bytemuck::cast_slice(chunk));
        }
    }
    Ok(())
}

/// An error of the operator `op`, for arguments torch's checks do not cover.
fn invalid(shmem: &Shmem, op: &str, message: String) -> Error {
    Error::new(ErrorKind::InvalidArgument, op, message).on_rank(shmem.rank())
}

/// `one_shot_all_reduce`: the sum over `members` of their `input` (of `dtype`), in member
/// order, into this PE's private `out`.
#[pyfunction]
pub(crate) fn symm_one_shot(
    py: Python<'_>,
    input: Place,
    dtype: &str,
    members: Members,
    out: Private,
) -> PyResult<()> {
    let pes = &members.1[..];
    let out = LocalBuffer::new(out.0, out.1)?;
    with_float!(dtype, T => py_result(py, py.detach(|| {
        lifecycle::guarded("one_shot_all_reduce", |shmem| {
            let source = region(shmem, input)?;
            if out.len() as u64 != source.bytes {
                let message = format!("out has {} bytes, input {}", out.len(), source.bytes);
                return Err(invalid(shmem, "one_shot_all_reduce", message));
            }
            let count = source.bytes as usize / std::mem::size_of::<T>();
            barrier(shmem, &members)?;
            out.with_bytes_mut(|into| {
                sum_segments::<T>(shmem, pes, source, std::iter::once((0, count, 0)), into)
            })?;
            barrier(shmem, &members)
        })
    })))
}

/// The elements member `rank` of `n` reduces in a two-shot all-reduce of `count` elements
/// (torch's split: shares of `ceil(count / n)`, the last ones shorter or empty).
fn share(count: usize, n: usize, rank: usize) -> std::ops::Range<usize> {
    let per = count.div_ceil(n);
    (rank * per).min(count)..((rank + 1) * per).min(count)
}

/// `two_shot_all_reduce_` (`output` None) and `two_shot_all_reduce_out`: member `me` sums its
/// share of every member's `input` and writes it into every member's input (in place) or into
/// its own (`_out`: then every member copies every share into its private `output`).
#[pyfunction]
#[pyo3(signature = (input, dtype, members, output=None))]
pub(crate) fn symm_two_shot(
    py: Python<'_>,
    input: Place,
    dtype: &str,
    members: Members,
    output: Option<Private>,
) -> PyResult<()> {
    let (pes, me) = (&members.1[..], members.2);
    let output = output
        .map(|(at, len)| LocalBuffer::new(at, len))
        .transpose()?;
    with_float!(dtype, T => py_result(py, py.detach(|| {
        lifecycle::guarded("two_shot_all_reduce", |shmem| {
            const OP: &str = "two_shot_all_reduce";
            let source = region(shmem, input)?;
            if let Some(output) = output.filter(|o| o.len() as u64 != source.bytes) {
                let message = format!("output has {} bytes, input {}", output.len(), source.bytes);
                return Err(invalid(shmem, OP, message));
            }
            let width = std::mem::size_of::<T>();
            let count = source.bytes as usize / width;
            let n = pes.len();
            let mine = share(count, n, me);
            let mut reduced = vec![0u8; mine.len() * width];
            barrier(shmem, &members)?;
            sum_segments::<T>(shmem, pes, source, std::iter::once((mine.start, mine.len(), 0)), &mut reduced)?;
            // Only this member reads this share of any input: writing it is safe now.
            let part = |range: &std::ops::Range<usize>| Region {
                id: source.id,
                heap_offset: source.heap_offset + (range.start * width) as u64,
                bytes: (range.len() * width) as u64,
            };
            let Some(output) = output else {
                for step in 0..n {
                    shmem.put_bytes(part(&mine), &reduced, pes[(me + step) % n])?;
                }
                return barrier(shmem, &members);
            };
            shmem.put_bytes(part(&mine), &reduced, pes[me])?;
            barrier(shmem, &members)?;
            output.with_bytes_mut(|into| {
                (0..n).try_for_each(|rank| {
                    let theirs = share(count, n, rank);
                    let bytes = theirs.start * width..theirs.end * width;
                    shmem.get_bytes(&mut into[bytes], part(&theirs), pes[rank])
                })
            })?;
            barrier(shmem, &members)
        })
    })))
}

/// `reduce_scatter_out`: member `me`'s block of the sum of every member's `input`, into its
/// private `output`. The input is `rows` rows of `width` elements; the block is columns
/// `me * width / n ..` of every row (with `rows == 1`: the 1-D split).
#[pyfunction]
pub(crate) fn symm_reduce_scatter(
    py: Python<'_>,
    input: Place,
    dtype: &str,
    members: Members,
    rows: usize,
    output: Private,
) -> PyResult<()> {
    let (pes, me) = (&members.1[..], members.2);
    let output = LocalBuffer::new(output.0, output.1)?;
    with_float!(dtype, T => py_result(py, py.detach(|| {
        lifecycle::guarded("reduce_scatter", |shmem| {
            let source = region(shmem, input)?;
            let count = source.bytes as usize / std::mem::size_of::<T>();
            let n = pes.len();
            let width = count.checked_div(rows).unwrap_or(0);
            let block_width = width / n;
            if rows * width != count || block_width * n != width
                || output.len() != count / n * std::mem::size_of::<T>()
            {
                let message = format!(
                    "{rows} rows do not split {count} elements into {n} blocks of an output of \
                     {} bytes",
                    output.len()
                );
                return Err(invalid(shmem, "reduce_scatter", message));
            }
            let segments =
                (0..rows).map(|r| (r * width + me * block_width, block_width, r * block_width));
            barrier(shmem, &members)?;
            output.with_bytes_mut(|into| sum_segments::<T>(shmem, pes, source, segments, into))?;
            barrier(shmem, &members)
        })
    })))
}

/// Which all-to-all of torch's: the flat one, MoE dispatch (2-D, expert-major out, aligned) or
/// MoE combine (2-D with offsets, rank-major out, packed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Exchange {
    /// `all_to_all_vdev`.
    Flat,
    /// `all_to_all_vdev_2d` with its `major_align`.
    Dispatch(usize),
    /// `all_to_all_vdev_2d_offset`.
    Combine,
}

/// Every member's published splits (`len` int64 values at `splits`), in member order.
fn published(
    shmem: &Shmem,
    splits: Region,
    pes: &[usize],
) -> hyper_multicore::Result<Vec<Vec<i64>>> {
    pes.iter()
        .map(|&pe| {
            let mut values = vec![0i64; splits.bytes as usize / 8];
            shmem.get_bytes(bytemuck::cast_slice_mut(&mut values), splits, pe)?;
            Ok(values)
        })
        .collect()
}

/// What member `me` receives: `(received rows per chunk, where each chunk starts in out, the
/// moves (member, source row, out row, rows))`, from every member's published splits.
type Plan = (Vec<i64>, Vec<i64>, Vec<(usize, i64, i64, i64)>);

/// Exclusive prefix sums.
fn exclusive_scan(values: impl IntoIterator<Item = i64>) -> Vec<i64> {
    let mut total = 0;
    values
        .into_iter()
        .map(|value| {
            let start = total;
            total += value;
            start
        })
        .collect()
}

/// The plan of `kind` for member `me` of `n`, from every member's splits (`splits[rank]`).
fn plan(kind: Exchange, splits: &[Vec<i64>], me: usize) -> Plan {
    let n = splits.len();
    match kind {
        Exchange::Flat => {
            let received: Vec<i64> = splits.iter().map(|s| s[me]).collect();
            let offsets = exclusive_scan(received.iter().copied());
            let moves = (0..n)
                .map(|rank| {
                    let start = exclusive_scan(splits[rank].iter().copied())[me];
                    (rank, start, offsets[rank], received[rank])
                })
                .collect();
            (received, offsets, moves)
        }
        Exchange::Dispatch(align) => {
            let experts = splits[0].len() / n;
            let starts: Vec<Vec<i64>> = splits
                .iter()
                .map(|s| exclusive_scan(s.iter().copied()))
                .collect();
            let align = align as i64;
            let (mut received, mut offsets, mut moves, mut at) = (vec![], vec![], vec![], 0);
            for e in 0..experts {
                let chunk = me * experts + e;
                let total: i64 = splits.iter().map(|s| s[chunk]).sum();
                for rank in 0..n {
                    let rows = splits[rank][chunk];
                    received.push(rows);
                    offsets.push(at);
                    moves.push((rank, starts[rank][chunk], at, rows));
                    at += rows;
                }
                at += ((total + align - 1) / align * align).max(align) - total;
            }
            (received, offsets, moves)
        }
        Exchange::Combine => {
            let nsplits = splits[0].len() / 2;
            let experts = nsplits / n;
            let (mut received, mut moves, mut at) = (vec![], vec![], 0);
            for (rank, both) in splits.iter().enumerate() {
                let (rows, starts) = both.split_at(nsplits);
                for e in 0..experts {
                    let chunk = e * n + me;
                    received.push(rows[chunk]);
                    moves.push((rank, starts[chunk], at, rows[chunk]));
                    at += rows[chunk];
                }
            }
            let offsets = exclusive_scan(received.iter().copied());
            (received, offsets, moves)
        }
    }
}

/// `all_to_all_vdev` (`kind` "flat"), `all_to_all_vdev_2d` ("dispatch", with `major_align`)
/// and `all_to_all_vdev_2d_offset` ("combine") of `tensors`, `[input, out, splits,
/// out_splits_offsets]`: member `me` reads every member's `splits`, gets the rows it receives
/// (of `row_bytes` bytes) from every member's `input` into its own `out`, and writes what it
/// received and where each chunk starts into its own `out_splits_offsets` (two rows of int64).
/// The barriers use the pad of `members`' block (the input's).
#[pyfunction]
pub(crate) fn symm_all_to_all(
    py: Python<'_>,
    kind: &str,
    major_align: usize,
    tensors: [Place; 4],
    row_bytes: u64,
    members: Members,
) -> PyResult<()> {
    let (pes, me) = (&members.1[..], members.2);
    let [input, out, splits, out_splits_offsets] = tensors;
    let kind = match kind {
        "flat" => Exchange::Flat,
        "dispatch" => Exchange::Dispatch(major_align.max(1)),
        "combine" => Exchange::Combine,
        other => {
            return Err(PyTypeError::new_err(format!(
                "unknown all-to-all {other:?}"
            )))
        }
    };
    const OP: &str = "all_to_all_vdev";
    py_result(
        py,
        py.detach(|| {
            lifecycle::guarded(OP, |shmem| {
                let (input, out) = (region(shmem, input)?, region(shmem, out)?);
                let splits = region(shmem, splits)?;
                let out_splits_offsets = region(shmem, out_splits_offsets)?;
                let (input_rows, out_rows) = (
                    (input.bytes / row_bytes) as i64,
                    (out.bytes / row_bytes) as i64,
                );
                barrier(shmem, &members)?;
                let (received, offsets, moves) = plan(kind, &published(shmem, splits, pes)?, me);
                for &(rank, source, target, rows) in &moves {
                    if source < 0 || rows < 0 || source + rows > input_rows {
                        let message = format!(
                            "rank {rank} sends rows {source}..{} of its input, which has \
                             {input_rows}",
                            source + rows
                        );
                        return Err(invalid(shmem, OP, message));
                    }
                    if target + rows > out_rows {
                        let message = format!(
                            "out has {out_rows} rows, too few for rows {target}..{} from rank \
                             {rank}",
                            target + rows
                        );
                        return Err(invalid(shmem, OP, message));
                    }
                }
                let at = |region: Region, row: i64, rows: i64| Region {
                    id: region.id,
                    heap_offset: region.heap_offset + row as u64 * row_bytes,
                    bytes: rows as u64 * row_bytes,
                };
                for &(rank, source, target, rows) in moves.iter().filter(|m| m.3 > 0) {
                    shmem.get_into(
                        &crate::heap::Target::<u8>::new(at(out, target, rows)),
                        &crate::heap::Target::<u8>::new(at(input, source, rows)),
                        pes[rank],
                    )?;
                }
                let written: Vec<i64> = received.into_iter().chain(offsets).collect();
                shmem.put_bytes(out_splits_offsets, bytemuck::cast_slice(&written), pes[me])?;
                barrier(shmem, &members)
            })
        }),
    )
}

/// Adds the kernels to the extension module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(symm_one_shot, m)?)?;
    m.add_function(wrap_pyfunction!(symm_two_shot, m)?)?;
    m.add_function(wrap_pyfunction!(symm_reduce_scatter, m)?)?;
    m.add_function(wrap_pyfunction!(symm_all_to_all, m)?)?;
    Ok(())
}
