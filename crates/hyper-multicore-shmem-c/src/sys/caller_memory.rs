//! The C caller's buffers: the only place this crate reads or writes memory through a pointer a
//! C program passed in.
//!
//! # Safety contract
//!
//! A [`CallerBuffer`] is made (unsafely) by an entry point from a pointer and length the C caller
//! passed under the contract of `shmem.h`: valid for reads (a source) or writes (a target) of
//! `len` bytes for the duration of the call. After that, its methods are safe.
//!
//! The buffer may itself lie in memory other processes write (a symmetric heap address passed
//! as a local source or target is common in OpenSHMEM programs): such a buffer is never viewed
//! as a Rust slice (a concurrent writer can only make the bytes stale or torn, never invalid:
//! they are plain bytes). Puts and gets hand it to the runtime as a pointer
//! ([`CallerBuffer::source`], [`CallerBuffer::target`]), which copies it once with a raw copy;
//! the calls that need its bytes as a slice ([`CallerBuffer::with_source`],
//! [`CallerBuffer::with_target`]: collectives, fetched values) copy a shared buffer through a
//! private bounce buffer instead.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use hyper_multicore::shmem::{count_bounced, overlaps_shared_memory, LocalSource, LocalTarget};

/// The executable's data and bss once they are symmetric (start, end, alias; 0, 0, 0 before):
/// shared memory too, though not one of the runtime's mappings — the same pages are mapped a
/// second time at `alias`, in this PE's heap.
static SHARED_STATICS: [AtomicUsize; 3] = [const { AtomicUsize::new(0) }; 3];

/// Bumped whenever the set of shared mappings may change (this library starts or ends the
/// runtime, the data and bss become shared): a private verdict cached before is void.
static MAPPINGS_EPOCH: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// The last range this thread found private (start, end, epoch): a loop over one local
    /// buffer checks the runtime's mappings (a lock) once.
    static LAST_PRIVATE: Cell<(usize, usize, u64)> = const { Cell::new((0, 0, u64::MAX)) };
}

/// Marks `start..end` (the executable's data and bss, now symmetric) as memory other processes
/// write, whose pages are also mapped at `alias` in this PE's heap (at `shmem_init`, and again
/// after a heap restart moved them).
pub(crate) fn statics_are_shared(start: usize, end: usize, alias: usize) {
    SHARED_STATICS[0].store(start, Ordering::Relaxed);
    SHARED_STATICS[2].store(alias, Ordering::Relaxed);
    SHARED_STATICS[1].store(end, Ordering::Release);
    mappings_changed();
}

/// `address..address + len` as the heap's mapping sees it: a range inside the symmetric data and
/// bss moves to its alias in the heap (the same pages, mapped twice), so that a copy between it
/// and the heap — a put of a global variable into itself on this PE, say — is a copy inside
/// one mapping, where `memmove` sees the overlap. Any other range stays as it is.
#[inline]
fn in_heap_mapping(address: usize, len: usize) -> usize {
    let end = SHARED_STATICS[1].load(Ordering::Acquire);
    let start = SHARED_STATICS[0].load(Ordering::Relaxed);
    if start <= address && address.saturating_add(len) <= end && address < end {
        SHARED_STATICS[2].load(Ordering::Relaxed) + (address - start)
    } else {
        address
    }
}

/// Voids every cached private verdict: the runtime's mappings are about to change or did.
pub(crate) fn mappings_changed() {
    MAPPINGS_EPOCH.fetch_add(1, Ordering::AcqRel);
}

/// True if `address..address + len` may be written by other processes.
fn shared(address: usize, len: usize) -> bool {
    let epoch = MAPPINGS_EPOCH.load(Ordering::Acquire);
    let end_address = address.saturating_add(len);
    let (start, end, seen) = LAST_PRIVATE.with(Cell::get);
    if seen == epoch && start <= address && end_address <= end {
        return false;
    }
    let statics_end = SHARED_STATICS[1].load(Ordering::Acquire);
    let statics_start = SHARED_STATICS[0].load(Ordering::Relaxed);
    let shared = overlaps_shared_memory(address, len)
        || (address < statics_end && statics_start < end_address);
    if !shared {
        LAST_PRIVATE.with(|last| last.set((address, end_address, epoch)));
    }
    shared
}

