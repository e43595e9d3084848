//! Private anonymous memory viewed only as atomic words, whose whole pages can be handed back to
//! the kernel while other threads may still read them ([`ZeroPages::discard`]: they read zeros
//! from then on, and a later write gets a fresh zero page).
//!
//! # Safety contract (stated once, relied on by every method)
//!
//! A [`ZeroPages`] covers `len` bytes of a `MAP_PRIVATE | MAP_ANONYMOUS` mapping that stays
//! mapped until the value is dropped. The memory is only ever viewed as atomic words
//! ([`SharedWords`]: valid for every bit pattern, zeros included), never as `&[u8]`, so a page
//! discarded under a reader changes the values it loads, never their validity.

use std::io;
use std::ptr::NonNull;

use rustix::mm::{madvise, mmap_anonymous, munmap, Advice, MapFlags, ProtFlags};

use super::mapping::SharedWords;

/// The system's page size: what [`ZeroPages::discard`] hands back whole.
pub(crate) fn page_size() -> usize {
    rustix::param::page_size()
}

/// An anonymous private mapping of zero-filled pages (see the module docs).
#[derive(Debug)]
pub(crate) struct ZeroPages {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: the pages belong to this process; every access is atomic (module contract), so the
// handle may move and be shared between threads.
unsafe impl Send for ZeroPages {}
// SAFETY: as above.
unsafe impl Sync for ZeroPages {}

impl ZeroPages {
    /// Maps `len` bytes (rounded up to whole pages) of zero pages, without reserving swap for
    /// them (`MAP_NORESERVE`: untouched pages cost nothing).
    pub(crate) fn map(len: usize) -> io::Result<ZeroPages> {
        let len = len.max(1).next_multiple_of(page_size());
        // SAFETY: a fresh anonymous mapping at an address the kernel picks; it aliases nothing.
        let pointer = unsafe {
            mmap_anonymous(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::PRIVATE | MapFlags::NORESERVE,
            )
        }?;
        let base = NonNull::new(pointer.cast::<u8>()).expect("mmap never returns null on success");
        Ok(ZeroPages { base, len })
    }

    /// The words of type `W` at `offset`.
    #[inline]
    pub(crate) fn words<W: SharedWords>(&self, offset: usize) -> &W {
        let size = std::mem::size_of::<W>();
        let past_end = offset.checked_add(size).map_or(true, |end| end > self.len);
        if past_end || offset % std::mem::align_of::<W>() != 0 {
            outside(offset, self.len);
        }
        // SAFETY: in bounds and aligned (checked) in a mapping that lives as long as the
        // returned borrow; `W: SharedWords` is valid for any bit pattern and only accessed
        // atomically (module contract).
        unsafe { &*self.base.as_ptr().add(offset).cast::<W>() }
    }

    /// Hands the whole pages of `offset..offset + len` back to the kernel (Linux's
    /// `MADV_DONTNEED`, not the POSIX advice of that name, which leaves them be): they read as
    /// zeros from now on. Best effort: should the kernel refuse, they keep their contents and
    /// their memory.
    pub(crate) fn discard(&self, offset: usize, len: usize) {
        let page = page_size();
        let first = offset.next_multiple_of(page);
        let end = offset.saturating_add(len).min(self.len) & !(page - 1);
        if end <= first {
            return;
        }
        // SAFETY: whole pages inside our own live mapping; DONTNEED on private anonymous memory
        // only replaces their contents by zeros, which every view of them (atomic words, module
        // contract) is valid for.
        let _ = unsafe {
            madvise(
                self.base.as_ptr().add(first).cast(),
                end - first,
                Advice::LinuxDontNeed,
            )
        };
    }
}

/// The panic of words outside or misaligned in the pages (a bug of the caller). Out of line, its
/// values passed by value, so that the check costs the hot path no stack slots.
#[cold]
#[inline(never)]
#[track_caller]
fn outside(offset: usize, len: usize) -> ! {
    panic!("words at {offset} outside or misaligned in zero pages of {len} bytes")
}

impl Drop for ZeroPages {
    fn drop(&mut self) {
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
    use std::sync::atomic::{AtomicU64, Ordering};

    #[test]
    fn discarded_pages_read_zero_and_the_rest_keeps_its_words() {
        let page = page_size();
        let pages = ZeroPages::map(3 * page).unwrap();
        for i in 0..3 {
            pages
                .words::<AtomicU64>(i * page + 8)
                .store(i as u64 + 1, Ordering::Relaxed);
        }
        // Only whole pages inside the range go: the first and last are partly outside it.
        pages.discard(page / 2, 2 * page);
        pages.discard(page, page);
        let seen: Vec<u64> = (0..3)
            .map(|i| {
                pages
                    .words::<AtomicU64>(i * page + 8)
                    .load(Ordering::Relaxed)
            })
            .collect();
        assert_eq!(seen, [1, 0, 3]);
        // A discarded page is writable again.
        pages.words::<AtomicU64>(page).store(7, Ordering::Relaxed);
        assert_eq!(pages.words::<AtomicU64>(page).load(Ordering::Relaxed), 7);
    }

    #[test]
    #[should_panic(expected = "outside or misaligned")]
    fn words_past_the_end_panic() {
        let pages = ZeroPages::map(1).unwrap();
        pages.words::<AtomicU64>(page_size() - 4);
    }
}
