//! The data plane: put/get (and their non-blocking forms), quiet and fence, signals and
//! signal waits, atomics on 32/64-bit integers, and direct pointers to peers' copies.
//!
//! Every operation goes through the transport layer (`crate::transport`), which routes it per
//! peer: for a PE whose heap is mapped here it is a copy or an atomic instruction on the shared
//! mapping — no thread or syscall is involved unless a waiter must sleep.
//!
//! Fronts that address the heap by raw address (the OpenSHMEM C API) check a range once
//! ([`Shmem::locate_region`]) and keep the [`Located`] it returns (in a [`LocatedCache`]): the
//! `_located` entries ([`Shmem::put_located`], [`Shmem::get_located`],
//! [`Shmem::atomic_located`], which take it by reference: a front calls them right after
//! building it, and a by-value copy of a just-stored 32-byte value may stall store-to-load
//! forwarding) then only check that the runtime lifetime is the same and the
//! allocation still live, and go through the same transport calls as every other entry.

use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::allocation::{Element, Region, Symmetric};
use super::runtime::Shmem;
use crate::error::{Error, ErrorKind, Result};
use crate::sys::mapping::{LocalSource, LocalTarget, Strides};
use crate::transport::sync::{Deadline, WaitError, WaitPolicy};
use crate::transport::{Rmw, Width};

/// How a signal updates its word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SignalOp {
    /// Store the value.
    Set,
    /// Add the value (wrapping).
    Add,
}

/// How [`Shmem::wait_signal`] compares the word with the value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Comparison {
    /// word == value
    Eq,
    /// word != value
    Ne,
    /// word > value
    Gt,
    /// word >= value
    Ge,
    /// word < value
    Lt,
    /// word <= value
    Le,
}

impl Comparison {
    /// Whether `word` compares to `value` this way (`word == value` for [`Comparison::Eq`]).
    #[inline]
    pub fn holds<W: PartialOrd>(self, word: W, value: W) -> bool {
        match self {
            Comparison::Eq => word == value,
            Comparison::Ne => word != value,
            Comparison::Gt => word > value,
            Comparison::Ge => word >= value,
            Comparison::Lt => word < value,
            Comparison::Le => word <= value,
        }
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for u32 {}
    impl Sealed for i32 {}
    impl Sealed for u64 {}
    impl Sealed for i64 {}
}

/// 32- and 64-bit integers: the types of signal words and atomics.
pub trait AtomicWord: Element + PartialOrd + std::fmt::Debug + sealed::Sealed {
    /// The value's bits, zero-extended.
    fn to_bits(self) -> u64;
    /// The value of the low `size_of::<Self>()` bytes of `bits`.
    fn from_bits(bits: u64) -> Self;
}

macro_rules! atomic_words {
    ($($ty:ty => $unsigned:ty),*) => {$(
        impl AtomicWord for $ty {
            fn to_bits(self) -> u64 {
                self as $unsigned as u64
            }
            fn from_bits(bits: u64) -> Self {
                bits as $unsigned as $ty
            }
        }
    )*};
}
atomic_words!(u32 => u32, i32 => u32, u64 => u64, i64 => u64);

/// A byte range of one allocation that a checked call ([`Shmem::locate_region`]) found inside
/// its live allocation, in the runtime lifetime of the allocation's generation.
///
/// Only checked calls make one (and [`Located::part`], a sub-range of one), so the `_located`
/// entries need not look at the allocation's span again: allocation indices are never reused
/// within a lifetime, so while the generation is the runtime's and the allocation is live the
/// span is the one that was checked. They still check both (a generation compare and one
/// lock-free load): a `Located` kept past a free, a shutdown or a restart is refused with the
/// same error as a stale [`Region`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Located {
    region: Region,
}

impl Located {
    /// The range as a [`Region`] (for the checked entries).
    pub fn region(&self) -> Region {
        self.region
    }

    /// The `bytes` bytes at `offset` from this range's start, if they lie inside it.
    #[inline]
    pub fn part(&self, offset: u64, bytes: u64) -> Option<Located> {
        let end = offset.checked_add(bytes)?;
        (end <= self.region.bytes).then_some(Located {
            region: Region {
                id: self.region.id,
                heap_offset: self.region.heap_offset + offset,
                bytes,
            },
        })
    }
}

/// One [`Located`] and three words of the caller's (a key: e.g. the address range it covers
/// and the epoch of the caller's tables), readable and replaceable by any thread without a
/// lock: a sequence lock over atomic words (the version is odd while a thread rewrites them).
/// What [`LocatedCache::load`] returns is always a pair some thread stored, never a mix, so a
/// `Located` taken out of it was made by a checked call.
///
/// ```
/// use hyper_multicore::shmem::LocatedCache;
/// static LAST: LocatedCache = LocatedCache::new();
/// assert!(LAST.load().is_none(), "empty until a Located is stored");
/// ```
#[derive(Debug)]
pub struct LocatedCache {
    /// Even: the words are consistent (0: nothing stored yet); odd: a thread rewrites them.
    version: AtomicU64,
    /// The key, then the allocation index and generation, heap offset and length.
    words: [AtomicU64; 7],
}