/// Buffers up to this many bytes always travel through a private copy on the stack: copying
/// them costs less than finding out whether they lie in shared memory (a lookup that, cached
/// per thread, still costs a thread-local access in a shared library).
const SMALL: usize = 64;

/// The most common small buffer (a `long`, a `double`): copied as one word, not through
/// `memcpy` with a length known only at run time.
pub(crate) const WORD: usize = 8;

/// `len` bytes of the C caller's memory at `address`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CallerBuffer {
    address: usize,
    len: usize,
}

impl CallerBuffer {
    /// # Safety
    /// `address` must be valid for reads (and, for [`CallerBuffer::with_target`], writes) of
    /// `len` bytes until the current entry point returns; it may be null or dangling when `len`
    /// is 0.
    pub(crate) unsafe fn new(address: *const u8, len: usize) -> CallerBuffer {
        CallerBuffer {
            address: address as usize,
            len,
        }
    }

    /// Its length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// A copy of the buffer's bytes if it is one word (8 bytes) long: the most common small
    /// buffer (a `long`, a `double`), whose length the compiler then knows.
    #[inline]
    pub(crate) fn word(&self) -> Option<[u8; WORD]> {
        // SAFETY: readable for `len` = 8 bytes (constructor contract), unaligned allowed;
        // shared bytes are plain data (module contract).
        (self.len == WORD).then(|| unsafe { (self.address as *const [u8; WORD]).read_unaligned() })
    }

    /// Writes `word` into the buffer (panics unless it is one word long).
    #[inline]
    pub(crate) fn set_word(&self, word: [u8; WORD]) {
        assert_eq!(
            self.len, WORD,
            "a word written into a caller buffer of another length"
        );
        // SAFETY: writable for `len` = 8 bytes (constructor contract), unaligned allowed.
        unsafe { (self.address as *mut [u8; WORD]).write_unaligned(word) };
    }

