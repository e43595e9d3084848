//! Child-process setup that must run between `fork` and `exec`.

use std::os::fd::{BorrowedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::Command;

use rustix::io::{fcntl_setfd, FdFlags};
use rustix::process::{getpid, getppid, set_parent_process_death_signal, Signal};

/// Makes the child die with the calling thread's process and, if `inherit` is given, keeps that
/// descriptor open across `exec` (at the same number) in the child only.
pub(crate) fn die_with_parent(command: &mut Command, inherit: Option<RawFd>) {
    let parent = getpid();
    let hook = move || -> std::io::Result<()> {
        set_parent_process_death_signal(Some(Signal::KILL))?;
        if getppid() != Some(parent) {
            // The launcher died before the death signal was armed.
            return Err(std::io::Error::other("the launcher exited during spawn"));
        }
        if let Some(fd) = inherit {
            // SAFETY: `fd` is owned by the parent's listener, which outlives the spawn call
            // (the caller borrows it for the whole `Command::spawn`), so it is open here.
            let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
            fcntl_setfd(borrowed, FdFlags::empty())?;
        }
        Ok(())
    };
    // SAFETY: the hook only makes async-signal-safe system calls (prctl, getppid, fcntl) and
    // allocates nothing except on the error path, which ends the child's exec attempt.
    unsafe {
        command.pre_exec(hook);
    }
}
