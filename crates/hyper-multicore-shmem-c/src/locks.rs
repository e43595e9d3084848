//! Distributed locks on a symmetric `long` (`shmem_set_lock`, `shmem_test_lock`,
//! `shmem_clear_lock`): a queue lock (Mellor-Crummey–Scott) made of the runtime's atomics, where
//! every waiter waits on its own memory (the runtime's doorbell wakes it), never polling a peer.
//!
//! The lock's 8 bytes are two 32-bit words on every PE: the low word of PE 0's copy is the
//! queue's tail (the last PE in line, plus one; 0 when free); the high word of each PE's copy is
//! that PE's queue node: its successor (plus one) in bits 0..31, and bit 31 set once its
//! predecessor hands it the lock. The low words of other PEs' copies are unused.

use std::ffi::c_int;

use hyper_multicore::shmem::Region;

use crate::atomics::{self, Bitwise};
use crate::job::{self, At};

/// Bit of a node: the lock was handed over.
const GRANTED: u32 = 1 << 31;
/// Bits of a node: the successor's PE plus one.
const SUCCESSOR: u32 = GRANTED - 1;

/// The tail word (on PE 0) and this PE's node word of the lock at `lock`.
fn words(call: &str, lock: usize) -> (At, At) {
    let whole: Region = job::region(call, lock, 8);
    let half = |offset: u64| {
        At(Region {
            heap_offset: whole.heap_offset + offset,
            bytes: 4,
            ..whole
        })
    };
    (half(0), half(4))
}

/// Puts this PE at the end of the queue (`try_only`: only if the lock is free); returns whether
/// it holds the lock now, or else its predecessor (plus one) if it queued.
fn enqueue(call: &str, lock: usize, try_only: bool) -> Result<bool, u32> {
    let me = job::my_pe(call);
    let (tail, node) = words(call, lock);
    let ticket = me as u32 + 1;
    job::run(call, |shmem| {
        shmem.atomic_set(&node, 0u32, me)?;
        if try_only {
            let previous = shmem.atomic_compare_swap(&tail, 0u32, ticket, 0)?;
            return Ok(Ok(previous == 0));
        }
        let previous = shmem.atomic_swap(&tail, ticket, 0)?;
        Ok(if previous == 0 {
            Ok(true)
        } else {
            Err(previous)
        })
    })
}

/// Sets bits `bits` of PE `pe`'s node word (or-ing them in: its successor and its grant come
/// from different PEs).
fn mark(call: &str, lock: usize, pe: u32, bits: u32) {
    let (_, node) = words(call, lock);
    job::run(call, |shmem| {
        atomics::bitwise::<u32>(shmem, &node, u64::from(bits), Bitwise::Or, pe as usize)
    });
}

/// Waits until this PE's node word satisfies `ready`; returns it.
fn wait_own(call: &str, lock: usize, ready: impl Fn(u32) -> bool) -> u32 {
    let (_, node) = words(call, lock);
    let mut seen = 0;
    job::run(call, |shmem| {
        shmem.wait_words::<u32>(
            call,
            &[node.0],
            |values| {
                seen = values[0];
                ready(seen)
            },
            None,
        )
    });
    seen
}

/// Waits until this PE holds the lock at `lock` (a symmetric `long`, zero before first use).
///
/// # Safety
/// `lock` must be a symmetric address of a `long`.
#[no_mangle]
pub unsafe extern "C" fn shmem_set_lock(lock: *mut std::ffi::c_long) {
    const CALL: &str = "shmem_set_lock";
    let lock = lock as usize;
    if let Err(predecessor) = enqueue(CALL, lock, false) {
        mark(CALL, lock, predecessor - 1, job::my_pe(CALL) as u32 + 1);
        wait_own(CALL, lock, |node| node & GRANTED != 0);
    }
}

/// Takes the lock at `lock` if it is free: 0 if this PE holds it now, 1 if not.
///
/// # Safety
/// `lock` must be a symmetric address of a `long`.
#[no_mangle]
pub unsafe extern "C" fn shmem_test_lock(lock: *mut std::ffi::c_long) -> c_int {
    match enqueue("shmem_test_lock", lock as usize, true) {
        Ok(true) => 0,
        _ => 1,
    }
}

/// Completes this PE's outstanding operations and hands the lock at `lock` to the next PE in
/// line (or frees it).
///
/// # Safety
/// `lock` must be a symmetric address of a `long` this PE holds.
#[no_mangle]
pub unsafe extern "C" fn shmem_clear_lock(lock: *mut std::ffi::c_long) {
    const CALL: &str = "shmem_clear_lock";
    let lock = lock as usize;
    let me = job::my_pe(CALL);
    let (tail, node) = words(CALL, lock);
    let ticket = me as u32 + 1;
    let successor = job::run(CALL, |shmem| {
        shmem.try_quiet()?;
        let node = shmem.atomic_fetch::<u32>(&node, me)?;
        if node & SUCCESSOR != 0 {
            return Ok(Some(node & SUCCESSOR));
        }
        let released = shmem.atomic_compare_swap(&tail, ticket, 0u32, 0)? == ticket;
        Ok((!released).then_some(0))
    });
    let successor = match successor {
        None => return,
        Some(0) => wait_own(CALL, lock, |node| node & SUCCESSOR != 0) & SUCCESSOR,
        Some(successor) => successor,
    };
    mark(CALL, lock, successor - 1, GRANTED);
}
