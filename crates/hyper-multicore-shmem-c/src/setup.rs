//! Set-up and queries: `shmem_init` (and its thread and legacy forms), `shmem_finalize`,
//! `shmem_global_exit`, the PE queries, accessibility, `shmem_ptr` and the library information.

use std::ffi::{c_char, c_int, c_void};

use hyper_multicore::config::parse_size;

use crate::failure::{fail, record};
use crate::job;

/// The standard's major version this library implements.
pub const MAJOR_VERSION: c_int = 1;
/// The standard's minor version this library implements.
pub const MINOR_VERSION: c_int = 5;
/// The vendor string `shmem_info_get_name` returns.
const VENDOR: &[u8] = b"hyper_multicore\0";
/// `SHMEM_THREAD_MULTIPLE`: the highest thread level (every level is provided).
const THREAD_MULTIPLE: c_int = 3;

/// The standard's heap-size variable (`SHMEM_SYMMETRIC_SIZE`), read by `shmem_init`.
pub const SYMMETRIC_SIZE: &str = "SHMEM_SYMMETRIC_SIZE";
/// The standard's debug variable: any value but `0` turns on the runtime's debug log.
const DEBUG: &str = "SHMEM_DEBUG";
/// The standard's variable asking PE 0 to print the library version at start.
const VERSION: &str = "SHMEM_VERSION";
/// The standard's variable asking PE 0 to print the library's variables at start.
const INFO: &str = "SHMEM_INFO";

/// The thread level granted to the program (the one it asked for).
static THREAD_LEVEL: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

fn set(variable: &str) -> bool {
    std::env::var(variable).is_ok_and(|value| !value.is_empty() && value != "0")
}

/// The per-PE heap size `shmem_init` asks for: `SHMEM_SYMMETRIC_SIZE` when set (the same
/// syntax as `HYPER_MULTICORE_SHMEM_HEAP_SIZE`: bytes, or K/M/G suffixes), else the runtime's
/// configured size.
fn heap_size(call: &str) -> Option<u64> {
    let text = std::env::var(SYMMETRIC_SIZE).ok()?;
    match parse_size(&text) {
        Ok(0) | Err(_) => fail(
            call,
            format!(
                "{SYMMETRIC_SIZE}={text:?} is not a positive size; give bytes or a number with a \
                 K, M or G suffix (e.g. 512M)"
            ),
        ),
        Ok(size) => Some(size),
    }
}

/// Unmatched initialization calls: OpenSHMEM 1.6 pairs every `shmem_init` with a
/// `shmem_finalize`, and only the last finalize ends the library.
static INITIALIZATIONS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
/// Set by the last `shmem_finalize`, cleared by the next initialization.
static FINALIZED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn initialize(call: &str) {
    if job::initialized() {
        INITIALIZATIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        return;
    }
    if set(DEBUG) && std::env::var_os(hyper_multicore::config::LOG_LEVEL).is_none() {
        std::env::set_var(hyper_multicore::config::LOG_LEVEL, "debug");
    }
    job::start(call, heap_size(call));
    INITIALIZATIONS.store(1, std::sync::atomic::Ordering::Relaxed);
    FINALIZED.store(false, std::sync::atomic::Ordering::Relaxed);
    if job::my_pe(call) == 0 {
        if set(VERSION) || set(INFO) {
            eprintln!(
                "hmshmem: OpenSHMEM {MAJOR_VERSION}.{MINOR_VERSION}, hyper_multicore {}",
                env!("CARGO_PKG_VERSION")
            );
        }
        if set(INFO) {
            eprintln!(
                "hmshmem: {SYMMETRIC_SIZE}: per-PE symmetric heap size (bytes, K/M/G suffixes)\n\
                 hmshmem: {DEBUG}: non-zero turns on the runtime's debug log\n\
                 hmshmem: {VERSION}: non-zero prints the library version at start\n\
                 hmshmem: {INFO}: non-zero prints this list at start\n\
                 hmshmem: every HYPER_MULTICORE_SHMEM_* variable of docs/configuration.md applies"
            );
        }
    }
}