    /// The buffer as the source of a put or of a signal's data: read in place, whatever memory
    /// it is (no private copy: the runtime copies it once, with a raw copy). A buffer in the
    /// symmetric data and bss is read through its alias in the heap (see [`in_heap_mapping`]).
    #[inline]
    pub(crate) fn source(&self) -> LocalSource<'_> {
        let address = in_heap_mapping(self.address, self.len);
        // SAFETY: readable for `len` bytes until the current entry point returns (constructor
        // contract), which outlives this borrow of a buffer made inside it — or the same pages
        // at their alias in the heap, mapped while the runtime is; concurrent writers are
        // allowed by `LocalSource` (plain bytes).
        unsafe { LocalSource::from_raw(address as *const u8, self.len) }
    }

    /// The buffer as the target of a get: written in place, whatever memory it is (no private
    /// copy: the runtime copies into it once, with a raw copy). A buffer in the symmetric data
    /// and bss is written through its alias in the heap (see [`in_heap_mapping`]).
    #[inline]
    pub(crate) fn target(&self) -> LocalTarget<'_> {
        let address = in_heap_mapping(self.address, self.len);
        // SAFETY: writable for `len` bytes until the current entry point returns (constructor
        // contract), which outlives this borrow — or the same pages at their alias in the heap,
        // mapped while the runtime is; this crate forms no reference to the caller's memory
        // meanwhile (only `with_source`/`with_target` do, not during a get), and other
        // processes' accesses are allowed by `LocalTarget` (plain bytes).
        unsafe { LocalTarget::from_raw(address as *mut u8, self.len) }
    }

    /// Calls `f` with the buffer's bytes: the buffer itself when it is large private memory of
    /// this process, else a private copy of it.
    pub(crate) fn with_source<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        if self.len == 0 {
            return f(&[]);
        }
        if let Some(word) = self.word() {
            return f(&word);
        }
        if self.len <= SMALL {
            let mut copy = [0u8; SMALL];
            // SAFETY: readable for `len` bytes (constructor contract); the copy is private, at
            // least `len` long and does not overlap it; shared bytes are plain data (module
            // contract).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    self.address as *const u8,
                    copy.as_mut_ptr(),
                    self.len,
                );
            }
            count_bounced(self.len);
            return f(&copy[..self.len]);
        }
        if shared(self.address, self.len) {
            count_bounced(self.len);
            let mut copy = vec![0u8; self.len];
            // SAFETY: readable for `len` bytes (constructor contract); the copy is private and
            // does not overlap it; shared bytes are plain data (module contract).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    self.address as *const u8,
                    copy.as_mut_ptr(),
                    self.len,
                );
            }
            return f(&copy);
        }
        // SAFETY: readable for `len` bytes (constructor contract) and private to this process
        // (checked above), so no other process writes it while the slice lives.
        f(unsafe { std::slice::from_raw_parts(self.address as *const u8, self.len) })
    }

    /// Calls `f` with a mutable view of the buffer's bytes (writes through it land in the
    /// buffer): the buffer itself when it is large and private, else a private copy written
    /// back after.
    pub(crate) fn with_target<R>(&self, f: impl FnOnce(&mut [u8]) -> R) -> R {
        if self.len == 0 {
            return f(&mut []);
        }
        if self.len == WORD {
            let mut copy = [0u8; WORD];
            let result = f(&mut copy);
            self.set_word(copy);
            return result;
        }
        if self.len <= SMALL {
            count_bounced(self.len);
            let mut copy = [0u8; SMALL];
            let result = f(&mut copy[..self.len]);
            // SAFETY: writable for `len` bytes (constructor contract); the copy is private, at
            // least `len` long and does not overlap it.
            unsafe {
                std::ptr::copy_nonoverlapping(copy.as_ptr(), self.address as *mut u8, self.len);
            }
            return result;
        }
        if shared(self.address, self.len) {
            count_bounced(self.len);
            let mut copy = vec![0u8; self.len];
            let result = f(&mut copy);
            // SAFETY: writable for `len` bytes (constructor contract); the copy is private and
            // does not overlap it.
            unsafe {
                std::ptr::copy_nonoverlapping(copy.as_ptr(), self.address as *mut u8, self.len);
            }
            return result;
        }
        // SAFETY: writable for `len` bytes (constructor contract) and private to this process
        // (checked above); no other reference to it exists during the call.
        f(unsafe { std::slice::from_raw_parts_mut(self.address as *mut u8, self.len) })
    }
}

/// Reads the C value the caller passed a pointer to (`int *status` arrays, comparison values).
///
/// # Safety
/// `address` must be valid for reads of `len` elements of `T` for the duration of the call.
pub(crate) unsafe fn read_array<T: Copy>(address: *const T, len: usize) -> Vec<T> {
    if len == 0 || address.is_null() {
        return Vec::new();
    }
    // SAFETY: readable for `len` elements (function contract); private caller memory, or
    // plain data copied out element by element.
    (0..len)
        .map(|i| unsafe { address.add(i).read_unaligned() })
        .collect()
}

/// Writes `values` to the caller's array at `address` (`size_t *indices` outputs).
///
/// # Safety
/// `address` must be valid for writes of `values.len()` elements of `T` for the call.
pub(crate) unsafe fn write_array<T: Copy>(address: *mut T, values: &[T]) {
    for (i, &value) in values.iter().enumerate() {
        // SAFETY: writable for `values.len()` elements (function contract).
        unsafe { address.add(i).write_unaligned(value) };
    }
}
