//! A global exit: one process ends every process of a control plane's group with one exit status
//! (OpenSHMEM's `shmem_global_exit`; [`ControlPlane::global_exit`],
//! [`crate::lifecycle::global_exit`]).
//!
//! The round, through root rank 0 like every message of the plane:
//!
//! 1. The initiator records the status in its process ([`announced`]); a member sends
//!    [`Kind::Exit`] with it to root rank 0.
//! 2. Root rank 0 opens the round (the first status wins: a second initiator's `Exit` is
//!    ignored, and that initiator acknowledges the round's status like every member), records
//!    the status and sends `Exit` with it to every member.
//! 3. Each member's router thread records the status and answers [`Kind::ExitAck`].
//! 4. When every member has acknowledged (or [`ROUND_GRACE`] has passed: a member that cannot
//!    answer), root rank 0 sends [`Kind::ExitNow`] to every member and ends its process; each
//!    member's router ends its process on it, whatever the program's threads are doing (waiting
//!    in a barrier or computing without a call).
//!
//! No process ends before every process has recorded the status, so whatever a process notices
//! of the others ending — a hang-up on any control plane, the shared-memory abort word that a
//! break sets, a UCX endpoint error — finds the status recorded: a plane that breaks while a
//! global exit is recorded ends its process with that status instead
//! (`Shared::mark_broken`, before any waiter is woken), and so do a failing guarded call
//! ([`crate::lifecycle::guarded`]) and the C API's failure path ([`end_if_announced`]).
//!
//! A process that has recorded the status ignores SIGTERM from then on: `hmrun` stops the rest of
//! a job with SIGTERM when the first process exits non-zero, and each process is to end with
//! the status by itself (SIGKILL, after hmrun's grace period, still ends it).
//!
//! How a process ends: the initiating thread calls `exit` (the standard: as if the program
//! called `exit`, with its `atexit` handlers); elsewhere — a router thread, or a thread failing
//! while the program's own threads still run — the streams are flushed (Rust's and the C
//! library's) and the process `_exit`s, so no `atexit` handler or library destructor runs under
//! threads still using what it tears down. Either way a watchdog `_exit`s the process if ending
//! it takes longer than [`ENDING_WATCHDOG`] (an `atexit` handler that waits for a peer).

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::frame::Kind;
use super::router::{Link, Shared};
use super::ControlPlane;
use crate::sys::process_exit;

/// How long root rank 0 waits for every member's acknowledgement before it ends the job
/// anyway (routers answer at once; a member that does not is stopped or dead).
pub(crate) const ROUND_GRACE: Duration = Duration::from_secs(10);

/// How long ending the process may take before a watchdog `_exit`s it.
const ENDING_WATCHDOG: Duration = Duration::from_secs(10);

/// The status recorded in this process, as `RECORDED | status as u32`; 0 while none is.
static ANNOUNCED: AtomicU64 = AtomicU64::new(0);
const RECORDED: u64 = 1 << 32;
/// A thread of this process called [`ControlPlane::global_exit`]: it ends the process itself.
static INITIATED: AtomicBool = AtomicBool::new(false);
/// A thread of this process is ending it.
static ENDING: AtomicBool = AtomicBool::new(false);

/// Root only: the global exit under way on a plane.
#[derive(Debug)]
pub(crate) struct ExitRound {
    /// The status every process exits with.
    pub(crate) status: i32,
    /// By rank: the members that have not acknowledged it yet.
    pub(crate) unacknowledged: Vec<bool>,
}

/// The status of the global exit under way in this process, if one is.
pub(crate) fn announced() -> Option<i32> {
    let word = ANNOUNCED.load(Ordering::SeqCst);
    (word & RECORDED != 0).then_some(word as u32 as i32)
}

/// Records that a global exit with `status` is under way (a later record — root rank 0's
/// word on the round — replaces an earlier one). From then on the process ignores SIGTERM: it
/// ends with the status by itself, also when its launcher, seeing another process of the job
/// end with a non-zero status first, asks the rest to stop (SIGKILL still ends it).
pub(crate) fn record(status: i32) {
    if ANNOUNCED.swap(RECORDED | u64::from(status as u32), Ordering::SeqCst) == 0 {
        process_exit::ignore_termination_requests();
    }
}