impl Default for LocatedCache {
    fn default() -> Self {
        LocatedCache::new()
    }
}

impl LocatedCache {
    /// An empty cache.
    pub const fn new() -> LocatedCache {
        LocatedCache {
            version: AtomicU64::new(0),
            words: [const { AtomicU64::new(0) }; 7],
        }
    }

    /// The key and the `Located` stored last, if any and no thread is rewriting them.
    #[inline]
    pub fn load(&self) -> Option<([u64; 3], Located)> {
        let version = self.version.load(Ordering::Acquire);
        if version == 0 || version & 1 == 1 {
            return None;
        }
        let [a, b, c, index, generation, heap_offset, bytes] =
            std::array::from_fn(|i| self.words[i].load(Ordering::Relaxed));
        fence(Ordering::Acquire);
        if self.version.load(Ordering::Relaxed) != version {
            return None;
        }
        let region = Region {
            id: super::allocation::AllocationId { index, generation },
            heap_offset,
            bytes,
        };
        Some(([a, b, c], Located { region }))
    }

    /// The first two words of the key stored last, read without the sequence lock: possibly
    /// torn or stale, a hint for skipping an entry cheaply (then [`LocatedCache::load`] it).
    #[inline]
    pub fn key_hint(&self) -> [u64; 2] {
        [
            self.words[0].load(Ordering::Relaxed),
            self.words[1].load(Ordering::Relaxed),
        ]
    }

    /// Stores `located` under `key` (skipped while another thread rewrites the cache: the
    /// cache is a hint, a miss only costs a checked call).
    pub fn store(&self, key: [u64; 3], located: Located) {
        let version = self.version.load(Ordering::Relaxed);
        if version & 1 == 1
            || self
                .version
                .compare_exchange(version, version + 1, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        fence(Ordering::Release);
        let region = located.region;
        let words = [
            key[0],
            key[1],
            key[2],
            region.id.index,
            region.id.generation,
            region.heap_offset,
            region.bytes,
        ];
        for (word, value) in self.words.iter().zip(words) {
            word.store(value, Ordering::Relaxed);
        }
        self.version.store(version + 2, Ordering::Release);
    }
}

/// An atomic operation of [`Shmem::atomic_located`] on a word of type `W`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AtomicOp<W> {
    /// Read the word ([`Shmem::atomic_fetch`]).
    Fetch,
    /// Store the value ([`Shmem::atomic_set`]).
    Set(W),
    /// Store the value, return the previous one ([`Shmem::atomic_swap`]).
    Swap(W),
    /// Store `desired` if the word equals `expected` ([`Shmem::atomic_compare_swap`]).
    CompareSwap {
        /// The value the word must hold.
        expected: W,
        /// The value stored then.
        desired: W,
    },
    /// Add the value, wrapping ([`Shmem::atomic_fetch_add`]).
    FetchAdd(W),
    /// Add the value, wrapping, without reading the previous one ([`Shmem::atomic_add`]).
    Add(W),
}

impl<W: AtomicWord> AtomicOp<W> {
    /// The operation's name in errors (that of its checked entry).
    pub fn name(&self) -> &'static str {
        match self {
            AtomicOp::Fetch => "atomic_fetch",
            AtomicOp::Set(_) => "atomic_set",
            AtomicOp::Swap(_) => "atomic_swap",
            AtomicOp::CompareSwap { .. } => "atomic_compare_swap",
            AtomicOp::FetchAdd(_) => "atomic_fetch_add",
            AtomicOp::Add(_) => "atomic_add",
        }
    }

    /// The transport's read-modify-write.
    fn rmw(self) -> Rmw {
        match self {
            AtomicOp::Fetch => Rmw::Load,
            AtomicOp::Set(value) => Rmw::Store(value.to_bits()),
            AtomicOp::Swap(value) => Rmw::Swap(value.to_bits()),
            AtomicOp::CompareSwap { expected, desired } => Rmw::CompareSwap {
                expected: expected.to_bits(),
                desired: desired.to_bits(),
            },
            AtomicOp::FetchAdd(value) | AtomicOp::Add(value) => Rmw::Add(value.to_bits()),
        }
    }
}

impl Shmem {
    /// True if `region` on PE `pe` passes every check of [`Shmem::locate`]: of this runtime
    /// lifetime, its allocation live, the range inside it, `pe` a PE of the root. Branches and
    /// loads only: the fast entries test this first and build no error on the way (nothing to
    /// spill before the data operation); a failure is worked out again by the checked entry.
    #[inline(always)]
    fn in_place(&self, region: &Region, pe: usize) -> bool {
        pe < self.size
            && region.id.generation == self.segment.generation()
            && self.live.contains(*region)
    }

    /// The offset of `region` in PE `pe`'s heap, after checking both.
    #[inline(always)]
    fn locate(&self, operation: &str, region: Region, pe: usize) -> Result<usize> {
        if self.in_place(&region, pe) {
            return Ok(region.heap_offset as usize);
        }
        self.refused(|| self.locate_checked(operation, region, pe))
    }

