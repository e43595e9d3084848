//! The shared mapping of a heap segment, and every raw access to it.
//!
//! # Safety contract (stated once, relied on by every method)
//!
//! A [`SharedMapping`] covers `len` bytes of a `MAP_SHARED` memfd mapping that stays mapped until
//! the value is dropped. Other processes read and write the same pages at any time, so this
//! module never hands out `&[u8]` or `&mut [u8]` into it: bytes are copied in and out with raw
//! pointer copies (a concurrent writer can only make the copied bytes stale or torn — every type
//! moved this way is plain old data, valid for any bit pattern), and words that several
//! processes update are only ever accessed as atomics ([`SharedWords`]).
//!
//! The local side of a put or get is a [`LocalSource`] or [`LocalTarget`]: a pointer and a
//! length, never a slice, because it may be shared memory too (this PE's own heap, a C
//! program's symmetric data). A put or get between two mappings is then one raw copy from
//! mapping to mapping, with no private copy in between.

use std::io;
use std::marker::PhantomData;
use std::os::fd::AsFd;
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicI32, AtomicI64, AtomicU32, AtomicU64, AtomicUsize, Ordering};

use parking_lot::Mutex;
use rustix::mm::{mmap, mmap_anonymous, munmap, MapFlags, ProtFlags};

/// Every [`SharedMapping`] alive in this process, as `(start address, length)`: registered when
/// mapped, removed just before it is unmapped. Fronts check local buffers against it so that no
/// reference is ever formed over memory other processes write ([`overlaps_any`]). Changed only
/// under its lock, which also republishes it in [`PUBLISHED`].
static MAPPED: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());

/// How many ranges [`PUBLISHED`] holds; a process maps a few (a runtime's segment, a mapping
/// kept alive across a restart), so more are rare and checked under [`MAPPED`]'s lock.
const PUBLISHED_RANGES: usize = 8;

/// [`MAPPED`] published for lock-free reads: a sequence lock over atomic words, rewritten by
/// the holder of `MAPPED`'s lock after every change.
struct Published {
    /// Even while the words are consistent; odd while they are rewritten.
    version: AtomicUsize,
    /// The number of ranges in `MAPPED` (more than [`PUBLISHED_RANGES`]: readers take the lock).
    count: AtomicUsize,
    /// The first `count` ranges' starts and lengths.
    ranges: [[AtomicUsize; 2]; PUBLISHED_RANGES],
}

static PUBLISHED: Published = Published {
    version: AtomicUsize::new(0),
    count: AtomicUsize::new(0),
    ranges: [const { [AtomicUsize::new(0), AtomicUsize::new(0)] }; PUBLISHED_RANGES],
};

/// Republishes `mapped` (the contents of [`MAPPED`], whose lock the caller holds: one writer at
/// a time).
fn publish(mapped: &[(usize, usize)]) {
    let version = PUBLISHED.version.load(Ordering::Relaxed);
    PUBLISHED.version.store(version + 1, Ordering::Relaxed);
    fence(Ordering::Release);
    PUBLISHED.count.store(mapped.len(), Ordering::Relaxed);
    for (slot, &(start, len)) in PUBLISHED.ranges.iter().zip(mapped) {
        slot[0].store(start, Ordering::Relaxed);
        slot[1].store(len, Ordering::Relaxed);
    }
    PUBLISHED.version.store(version + 2, Ordering::Release);
}

/// [`overlaps_any`] from [`PUBLISHED`], without a lock; `None` if a writer was rewriting it or
/// it overflowed (then ask under the lock).
#[inline]
fn overlaps_published(address: usize, end: usize) -> Option<bool> {
    let version = PUBLISHED.version.load(Ordering::Acquire);
    if version & 1 == 1 {
        return None;
    }
    let count = PUBLISHED.count.load(Ordering::Relaxed);
    if count > PUBLISHED_RANGES {
        return None;
    }
    let overlaps = PUBLISHED.ranges[..count].iter().any(|slot| {
        let start = slot[0].load(Ordering::Relaxed);
        let len = slot[1].load(Ordering::Relaxed);
        address < start.saturating_add(len) && start < end
    });
    fence(Ordering::Acquire);
    (PUBLISHED.version.load(Ordering::Relaxed) == version).then_some(overlaps)
}