/// Collective: starts the library on every PE (joins the job `hmrun` started and maps the
/// symmetric heap of `SHMEM_SYMMETRIC_SIZE` bytes). A call while initialized only counts (one
/// more `shmem_finalize` is then needed); a call after the last `shmem_finalize` starts a fresh
/// runtime (OpenSHMEM 1.6).
#[no_mangle]
pub extern "C" fn shmem_init() {
    initialize("shmem_init");
}

/// Collective: [`shmem_init`], granting the thread level asked for.
///
/// # Safety
/// `provided` must be null or valid for writing one `int`.
#[no_mangle]
pub unsafe extern "C" fn shmem_init_thread(requested: c_int, provided: *mut c_int) -> c_int {
    const CALL: &str = "shmem_init_thread";
    if !(0..=THREAD_MULTIPLE).contains(&requested) {
        fail(
            CALL,
            format!("thread level {requested} is not one of SHMEM_THREAD_SINGLE..MULTIPLE (0..3)"),
        );
    }
    initialize(CALL);
    THREAD_LEVEL.store(requested, std::sync::atomic::Ordering::Relaxed);
    if !provided.is_null() {
        // SAFETY: non-null and writable for one int (function contract).
        unsafe { provided.write(requested) };
    }
    0
}

/// The thread level granted at initialization.
///
/// # Safety
/// `provided` must be valid for writing one `int`.
#[no_mangle]
pub unsafe extern "C" fn shmem_query_thread(provided: *mut c_int) {
    let level = THREAD_LEVEL.load(std::sync::atomic::Ordering::Relaxed);
    if !provided.is_null() {
        // SAFETY: non-null and writable for one int (function contract).
        unsafe { provided.write(level) };
    }
}

/// Legacy form of [`shmem_init`] (its argument is ignored, as the standard says).
#[no_mangle]
pub extern "C" fn start_pes(_npes: c_int) {
    initialize("start_pes");
}

/// Collective: the last call (one per initialization) frees what is still allocated, destroys
/// every team and ends this PE's use of the library; an earlier one is a barrier. Without
/// `shmem_init` it does nothing.
#[no_mangle]
pub extern "C" fn shmem_finalize() {
    const CALL: &str = "shmem_finalize";
    use std::sync::atomic::Ordering;
    let left = INITIALIZATIONS.load(Ordering::Relaxed);
    if left > 1 {
        INITIALIZATIONS.store(left - 1, Ordering::Relaxed);
        return job::run(CALL, |shmem| shmem.barrier());
    }
    if left == 1 {
        crate::teams::retire_all();
        job::finish(CALL);
        INITIALIZATIONS.store(0, Ordering::Relaxed);
        FINALIZED.store(true, Ordering::Relaxed);
    }
}

/// Writes nonzero to `initialized` between an initialization and the last `shmem_finalize`,
/// else zero (OpenSHMEM 1.6; callable in any state).
///
/// # Safety
/// `initialized` must be null or valid for writing one `int`.
#[no_mangle]
pub unsafe extern "C" fn shmem_query_initialized(initialized: *mut c_int) {
    if !initialized.is_null() {
        // SAFETY: non-null and writable for one int (function contract).
        unsafe { initialized.write(c_int::from(job::initialized())) };
    }
}

/// Writes nonzero to `finalized` after the last `shmem_finalize` (until the next
/// initialization), else zero (callable in any state).
///
/// # Safety
/// `finalized` must be null or valid for writing one `int`.
#[no_mangle]
pub unsafe extern "C" fn shmem_query_finalized(finalized: *mut c_int) {
    if !finalized.is_null() {
        let done = FINALIZED.load(std::sync::atomic::Ordering::Relaxed);
        // SAFETY: non-null and writable for one int (function contract).
        unsafe { finalized.write(c_int::from(done)) };
    }
}

/// Sets the profiling level: this library has no profiling hooks, so it returns at once, as
/// the standard allows. Declared variadic in `shmem.h` (`int level, ...`); the extra arguments
/// are never read, which the C calling conventions of the supported targets allow.
#[no_mangle]
pub extern "C" fn shmem_pcontrol(_level: c_int) {}

