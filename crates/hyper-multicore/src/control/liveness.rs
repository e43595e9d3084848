//! Liveness of a control plane: heartbeats on the star's links and a silence deadline, so a
//! host that vanishes without closing anything (power, cable, a frozen machine) ends every wait
//! within the peer timeout instead of the wait's own deadline.
//!
//! A watchdog thread per connected plane does all of it, never a user call, so a PE computing
//! for minutes without calling the runtime stays alive: root rank 0's watchdog sends a
//! [`Kind::Heartbeat`] to every member, and each member's watchdog one to root rank 0, every
//! fifth of the peer timeout ([`crate::config::PEER_TIMEOUT_SEC`]). Whatever the router reads
//! counts as heard, and so do bytes waiting unread in a connection (the router may be busy
//! serving the transport; the peer is alive all the same). Root rank 0 declares a member lost
//! when nothing arrived from it for the peer timeout, names its host and the host's silent ranks,
//! and tells every survivor (the plane's usual abort); a member that hears nothing from root rank
//! 0 for as long breaks its own plane, naming root rank 0's host and every host it reached
//! through it. Traffic is one small frame per member per interval each way — it grows with PEs,
//! not with pairs of PEs: a thousand ranks at the default cost root rank 0 a thousand 20-byte
//! frames a second each way.
//!
//! The watchdog is a thread of its own, not the router's: the router also serves the network
//! transport's requests and may be held up there, and a late heartbeat is a false alarm on the
//! peer. A heartbeat never waits for a link another thread is writing to: that thread's frame is
//! traffic the peer hears just as well.
//!
//! ```text
//! peer timeout 5 s: beats every 1 s; a member silent for 5 s is lost
//! ```

use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use rustix::event::{poll, PollFd, PollFlags, Timespec};

use super::frame::Kind;
use super::hosts::HostMap;
use super::router::{abort_members, Link, Shared};
use crate::config::PEER_TIMEOUT_SEC;
use crate::error::{Error, Result};

/// Heartbeats per peer timeout.
const BEATS_PER_DEADLINE: u32 = 5;

/// When each rank of a plane was last heard, written by the router, read by the watchdog; and
/// the hosts of the ranks.
#[derive(Debug)]
pub(crate) struct Liveness {
    hosts: HostMap,
    epoch: Instant,
    /// Nanoseconds since `epoch` at which something last arrived from each rank (a member
    /// only uses rank 0's entry).
    last_heard: Box<[AtomicU64]>,
}