/// True if `address..address + len` overlaps any shared mapping alive in this process (a
/// zero-length range overlaps nothing; a range that wraps around the address space overlaps
/// everything it could). Without a lock while few mappings are alive and none is being added
/// or removed at the moment; else under [`MAPPED`]'s lock.
pub(crate) fn overlaps_any(address: usize, len: usize) -> bool {
    if len == 0 {
        return false;
    }
    let end = address.saturating_add(len);
    if let Some(overlaps) = overlaps_published(address, end) {
        return overlaps;
    }
    MAPPED
        .lock()
        .iter()
        .any(|&(start, length)| address < start + length && start < end)
}

/// The local side of a put: `len` bytes of this process at a pointer, readable for the lifetime
/// `'a`, which other processes may write meanwhile (plain bytes: a concurrent writer can only
/// make what a copy reads stale or torn). Never turned into a slice: the data plane copies out
/// of it with one raw copy, or hands the pointer to UCX.
///
/// Made from a slice of private memory (`From<&[u8]>`), by the runtime from this PE's own heap
/// ([`Shmem::put_from`](crate::shmem::Shmem::put_from)), or from a pointer a foreign caller
/// passed ([`LocalSource::from_raw`], unsafe).
///
/// ```
/// use hyper_multicore::shmem::LocalSource;
/// let bytes = [1u8, 2, 3];
/// let source = LocalSource::from(&bytes[..]);
/// assert_eq!(source.len(), 3);
/// ```
#[derive(Clone, Copy, Debug)]
pub struct LocalSource<'a> {
    start: NonNull<u8>,
    len: usize,
    _borrow: PhantomData<&'a [u8]>,
}

impl<'a> LocalSource<'a> {
    /// The `len` bytes at `start`.
    ///
    /// # Safety
    /// `start` must be valid for reads of `len` bytes for all of `'a` (it may be null or
    /// dangling when `len` is 0), and nothing may unmap or free that memory meanwhile. The bytes
    /// may be written concurrently, by this process or others (they are read as plain bytes),
    /// and they may overlap the target of the put they are the source of.
    pub unsafe fn from_raw(start: *const u8, len: usize) -> LocalSource<'a> {
        let start = match len {
            0 => NonNull::dangling(),
            _ => NonNull::new(start.cast_mut()).unwrap_or(NonNull::dangling()),
        };
        LocalSource {
            start,
            len,
            _borrow: PhantomData,
        }
    }

    /// Its length in bytes.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if it holds no byte.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Its first byte's address (for UCX, which reads the bytes itself).
    #[inline]
    pub(crate) fn as_ptr(&self) -> *const u8 {
        self.start.as_ptr()
    }

    /// Bytes `offset..offset + len` of it (panics if they are not inside it).
    #[inline]
    pub(crate) fn part(&self, offset: usize, len: usize) -> LocalSource<'a> {
        if offset.checked_add(len).map_or(true, |end| end > self.len) {
            outside(offset, len, self.len);
        }
        // SAFETY: a sub-range of a range readable for 'a (this value's invariant).
        unsafe { LocalSource::from_raw(self.start.as_ptr().wrapping_add(offset), len) }
    }

    /// Copies its bytes into `destination` (private memory of the same length).
    pub(crate) fn copy_into(&self, destination: &mut [u8]) {
        assert_eq!(
            destination.len(),
            self.len,
            "a copy between unequal lengths"
        );
        // SAFETY: the source is readable for `len` bytes (invariant) and `destination`, a
        // private slice, cannot overlap it: a slice is never formed over memory the source
        // may be (shared, or borrowed immutably by this value); raw copy of plain bytes.
        unsafe { copy_small_inline(self.as_ptr(), destination.as_mut_ptr(), self.len) }
    }
}

impl<'a> From<&'a [u8]> for LocalSource<'a> {
    #[inline]
    fn from(bytes: &'a [u8]) -> LocalSource<'a> {
        // SAFETY: a slice is readable for its length while borrowed, and nothing writes it
        // meanwhile.
        unsafe { LocalSource::from_raw(bytes.as_ptr(), bytes.len()) }
    }
}

impl<'a, const N: usize> From<&'a [u8; N]> for LocalSource<'a> {
    #[inline]
    fn from(bytes: &'a [u8; N]) -> LocalSource<'a> {
        LocalSource::from(&bytes[..])
    }
}