/// Ends the whole job: every PE exits with `status` — this one with `exit`, every other one
/// whatever it is doing (waiting in a call, or computing without one), after flushing its
/// output — so `hmrun` exits with `status` on every host. No PE reports the others' ending as
/// a lost peer ([`hyper_multicore::lifecycle::global_exit`]). Callable in any state: before
/// `shmem_init` in a process that never joined the job, this PE exits alone.
#[no_mangle]
pub extern "C" fn shmem_global_exit(status: c_int) -> ! {
    eprintln!(
        "hmshmem: PE {}: shmem_global_exit({status}): ending the job",
        job::rank().map_or_else(|| "?".to_string(), |r| r.to_string())
    );
    hyper_multicore::lifecycle::global_exit(status)
}

/// This PE's number.
#[no_mangle]
pub extern "C" fn shmem_my_pe() -> c_int {
    job::my_pe("shmem_my_pe") as c_int
}

/// The number of PEs.
#[no_mangle]
pub extern "C" fn shmem_n_pes() -> c_int {
    job::n_pes("shmem_n_pes") as c_int
}

/// Legacy form of [`shmem_my_pe`].
#[no_mangle]
pub extern "C" fn _my_pe() -> c_int {
    shmem_my_pe()
}

/// Legacy form of [`shmem_n_pes`].
#[no_mangle]
pub extern "C" fn _num_pes() -> c_int {
    shmem_n_pes()
}

/// 1 if `pe` is a PE of the job (every PE of the job is reachable), else 0.
#[no_mangle]
pub extern "C" fn shmem_pe_accessible(pe: c_int) -> c_int {
    let size = job::n_pes("shmem_pe_accessible");
    c_int::from(usize::try_from(pe).is_ok_and(|pe| pe < size))
}

/// 1 if `address` is a symmetric address (in a live allocation) and `pe` a PE of the job.
#[no_mangle]
pub extern "C" fn shmem_addr_accessible(address: *const c_void, pe: c_int) -> c_int {
    const CALL: &str = "shmem_addr_accessible";
    if shmem_pe_accessible(pe) == 0 {
        record(CALL, &format!("PE {pe} does not exist"));
        return 0;
    }
    match job::locate(address as usize, 1) {
        Ok(_) => 1,
        Err(why) => {
            record(CALL, &why);
            0
        }
    }
}

/// A local address of PE `pe`'s copy of the symmetric `dest`, or null when that copy is not
/// mapped in this process (a PE on another host; the reason goes to `shmemx_last_error`).
#[no_mangle]
pub extern "C" fn shmem_ptr(dest: *const c_void, pe: c_int) -> *mut c_void {
    const CALL: &str = "shmem_ptr";
    let pe = job::target_pe(CALL, pe);
    let region = job::region(CALL, dest as usize, 1);
    let pointer = job::run(CALL, |shmem| {
        Ok(shmem
            .ptr::<u8>(&job::At(region), pe)
            .map_err(|e| e.to_string()))
    });
    match pointer {
        Ok(pointer) => pointer.as_ptr().cast(),
        Err(why) => {
            record(CALL, &why);
            std::ptr::null_mut()
        }
    }
}

/// The standard version this library implements.
///
/// # Safety
/// `major` and `minor` must be valid for writing one `int` each.
#[no_mangle]
pub unsafe extern "C" fn shmem_info_get_version(major: *mut c_int, minor: *mut c_int) {
    // SAFETY: writable for one int each (function contract).
    unsafe {
        major.write(MAJOR_VERSION);
        minor.write(MINOR_VERSION);
    }
}

/// The vendor name, NUL-terminated, into `name` (at least `SHMEM_MAX_NAME_LEN` bytes).
///
/// # Safety
/// `name` must be valid for writing `SHMEM_MAX_NAME_LEN` bytes.
#[no_mangle]
pub unsafe extern "C" fn shmem_info_get_name(name: *mut c_char) {
    // SAFETY: writable for SHMEM_MAX_NAME_LEN (256) bytes (function contract), more than the
    // vendor string's length.
    unsafe { std::ptr::copy_nonoverlapping(VENDOR.as_ptr().cast(), name, VENDOR.len()) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_standard_variable_is_documented() {
        let page = include_str!("../../../docs/configuration.md");
        for variable in [SYMMETRIC_SIZE, DEBUG, VERSION, INFO] {
            assert!(
                page.contains(&format!("`{variable}`")),
                "docs/configuration.md misses {variable}"
            );
        }
    }
}
