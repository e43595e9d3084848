//! Remote memory access — put, get (blocking and `_nbi`), the single-element `p`/`g`, strided
//! `iput`/`iget`, put-with-signal, `signal_fetch`, `fence` and `quiet` — for every element size.
//! The typed and sized entry points (`shmem_int_put`, `shmem_put32`, …; see `typed.rs`) call
//! these with the element size; every byte moves through the runtime's data plane.
//!
//! The caller's local buffer goes to the runtime as a pointer ([`CallerBuffer::source`],
//! [`CallerBuffer::target`]), private or shared alike: the bytes move once, with one raw copy
//! between the two mappings on the shared-memory route (a heap-to-heap put is one `memmove`),
//! or handed to UCX in place. Only a word (8 bytes) takes another path, as a value the compiler
//! can keep in a register.

use std::ffi::c_int;

use hyper_multicore::lifecycle;
use hyper_multicore::shmem::{Located, SignalOp, Strides};

use crate::atomics;
use crate::failure::fail;
use crate::job::{self, At};
use crate::sys::caller_memory::{CallerBuffer, WORD};

/// `SHMEM_SIGNAL_SET`.
pub const SIGNAL_SET: c_int = 0;
/// `SHMEM_SIGNAL_ADD`.
pub const SIGNAL_ADD: c_int = 1;

/// The bytes of `nelems` elements of `size` bytes (fails on overflow).
pub(crate) fn bytes(call: &str, nelems: usize, size: usize) -> usize {
    nelems
        .checked_mul(size)
        .unwrap_or_else(|| fail(call, format!("{nelems} elements of {size} bytes overflow")))
}

/// The byte span of `nelems` elements of `size` bytes, `stride` elements apart.
pub(crate) fn strided_bytes(call: &str, nelems: usize, stride: isize, size: usize) -> usize {
    if nelems == 0 {
        return 0;
    }
    let stride = usize::try_from(stride)
        .ok()
        .filter(|&s| s > 0)
        .unwrap_or_else(|| fail(call, format!("stride {stride} must be a positive number")));
    (nelems - 1)
        .checked_mul(stride)
        .and_then(|n| n.checked_mul(size))
        .and_then(|n| n.checked_add(size))
        .unwrap_or_else(|| fail(call, format!("{nelems} elements {stride} apart overflow")))
}

/// Copies `source` into PE `pe`'s copy of the symmetric `dest` (nothing at all for zero bytes,
/// whatever the pointers: the standard's zero-length no-op). `source` is read in place, once.
pub(crate) fn put(call: &str, dest: usize, source: CallerBuffer, pe: c_int, nbi: bool) {
    if source.len() == 0 {
        return;
    }
    let word = if nbi { None } else { source.word() };
    if let Some(word) = word {
        return put_value(call, dest, word, pe);
    }
    let pe = job::target_pe(call, pe);
    let at = job::located(call, dest, source.len());
    // One reference captured (see `job::run`).
    let args = &(at, source, pe, nbi);
    job::run(call, move |shmem| {
        let (at, source, pe, nbi) = args;
        match nbi {
            false => shmem.put_located_from(at, source.source(), *pe),
            true => shmem.put_located_from_nbi(at, source.source(), *pe),
        }
    });
}

/// Copies PE `pe`'s copy of the symmetric `source` into `target` (nothing at all for zero
/// bytes, whatever the pointers). `target` is written in place, once.
pub(crate) fn get(call: &str, target: CallerBuffer, source: usize, pe: c_int, nbi: bool) {
    if target.len() == 0 {
        return;
    }
    if target.len() == WORD && !nbi {
        return target.set_word(g(call, source, pe));
    }
    let pe = job::target_pe(call, pe);
    let at = job::located(call, source, target.len());
    // One reference captured (see `job::run`).
    let args = &(at, target, pe, nbi);
    job::run(call, move |shmem| {
        let (at, target, pe, nbi) = args;
        match nbi {
            false => shmem.get_located_into(target.target(), at, *pe),
            true => shmem.get_located_into_nbi(target.target(), at, *pe),
        }
    });
}