impl<'a> From<&'a Vec<u8>> for LocalSource<'a> {
    #[inline]
    fn from(bytes: &'a Vec<u8>) -> LocalSource<'a> {
        LocalSource::from(&bytes[..])
    }
}

/// The local side of a get: `len` bytes of this process at a pointer, writable for the lifetime
/// `'a`, which other processes may read or write meanwhile (plain bytes). Never turned into a
/// slice: the data plane copies into it with one raw copy, or hands the pointer to UCX.
///
/// Made from a slice of private memory (`From<&mut [u8]>`), by the runtime from this PE's own
/// heap ([`Shmem::get_into`](crate::shmem::Shmem::get_into)), or from a pointer a foreign caller
/// passed ([`LocalTarget::from_raw`], unsafe).
///
/// ```
/// use hyper_multicore::shmem::LocalTarget;
/// let mut bytes = [0u8; 3];
/// let target = LocalTarget::from(&mut bytes[..]);
/// assert_eq!(target.len(), 3);
/// ```
#[derive(Debug)]
pub struct LocalTarget<'a> {
    start: NonNull<u8>,
    len: usize,
    _borrow: PhantomData<&'a mut [u8]>,
}

impl<'a> LocalTarget<'a> {
    /// The `len` bytes at `start`.
    ///
    /// # Safety
    /// `start` must be valid for writes (and reads) of `len` bytes for all of `'a` (it may be
    /// null or dangling when `len` is 0), and nothing may unmap or free that memory meanwhile.
    /// Other processes may read or write the bytes concurrently (they are written as plain
    /// bytes), and they may overlap the source of the get they are the target of; but no Rust
    /// reference to them may be used during `'a` (a shared reference to an atomic, as this
    /// crate holds to words of shared memory, excepted: such words are plain bytes to a copy).
    ///
    /// ```
    /// use hyper_multicore::shmem::LocalTarget;
    /// let mut word = 0u64;
    /// // SAFETY: `word` is writable for 8 bytes while the target lives, and nothing else uses it.
    /// let target = unsafe { LocalTarget::from_raw((&mut word as *mut u64).cast(), 8) };
    /// assert_eq!(target.len(), 8);
    /// ```
    pub unsafe fn from_raw(start: *mut u8, len: usize) -> LocalTarget<'a> {
        let start = match len {
            0 => NonNull::dangling(),
            _ => NonNull::new(start).unwrap_or(NonNull::dangling()),
        };
        LocalTarget {
            start,
            len,
            _borrow: PhantomData,
        }
    }

    /// Its length in bytes.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if it holds no byte.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Its first byte's address (for UCX, which writes the bytes itself).
    #[inline]
    pub(crate) fn as_mut_ptr(&mut self) -> *mut u8 {
        self.start.as_ptr()
    }

    /// Bytes `offset..offset + len` of it, borrowing it (panics if they are not inside it).
    #[inline]
    pub(crate) fn part(&mut self, offset: usize, len: usize) -> LocalTarget<'_> {
        if offset.checked_add(len).map_or(true, |end| end > self.len) {
            outside(offset, len, self.len);
        }
        // SAFETY: a sub-range of a range writable for 'a (this value's invariant), lent for
        // the borrow of `self`.
        unsafe { LocalTarget::from_raw(self.start.as_ptr().wrapping_add(offset), len) }
    }

    /// Copies `source` (private memory of the same length) into it.
    pub(crate) fn copy_from(&mut self, source: &[u8]) {
        assert_eq!(source.len(), self.len, "a copy between unequal lengths");
        // SAFETY: writable for `len` bytes (invariant); `source`, a private slice, cannot
        // overlap it (no slice is formed over memory a target may be); raw copy.
        unsafe { copy_small_inline(source.as_ptr(), self.start.as_ptr(), self.len) }
    }
}

impl<'a> From<&'a mut [u8]> for LocalTarget<'a> {
    #[inline]
    fn from(bytes: &'a mut [u8]) -> LocalTarget<'a> {
        // SAFETY: a mutable slice is writable for its length while borrowed, and no other
        // reference to it is used meanwhile.
        unsafe { LocalTarget::from_raw(bytes.as_mut_ptr(), bytes.len()) }
    }
}

impl<'a, const N: usize> From<&'a mut [u8; N]> for LocalTarget<'a> {
    #[inline]
    fn from(bytes: &'a mut [u8; N]) -> LocalTarget<'a> {
        LocalTarget::from(&mut bytes[..])
    }
}