    /// [`Shmem::locate`] that names the failed check.
    fn locate_checked(&self, operation: &str, region: Region, pe: usize) -> Result<usize> {
        self.check_region(operation, region)?;
        if pe >= self.size {
            return Err(self.error(
                ErrorKind::InvalidArgument,
                operation,
                format!("PE {pe} is out of range for a root of {} PEs", self.size),
            ));
        }
        Ok(region.heap_offset as usize)
    }

    /// [`Shmem::locate`] of a region that a local buffer of `local_bytes` is copied to or from
    /// (the lengths must match).
    #[inline(always)]
    fn locate_bytes(
        &self,
        operation: &str,
        region: Region,
        local_bytes: usize,
        pe: usize,
    ) -> Result<usize> {
        if region.bytes == local_bytes as u64 && self.in_place(&region, pe) {
            return Ok(region.heap_offset as usize);
        }
        self.refused(|| {
            if region.bytes as usize == local_bytes {
                return self.locate_checked(operation, region, pe);
            }
            Err(self.error(
                ErrorKind::InvalidArgument,
                operation,
                format!(
                    "byte-count mismatch: the local buffer has {local_bytes} bytes, the \
                     symmetric target {}; pass a view of the same length",
                    region.bytes
                ),
            ))
        })
    }

    /// Checks `region` once for the `_located` entries: of this runtime lifetime, its
    /// allocation live, the range inside it (the check every data-plane call makes).
    pub fn locate_region(&self, operation: &str, region: Region) -> Result<Located> {
        self.check_region(operation, region)?;
        Ok(Located { region })
    }

    /// True if `at` may still be used on PE `pe` for `bytes` bytes: the runtime lifetime is
    /// the one it was located in, its allocation is still live, `pe` is a PE of the root and
    /// the lengths match. Its span is not looked at again (see [`Located`]).
    #[inline]
    fn still_located(&self, at: &Located, bytes: usize, pe: usize) -> bool {
        at.region.id.generation == self.segment.generation()
            && self.live.is_live(at.region.id.index)
            && pe < self.size
            && at.region.bytes == bytes as u64
    }

    /// The heap offset of the one-`W` word `at` (located before) on PE `pe`: checked as
    /// [`Shmem::still_located`] does, plus its alignment; else the checked entry's error.
    #[inline(always)]
    pub(crate) fn located_word<W: AtomicWord>(
        &self,
        operation: &str,
        at: &Located,
        pe: usize,
    ) -> Result<usize> {
        let width = std::mem::size_of::<W>();
        if self.still_located(at, width, pe) && at.region.heap_offset % width as u64 == 0 {
            return Ok(at.region.heap_offset as usize);
        }
        self.refused(|| self.word_checked::<W>(operation, at.region, pe))
    }

    /// Why a fast check ([`Shmem::in_place`], [`Shmem::still_located`]) failed: the checked
    /// entry's own check (`check`), which names the cause. Cold and out of line, so the fast
    /// entries keep their error paths off the hot path.
    #[cold]
    #[inline(never)]
    fn refused<R>(&self, check: impl FnOnce() -> Result<R>) -> Result<R> {
        check()
    }

    /// [`Shmem::put_bytes`] into a range located before (see [`Located`]).
    #[inline(always)]
    pub fn put_located(&self, target: &Located, source: &[u8], pe: usize) -> Result<()> {
        self.put_located_from(target, source.into(), pe)
    }

    /// [`Shmem::get_bytes`] out of a range located before (see [`Located`]).
    #[inline(always)]
    pub fn get_located(&self, target: &mut [u8], source: &Located, pe: usize) -> Result<()> {
        self.get_located_into(target.into(), source, pe)
    }

    /// [`Shmem::put_located`] of a [`LocalSource`]: the bytes are read in place, whatever
    /// memory they lie in — private, this PE's heap, a C program's symmetric data — and move
    /// once (one raw copy into the target's mapping on the shared-memory route; UCX reads them
    /// itself on the other). Source and target may overlap (a put to this PE): the target then
    /// holds what the source held before the call.
    #[inline(always)]
    pub fn put_located_from(
        &self,
        target: &Located,
        source: LocalSource<'_>,
        pe: usize,
    ) -> Result<()> {
        let offset = self.located_bytes("put", target, source.len(), pe)?;
        self.transport.put(pe, offset, source)
    }

    /// [`Shmem::get_located`] into a [`LocalTarget`]: the bytes are written in place, whatever
    /// memory it is, and move once (see [`Shmem::put_located_from`]).
    #[inline(always)]
    pub fn get_located_into(
        &self,
        target: LocalTarget<'_>,
        source: &Located,
        pe: usize,
    ) -> Result<()> {
        let offset = self.located_bytes("get", source, target.len(), pe)?;
        self.transport.get(pe, offset, target)
    }

    /// [`Shmem::put_located_from`] that may complete only at the next [`Shmem::quiet`].
    #[inline]
    pub fn put_located_from_nbi(
        &self,
        target: &Located,
        source: LocalSource<'_>,
        pe: usize,
    ) -> Result<()> {
        let offset = self.located_bytes("put_nbi", target, source.len(), pe)?;
        self.transport.put_nbi(pe, offset, source)
    }

