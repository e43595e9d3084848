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

use super::allocation::{Element, Region, Symmetric};
use super::runtime::Shmem;
use crate::error::{ErrorKind, Result};
use crate::sys::mapping::{LocalSource, LocalTarget, Strides};
use crate::transport::{Rmw, SignalOp, Width};

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
    pub(super) fn in_place(&self, region: &Region, pe: usize) -> bool {
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
    pub(super) fn locate_checked(
        &self,
        operation: &str,
        region: Region,
        pe: usize,
    ) -> Result<usize> {
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
    pub(super) fn refused<R>(&self, check: impl FnOnce() -> Result<R>) -> Result<R> {
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
            AtomicOp::Set(value) => self.update_at(pe, offset, width, SignalOp::Set, value),
            AtomicOp::Add(value) => self.update_at(pe, offset, width, SignalOp::Add, value),
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