impl<'a> From<&'a mut Vec<u8>> for LocalTarget<'a> {
    #[inline]
    fn from(bytes: &'a mut Vec<u8>) -> LocalTarget<'a> {
        LocalTarget::from(&mut bytes[..])
    }
}

/// The shape of a strided transfer ([`Shmem::put_located_strided`]): `count` elements of
/// `size` bytes, `stride` bytes apart on the symmetric side and `local_stride` bytes apart on
/// the local side (OpenSHMEM's `iput`/`iget`, with strides in bytes).
///
/// [`Shmem::put_located_strided`]: crate::shmem::Shmem::put_located_strided
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Strides {
    /// The number of elements.
    pub count: usize,
    /// Bytes per element.
    pub size: usize,
    /// Bytes from one element's start to the next one's on the symmetric side.
    pub stride: usize,
    /// Bytes from one element's start to the next one's on the local side.
    pub local_stride: usize,
}

impl Strides {
    /// The bytes from the first element's start to the last one's end, `stride` apart (0 for
    /// no element); `None` on overflow.
    pub fn span(count: usize, stride: usize, size: usize) -> Option<usize> {
        match count {
            0 => Some(0),
            _ => (count - 1).checked_mul(stride)?.checked_add(size),
        }
    }

    /// The heap side's span and the local side's.
    fn spans(&self) -> (usize, usize) {
        let heap = Strides::span(self.count, self.stride, self.size);
        let local = Strides::span(self.count, self.local_stride, self.size);
        match (heap, local) {
            (Some(heap), Some(local)) => (heap, local),
            _ => panic!("a strided transfer of {} elements overflows", self.count),
        }
    }
}

/// Copies `strides.count` elements of `strides.size` bytes from `source` (`local_stride`
/// apart) to `destination` (`stride` apart), or the other way round with `to_local`, one raw
/// element copy each (the common element sizes with a length the compiler knows).
///
/// # Safety
/// Every element's bytes must be valid for reads at the source and writes at the destination
/// (the callers check the spans); the ranges may overlap (each element is a `copy`).
#[inline(always)]
unsafe fn copy_strided(heap: *mut u8, local: *mut u8, strides: Strides, to_local: bool) {
    let Strides {
        count,
        size,
        stride,
        local_stride,
    } = strides;
    let element = |i: usize| {
        let (at_heap, at_local) = (
            heap.wrapping_add(i * stride),
            local.wrapping_add(i * local_stride),
        );
        match to_local {
            true => (at_heap.cast_const(), at_local),
            false => (at_local.cast_const(), at_heap),
        }
    };
    macro_rules! elements_of {
        ($n:expr) => {
            for i in 0..count {
                let (from, to) = element(i);
                // SAFETY: element `i` is valid at both ends (function contract).
                unsafe { std::ptr::copy(from, to, $n) };
            }
        };
    }
    match size {
        1 => elements_of!(1),
        2 => elements_of!(2),
        4 => elements_of!(4),
        8 => elements_of!(8),
        16 => elements_of!(16),
        _ => elements_of!(size),
    }
}

/// Types made only of atomics (and padding), `#[repr(C)]`, that may be viewed in shared memory.
///
/// # Safety
/// Implementors must be `#[repr(C)]` (or a primitive atomic), contain no pointers, and be valid
/// for the all-zero bit pattern and every bit pattern other processes may store through the
/// same type.
pub(crate) unsafe trait SharedWords: Sync {}

// SAFETY: primitive atomics are valid for every bit pattern and designed for shared mutation.
unsafe impl SharedWords for AtomicU32 {}
// SAFETY: as above.
unsafe impl SharedWords for AtomicU64 {}
// SAFETY: as above.
unsafe impl SharedWords for AtomicI32 {}
// SAFETY: as above.
unsafe impl SharedWords for AtomicI64 {}
// SAFETY: an array of primitive atomics, laid out without padding: valid for every bit pattern.
unsafe impl SharedWords for [AtomicU64; 2] {}

