//! The executable's writable data and bss, and the one remapping that makes them symmetric:
//! their pages are replaced, at the same addresses, by a second mapping of this PE's copy of a
//! symmetric heap allocation (`mremap` with an old size of 0 duplicates a shared mapping), so a
//! store to a global variable and a peer's put into the allocation reach the same memory.
//!
//! # Safety contract
//!
//! [`alias_onto`] replaces memory under the program's feet: it must run while nothing else
//! reads or writes the range (at `shmem_init`, before the program touches symmetric data; this
//! library's own statics are never inside it — the caller checks), after the range's bytes were
//! copied into the heap copy.

use std::ffi::{c_char, c_int, c_void};

/// `PT_LOAD`: a loaded segment.
const PT_LOAD: u32 = 1;
/// `PT_GNU_RELRO`: the part of a writable segment made read-only after relocation.
const PT_GNU_RELRO: u32 = 0x6474_e552;
/// `PF_W`: the segment is writable.
const PF_W: u32 = 2;

/// `Elf64_Phdr`.
#[repr(C)]
struct ProgramHeader {
    kind: u32,
    flags: u32,
    offset: u64,
    vaddr: u64,
    paddr: u64,
    filesz: u64,
    memsz: u64,
    align: u64,
}

/// The leading fields of glibc's `struct dl_phdr_info` (the rest is not read).
#[repr(C)]
struct ObjectInfo {
    addr: usize,
    name: *const c_char,
    phdr: *const ProgramHeader,
    phnum: u16,
}

extern "C" {
    /// glibc's walk over the loaded objects (the main program first).
    fn dl_iterate_phdr(
        callback: extern "C" fn(*mut ObjectInfo, usize, *mut c_void) -> c_int,
        data: *mut c_void,
    ) -> c_int;
}

/// The main program's writable range past its RELRO part, rounded out to pages, or `None`.
#[derive(Default)]
struct Found(Option<(usize, usize)>);

extern "C" fn first_object(info: *mut ObjectInfo, _size: usize, data: *mut c_void) -> c_int {
    // SAFETY: glibc passes a valid info for the duration of the callback, and `data` is the
    // `Found` that `writable_range` passed in.
    let (info, found) = unsafe { (&*info, &mut *data.cast::<Found>()) };
    // SAFETY: `phdr` points at `phnum` program headers of this object (glibc's contract).
    let headers = unsafe { std::slice::from_raw_parts(info.phdr, usize::from(info.phnum)) };
    let page = rustix::param::page_size();
    let up = |address: usize| (address + page - 1) & !(page - 1);
    let relro_end = headers
        .iter()
        .filter(|h| h.kind == PT_GNU_RELRO)
        .map(|h| info.addr + (h.vaddr + h.memsz) as usize)
        .max()
        .unwrap_or(0);
    found.0 = headers
        .iter()
        .filter(|h| h.kind == PT_LOAD && h.flags & PF_W != 0)
        .map(|h| {
            let start = info.addr + h.vaddr as usize;
            let end = start + h.memsz as usize;
            (up(start.max(relro_end)), up(end))
        })
        .filter(|(start, end)| start < end)
        .reduce(|(a, b), (c, d)| (a.min(c), b.max(d)));
    1 // the main program is the first object: stop
}

/// The page-aligned range `[start, end)` of the executable's writable data and bss (past the
/// part that becomes read-only after relocation), or `None` if it has none.
pub(crate) fn writable_range() -> Option<(usize, usize)> {
    let mut found = Found::default();
    // SAFETY: the callback only reads what glibc hands it and writes `found`, which outlives the
    // call.
    unsafe { dl_iterate_phdr(first_object, (&mut found as *mut Found).cast()) };
    found.0
}

/// Copies the `len` bytes at `start` (this process's own, private memory) into a vector.
pub(crate) fn snapshot(start: usize, len: usize) -> Vec<u8> {
    let mut bytes = vec![0u8; len];
    // SAFETY: `start..start + len` is the executable's writable range (readable, mapped for the
    // process's lifetime) and not yet shared with any process.
    unsafe { std::ptr::copy_nonoverlapping(start as *const u8, bytes.as_mut_ptr(), len) };
    bytes
}

/// Replaces the pages of `target..target + len` by a second mapping of the shared pages at
/// `shared` (page-aligned, inside a `MAP_SHARED` mapping that holds at least `len` bytes).
///
/// # Safety
/// See the module contract: nothing may access the target range while this runs, and its bytes
/// must already be in the shared pages.
pub(crate) unsafe fn alias_onto(shared: usize, target: usize, len: usize) -> std::io::Result<()> {
    // SAFETY: with an old size of 0 the kernel duplicates the shared pages instead of moving
    // them; the target range is replaced (the caller's contract says nothing uses it now).
    unsafe {
        rustix::mm::mremap_fixed(
            shared as *mut c_void,
            0,
            len,
            rustix::mm::MremapFlags::MAYMOVE,
            target as *mut c_void,
        )
    }?;
    Ok(())
}

/// Gives `start..start + len` (page-aligned) private pages again, holding the `len` bytes at
/// `from` (outside the range): undoes [`alias_onto`], or repairs the range after it failed.
///
/// # Safety
/// See the module contract: nothing may access the range while this runs, and no other process
/// may write it any more; `from..from + len` must be readable.
pub(crate) unsafe fn make_private(start: usize, len: usize, from: usize) -> std::io::Result<()> {
    // SAFETY: the range is the executable's writable range, which the caller's contract says
    // nothing uses now; a fixed private anonymous mapping replaces whatever is there.
    unsafe {
        rustix::mm::mmap_anonymous(
            start as *mut c_void,
            len,
            rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
            rustix::mm::MapFlags::PRIVATE | rustix::mm::MapFlags::FIXED,
        )
    }?;
    // SAFETY: the range is now mapped readable and writable, `len` bytes; `from` holds `len`
    // readable bytes in another mapping.
    unsafe { std::ptr::copy_nonoverlapping(from as *const u8, start as *mut u8, len) };
    Ok(())
}