/// The shape of a strided transfer of `nelems` elements of `size` bytes with `strides` =
/// [symmetric, local] in elements (each checked: positive, and the span fits); `None` for no
/// element.
fn strides(
    call: &str,
    [symmetric, local]: [isize; 2],
    size: usize,
    nelems: usize,
) -> Option<Strides> {
    if nelems == 0 {
        return None;
    }
    strided_bytes(call, nelems, symmetric, size);
    strided_bytes(call, nelems, local, size);
    // In bytes; a stride's bytes overflow only where no second element uses them (checked).
    let apart = |stride: isize| (stride as usize).checked_mul(size).unwrap_or(0);
    Some(Strides {
        count: nelems,
        size,
        stride: apart(symmetric),
        local_stride: apart(local),
    })
}

/// Strided put: element `i` of `source` (`sst` elements apart) to element `i` of `dest` (`dst`
/// apart) on PE `pe`; `source` spans every element read. One call of the runtime for all of
/// them: on the shared-memory route one raw copy per element.
pub(crate) fn iput(
    call: &str,
    dest: usize,
    source: CallerBuffer,
    [dst, sst]: [isize; 2],
    size: usize,
    nelems: usize,
    pe: c_int,
) {
    let Some(strides) = strides(call, [dst, sst], size, nelems) else {
        return;
    };
    let pe = job::target_pe(call, pe);
    let span = strided_bytes(call, nelems, dst, size);
    let at = job::located(call, dest, span);
    job::run(call, |shmem| {
        shmem.put_located_strided(&at, source.source(), strides, pe)
    });
}

/// Strided get: element `i` of `source` on PE `pe` (`sst` elements apart) to element `i` of
/// `target` (`tst` apart); `target` spans every element written. One call of the runtime for
/// all of them (see [`iput`]).
pub(crate) fn iget(
    call: &str,
    target: CallerBuffer,
    source: usize,
    [tst, sst]: [isize; 2],
    size: usize,
    nelems: usize,
    pe: c_int,
) {
    let Some(strides) = strides(call, [sst, tst], size, nelems) else {
        return;
    };
    let pe = job::target_pe(call, pe);
    let span = strided_bytes(call, nelems, sst, size);
    let at = job::located(call, source, span);
    job::run(call, |shmem| {
        shmem.get_located_strided(target.target(), &at, strides, pe)
    });
}

/// Puts `source` into `dest` on PE `pe`, then updates the 64-bit signal word `signal` there
/// (`sig_op`: [`SIGNAL_SET`] or [`SIGNAL_ADD`]): a PE that sees the signal sees the data. With
/// zero bytes only the signal is updated (`dest` is not looked at).
pub(crate) fn put_signal(
    call: &str,
    dest: usize,
    source: CallerBuffer,
    signal: usize,
    value: u64,
    sig_op: c_int,
    pe: c_int,
) {
    let op = match sig_op {
        SIGNAL_SET => SignalOp::Set,
        SIGNAL_ADD => SignalOp::Add,
        other => fail(
            call,
            format!("signal operation {other} is neither SHMEM_SIGNAL_SET nor SHMEM_SIGNAL_ADD"),
        ),
    };
    let pe = job::target_pe(call, pe);
    let signal = job::located(call, signal, 8);
    match source.word() {
        Some(word) => put_signal_word(call, dest, word, (signal, value, op), pe),
        None => put_signal_from_buffer(call, dest, source, (signal, value, op), pe),
    }
}

/// [`put_signal`] of the caller's buffer (of any length but a word's), read in place.
fn put_signal_from_buffer(
    call: &str,
    dest: usize,
    source: CallerBuffer,
    signal: (Located, u64, SignalOp),
    pe: usize,
) {
    if source.len() == 0 {
        let (signal, value, op) = signal;
        return job::run(call, |shmem| shmem.signal_located(&signal, value, op, pe));
    }
    let at = job::located(call, dest, source.len());
    // One reference captured (see `job::run`).
    let args = &(at, source, signal, pe);
    job::run(call, move |shmem| {
        let (at, source, (signal, value, op), pe) = args;
        shmem.put_located_from(at, source.source(), *pe)?;
        shmem.signal_located(signal, *value, *op, *pe)
    });
}

