//! Ending the process from a thread that is not the program's own: flush the C library's
//! streams, then `_exit`, without running `atexit` handlers or static destructors while the
//! program's threads still run (a global exit ends a PE from its control-plane router thread,
//! `control/global_exit.rs`).

/// Flushes every open C `FILE` stream (`fflush(NULL)`): the `printf` output a C program has
/// buffered is written before the process ends without `exit`.
pub(crate) fn flush_c_streams() {
    // SAFETY: fflush(NULL) takes no pointer of ours; it flushes every output stream under
    // each stream's own lock.
    unsafe {
        libc::fflush(std::ptr::null_mut());
    }
}

/// Makes the process ignore SIGTERM from now on: a process ending for a global exit must end
/// with the global exit's status, not be stopped by a launcher that saw another process end
/// first (`hmrun` sends SIGTERM to the rest of a job when one process exits non-zero).
pub(crate) fn ignore_termination_requests() {
    // SAFETY: installs the SIG_IGN disposition (no handler code of ours runs); sigaction is
    // process-wide and may be called from any thread.
    unsafe {
        libc::signal(libc::SIGTERM, libc::SIG_IGN);
    }
}

/// Ends the process at once with `status` (`_exit`): no `atexit` handler, no destructor, no
/// stream flush.
pub(crate) fn exit_immediately(status: i32) -> ! {
    // SAFETY: _exit has no preconditions; it does not return.
    unsafe { libc::_exit(status) }
}