/// A `MAP_SHARED` mapping of a memfd, aligned to `alignment` bytes.
#[derive(Debug)]
pub(crate) struct SharedMapping {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is process-wide memory; all access goes through raw copies or atomics as
// the module contract says, so sharing the handle between threads adds no new hazard.
unsafe impl Send for SharedMapping {}
// SAFETY: as above.
unsafe impl Sync for SharedMapping {}

impl SharedMapping {
    /// Maps `len` bytes of `fd` read-write and shared, where byte `aligned` of the mapping (a
    /// multiple of the page size) lands on an address that is a multiple of `alignment` (a power
    /// of two, at least the page size).
    pub(crate) fn map(
        fd: impl AsFd,
        len: usize,
        alignment: usize,
        aligned: usize,
    ) -> io::Result<SharedMapping> {
        assert!(alignment.is_power_of_two() && len > 0 && aligned < len);
        let reserve = len
            .checked_add(alignment)
            .ok_or_else(|| io::Error::new(io::ErrorKind::OutOfMemory, "mapping size overflows"))?;
        // SAFETY: a fresh anonymous PROT_NONE reservation at an address the kernel picks; it
        // aliases nothing.
        let reserved = unsafe {
            mmap_anonymous(
                std::ptr::null_mut(),
                reserve,
                ProtFlags::empty(),
                MapFlags::PRIVATE | MapFlags::NORESERVE,
            )
        }?;
        let start = reserved as usize;
        // The first address in the reservation whose byte `aligned` is on the boundary.
        let aligned = ((start + aligned + alignment - 1) & !(alignment - 1)) - aligned;
        // SAFETY: [aligned, aligned + len) lies inside the reservation made above, which this
        // function owns, so MAP_FIXED replaces only our own PROT_NONE pages.
        let mapped = unsafe {
            mmap(
                aligned as *mut _,
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED | MapFlags::FIXED,
                fd,
                0,
            )
        };
        let head = aligned - start;
        let tail = reserve - head - len;
        // SAFETY: the head and tail slack are parts of our own reservation that nothing uses.
        unsafe {
            if head > 0 {
                let _ = munmap(reserved, head);
            }
            if tail > 0 {
                let _ = munmap((aligned + len) as *mut _, tail);
            }
        }
        let mapped = match mapped {
            Ok(pointer) => pointer,
            Err(e) => {
                // SAFETY: the middle of our reservation, still PROT_NONE and unused.
                unsafe {
                    let _ = munmap(aligned as *mut _, len);
                }
                return Err(e.into());
            }
        };
        let base = NonNull::new(mapped.cast::<u8>()).expect("mmap never returns null on success");
        let mut mapped = MAPPED.lock();
        mapped.push((base.as_ptr() as usize, len));
        publish(&mapped);
        drop(mapped);
        Ok(SharedMapping { base, len })
    }

    /// The address of byte `offset` (for `ptr()` and diagnostics; no access is made).
    #[inline]
    pub(crate) fn address(&self, offset: usize) -> *mut u8 {
        if offset > self.len {
            offset_outside(offset, self.len);
        }
        self.base.as_ptr().wrapping_add(offset)
    }

    /// The address of `len` bytes at `offset`, if they lie inside the mapping.
    #[cfg_attr(not(all(feature = "ucx", not(loom))), allow(dead_code))]
    pub(crate) fn range_address(&self, offset: usize, len: usize) -> Option<*mut u8> {
        let end = offset.checked_add(len)?;
        (end <= self.len).then(|| self.base.as_ptr().wrapping_add(offset))
    }

    #[inline]
    fn check(&self, offset: usize, len: usize) {
        if offset.checked_add(len).map_or(true, |end| end > self.len) {
            outside(offset, len, self.len);
        }
    }

    /// Copies `source` into the mapping at `offset`.
    #[inline]
    pub(crate) fn write(&self, offset: usize, source: &[u8]) {
        self.check(offset, source.len());
        // SAFETY: in bounds (checked); `source` is ordinary memory of this process and cannot
        // overlap the shared mapping's pages viewed as a slice (we never create such slices);
        // see the module contract for concurrent writers.
        unsafe { copy_small_inline(source.as_ptr(), self.address(offset), source.len()) }
    }

    /// Copies bytes at `offset` out of the mapping into `destination`.
    #[inline]
    pub(crate) fn read(&self, offset: usize, destination: &mut [u8]) {
        self.check(offset, destination.len());
        // SAFETY: in bounds (checked); see `write` and the module contract.
        unsafe {
            copy_small_inline(
                self.address(offset),
                destination.as_mut_ptr(),
                destination.len(),
            )
        }
    }

