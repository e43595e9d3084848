//! The guarded job: the word operations through `lifecycle::guarded`, one guard per call as a
//! front makes them, beside the same calls made inside one guarded call per batch.

use std::hint::black_box;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use hyper_multicore::lifecycle;
use hyper_multicore::shmem::{Allocation, Shmem};

use super::harness::{nanos, root_duration};
use super::{allowed_cpus, method, pin_main_thread, PeArgs, PeMessage, LAYER, PEER, WORD_BYTES};
use crate::launch::emit;
use crate::stats::{time_interleaved, Batch, Method};

/// The PE side of the guarded job: the runtime comes from `lifecycle::acquire` (over the whole
/// world) and every call goes through `lifecycle::guarded` from outside any other guarded call,
/// as a front makes them (see [`guarded_word_ops`]).
pub(super) fn run_pe_lifecycle(args: &PeArgs) -> Result<()> {
    lifecycle::acquire(None, Some(args.heap)).context("acquire the runtime")?;
    let rank = lifecycle::guarded("my_pe", |shmem| Ok(shmem.rank()))?;
    if !args.no_pin {
        pin_main_thread(rank, &allowed_cpus()?)?;
    }
    guarded_word_ops(&method(args.quick), rank)
        .with_context(|| format!("guarded benchmarks on rank {rank}"))?;
    lifecycle::release().context("release the runtime")
}

/// Put 8 B + quiet, get 8 B and fetch-add on the peer's word, each call through its own
/// `lifecycle::guarded` (one guard per API call, none nested: a front calling them one by one),
/// interleaved with the same calls made directly inside one guarded call per batch (the
/// reference: the guard's cost).
fn guarded_word_ops(method: &Method, rank: usize) -> Result<()> {
    let (word, counter) = lifecycle::guarded("allocate", |s| {
        let word = s.allocate::<u64>(1, None)?;
        let counter = s.allocate::<u64>(1, None)?;
        s.put(&word, &[0], s.rank())?;
        s.atomic_set(&counter, 0, s.rank())?;
        s.barrier()?;
        Ok((word, counter))
    })?;
    // Each row writes its call out, as a program would (a helper closure shared by the rows
    // is compiled once, out of line, and then called from every row's loop).
    let root = rank == 0;
    let mut batches = vec![
        direct_on_root(root, |s, ops| {
            for i in 0..ops {
                s.put(&word, &[black_box(i)], PEER)?;
                s.quiet();
            }
            Ok(())
        }),
        guarded_on_root(root, |ops| {
            let start = Instant::now();
            for i in 0..ops {
                lifecycle::guarded("put", |s| s.put(&word, &[black_box(i)], PEER))?;
                lifecycle::quiet()?;
            }
            Ok(start.elapsed())
        }),
        direct_on_root(root, |s, ops| {
            let mut value = [0u64];
            for _ in 0..ops {
                s.get(&mut value, &word, PEER)?;
                black_box(&mut value);
            }
            Ok(())
        }),
        guarded_on_root(root, |ops| {
            let mut value = [0u64];
            let start = Instant::now();
            for _ in 0..ops {
                lifecycle::guarded("get", |s| s.get(&mut value, &word, PEER))?;
                black_box(&mut value);
            }
            Ok(start.elapsed())
        }),
        direct_on_root(root, |s, ops| {
            for _ in 0..ops {
                black_box(s.atomic_fetch_add(&counter, 1u64, PEER)?);
            }
            Ok(())
        }),
        guarded_on_root(root, |ops| {
            let start = Instant::now();
            for _ in 0..ops {
                black_box(lifecycle::guarded("atomic_fetch_add", |s| {
                    s.atomic_fetch_add(&counter, 1u64, PEER)
                })?);
            }
            Ok(start.elapsed())
        }),
        // The same guarded calls as a front's entry points make them: each an out-of-line
        // function whose handle and PE arrive as arguments, so nothing of the call can be
        // hoisted out of the loop (what a C API call, behind its library boundary, pays).
        guarded_on_root(root, |ops| {
            let start = Instant::now();
            for i in 0..ops {
                put_call(black_box(&word), black_box(i), black_box(PEER))?;
                quiet_call()?;
            }
            Ok(start.elapsed())
        }),
        guarded_on_root(root, |ops| {
            let start = Instant::now();
            for _ in 0..ops {
                black_box(get_call(black_box(&word), black_box(PEER))?);
            }
            Ok(start.elapsed())
        }),
        guarded_on_root(root, |ops| {
            let start = Instant::now();
            for _ in 0..ops {
                black_box(fetch_add_call(black_box(&counter), black_box(PEER))?);
            }
            Ok(start.elapsed())
        }),
    ];
    let timings = time_interleaved(method, &mut batches)?;
    drop(batches);
    let [put, put_guarded, get, get_guarded, fetch_add, fetch_add_guarded, put_call, get_call, fetch_add_call] =
        timings[..]
    else {
        unreachable!("nine batches were timed")
    };
    if root {
        let rows = [
            (
                "put_quiet_guarded",
                put_guarded,
                "put_quiet without the guard",
                put,
            ),
            ("get_guarded", get_guarded, "get without the guard", get),
            (
                "fetch_add_guarded",
                fetch_add_guarded,
                "fetch_add without the guard",
                fetch_add,
            ),
            (
                "put_quiet_guarded_call",
                put_call,
                "put_quiet_guarded, inlined",
                put_guarded,
            ),
            (
                "get_guarded_call",
                get_call,
                "get_guarded, inlined",
                get_guarded,
            ),
            (
                "fetch_add_guarded_call",
                fetch_add_call,
                "fetch_add_guarded, inlined",
                fetch_add_guarded,
            ),
        ];
        for (op, timing, reference, direct) in rows {
            emit(&PeMessage::Timed {
                op: op.to_string(),
                layer: LAYER.to_string(),
                bytes: WORD_BYTES,
                timing,
                reference: Some((reference.to_string(), direct.per_op.median_ns)),
            })?;
        }
    }
    Ok(lifecycle::guarded("free", |s| {
        s.barrier()?;
        s.free(counter)?;
        s.free(word)
    })?)
}

