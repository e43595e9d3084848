//! What a failing call does: the OpenSHMEM calls have no error returns, so a failure prints one
//! line naming the PE, the call and the cause on stderr and exits the PE with status 1 (`hmrun`
//! then fails the whole job fast). A few calls report a failure by their result instead (a null
//! `shmem_malloc`, a null `shmem_ptr`); they record it for `shmemx_last_error`. While a
//! `shmem_global_exit` is under way a failure ends the PE with the global exit's status instead.

use std::ffi::CString;
use std::io::Write;

use parking_lot::Mutex;

/// The last failure recorded on this PE (for `shmemx_last_error`).
static LAST_ERROR: Mutex<Option<CString>> = Mutex::new(None);

/// This PE's rank for messages, or `?` before `shmem_init`.
fn pe_label() -> String {
    crate::job::rank().map_or_else(|| "?".to_string(), |rank| rank.to_string())
}

/// Records `message` as the last error of call `call`.
pub(crate) fn record(call: &str, message: &str) {
    let line = format!("PE {}: {call}: {message}", pe_label());
    *LAST_ERROR.lock() = Some(CString::new(line.replace('\0', " ")).expect("no NUL left"));
}

/// The last recorded failure (a C string valid until the next failure), or null.
pub(crate) fn last_error() -> *const std::ffi::c_char {
    LAST_ERROR
        .lock()
        .as_ref()
        .map_or(std::ptr::null(), |line| line.as_ptr())
}

/// Prints the one-line diagnosis of `call` failing with `message` and exits this PE with
/// status 1.
pub(crate) fn fail(call: &str, message: impl std::fmt::Display) -> ! {
    // While a global exit is under way, a failure is the other PEs ending (a lost peer, an
    // aborted wait): this PE ends with the global exit's status, saying nothing.
    hyper_multicore::lifecycle::end_if_global_exit();
    let message = message.to_string();
    record(call, &message);
    // One write, so a PE stopped right after cannot leave half a line.
    let line = format!("hmshmem: PE {}: {call}: {message}\n", pe_label());
    let _ = std::io::stderr().write_all(line.as_bytes());
    std::process::exit(1)
}

/// The value of `result`, or [`fail`] with its error.
pub(crate) fn check<T>(call: &str, result: hyper_multicore::Result<T>) -> T {
    result.unwrap_or_else(|error| fail(call, error))
}