/// [`put_signal`] of a word (8 bytes, as a value), then `signal` (the word, value and
/// operation): the put's length is a constant here.
#[inline(always)]
fn put_signal_word(
    call: &str,
    dest: usize,
    word: [u8; WORD],
    signal: (Located, u64, SignalOp),
    pe: usize,
) {
    let at = job::located(call, dest, WORD);
    // One reference captured (see `job::run`).
    let args = &(at, word, signal, pe);
    job::run(call, move |shmem| {
        let (at, word, (signal, value, op), pe) = args;
        shmem.put_located(at, word, *pe)?;
        shmem.signal_located(signal, *value, *op, *pe)
    });
}

/// Atomically reads this PE's signal word `signal`.
pub(crate) fn signal_fetch(call: &str, signal: usize) -> u64 {
    let region = job::region(call, signal, 8);
    job::run(call, |shmem| {
        shmem.atomic_fetch::<u64>(&At(region), shmem.rank())
    })
}

/// Stores `value` into PE `pe`'s copy of the symmetric `dest`. A naturally aligned 4- or
/// 8-byte value is stored atomically, which also wakes a PE waiting on it.
pub(crate) fn p<R: bytemuck::Pod>(call: &str, dest: usize, value: R, pe: c_int) {
    let bytes = bytemuck::bytes_of(&value);
    let aligned = dest % bytes.len().max(1) == 0;
    match bytes.len() {
        4 if aligned => atomics::set(call, dest, bytemuck::pod_read_unaligned::<u32>(bytes), pe),
        8 if aligned => atomics::set(call, dest, bytemuck::pod_read_unaligned::<u64>(bytes), pe),
        _ => put_value(call, dest, value, pe),
    }
}

/// Copies `value` into PE `pe`'s copy of the symmetric `dest` (a put whose length the
/// compiler knows: no `memcpy` call for a word).
fn put_value<R: bytemuck::Pod>(call: &str, dest: usize, value: R, pe: c_int) {
    let pe = job::target_pe(call, pe);
    let at = job::located(call, dest, std::mem::size_of::<R>());
    // One reference captured (see `job::run`).
    let args = &(at, value, pe);
    job::run(call, move |shmem| {
        let (at, value, pe) = args;
        shmem.put_located(at, bytemuck::bytes_of(value), *pe)
    });
}

/// PE `pe`'s copy of the symmetric `source`.
pub(crate) fn g<R: bytemuck::Pod>(call: &str, source: usize, pe: c_int) -> R {
    let pe = job::target_pe(call, pe);
    let mut value = R::zeroed();
    let at = job::located(call, source, std::mem::size_of::<R>());
    job::run(call, |shmem| get_word(shmem, &at, &mut value, pe));
    value
}

/// The body of [`g`]'s guarded call, a function the compiler must inline into the closure
/// around it: the closure then works on the caller's `at`, `value` and `pe` in place, where a
/// closure body of its own copied the located range through the stack three times (which
/// showed in the C API's `get` row; the same form did not move put + quiet or the atomics).
#[inline(always)]
fn get_word<R: bytemuck::Pod>(
    shmem: &hyper_multicore::shmem::Shmem,
    at: &Located,
    value: &mut R,
    pe: usize,
) -> hyper_multicore::Result<()> {
    shmem.get_located(bytemuck::bytes_of_mut(value), at, pe)
}

/// Orders this PE's puts and atomics to each PE.
#[no_mangle]
pub extern "C" fn shmem_fence() {
    job::order("shmem_fence", lifecycle::fence);
}

/// Completes every outstanding put, get and atomic of this PE.
#[no_mangle]
pub extern "C" fn shmem_quiet() {
    job::order("shmem_quiet", lifecycle::quiet);
}

/// Atomically reads this PE's signal word `sig_addr`.
///
/// # Safety
/// `sig_addr` must be a symmetric address of a `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn shmem_signal_fetch(sig_addr: *const u64) -> u64 {
    signal_fetch("shmem_signal_fetch", sig_addr as usize)
}