    /// Copies `source` into the mapping at `offset`: one raw copy, whatever memory the source
    /// is (private, this mapping — the ranges may overlap —, or another shared mapping).
    #[inline]
    pub(crate) fn write_from(&self, offset: usize, source: LocalSource<'_>) {
        self.check(offset, source.len());
        // SAFETY: in bounds (checked); the source is readable for its length (its invariant);
        // `copy` allows the ranges to overlap; raw copy of plain bytes (module contract).
        unsafe {
            copy_small_inline_overlapping(source.as_ptr(), self.address(offset), source.len())
        }
    }

    /// Copies bytes at `offset` out of the mapping into `target`: one raw copy, whatever
    /// memory the target is (the ranges may overlap).
    #[inline]
    pub(crate) fn read_into(&self, offset: usize, mut target: LocalTarget<'_>) {
        self.check(offset, target.len());
        let len = target.len();
        // SAFETY: in bounds (checked); the target is writable for its length (its invariant);
        // `copy` allows the ranges to overlap; raw copy of plain bytes (module contract).
        unsafe { copy_small_inline_overlapping(self.address(offset), target.as_mut_ptr(), len) }
    }

    /// Copies the elements of `source` (`strides.local_stride` apart) into the mapping from
    /// `offset` on (`strides.stride` apart), each with one raw copy.
    pub(crate) fn write_strided(&self, offset: usize, source: LocalSource<'_>, strides: Strides) {
        let (heap_span, local_span) = strides.spans();
        self.check(offset, heap_span);
        if local_span > source.len() {
            outside(0, local_span, source.len());
        }
        // SAFETY: both spans are in bounds (checked): every element is readable in the source
        // (its invariant) and writable in the mapping; element copies may overlap.
        unsafe {
            copy_strided(
                self.address(offset),
                source.as_ptr().cast_mut(),
                strides,
                false,
            );
        }
    }

    /// Copies elements from `offset` on of the mapping (`strides.stride` apart) into `target`
    /// (`strides.local_stride` apart), each with one raw copy.
    pub(crate) fn read_strided(
        &self,
        offset: usize,
        mut target: LocalTarget<'_>,
        strides: Strides,
    ) {
        let (heap_span, local_span) = strides.spans();
        self.check(offset, heap_span);
        if local_span > target.len() {
            outside(0, local_span, target.len());
        }
        // SAFETY: both spans are in bounds (checked): every element is readable in the mapping
        // and writable in the target (its invariant); element copies may overlap.
        unsafe { copy_strided(self.address(offset), target.as_mut_ptr(), strides, true) };
    }

    /// The `len` bytes at `offset` of the mapping as the source of a put, for as long as the
    /// mapping is borrowed.
    #[inline]
    pub(crate) fn source(&self, offset: usize, len: usize) -> LocalSource<'_> {
        self.check(offset, len);
        // SAFETY: in bounds (checked) of a mapping that stays mapped while borrowed; other
        // processes' writes are allowed by `LocalSource`'s contract.
        unsafe { LocalSource::from_raw(self.address(offset), len) }
    }

