//! Remote memory access — put, get (blocking and `_nbi`), the single-element `p`/`g`, strided
//! `iput`/`iget`, put-with-signal, `signal_fetch`, `fence` and `quiet` — for every element size.
//! The typed and sized entry points (`shmem_int_put`, `shmem_put32`, …; see `typed.rs`) call
//! these with the element size; every byte moves through the runtime's data plane.

use std::ffi::c_int;

use hyper_multicore::lifecycle;
use hyper_multicore::shmem::{Located, SignalOp};

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
/// whatever the pointers: the standard's zero-length no-op).
pub(crate) fn put(call: &str, dest: usize, source: CallerBuffer, pe: c_int, nbi: bool) {
    if source.len() == 0 {
        return;
    }
    let word = if nbi { None } else { source.word() };
    if let Some(word) = word {
        return put_value(call, dest, word, pe);
    }
    let pe = job::target_pe(call, pe);
    source.with_source(|bytes| {
        let at = job::located(call, dest, bytes.len());
        // One reference captured (see `job::run`).
        let args = &(at, bytes, pe, nbi);
        job::run(call, move |shmem| {
            let (at, bytes, pe, nbi) = args;
            match nbi {
                false => shmem.put_located(at, bytes, *pe),
                true => shmem.put_nbi::<u8>(&At(at.region()), bytes, *pe),
            }
        });
    });
}

/// Copies PE `pe`'s copy of the symmetric `source` into `target` (nothing at all for zero
/// bytes, whatever the pointers).
pub(crate) fn get(call: &str, target: CallerBuffer, source: usize, pe: c_int, nbi: bool) {
    if target.len() == 0 {
        return;
    }
    if target.len() == WORD && !nbi {
        return target.set_word(g(call, source, pe));
    }
    let pe = job::target_pe(call, pe);
    target.with_target(|bytes| {
        let at = job::located(call, source, bytes.len());
        // One reference captured (see `job::run`).
        let args = &mut (at, bytes, pe, nbi);
        job::run(call, move |shmem| {
            let (at, bytes, pe, nbi) = args;
            match nbi {
                false => shmem.get_located(bytes, at, *pe),
                true => shmem.get_nbi::<u8>(bytes, &At(at.region()), *pe),
            }
        });
    });
}

/// The byte offsets of the `nelems` elements of `size` bytes of a strided transfer: (in the
/// symmetric side, in the local side), with `strides` = [symmetric, local] in elements.
fn strided(
    call: &str,
    strides: [isize; 2],
    size: usize,
    nelems: usize,
) -> impl Iterator<Item = (usize, usize)> {
    let [symmetric, local] = strides;
    strided_bytes(call, nelems, symmetric, size);
    (0..nelems).map(move |i| (i * symmetric as usize * size, i * local as usize * size))
}

/// Strided put: element `i` of `source` (`sst` elements apart) to element `i` of `dest` (`dst`
/// apart) on PE `pe`; `source` spans every element read.
pub(crate) fn iput(
    call: &str,
    dest: usize,
    source: CallerBuffer,
    [dst, sst]: [isize; 2],
    size: usize,
    nelems: usize,
    pe: c_int,
) {
    for (remote, local) in strided(call, [dst, sst], size, nelems) {
        put(call, dest + remote, source.part(local, size), pe, false);
    }
}

/// Strided get: element `i` of `source` on PE `pe` (`sst` elements apart) to element `i` of
/// `target` (`tst` apart); `target` spans every element written.
pub(crate) fn iget(
    call: &str,
    target: CallerBuffer,
    source: usize,
    [tst, sst]: [isize; 2],
    size: usize,
    nelems: usize,
    pe: c_int,
) {
    for (remote, local) in strided(call, [sst, tst], size, nelems) {
        get(call, target.part(local, size), source + remote, pe, false);
    }
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
        Some(word) => put_signal_from(call, dest, word, (signal, value, op), pe),
        None => source.with_source(|bytes| {
            put_signal_from(call, dest, bytes, (signal, value, op), pe);
        }),
    }
}

/// [`put_signal`] of `source`'s bytes, then `signal` (the word, value and operation): generic
/// so that a word's put has its own copy of this code, in which the length is a constant.
#[inline(always)]
fn put_signal_from(
    call: &str,
    dest: usize,
    source: impl AsRef<[u8]>,
    signal: (Located, u64, SignalOp),
    pe: usize,
) {
    let bytes = source.as_ref();
    if bytes.is_empty() {
        let (signal, value, op) = signal;
        return job::run(call, |shmem| shmem.signal_located(&signal, value, op, pe));
    }
    let at = job::located(call, dest, bytes.len());
    // One reference captured (see `job::run`).
    let args = &(at, bytes, signal, pe);
    job::run(call, move |shmem| {
        let (at, bytes, (signal, value, op), pe) = args;
        shmem.put_located(at, bytes, *pe)?;
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
/// closure body of its own copied the located range through the stack three times (get 8 B
/// 8.6 → 8.0 ns, 4 alternated runs; the same form did not move put + quiet or the atomics).
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