    /// [`Shmem::get_located_into`] whose target is valid after the next [`Shmem::quiet`] (it is
    /// complete on return today).
    #[inline]
    pub fn get_located_into_nbi(
        &self,
        target: LocalTarget<'_>,
        source: &Located,
        pe: usize,
    ) -> Result<()> {
        let offset = self.located_bytes("get_nbi", source, target.len(), pe)?;
        self.transport.get_nbi(pe, offset, target)
    }

    /// A strided put into a range located before: `strides.count` elements of `strides.size`
    /// bytes, `strides.local_stride` bytes apart in `source`, to `strides.stride` bytes apart
    /// in PE `pe`'s copy of `target` (which must span exactly from the first element's start to
    /// the last one's end). Each element moves once: on the shared-memory route one raw copy
    /// per element in one call, with one check of the whole range.
    pub fn put_located_strided(
        &self,
        target: &Located,
        source: LocalSource<'_>,
        strides: Strides,
        pe: usize,
    ) -> Result<()> {
        let span = self.strided_span("iput", &strides, source.len())?;
        let offset = self.located_bytes("iput", target, span, pe)?;
        self.transport.put_strided(pe, offset, source, strides)
    }

    /// A strided get out of a range located before, the other way round of
    /// [`Shmem::put_located_strided`]: elements `strides.stride` bytes apart in PE `pe`'s copy
    /// of `source` to `strides.local_stride` apart in `target`.
    pub fn get_located_strided(
        &self,
        target: LocalTarget<'_>,
        source: &Located,
        strides: Strides,
        pe: usize,
    ) -> Result<()> {
        let span = self.strided_span("iget", &strides, target.len())?;
        let offset = self.located_bytes("iget", source, span, pe)?;
        self.transport.get_strided(pe, offset, target, strides)
    }

    /// The symmetric side's span of `strides`, after checking that the local side's fits in
    /// `local_bytes`.
    fn strided_span(
        &self,
        operation: &str,
        strides: &Strides,
        local_bytes: usize,
    ) -> Result<usize> {
        let span = |stride| Strides::span(strides.count, stride, strides.size);
        match (span(strides.stride), span(strides.local_stride)) {
            (Some(symmetric), Some(local)) if local <= local_bytes => Ok(symmetric),
            (Some(_), Some(local)) => Err(self.error(
                ErrorKind::InvalidArgument,
                operation,
                format!(
                    "the local buffer has {local_bytes} bytes but {} elements of {} bytes, {} \
                     apart, span {local}",
                    strides.count, strides.size, strides.local_stride
                ),
            )),
            _ => Err(self.error(
                ErrorKind::InvalidArgument,
                operation,
                format!(
                    "{} elements of {} bytes overflow",
                    strides.count, strides.size
                ),
            )),
        }
    }

    /// The heap offset of `at` (located before) for `bytes` bytes on PE `pe`: checked as
    /// [`Shmem::still_located`] does, else the checked entry's error.
    #[inline(always)]
    fn located_bytes(
        &self,
        operation: &str,
        at: &Located,
        bytes: usize,
        pe: usize,
    ) -> Result<usize> {
        match self.still_located(at, bytes, pe) {
            true => Ok(at.region.heap_offset as usize),
            false => self.refused(|| self.locate_bytes(operation, at.region, bytes, pe)),
        }
    }

    /// The atomic `op` on PE `pe`'s copy of the one-`W` word `target`, located before (see
    /// [`Located`]); returns the previous value (the value read, for [`AtomicOp::Fetch`]).
    #[inline(always)]
    pub fn atomic_located<W: AtomicWord>(
        &self,
        target: &Located,
        op: AtomicOp<W>,
        pe: usize,
    ) -> Result<W> {
        let width = Width::of_bytes(std::mem::size_of::<W>());
        let offset = self.located_word::<W>(op.name(), target, pe)?;
        match op {
            AtomicOp::Set(value) => self.update_at(pe, offset, width, false, value),
            AtomicOp::Add(value) => self.update_at(pe, offset, width, true, value),
            _ => self.rmw_at(pe, offset, width, op.rmw()),
        }
    }

    /// The byte range `offset..offset + bytes` of live allocation `id` (fails if the allocation
    /// was freed, belongs to another lifetime, or the range is past its end). Fronts that track
    /// allocations by id (Python) address the data plane with it.
    pub fn region(
        &self,
        id: super::allocation::AllocationId,
        offset: u64,
        bytes: u64,
    ) -> Result<Region> {
        let record = self.resolve(id)?;
        let end = offset.checked_add(bytes).filter(|&end| end <= record.bytes);
        if end.is_none() {
            return Err(self.error(
                ErrorKind::InvalidArgument,
                "view",
                format!(
                    "bytes {offset}..{} are past the end of allocation {} ({} bytes)",
                    offset.saturating_add(bytes),
                    id.index,
                    record.bytes
                ),
            ));
        }
        Ok(Region {
            id,
            heap_offset: record.offset + offset,
            bytes,
        })
    }

