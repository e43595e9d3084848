//! Adopting a listening socket that a launcher left open for this process.

use std::net::TcpListener;
use std::os::fd::{BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::io::{fcntl_getfd, fcntl_setfd, FdFlags};
use rustix::net::sockopt::socket_acceptconn;

use crate::error::{Error, ErrorKind, Result};

static CLAIMED: AtomicBool = AtomicBool::new(false);

/// Takes ownership of the inherited listening socket `fd`; succeeds at most once per process.
pub(crate) fn take_inherited_listener(fd: RawFd, variable: &str) -> Result<TcpListener> {
    let invalid = |why: &str| {
        Error::new(
            ErrorKind::InvalidConfig,
            "read world environment",
            format!("{variable}={fd} {why}; start the job with hmrun or unset {variable}"),
        )
    };
    if fd < 0 {
        return Err(invalid("is negative"));
    }
    // SAFETY: the borrow is only used for two queries below; an fd number that is not open
    // makes them fail with EBADF, which is handled.
    let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
    fcntl_getfd(borrowed).map_err(|_| invalid("is not an open file descriptor"))?;
    if !socket_acceptconn(borrowed).unwrap_or(false) {
        return Err(invalid("is not a listening socket"));
    }
    if CLAIMED.swap(true, Ordering::AcqRel) {
        return Err(Error::new(
            ErrorKind::InvalidState,
            "read world environment",
            format!("the listener in {variable} was already taken by an earlier World"),
        ));
    }
    // SAFETY: the descriptor is open and a listening socket (checked above), the launcher gave
    // it to this process, and CLAIMED guarantees only one owner is ever created.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    // Our own children must not inherit it again.
    fcntl_setfd(&owned, FdFlags::CLOEXEC)
        .map_err(|e| Error::backend("read world environment", "cannot set FD_CLOEXEC", e.into()))?;
    Ok(TcpListener::from(owned))
}