    /// The `len` bytes at `offset` of the mapping as the target of a get, for as long as the
    /// mapping is borrowed.
    #[inline]
    pub(crate) fn target(&self, offset: usize, len: usize) -> LocalTarget<'_> {
        self.check(offset, len);
        // SAFETY: in bounds (checked) of a mapping that stays mapped while borrowed and is never
        // viewed through a Rust reference (module contract); other processes' accesses are
        // allowed by `LocalTarget`'s contract.
        unsafe { LocalTarget::from_raw(self.address(offset), len) }
    }

    /// Copies `len` bytes at `offset` of this mapping to `target_offset` of `target` (a
    /// restart's old heap into its new one, with no staging copy; or, when `target` is this
    /// mapping, a move inside it: the ranges may overlap).
    pub(crate) fn copy_to(
        &self,
        offset: usize,
        target: &SharedMapping,
        target_offset: usize,
        len: usize,
    ) {
        self.check(offset, len);
        target.check(target_offset, len);
        // SAFETY: both ranges are in bounds (checked) of live mappings; `copy` allows them to
        // overlap (one mapping); raw copy per the module contract.
        unsafe {
            std::ptr::copy(self.address(offset), target.address(target_offset), len);
        }
    }

    /// Sets `offset..offset + len` to zero (memory no other process uses at the time: a
    /// segment's control words before a new lifetime's start-up, a heap's free space). Whole
    /// pages of a large range are given back to the kernel instead of written (`MADV_REMOVE`:
    /// the memfd's pages are freed and read as zero again; a page never touched costs nothing),
    /// the rest is written.
    pub(crate) fn zero(&self, offset: usize, len: usize) {
        self.check(offset, len);
        const PAGE: usize = 4096;
        let first = (offset + PAGE - 1) & !(PAGE - 1);
        let end = offset + len;
        let last = end & !(PAGE - 1);
        let removed = last > first
            && last - first >= 16 * PAGE
            // SAFETY: whole pages inside our own live mapping; MADV_REMOVE only replaces their
            // contents by zeros (what this method does), and no Rust reference covers them.
            && unsafe {
                rustix::mm::madvise(
                    self.address(first).cast(),
                    last - first,
                    rustix::mm::Advice::LinuxRemove,
                )
            }
            .is_ok();
        let written = if removed {
            [(offset, first - offset), (last, end - last)]
        } else {
            [(offset, len), (end, 0)]
        };
        for (start, bytes) in written {
            // SAFETY: in bounds (checked above: a part of the range); raw write per the
            // module contract.
            unsafe {
                std::ptr::write_bytes(self.address(start), 0, bytes);
            }
        }
    }

    /// Replaces the whole range by private zero pages (`MAP_FIXED` anonymous memory over it):
    /// the shared pages are no longer reached through this mapping, while every address of it
    /// stays valid (a stale view reads zeros instead of faulting). Best effort: should the
    /// kernel refuse, the range stays as it was.
    pub(crate) fn detach(&self) {
        // SAFETY: MAP_FIXED replaces exactly our own mapping's pages with fresh private ones of
        // the same protection; no Rust reference into them is invalidated (references made by
        // `words` stay valid for atomics on the new zero pages), and `Drop` unmaps the range.
        let _ = unsafe {
            mmap_anonymous(
                self.base.as_ptr().cast(),
                self.len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::PRIVATE | MapFlags::FIXED | MapFlags::NORESERVE,
            )
        };
    }

    /// Makes the pages of `offset..offset + len` present and writable now
    /// (`MADV_POPULATE_WRITE`: one call allocating them, instead of a fault per page on first
    /// write). Best effort: an error (an older kernel) leaves them to fault in as usual.
    pub(crate) fn populate_write(&self, offset: usize, len: usize) -> io::Result<()> {
        self.check(offset, len);
        // Rounded down to 64 KiB, a multiple of every page size in use (the mapping itself is
        // 2 MiB-aligned); at most that much before the range is populated too, which is harmless.
        const PAGE_MULTIPLE: usize = 64 << 10;
        let start = offset & !(PAGE_MULTIPLE - 1);
        let end = (offset + len).min(self.len);
        // SAFETY: madvise on whole pages inside our own live mapping; POPULATE_WRITE only
        // allocates (zeroed) pages that are not present yet and never changes their contents.
        unsafe {
            rustix::mm::madvise(
                self.address(start).cast(),
                end - start,
                rustix::mm::Advice::LinuxPopulateWrite,
            )
        }?;
        Ok(())
    }

    /// The shared words of type `W` at `offset`.
    #[inline]
    pub(crate) fn words<W: SharedWords>(&self, offset: usize) -> &W {
        self.check(offset, std::mem::size_of::<W>());
        let pointer = self.address(offset);
        if pointer as usize % std::mem::align_of::<W>() != 0 {
            misaligned(offset, std::any::type_name::<W>());
        }
        // SAFETY: in bounds and aligned (checked), valid for the mapping's lifetime which the
        // returned borrow cannot outlive; `W: SharedWords` is valid for any bit pattern and only
        // mutated atomically.
        unsafe { &*pointer.cast::<W>() }
    }
}

/// The panic of a range outside a mapping (a bug of the caller, which checks ranges first).
/// Out of line, with its values passed by value: a formatted `assert!` in the checks would
/// keep them in stack slots on every data-plane call.
#[cold]
#[inline(never)]
#[track_caller]
fn outside(offset: usize, len: usize, mapping_len: usize) -> ! {
    match offset.checked_add(len) {
        Some(end) => panic!("range {offset}..{end} outside a mapping of {mapping_len}"),
        None => panic!("range overflows"),
    }
}