    /// [`Shmem::put`] of raw bytes into a [`Region`].
    pub fn put_bytes(&self, target: Region, source: &[u8], pe: usize) -> Result<()> {
        let offset = self.locate_bytes("put", target, source.len(), pe)?;
        self.transport.put(pe, offset, source.into())
    }

    /// [`Shmem::get`] of raw bytes out of a [`Region`].
    pub fn get_bytes(&self, target: &mut [u8], source: Region, pe: usize) -> Result<()> {
        let offset = self.locate_bytes("get", source, target.len(), pe)?;
        self.transport.get(pe, offset, target.into())
    }

    /// Copies `source` into PE `pe`'s copy of `target` (lengths must match).
    pub fn put<T: Element>(
        &self,
        target: &impl Symmetric<T>,
        source: &[T],
        pe: usize,
    ) -> Result<()> {
        self.put_bytes(target.region(), bytemuck::cast_slice(source), pe)
    }

    /// Copies PE `pe`'s copy of `source` into `target` (lengths must match).
    pub fn get<T: Element>(
        &self,
        target: &mut [T],
        source: &impl Symmetric<T>,
        pe: usize,
    ) -> Result<()> {
        self.get_bytes(bytemuck::cast_slice_mut(target), source.region(), pe)
    }

    /// Non-blocking put: may return before the data is visible; [`Shmem::quiet`] completes it.
    pub fn put_nbi<T: Element>(
        &self,
        target: &impl Symmetric<T>,
        source: &[T],
        pe: usize,
    ) -> Result<()> {
        let region = target.region();
        let bytes: &[u8] = bytemuck::cast_slice(source);
        let offset = self.locate_bytes("put_nbi", region, bytes.len(), pe)?;
        self.transport.put_nbi(pe, offset, bytes.into())
    }

    /// Non-blocking get: `target` is only valid after [`Shmem::quiet`].
    pub fn get_nbi<T: Element>(
        &self,
        target: &mut [T],
        source: &impl Symmetric<T>,
        pe: usize,
    ) -> Result<()> {
        let region = source.region();
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(target);
        let offset = self.locate_bytes("get_nbi", region, bytes.len(), pe)?;
        self.transport.get_nbi(pe, offset, bytes.into())
    }

    /// Copies this PE's own copy of `source` into PE `pe`'s copy of `target` (lengths must
    /// match): heap to heap with no slice in between. The bytes move once — one raw copy from
    /// this PE's heap into the target's on the shared-memory route; UCX reads this PE's heap in
    /// place on the other. The two may overlap (a put to this PE): the target then holds what
    /// the source held before the call.
    ///
    /// ```no_run
    /// # fn demo(shmem: &hyper_multicore::shmem::Shmem) -> hyper_multicore::Result<()> {
    /// let staging = shmem.allocate::<f32>(1024, None)?;
    /// let inbox = shmem.allocate::<f32>(1024, None)?;
    /// shmem.put_from(&inbox, &staging, (shmem.rank() + 1) % shmem.size())?;
    /// # Ok(()) }
    /// ```
    pub fn put_from<T: Element>(
        &self,
        target: &impl Symmetric<T>,
        source: &impl Symmetric<T>,
        pe: usize,
    ) -> Result<()> {
        let (offset, local) = self.heap_pair("put_from", target.region(), source.region(), pe)?;
        let len = source.region().bytes as usize;
        self.transport
            .put(pe, offset, self.transport.own_source(local, len))
    }

    /// [`Shmem::put_from`] that may complete only at the next [`Shmem::quiet`].
    pub fn put_from_nbi<T: Element>(
        &self,
        target: &impl Symmetric<T>,
        source: &impl Symmetric<T>,
        pe: usize,
    ) -> Result<()> {
        let (offset, local) =
            self.heap_pair("put_from_nbi", target.region(), source.region(), pe)?;
        let len = source.region().bytes as usize;
        self.transport
            .put_nbi(pe, offset, self.transport.own_source(local, len))
    }

    /// Copies PE `pe`'s copy of `source` into this PE's own copy of `target` (lengths must
    /// match): heap to heap, the bytes moving once (see [`Shmem::put_from`]). The two may
    /// overlap (a get from this PE).
    pub fn get_into<T: Element>(
        &self,
        target: &impl Symmetric<T>,
        source: &impl Symmetric<T>,
        pe: usize,
    ) -> Result<()> {
        let (offset, local) = self.heap_pair("get_into", source.region(), target.region(), pe)?;
        let len = target.region().bytes as usize;
        self.transport
            .get(pe, offset, self.transport.own_target(local, len))
    }

    /// [`Shmem::get_into`] whose target is valid after the next [`Shmem::quiet`].
    pub fn get_into_nbi<T: Element>(
        &self,
        target: &impl Symmetric<T>,
        source: &impl Symmetric<T>,
        pe: usize,
    ) -> Result<()> {
        let (offset, local) =
            self.heap_pair("get_into_nbi", source.region(), target.region(), pe)?;
        let len = target.region().bytes as usize;
        self.transport
            .get_nbi(pe, offset, self.transport.own_target(local, len))
    }

