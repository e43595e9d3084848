//! Handing the heap segment's memfd from root rank 0 to its local peers, with `SCM_RIGHTS` over
//! an abstract Unix socket whose name derives from the job secret. Both ends check the other's
//! credentials (`SO_PEERCRED`): same user, and the connecting process must be one of the
//! expected PEs — so no other process can obtain the heap.

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::net::sockopt::socket_peercred;
use rustix::net::{
    recvmsg, sendmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use rustix::process::{getuid, Pid};

use crate::error::{Error, ErrorKind, Result};

const OP: &str = "initialize";

/// How often a waiting root rank 0 re-checks whether the job is still alive.
const CHECK_INTERVAL: Duration = Duration::from_millis(50);

/// The abstract socket name for one runtime lifetime.
pub(crate) fn socket_name(secret: &[u8], generation: u64) -> Vec<u8> {
    let mut name = b"hyper_multicore/".to_vec();
    for byte in secret {
        name.extend_from_slice(format!("{byte:02x}").as_bytes());
    }
    name.extend_from_slice(format!("/{generation}").as_bytes());
    name
}

/// Root rank 0's listening end.
#[derive(Debug)]
pub(crate) struct HandoffListener {
    listener: UnixListener,
}

impl HandoffListener {
    /// Listens on the abstract name.
    pub(crate) fn bind(name: &[u8]) -> Result<HandoffListener> {
        let address = SocketAddr::from_abstract_name(name)
            .map_err(|e| Error::backend(OP, "invalid handoff socket name", e))?;
        let listener = UnixListener::bind_addr(&address)
            .map_err(|e| Error::backend(OP, "cannot listen for local peers", e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::backend(OP, "cannot make the handoff listener non-blocking", e))?;
        Ok(HandoffListener { listener })
    }

    /// Sends `fd` to each of the processes `expected` (by pid) as they connect.
    /// `still_alive` is polled while waiting so a lost peer fails the wait early.
    pub(crate) fn serve(
        &self,
        fd: BorrowedFd<'_>,
        expected: &[u32],
        deadline: Instant,
        still_alive: impl Fn() -> Result<()>,
    ) -> Result<()> {
        let mut served = vec![false; expected.len()];
        while served.iter().any(|s| !s) {
            still_alive()?;
            let now = Instant::now();
            if now >= deadline {
                let missing: Vec<u32> = expected
                    .iter()
                    .zip(&served)
                    .filter(|(_, s)| !**s)
                    .map(|(p, _)| *p)
                    .collect();
                return Err(Error::new(
                    ErrorKind::Timeout,
                    OP,
                    format!("local peers with pids {missing:?} never collected the heap segment"),
                ));
            }
            let wait = (deadline - now).min(CHECK_INTERVAL);
            let mut fds = [PollFd::new(&self.listener, PollFlags::IN)];
            match poll(&mut fds, Some(&timespec(wait))) {
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(e) => {
                    return Err(Error::backend(
                        OP,
                        "poll on the handoff socket failed",
                        e.into(),
                    ))
                }
            }
            loop {
                let stream = match self.listener.accept() {
                    Ok((stream, _)) => stream,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) => {
                        return Err(Error::backend(OP, "accept on the handoff socket failed", e))
                    }
                };
                let Ok(credentials) = socket_peercred(&stream) else {
                    continue;
                };
                let position = expected
                    .iter()
                    .position(|&pid| Pid::from_raw(pid as i32) == Some(credentials.pid));
                match position {
                    Some(index) if credentials.uid == getuid() && !served[index] => {
                        stream.set_nonblocking(false).map_err(|e| {
                            Error::backend(OP, "cannot configure a handoff connection", e)
                        })?;
                        send_fd(&stream, fd)?;
                        served[index] = true;
                    }
                    _ => tracing::warn!(
                        pid = ?credentials.pid,
                        "refused a handoff connection from a process that is not a PE of this job"
                    ),
                }
            }
        }
        Ok(())
    }
}

fn timespec(duration: Duration) -> Timespec {
    Timespec::try_from(duration).unwrap_or(Timespec {
        tv_sec: i64::MAX,
        tv_nsec: 0,
    })
}

fn send_fd(stream: &UnixStream, fd: BorrowedFd<'_>) -> Result<()> {
    let fds = [fd];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    control.push(SendAncillaryMessage::ScmRights(&fds));
    sendmsg(
        stream,
        &[IoSlice::new(b"F")],
        &mut control,
        SendFlags::NOSIGNAL,
    )
    .map_err(|e| Error::backend(OP, "cannot send the heap segment to a peer", e.into()))?;
    Ok(())
}

/// A member's side: connects to root rank 0 (whose pid is `root_pid`) and receives the memfd.
pub(crate) fn receive(name: &[u8], root_pid: u32, deadline: Instant) -> Result<OwnedFd> {
    let address = SocketAddr::from_abstract_name(name)
        .map_err(|e| Error::backend(OP, "invalid handoff socket name", e))?;
    let stream = UnixStream::connect_addr(&address)
        .map_err(|e| Error::backend(OP, "cannot reach root rank 0's handoff socket", e))?;
    let credentials = socket_peercred(&stream)
        .map_err(|e| Error::backend(OP, "cannot read the handoff peer's credentials", e.into()))?;
    if credentials.uid != getuid() || Some(credentials.pid) != Pid::from_raw(root_pid as i32) {
        return Err(Error::new(
            ErrorKind::Protocol,
            OP,
            format!(
                "the handoff socket belongs to pid {:?}, not root rank 0 (pid {root_pid}) of the \
                 same user; refusing its heap",
                credentials.pid
            ),
        ));
    }
    let remaining = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1));
    stream
        .set_read_timeout(Some(remaining))
        .map_err(|e| Error::backend(OP, "cannot set a handoff timeout", e))?;
    let mut byte = [0u8; 1];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    recvmsg(
        &stream,
        &mut [IoSliceMut::new(&mut byte)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )
    .map_err(|e| {
        Error::backend(
            OP,
            "did not receive the heap segment from root rank 0",
            e.into(),
        )
    })?;
    let received = control.drain().find_map(|message| match message {
        RecvAncillaryMessage::ScmRights(mut fds) => fds.next(),
        _ => None,
    });
    received.ok_or_else(|| {
        Error::new(
            ErrorKind::Protocol,
            OP,
            "root rank 0 closed the handoff without sending the heap segment",
        )
    })
}