/// If a global exit is under way in this process, ends the process with its status (never
/// returns then); else does nothing. For every path that would otherwise report a lost peer
/// or a failure caused by the others ending.
#[cold]
#[inline(never)]
pub(crate) fn end_if_announced() {
    let Some(status) = announced() else {
        return;
    };
    if INITIATED.load(Ordering::SeqCst) {
        // The initiating thread ends the process with `exit` once its round is over; this
        // thread only steps in if that thread cannot.
        std::thread::sleep(ROUND_GRACE * 3);
    }
    end(status, Ending::Immediate)
}

/// How [`end`] ends the process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ending {
    /// `exit` (on the initiating thread).
    Exit,
    /// Flush the streams, then `_exit` (anywhere else).
    Immediate,
}

/// Ends the process with `status`. Only the first caller ends it; another waits for that
/// (bounded: it `_exit`s the process after the watchdog's time if it is still there).
pub(crate) fn end(status: i32, how: Ending) -> ! {
    if ENDING.swap(true, Ordering::SeqCst) {
        std::thread::sleep(ENDING_WATCHDOG * 2);
        process_exit::exit_immediately(status)
    }
    let _ = std::thread::Builder::new()
        .name("hm-exit-watchdog".into())
        .spawn(move || {
            std::thread::sleep(ENDING_WATCHDOG);
            process_exit::exit_immediately(status)
        });
    tracing::debug!(status, ?how, "ending the process for a global exit");
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    match how {
        Ending::Exit => std::process::exit(status),
        Ending::Immediate => {
            process_exit::flush_c_streams();
            process_exit::exit_immediately(status)
        }
    }
}

/// The payload of `Exit` and `ExitNow`: the status, 4 bytes little endian.
pub(super) fn parse_status(payload: &[u8]) -> Option<i32> {
    Some(i32::from_le_bytes(payload.try_into().ok()?))
}

/// Root rank 0: opens the round of `status` on the plane of `links` unless one is open, and
/// tells every member; returns the round's status and whether this call opened it.
pub(super) fn open_round(shared: &Shared, links: &[Option<Arc<Link>>], status: i32) -> (i32, bool) {
    shared.update(|inbox| {
        if let Some(round) = &inbox.exit_round {
            return (round.status, false);
        }
        record(status);
        // A broken plane may have dead members, which never answer: no waiting then.
        let broken = inbox.broken.is_some();
        let unacknowledged = links
            .iter()
            .enumerate()
            .map(|(rank, link)| match link {
                Some(link) if !broken && !inbox.departed[rank] => {
                    link.send(Kind::Exit, &[&status.to_le_bytes()]).is_ok()
                }
                Some(link) => {
                    let _ = link.send(Kind::Exit, &[&status.to_le_bytes()]);
                    false
                }
                None => false,
            })
            .collect();
        inbox.exit_round = Some(ExitRound {
            status,
            unacknowledged,
        });
        (status, true)
    })
}

/// Root rank 0: a member's acknowledgement of the round.
pub(super) fn acknowledged(shared: &Shared, rank: usize) {
    shared.update(|inbox| {
        if let Some(flag) = inbox
            .exit_round
            .as_mut()
            .and_then(|round| round.unacknowledged.get_mut(rank))
        {
            *flag = false;
        }
    });
}

/// Root rank 0: waits until every member has acknowledged the open round, or `deadline`; then
/// tells every member to end and ends this process.
pub(super) fn finish_round(
    shared: &Shared,
    links: &[Option<Arc<Link>>],
    deadline: Instant,
    how: Ending,
) -> ! {
    let settled = |inbox: &mut super::router::Inbox| {
        let round = inbox.exit_round.as_ref()?;
        (!round.unacknowledged.contains(&true)).then_some(round.status)
    };
    let status = shared
        .wait_until(deadline, settled)
        .or_else(|| shared.update(|inbox| inbox.exit_round.as_ref().map(|r| r.status)))
        .or_else(announced)
        .unwrap_or(1);
    for link in links.iter().flatten() {
        let _ = link.send(Kind::ExitNow, &[&status.to_le_bytes()]);
    }
    end(status, how)
}