/// A guarded put of `value` into the peer's `word`, out of line (see [`guarded_word_ops`]).
#[inline(never)]
fn put_call(word: &Allocation<u64>, value: u64, pe: usize) -> hyper_multicore::Result<()> {
    lifecycle::guarded("put", |s| s.put(word, &[value], pe))
}

/// [`lifecycle::quiet`], out of line (see [`guarded_word_ops`]).
#[inline(never)]
fn quiet_call() -> hyper_multicore::Result<()> {
    lifecycle::quiet()
}

/// A guarded get of PE `pe`'s `word`, out of line (see [`guarded_word_ops`]).
#[inline(never)]
fn get_call(word: &Allocation<u64>, pe: usize) -> hyper_multicore::Result<u64> {
    let mut value = [0u64];
    lifecycle::guarded("get", |s| s.get(&mut value, word, pe))?;
    Ok(value[0])
}

/// A guarded fetch-add of 1 on PE `pe`'s `counter`, out of line (see [`guarded_word_ops`]).
#[inline(never)]
fn fetch_add_call(counter: &Allocation<u64>, pe: usize) -> hyper_multicore::Result<u64> {
    lifecycle::guarded("atomic_fetch_add", |s| {
        s.atomic_fetch_add(counter, 1u64, pe)
    })
}

/// A batch of direct calls (`batch(shmem, ops)`) inside one guarded call, as
/// [`guarded_on_root`] runs it.
fn direct_on_root<'b>(
    root: bool,
    batch: impl Fn(&Shmem, u64) -> hyper_multicore::Result<()> + 'b,
) -> Batch<'b> {
    guarded_on_root(root, move |ops| {
        Ok(lifecycle::guarded("batch", |s| {
            let start = Instant::now();
            batch(s, ops)?;
            Ok(start.elapsed())
        })?)
    })
}

/// [`together`](super::together) for the guarded job, where no `&Shmem` outlives a guarded call: each call of
/// the batch starts right after a barrier, and root rank 0's duration is broadcast, each
/// through `lifecycle::guarded`; only root rank 0 runs `batch` (the others wait).
fn guarded_on_root<'b>(
    root: bool,
    mut batch: impl FnMut(u64) -> Result<Duration> + 'b,
) -> Batch<'b> {
    Box::new(move |ops| {
        lifecycle::guarded("barrier", |s| s.barrier())?;
        let took = if root { nanos(batch(ops)?) } else { 0 };
        let root_took =
            lifecycle::guarded("broadcast", |s| s.control().broadcast(&took.to_le_bytes()))?;
        root_duration(root_took)
    })
}