impl Liveness {
    /// Liveness of a plane whose ranks run on `hosts`, every rank heard now.
    pub(crate) fn new(hosts: HostMap) -> Liveness {
        let size = hosts.len();
        Liveness {
            hosts,
            epoch: Instant::now(),
            last_heard: (0..size).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// The hosts of the plane's ranks.
    pub(crate) fn hosts(&self) -> &HostMap {
        &self.hosts
    }

    /// Records that something arrived from `peer`.
    pub(crate) fn heard(&self, peer: usize) {
        if let Some(last) = self.last_heard.get(peer) {
            let now = crate::sys::nanos_since(self.epoch);
            last.fetch_max(now, Ordering::Relaxed);
        }
    }

    /// How long nothing arrived from `peer`.
    fn silent_for(&self, peer: usize) -> Duration {
        let last = self.last_heard[peer].load(Ordering::Relaxed);
        Duration::from_nanos(crate::sys::nanos_since(self.epoch).saturating_sub(last))
    }
}

/// What a watchdog watches: this process's rank, its links and connections, and the plane.
pub(crate) struct Watched {
    /// This process's rank.
    pub(crate) rank: usize,
    /// The plane's links (root rank 0: one per member; a member: the one to the root).
    pub(crate) links: Vec<Option<Arc<Link>>>,
    /// The same connections, by rank, to look for bytes the router has not read yet.
    pub(crate) probes: Vec<Option<TcpStream>>,
    pub(crate) shared: Arc<Shared>,
    pub(crate) liveness: Arc<Liveness>,
}

/// The thread that beats and watches for silence; stopped (and joined) by [`Watchdog::stop`].
#[derive(Debug)]
pub(crate) struct Watchdog {
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: JoinHandle<()>,
}

impl Watchdog {
    /// Starts the watchdog of a plane with peer timeout `deadline`; `None` when liveness is
    /// off.
    pub(crate) fn start(watched: Watched, deadline: Option<Duration>) -> Result<Option<Watchdog>> {
        let Some(deadline) = deadline else {
            return Ok(None);
        };
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let stopping = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("hm-liveness".into())
            .spawn(move || watch(&watched, deadline, &stopping))
            .map_err(|e| {
                Error::backend("rendezvous", "cannot start the control plane's watchdog", e)
            })?;
        Ok(Some(Watchdog { stop, thread }))
    }

    /// Stops the thread and waits for it.
    pub(crate) fn stop(self) {
        let (stopped, wake) = &*self.stop;
        *stopped.lock() = true;
        wake.notify_all();
        let _ = self.thread.join();
    }
}

/// The watchdog's loop: beat, look for silence, sleep an interval; until stopped or it
/// declared a loss.
fn watch(watched: &Watched, deadline: Duration, stop: &(Mutex<bool>, Condvar)) {
    let interval = deadline / BEATS_PER_DEADLINE;
    loop {
        {
            let (stopped, wake) = stop;
            let mut stopped = stopped.lock();
            if !*stopped {
                wake.wait_for(&mut stopped, interval);
            }
            if *stopped {
                return;
            }
        }
        // A broken or closing plane has nobody left to convince; a heartbeat arriving at a
        // root rank 0 that closes without reading it would make its kernel reset the
        // connection, and a reset can overtake the abort that root rank 0 sent before it.
        if watched
            .shared
            .peek(|inbox| inbox.broken.is_some() || inbox.closing)
        {
            continue;
        }
        for link in watched.links.iter().flatten() {
            // A failed send means the peer is gone: its hang-up or silence is reported anyway.
            let _ = link.try_send(Kind::Heartbeat);
        }
        if declared_a_loss(watched, deadline) {
            return;
        }
    }
}

/// Declares the first peer silent past `deadline` lost, unless the plane is closing or broken
/// already; returns whether it did.
fn declared_a_loss(watched: &Watched, deadline: Duration) -> bool {
    let Watched {
        rank,
        links,
        shared,
        liveness,
        ..
    } = watched;
    let silent = |peer: usize| {
        let waiting = watched.probes.get(peer).and_then(Option::as_ref);
        if waiting.is_some_and(has_unread_bytes) {
            liveness.heard(peer);
        }
        liveness.silent_for(peer) > deadline
    };
    if *rank == 0 {
        let departed = shared.peek(|inbox| inbox.departed.clone());
        let watched_member = |peer: usize| !departed[peer];
        let Some(lost) = (1..departed.len()).find(|&peer| watched_member(peer) && silent(peer))
        else {
            return false;
        };
        if shared.peek(|inbox| inbox.closing || inbox.broken.is_some()) {
            return false;
        }
        let error = member_lost(liveness, deadline, lost, watched_member);
        abort_members(shared, links, &error, Some(lost));
    } else {
        if !silent(0)
            || shared.peek(|inbox| inbox.closing || inbox.root_departed || inbox.broken.is_some())
        {
            return false;
        }
        shared.break_with(&root_lost(liveness, deadline, *rank));
    }
    true
}

/// Whether bytes wait unread in `stream` (or it ended: the router reports that itself).
fn has_unread_bytes(stream: &TcpStream) -> bool {
    let mut fds = [PollFd::new(stream, PollFlags::IN)];
    let now = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    matches!(poll(&mut fds, Some(&now)), Ok(n) if n > 0)
}

/// Root rank 0's error for member `lost`, silent past `deadline`: its whole host is lost when
/// every watched rank there fell silent too (a vanished host falls silent all at once: its
/// other ranks are well past half the deadline), else only its process.
fn member_lost(
    liveness: &Liveness,
    deadline: Duration,
    lost: usize,
    watched: impl Fn(usize) -> bool,
) -> Error {
    let hosts = liveness.hosts();
    let host = hosts.host_of(lost);
    let on_host: Vec<usize> = hosts
        .ranks_on(host)
        .into_iter()
        .filter(|&rank| rank != 0 && watched(rank))
        .collect();
    let silent: Vec<usize> = on_host
        .iter()
        .copied()
        .filter(|&rank| liveness.silent_for(rank) > deadline / 2)
        .collect();
    let how_long = format!(
        "nothing arrived for {:.1} s, past {PEER_TIMEOUT_SEC}={}",
        liveness.silent_for(lost).as_secs_f64(),
        deadline.as_secs_f64()
    );
    let detail = if silent == on_host && host != hosts.host_of(0) {
        format!(
            "{} is lost: {how_long}; the host lost power or its network, or it is frozen",
            hosts.describe(host)
        )
    } else {
        format!(
            "rank {lost} on host {host} is lost: {how_long}; its process is frozen or stopped \
             (silent ranks on that host: {silent:?})"
        )
    };
    Error::peer_lost("control plane", lost, &detail).on_rank(0)
}

/// Member `rank`'s error for root rank 0, silent past `deadline`.
fn root_lost(liveness: &Liveness, deadline: Duration, rank: usize) -> Error {
    let hosts = liveness.hosts();
    let (root_host, mine) = (hosts.host_of(0), hosts.host_of(rank));
    let how_long = format!(
        "nothing arrived from it for {:.1} s, past {PEER_TIMEOUT_SEC}={}",
        liveness.silent_for(0).as_secs_f64(),
        deadline.as_secs_f64()
    );
    let detail = if root_host == mine {
        format!("root rank 0 on this host ({mine}) is lost: {how_long}; its process is frozen or stopped")
    } else {
        format!(
            "host {root_host} of root rank 0 is lost: {how_long}; this host ({mine}) lost every \
             other host, all reached through root rank 0: {}; the network between them failed, \
             or that host lost power or is frozen",
            hosts.hosts_except(mine)
        )
    };
    Error::peer_lost("control plane", 0, &detail).on_rank(rank)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn liveness() -> Liveness {
        Liveness::new(HostMap::new(
            ["a", "a", "b", "b", "c"].map(String::from).to_vec(),
        ))
    }

    /// Waits (yielding) until `liveness` has heard nothing from `rank` for `silence`.
    fn until_silent(liveness: &Liveness, rank: usize, silence: Duration) {
        while liveness.silent_for(rank) <= silence {
            std::thread::yield_now();
        }
    }

    #[test]
    fn a_host_whose_ranks_all_fell_silent_is_named_lost_with_its_ranks() {
        let liveness = liveness();
        let deadline = Duration::from_millis(20);
        until_silent(&liveness, 2, deadline);
        let error = member_lost(&liveness, deadline, 2, |_| true);
        assert_eq!(error.peer(), Some(2));
        assert!(
            error.message().contains("host b (ranks [2, 3]) is lost"),
            "{error}"
        );
    }

    #[test]
    fn a_rank_silent_while_its_host_answers_is_named_alone() {
        let liveness = liveness();
        let deadline = Duration::from_millis(20);
        until_silent(&liveness, 2, deadline);
        liveness.heard(3);
        let error = member_lost(&liveness, deadline, 2, |_| true);
        assert!(
            error.message().contains("rank 2 on host b is lost")
                && error.message().contains("silent ranks on that host: [2]"),
            "{error}"
        );
    }

    #[test]
    fn a_member_that_lost_root_names_root_s_host_and_every_other_host() {
        let liveness = liveness();
        let error = root_lost(&liveness, Duration::from_secs(1), 2);
        assert_eq!(error.peer(), Some(0));
        assert!(
            error.message().contains("host a of root rank 0 is lost")
                && error.message().contains("a (ranks [0, 1]), c (ranks [4])"),
            "{error}"
        );
        let error = root_lost(&liveness, Duration::from_secs(1), 1);
        assert!(
            error.message().contains("root rank 0 on this host (a)"),
            "{error}"
        );
    }
}