/// Root rank 0's router, on a member's `Exit`: opens the round and finishes it on a thread of
/// its own (the router must go on reading the acknowledgements).
pub(super) fn serve_request(shared: &Arc<Shared>, links: &[Option<Arc<Link>>], status: i32) {
    let (_, opened) = open_round(shared, links, status);
    if !opened {
        return;
    }
    let (thread_shared, thread_links) = (Arc::clone(shared), links.to_vec());
    let deadline = Instant::now() + ROUND_GRACE;
    let spawned = std::thread::Builder::new()
        .name("hm-global-exit".into())
        .spawn(move || finish_round(&thread_shared, &thread_links, deadline, Ending::Immediate));
    if spawned.is_err() {
        // No thread to wait on: end the job without the acknowledgements.
        finish_round(shared, links, Instant::now(), Ending::Immediate)
    }
}

/// A member's router, on root rank 0's `ExitNow`: ends the process, or, where a thread of
/// this process initiated the exit, wakes that thread to end it.
pub(super) fn exit_now(shared: &Shared, status: i32) {
    record(status);
    if INITIATED.load(Ordering::SeqCst) {
        shared.update(|inbox| inbox.exit_now = true);
    } else {
        end(status, Ending::Immediate)
    }
}

impl ControlPlane {
    /// Ends every process of this plane's group with exit status `status`: this one, and each
    /// other one whatever it is doing (waiting in any call, or computing without one). Does
    /// not return.
    ///
    /// Every process records the status before any ends, so none reports the others' ending as
    /// a lost peer: a plane breaking while a global exit is under way ends its process with the
    /// status instead. This thread ends its process with `exit` (`atexit` handlers run); the
    /// others end theirs from their router threads after flushing their output streams.
    /// When several processes call it at once, root rank 0 picks the first status it hears
    /// of, and every process exits with that one. A process that cannot answer within 10 s
    /// (stopped, or dead) is not waited for. Once a process has recorded the status it ignores
    /// SIGTERM (a launcher stopping the rest of a job after the first non-zero exit), so that
    /// it too ends with the status.
    pub fn global_exit(&self, status: i32) -> ! {
        INITIATED.store(true, Ordering::SeqCst);
        record(status);
        tracing::debug!(status, rank = self.rank, "global exit");
        let Some(network) = self.network.as_ref() else {
            end(status, Ending::Exit)
        };
        if self.rank == 0 {
            let (status, opened) = open_round(&self.shared, &network.links, status);
            if opened {
                let deadline = Instant::now() + ROUND_GRACE;
                finish_round(&self.shared, &network.links, deadline, Ending::Exit)
            }
            // A member's round came first: root's own thread for it ends the process; this
            // thread waits for that, and ends the process itself only if it does not happen.
            let deadline = Instant::now() + ROUND_GRACE * 2;
            let _ = self.shared.wait_until(deadline, |_| None::<()>);
            end(status, Ending::Exit)
        }
        let sent = network
            .links
            .first()
            .and_then(Option::as_ref)
            .map(|root| root.send(Kind::Exit, &[&status.to_le_bytes()]));
        if let Some(Ok(())) = sent {
            // Root rank 0's ExitNow (or its hang-up, if it ended first) ends the wait.
            let deadline = Instant::now() + ROUND_GRACE * 2;
            let _ = self.shared.wait_until(deadline, |inbox| {
                (inbox.exit_now || inbox.root_gone).then_some(())
            });
        }
        end(announced().unwrap_or(status), Ending::Exit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_round_trips_through_its_payload_and_the_record() {
        for status in [0, 7, 255, -1, i32::MIN, i32::MAX] {
            assert_eq!(parse_status(&status.to_le_bytes()), Some(status));
        }
        assert_eq!(parse_status(&[1, 2, 3]), None);
        // The record is process-wide; a unit test process has no plane a break could end.
        assert_eq!(announced(), None);
    }
}