    /// Puts this PE's own copy of `source` into PE `pe`'s `target` ([`Shmem::put_from`]), then
    /// signals: a waiter that sees the signal sees the data.
    pub fn put_signal_from<T: Element, W: AtomicWord>(
        &self,
        target: &impl Symmetric<T>,
        source: &impl Symmetric<T>,
        signal: &impl Symmetric<W>,
        value: W,
        op: SignalOp,
        pe: usize,
    ) -> Result<()> {
        self.put_from(target, source, pe)?;
        self.signal(signal, value, op, pe)
    }

    /// The heap offsets of a heap-to-heap transfer's `remote` range on PE `pe` and `local`
    /// range on this PE, after checking both (and that their lengths match).
    #[inline]
    fn heap_pair(
        &self,
        operation: &str,
        remote: Region,
        local: Region,
        pe: usize,
    ) -> Result<(usize, usize)> {
        let len = local.bytes as usize;
        let remote = self.locate_bytes(operation, remote, len, pe)?;
        let local = self.locate_bytes(operation, local, len, self.rank)?;
        Ok((remote, local))
    }

    /// Completes every outstanding operation of this PE (puts visible to everyone). A transport
    /// failure (a lost peer) surfaces at the next operation or wait; [`Shmem::try_quiet`]
    /// reports it here.
    pub fn quiet(&self) {
        let _ = self.transport.quiet();
    }

    /// [`Shmem::quiet`] that reports a transport failure (a peer lost with operations to it
    /// outstanding).
    pub fn try_quiet(&self) -> Result<()> {
        self.transport.quiet().map_err(|e| e.on_rank(self.rank))
    }

    /// Orders this PE's earlier puts before its later ones, per target PE.
    pub fn fence(&self) {
        let _ = self.transport.fence();
    }

    /// [`Shmem::word_offset`] that names the failed check: `target` must be exactly one
    /// naturally aligned `W`, then as [`Shmem::locate_checked`].
    fn word_checked<W: AtomicWord>(
        &self,
        operation: &str,
        target: Region,
        pe: usize,
    ) -> Result<usize> {
        let width = std::mem::size_of::<W>();
        if target.bytes as usize != width {
            return Err(self.error(
                ErrorKind::InvalidArgument,
                operation,
                format!(
                    "the target must be exactly one {width}-byte word, got {} bytes; pass a \
                     one-element view",
                    target.bytes
                ),
            ));
        }
        if target.heap_offset % width as u64 != 0 {
            return Err(self.error(
                ErrorKind::InvalidArgument,
                operation,
                format!(
                    "the {width}-byte word at heap offset {} is not naturally aligned (its \
                     address must be a multiple of {width}); pass an aligned word",
                    target.heap_offset
                ),
            ));
        }
        self.locate_checked(operation, target, pe)
    }

    /// Performs `rmw` on the one-element `target` at PE `pe`; returns the previous value.
    #[inline(always)]
    fn rmw<W: AtomicWord>(
        &self,
        operation: &str,
        target: Region,
        pe: usize,
        rmw: Rmw,
    ) -> Result<W> {
        let offset = self.word_offset::<W>(operation, &target, pe)?;
        self.rmw_at(pe, offset, Width::of_bytes(std::mem::size_of::<W>()), rmw)
    }

    /// The heap offset of the one-`W` word `target` on PE `pe`: exactly one naturally aligned
    /// `W`, and [`Shmem::in_place`]; else [`Shmem::word_checked`]'s error.
    #[inline(always)]
    fn word_offset<W: AtomicWord>(
        &self,
        operation: &str,
        target: &Region,
        pe: usize,
    ) -> Result<usize> {
        let width = std::mem::size_of::<W>() as u64;
        if target.bytes == width && target.heap_offset % width == 0 && self.in_place(target, pe) {
            return Ok(target.heap_offset as usize);
        }
        let target = *target;
        self.refused(move || self.word_checked::<W>(operation, target, pe))
    }

    /// The transport's `rmw` on the word at heap offset `offset` of PE `pe` (located and
    /// checked by the caller).
    #[inline(always)]
    fn rmw_at<W: AtomicWord>(&self, pe: usize, offset: usize, width: Width, rmw: Rmw) -> Result<W> {
        let previous = self.transport.atomic(pe, offset, width, rmw)?;
        Ok(W::from_bits(previous))
    }

    /// The transport's update (a store, or an add with `add`) of the word at heap offset
    /// `offset` of PE `pe`, which reads nothing back: complete at the next quiet, like a put.
    /// Returns zero, the value [`Shmem::atomic_located`] gives for [`AtomicOp::Set`] and
    /// [`AtomicOp::Add`].
    #[inline(always)]
    fn update_at<W: AtomicWord>(
        &self,
        pe: usize,
        offset: usize,
        width: Width,
        add: bool,
        value: W,
    ) -> Result<W> {
        self.transport
            .update(pe, offset, width, add, value.to_bits())?;
        Ok(W::from_bits(0))
    }