/// The panic of an address outside a mapping (see [`outside`]).
#[cold]
#[inline(never)]
#[track_caller]
fn offset_outside(offset: usize, mapping_len: usize) -> ! {
    panic!("offset {offset} outside a mapping of {mapping_len}")
}

/// The panic of a misaligned shared word (see [`outside`]).
#[cold]
#[inline(never)]
#[track_caller]
fn misaligned(offset: usize, type_name: &str) -> ! {
    panic!("offset {offset} is not aligned for {type_name}")
}

/// `copy_nonoverlapping(source, destination, len)`, with the word sizes (4 and 8 bytes, the
/// common single-element put and get) copied by an inline move instead of a call to `memcpy`.
///
/// # Safety
///
/// As [`std::ptr::copy_nonoverlapping`].
#[inline(always)]
unsafe fn copy_small_inline(source: *const u8, destination: *mut u8, len: usize) {
    // SAFETY: the caller's contract; each arm copies exactly `len` bytes.
    unsafe {
        match len {
            8 => std::ptr::copy_nonoverlapping(source, destination, 8),
            4 => std::ptr::copy_nonoverlapping(source, destination, 4),
            _ => std::ptr::copy_nonoverlapping(source, destination, len),
        }
    }
}

/// `copy(source, destination, len)` (the ranges may overlap), with the word sizes copied by an
/// inline move instead of a call to `memmove`.
///
/// # Safety
///
/// As [`std::ptr::copy`].
#[inline(always)]
unsafe fn copy_small_inline_overlapping(source: *const u8, destination: *mut u8, len: usize) {
    // SAFETY: the caller's contract; each arm copies exactly `len` bytes.
    unsafe {
        match len {
            8 => std::ptr::copy(source, destination, 8),
            4 => std::ptr::copy(source, destination, 4),
            _ => std::ptr::copy(source, destination, len),
        }
    }
}

impl Drop for SharedMapping {
    fn drop(&mut self) {
        // Unregistered before the pages go: a concurrent check may at worst see a range that is
        // about to be unmapped (a conservative "yes"), never miss a mapped one.
        {
            let mut mapped = MAPPED.lock();
            let start = self.base.as_ptr() as usize;
            if let Some(index) = mapped.iter().position(|&entry| entry == (start, self.len)) {
                mapped.swap_remove(index);
                publish(&mapped);
            }
        }
        // SAFETY: we own this mapping; every borrow derived from it has ended (they borrow
        // `self`).
        unsafe {
            let _ = munmap(self.base.as_ptr().cast(), self.len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn memfd_mapping(len: usize) -> SharedMapping {
        let fd = rustix::fs::memfd_create("mapping-test", rustix::fs::MemfdFlags::CLOEXEC)
            .expect("memfd_create");
        rustix::fs::ftruncate(&fd, len as u64).expect("ftruncate");
        SharedMapping::map(&fd, len, 4096, 0).expect("map")
    }

    /// Every live mapping is seen, with fewer mappings than are published and with more (the
    /// locked fallback), and a dropped one is not seen any more.
    #[test]
    fn overlaps_see_every_live_mapping() {
        for count in [1, PUBLISHED_RANGES + 3] {
            let mappings: Vec<_> = (0..count).map(|_| memfd_mapping(8192)).collect();
            let ranges: Vec<_> = mappings
                .iter()
                .map(|m| (m.address(0) as usize, m.len))
                .collect();
            for &(start, len) in &ranges {
                assert!(overlaps_any(start, 1), "{count} mappings: the first byte");
                assert!(
                    overlaps_any(start + len - 1, 1),
                    "{count} mappings: the last byte"
                );
                assert!(
                    overlaps_any(start - 8, 9),
                    "{count} mappings: straddling the start"
                );
                assert!(!overlaps_any(start, 0), "{count} mappings: zero bytes");
            }
            drop(mappings);
            for &(start, len) in &ranges {
                // Another test's mapping may land there meanwhile; only ours are known gone.
                let reused = MAPPED
                    .lock()
                    .iter()
                    .any(|&(s, l)| start < s + l && s < start + len);
                assert!(
                    reused || !overlaps_any(start, len),
                    "{count} mappings: dropped"
                );
            }
        }
    }
}