    /// Atomically reads PE `pe`'s copy of the one-element `source`.
    #[inline]
    pub fn atomic_fetch<W: AtomicWord>(&self, source: &impl Symmetric<W>, pe: usize) -> Result<W> {
        self.rmw("atomic_fetch", source.region(), pe, Rmw::Load)
    }

    /// Atomically stores `value` into PE `pe`'s copy of `target` (complete at the next quiet).
    #[inline]
    pub fn atomic_set<W: AtomicWord>(
        &self,
        target: &impl Symmetric<W>,
        value: W,
        pe: usize,
    ) -> Result<()> {
        let offset = self.word_offset::<W>("atomic_set", &target.region(), pe)?;
        let width = Width::of_bytes(std::mem::size_of::<W>());
        self.update_at(pe, offset, width, false, value).map(drop)
    }

    /// Atomically replaces PE `pe`'s copy of `target` with `value`; returns the previous value.
    #[inline]
    pub fn atomic_swap<W: AtomicWord>(
        &self,
        target: &impl Symmetric<W>,
        value: W,
        pe: usize,
    ) -> Result<W> {
        self.rmw(
            "atomic_swap",
            target.region(),
            pe,
            Rmw::Swap(value.to_bits()),
        )
    }

    /// Atomically sets PE `pe`'s copy of `target` to `desired` if it equals `expected`; returns
    /// the previous value (equal to `expected` on success).
    #[inline]
    pub fn atomic_compare_swap<W: AtomicWord>(
        &self,
        target: &impl Symmetric<W>,
        expected: W,
        desired: W,
        pe: usize,
    ) -> Result<W> {
        let rmw = Rmw::CompareSwap {
            expected: expected.to_bits(),
            desired: desired.to_bits(),
        };
        self.rmw("atomic_compare_swap", target.region(), pe, rmw)
    }

    /// Atomically adds `value` (wrapping) to PE `pe`'s copy of `target`; returns the previous value.
    #[inline]
    pub fn atomic_fetch_add<W: AtomicWord>(
        &self,
        target: &impl Symmetric<W>,
        value: W,
        pe: usize,
    ) -> Result<W> {
        self.rmw(
            "atomic_fetch_add",
            target.region(),
            pe,
            Rmw::Add(value.to_bits()),
        )
    }

    /// Atomically adds `value` (wrapping) to PE `pe`'s copy of `target` (complete at the next
    /// quiet).
    #[inline]
    pub fn atomic_add<W: AtomicWord>(
        &self,
        target: &impl Symmetric<W>,
        value: W,
        pe: usize,
    ) -> Result<()> {
        let offset = self.word_offset::<W>("atomic_add", &target.region(), pe)?;
        let width = Width::of_bytes(std::mem::size_of::<W>());
        self.update_at(pe, offset, width, true, value).map(drop)
    }

    /// Updates PE `pe`'s copy of the one-element signal word `signal` (set or add) and wakes
    /// its waiters.
    pub fn signal<W: AtomicWord>(
        &self,
        signal: &impl Symmetric<W>,
        value: W,
        op: SignalOp,
        pe: usize,
    ) -> Result<()> {
        let offset = self.word_offset::<W>("signal", &signal.region(), pe)?;
        self.signal_at(pe, offset, value, op)
    }

    /// Sets or adds `value` to the word of `W` at `offset` (checked) of PE `pe`'s heap.
    #[inline]
    fn signal_at<W: AtomicWord>(
        &self,
        pe: usize,
        offset: usize,
        value: W,
        op: SignalOp,
    ) -> Result<()> {
        let width = Width::of_bytes(std::mem::size_of::<W>());
        self.transport
            .signal(pe, offset, width, op == SignalOp::Add, value.to_bits())
    }

    /// [`Shmem::signal`] on a word located before (see [`Located`]).
    #[inline(always)]
    pub fn signal_located<W: AtomicWord>(
        &self,
        signal: &Located,
        value: W,
        op: SignalOp,
        pe: usize,
    ) -> Result<()> {
        let offset = self.located_word::<W>("signal", signal, pe)?;
        self.signal_at(pe, offset, value, op)
    }

    /// Puts `source` into PE `pe`'s `target`, then signals: a waiter that sees the signal sees
    /// the data.
    pub fn put_signal<T: Element, W: AtomicWord>(
        &self,
        target: &impl Symmetric<T>,
        source: &[T],
        signal: &impl Symmetric<W>,
        value: W,
        op: SignalOp,
        pe: usize,
    ) -> Result<()> {
        self.put(target, source, pe)?;
        self.signal(signal, value, op, pe)
    }

    /// Waits until this PE's copy of `signal` compares `comparison` to `value`; returns the
    /// word's value then. `timeout` defaults to the configured timeout; a lost peer ends the
    /// wait with a peer-lost error.
    pub fn wait_signal<W: AtomicWord>(
        &self,
        signal: &impl Symmetric<W>,
        value: W,
        comparison: Comparison,
        timeout: Option<Duration>,
    ) -> Result<W> {
        let timeout = timeout.unwrap_or(self.config.timeout);
        let deadline = Deadline::After(timeout);
        self.wait_for_signal("wait_signal", signal.region(), value, comparison, deadline)
    }

    /// [`Shmem::wait_signal`] with a deadline.
    pub fn wait_signal_deadline<W: AtomicWord>(
        &self,
        signal: &impl Symmetric<W>,
        value: W,
        comparison: Comparison,
        deadline: Instant,
    ) -> Result<W> {
        let deadline = Deadline::At(deadline);
        self.wait_for_signal("wait_signal", signal.region(), value, comparison, deadline)
    }

    /// The wait on this PE's copy of the word `region` (`operation` names it in errors).
    fn wait_for_signal<W: AtomicWord>(
        &self,
        operation: &str,
        region: Region,
        value: W,
        comparison: Comparison,
        deadline: Deadline,
    ) -> Result<W> {
        let offset = self.word_offset::<W>(operation, &region, self.rank)?;
        self.wait_own_word(operation, offset, value, comparison, deadline)
    }

    /// Waits until the word of `W` at `offset` of this PE's own heap (checked) compares
    /// `comparison` to `value`; returns its value then. The clock is not read unless the wait
    /// outlasts its spin phase (see [`Deadline::After`]), and nothing is formatted unless the
    /// wait fails.
    #[inline]
    pub(crate) fn wait_own_word<W: AtomicWord>(
        &self,
        operation: &str,
        offset: usize,
        value: W,
        comparison: Comparison,
        deadline: Deadline,
    ) -> Result<W> {
        // The word is located once, not on every look of the wait. It is in this PE's own
        // heap, which every transport keeps mapped here.
        let transport = &self.transport;
        let narrow = (std::mem::size_of::<W>() == 4).then(|| transport.own_word32(offset));
        let wide = (std::mem::size_of::<W>() == 8).then(|| transport.own_word64(offset));
        let load = || -> W {
            match (narrow, wide) {
                (Some(word), _) => W::from_bits(u64::from(word.load(Ordering::SeqCst))),
                (_, Some(word)) => W::from_bits(word.load(Ordering::SeqCst)),
                (None, None) => unreachable!("atomic words are 4 or 8 bytes"),
            }
        };
        let mut seen = load();
        if comparison.holds(seen, value) {
            return Ok(seen);
        }
        let policy = WaitPolicy {
            spin: self.spin,
            deadline,
        };
        let look = || {
            seen = load();
            comparison.holds(seen, value)
        };
        let outcome = transport.wait_own(look, &policy);
        self.wait_outcome(operation, outcome, || {
            format!("the word is {seen:?}, waiting for {comparison:?} {value:?}")
        })?;
        Ok(seen)
    }

    /// Turns a wait's outcome into this crate's errors.
    pub(crate) fn wait_outcome(
        &self,
        operation: &str,
        outcome: std::result::Result<(), WaitError>,
        waiting_for: impl FnOnce() -> String,
    ) -> Result<()> {
        match outcome {
            Ok(()) => Ok(()),
            Err(WaitError::Timeout { waited }) => {
                Err(Error::timeout(operation, waited, &waiting_for()).on_rank(self.rank))
            }
            Err(WaitError::Aborted { lost_rank }) => {
                // The control plane's own report is the most precise; the shared abort word may
                // have arrived first (another PE's router set it): the report follows within
                // moments (root rank 0's abort, or this PE's own liveness verdict).
                let grace = crate::control::VERDICT_GRACE;
                let error = match self.plane.broken_within(grace) {
                    Some(cause) => {
                        let error = Error::new(cause.kind(), operation, cause.message());
                        match cause.peer() {
                            Some(peer) => error.with_peer(peer),
                            None => error,
                        }
                    }
                    None if (lost_rank as usize) < self.size => Error::peer_lost(
                        operation,
                        lost_rank as usize,
                        "another PE of the root saw its connection close: the process exited or \
                         was killed",
                    ),
                    None => Error::new(
                        ErrorKind::PeerLost,
                        operation,
                        "the root's control plane broke; the root cannot continue",
                    ),
                };
                Err(error.on_rank(self.rank))
            }
        }
    }

    /// A direct pointer to PE `pe`'s copy of `target`, where that copy is mapped in this
    /// process (PEs sharing this host's segment); other PEs are refused with an error.
    ///
    /// Reading or writing through it is `unsafe`: other processes may change the memory at any
    /// time, so never turn it into a reference; the pointer is valid until this runtime is shut
    /// down or dropped.
    pub fn ptr<T: Element>(&self, target: &impl Symmetric<T>, pe: usize) -> Result<NonNull<T>> {
        let offset = self.locate("ptr", target.region(), pe)?;
        match self.transport.local_ptr(pe, offset) {
            Some(pointer) => Ok(pointer.cast()),
            None => Err(self.error(
                ErrorKind::InvalidArgument,
                "ptr",
                format!(
                    "PE {pe}'s heap is not mapped in this process (it is reached through {}); \
                     use put/get/atomics for it, or ptr only for PEs on this host",
                    self.transport.route_name(pe)
                ),
            )),
        }
    }
}
