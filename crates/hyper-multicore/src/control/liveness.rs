//! Liveness of a control plane: heartbeats across hosts and a silence deadline, so a host
//! that vanishes without closing anything (power, cable, a frozen machine) ends every wait
//! within the peer timeout instead of the wait's own deadline.
//!
//! A watchdog thread per connected plane does all of it, never a user call, so a PE computing
//! for minutes without calling the runtime stays alive. Traffic across hosts grows with hosts,
//! not with PEs: only each host's leader (its lowest rank) beats across hosts — root rank 0's
//! watchdog sends a [`Kind::Heartbeat`] to every other host's leader, and each leader's watchdog
//! one to root rank 0, every fifth of the peer timeout ([`crate::config::PEER_TIMEOUT_SEC`]).
//! Within a host, the leader and its other ranks beat to each other over Unix sockets
//! (`host_watch.rs`). Whatever the router reads counts as heard, and so do bytes waiting unread
//! in a connection (the router may be busy serving the transport; the peer is alive all the
//! same).
//!
//! What a silence means:
//! - root rank 0 hears nothing from a host's leader for the peer timeout: that host is lost
//!   (named with its ranks), and root tells every survivor (the plane's usual abort);
//! - a leader hears nothing from root rank 0 for as long: it breaks its own plane, naming root
//!   rank 0's host and every host it reached through it, and tells its locals, who do the same;
//! - a leader hears nothing from one of its locals: it reports the rank to root rank 0
//!   ([`Kind::Silent`]), which names that rank's process frozen and tells everyone;
//! - a local hears nothing from its leader: it reports the leader the same way (or, for root
//!   rank 0, breaks its plane naming it) and beats to root rank 0 itself from then on.
//!
//! Root rank 0 watches every rank that beats to it, so a local that beats across hosts itself
//! (its leader left, or cannot be reached) is watched too. A thousand ranks on a hundred hosts
//! at the default cost root rank 0 a hundred 20-byte frames a second each way.
//!
//! The watchdog is a thread of its own, not the router's: the router also serves the network
//! transport's requests and may be held up there, and a late heartbeat is a false alarm on the
//! peer. A heartbeat never waits for a link another thread is writing to: that thread's frame is
//! traffic the peer hears just as well.
//!
//! ```text
//! peer timeout 5 s: beats every 1 s; a leader silent for 5 s: its host is lost
//! ```

use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use rustix::event::{poll, PollFd, PollFlags, Timespec};

use super::frame::Kind;
use super::host_watch::{Finding, HostSide};
use super::hosts::HostMap;
use super::router::{abort_members, Link, Shared};
use crate::config::PEER_TIMEOUT_SEC;
use crate::error::{Error, Result};

/// Heartbeats per peer timeout.
pub(crate) const BEATS_PER_DEADLINE: u32 = 5;

/// When each rank of a plane was last heard, written by the router and the watchdog, read by
/// the watchdog; the heartbeats root rank 0 received from each rank; and the hosts of the ranks.
#[derive(Debug)]
pub(crate) struct Liveness {
    hosts: HostMap,
    epoch: Instant,
    /// Nanoseconds since `epoch` at which something last arrived from each rank (a member
    /// uses root rank 0's entry and its host's).
    last_heard: Box<[AtomicU64]>,
    /// Root rank 0: heartbeat frames received from each rank.
    heartbeats: Box<[AtomicU64]>,
}

impl Liveness {
    /// Liveness of a plane whose ranks run on `hosts`, every rank heard now.
    pub(crate) fn new(hosts: HostMap) -> Liveness {
        let size = hosts.len();
        Liveness {
            hosts,
            epoch: Instant::now(),
            last_heard: (0..size).map(|_| AtomicU64::new(0)).collect(),
            heartbeats: (0..size).map(|_| AtomicU64::new(0)).collect(),
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

    /// Root rank 0: records a heartbeat frame from `peer`.
    pub(crate) fn heartbeat_from(&self, peer: usize) {
        if let Some(count) = self.heartbeats.get(peer) {
            count.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Root rank 0: the heartbeat frames received from each rank so far (for the tests).
    #[cfg(feature = "fault-injection")]
    pub(crate) fn heartbeats(&self) -> Vec<u64> {
        self.heartbeats
            .iter()
            .map(|count| count.load(Ordering::Relaxed))
            .collect()
    }

    /// Root rank 0: whether it beats with `peer` across hosts: a host's leader, and any rank
    /// that beats to it itself.
    fn beats_with(&self, peer: usize) -> bool {
        self.hosts.leader_of(peer) == peer || self.heartbeats[peer].load(Ordering::Relaxed) > 0
    }

    /// Excuses every rank `lateness` of silence: the watchdog was held up that long (it had no
    /// core: an oversubscribed host), so it could neither read what arrived nor tell a silent
    /// peer from its own delay — and a peer on the same overloaded cores was most likely held
    /// up alike. Each rank's silence counts only the time the watchdog was on time.
    pub(crate) fn excuse(&self, lateness: Duration) {
        let now = crate::sys::nanos_since(self.epoch);
        let lateness = lateness.as_nanos().min(u128::from(u64::MAX)) as u64;
        for last in self.last_heard.iter() {
            let _ = last.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |heard| {
                Some(heard.saturating_add(lateness).min(now))
            });
        }
    }

    /// How long nothing arrived from `peer`.
    pub(crate) fn silent_for(&self, peer: usize) -> Duration {
        let last = self.last_heard[peer].load(Ordering::Relaxed);
        Duration::from_nanos(crate::sys::nanos_since(self.epoch).saturating_sub(last))
    }
}

/// What a watchdog watches: this process's rank, its links and connections, its part in its
/// host's liveness, and the plane.
pub(crate) struct Watched {
    /// This process's rank.
    pub(crate) rank: usize,
    /// The plane's links (root rank 0: one per member; a member: the one to the root).
    pub(crate) links: Vec<Option<Arc<Link>>>,
    /// The same connections, by rank, to look for bytes the router has not read yet.
    pub(crate) probes: Vec<Option<TcpStream>>,
    /// This rank's part in its host's liveness.
    pub(crate) side: HostSide,
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
            .spawn(move || watch(watched, deadline, &stopping))
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
fn watch(mut watched: Watched, deadline: Duration, stop: &(Mutex<bool>, Condvar)) {
    let interval = deadline / BEATS_PER_DEADLINE;
    let mut last_round = Instant::now();
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
        // A round that comes more than half an interval late is time this thread had no core;
        // it is nobody's silence (see `Liveness::excuse`).
        let round = Instant::now();
        let lateness = (round - last_round).saturating_sub(interval);
        if lateness > interval / 2 {
            watched.liveness.excuse(lateness);
        }
        last_round = round;
        // A broken or closing plane has nobody left to convince; a heartbeat arriving at a
        // root rank 0 that closes without reading it would make its kernel reset the
        // connection, and a reset can overtake the abort that root rank 0 sent before it.
        if watched
            .shared
            .peek(|inbox| inbox.broken.is_some() || inbox.closing)
        {
            continue;
        }
        beat_across_hosts(&watched);
        let Watched { side, liveness, .. } = &mut watched;
        let finding = side.beat(liveness.hosts(), liveness, deadline);
        if declared_a_loss(&mut watched, deadline, finding) {
            return;
        }
    }
}

/// Sends this interval's heartbeats across hosts: root rank 0 to every rank it beats with, a
/// member that beats across hosts to root rank 0.
fn beat_across_hosts(watched: &Watched) {
    let liveness = &watched.liveness;
    let beating = |rank: usize| {
        if watched.rank == 0 {
            liveness.beats_with(rank)
        } else {
            watched.side.beats_across_hosts()
        }
    };
    let departed = if watched.rank == 0 {
        watched.shared.peek(|inbox| inbox.departed.clone())
    } else {
        Vec::new()
    };
    for (rank, link) in watched.links.iter().enumerate() {
        let Some(link) = link else { continue };
        if departed.get(rank).copied().unwrap_or(false) || !beating(rank) {
            continue;
        }
        // A failed send means the peer is gone: its hang-up or silence is reported anyway.
        let _ = link.try_send(Kind::Heartbeat);
    }
}

/// Declares a loss when a peer this rank watches fell silent past `deadline` (or its host's
/// liveness found one: `finding`), unless the plane is closing or broken already; returns
/// whether it did.
fn declared_a_loss(watched: &mut Watched, deadline: Duration, finding: Option<Finding>) -> bool {
    let rank = watched.rank;
    let silent_across_hosts = |watched: &Watched, peer: usize| {
        let waiting = watched.probes.get(peer).and_then(Option::as_ref);
        if waiting.is_some_and(has_unread_bytes) {
            watched.liveness.heard(peer);
        }
        watched.liveness.silent_for(peer) > deadline
    };
    let ended = |watched: &Watched| {
        watched.shared.peek(|inbox| {
            inbox.closing || inbox.broken.is_some() || (rank != 0 && inbox.root_departed)
        })
    };
    if rank == 0 {
        let departed = watched.shared.peek(|inbox| inbox.departed.clone());
        let liveness = &watched.liveness;
        let across = |peer: usize| !departed[peer] && liveness.beats_with(peer);
        let lost = (1..departed.len())
            .find(|&peer| across(peer) && silent_across_hosts(watched, peer))
            .map(|peer| member_lost(liveness, deadline, peer, across))
            .or_else(|| match finding {
                Some(Finding::LocalSilent(peer, silence)) if !departed[peer] => {
                    Some(local_lost(liveness.hosts(), peer, 0, silence))
                }
                _ => None,
            });
        let Some(error) = lost else {
            return false;
        };
        if ended(watched) {
            return false;
        }
        abort_members(&watched.shared, &watched.links, &error, error.peer());
        return true;
    }
    let root_link = watched.links.first().and_then(Option::as_ref);
    match finding {
        Some(Finding::LocalSilent(peer, silence) | Finding::LeaderSilent(peer, silence))
            if peer != 0 =>
        {
            // Root rank 0 names it to everyone; this plane breaks when its abort arrives.
            let payload = [
                (peer as u32).to_le_bytes(),
                (silence.as_millis().min(u128::from(u32::MAX)) as u32).to_le_bytes(),
            ]
            .concat();
            if let Some(link) = root_link {
                let _ = link.send(Kind::Silent, &[&payload]);
            }
            false
        }
        Some(Finding::LeaderSilent(_, silence)) => {
            if ended(watched) {
                return false;
            }
            let how_long = silence_past(silence, deadline);
            let error = root_lost(watched.liveness.hosts(), rank, &how_long);
            watched.shared.break_with(&error);
            true
        }
        Some(Finding::RootLostByLeader(leader)) => {
            if ended(watched) {
                return false;
            }
            let how_long = format!(
                "this host's leader rank {leader} heard nothing from it for longer than \
                 {PEER_TIMEOUT_SEC}={}",
                deadline.as_secs_f64()
            );
            let error = root_lost(watched.liveness.hosts(), rank, &how_long);
            watched.shared.break_with(&error);
            true
        }
        _ => {
            if !watched.side.beats_across_hosts()
                || !silent_across_hosts(watched, 0)
                || ended(watched)
            {
                return false;
            }
            let how_long = silence_past(watched.liveness.silent_for(0), deadline);
            let error = root_lost(watched.liveness.hosts(), rank, &how_long);
            watched.side.tell_root_lost();
            watched.shared.break_with(&error);
            true
        }
    }
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

/// "nothing arrived from it for 5.2 s, past HYPER_MULTICORE_SHMEM_PEER_TIMEOUT_SEC=5".
fn silence_past(silence: Duration, deadline: Duration) -> String {
    format!(
        "nothing arrived from it for {:.1} s, past {PEER_TIMEOUT_SEC}={}",
        silence.as_secs_f64(),
        deadline.as_secs_f64()
    )
}

/// Root rank 0's error for `lost`, a rank it beats with across hosts, silent past `deadline`:
/// its whole host is lost when every rank there that root beats with fell silent too (a host's
/// leader stands for its host; a vanished host falls silent all at once: its other such ranks
/// are well past half the deadline), else only its process.
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
    let how_long = silence_past(liveness.silent_for(lost), deadline);
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

/// Root rank 0's error for rank `lost`, found silent for `silence` by `witness`, a rank of
/// its host, over the host's local liveness: its process is frozen (its host answers).
pub(crate) fn local_lost(hosts: &HostMap, lost: usize, witness: usize, silence: Duration) -> Error {
    let detail = format!(
        "rank {lost} on host {} is lost: rank {witness} of that host heard nothing from it for \
         {:.1} s, past {PEER_TIMEOUT_SEC}; its process is frozen or stopped",
        hosts.host_of(lost),
        silence.as_secs_f64()
    );
    Error::peer_lost("control plane", lost, &detail).on_rank(0)
}

/// Member `rank`'s error for root rank 0, silent as `how_long` says.
fn root_lost(hosts: &HostMap, rank: usize, how_long: &str) -> Error {
    let (root_host, mine) = (hosts.host_of(0), hosts.host_of(rank));
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
    fn a_late_watchdog_excuses_its_own_lateness_and_no_more() {
        let liveness = liveness();
        until_silent(&liveness, 2, Duration::from_millis(30));
        let before = liveness.silent_for(2);
        liveness.excuse(Duration::from_millis(20));
        let after = liveness.silent_for(2);
        // The silence shrank by the lateness (give or take the time between the two reads).
        assert!(after < before, "{after:?} after, {before:?} before");
        assert!(
            after >= before.saturating_sub(Duration::from_millis(20)),
            "{after:?} after, {before:?} before"
        );
        // Lateness beyond a rank's silence leaves it heard now, never in the future.
        liveness.excuse(Duration::from_secs(3600));
        assert!(liveness.silent_for(2) < Duration::from_millis(30));
        until_silent(&liveness, 2, Duration::from_millis(5));
    }

    #[test]
    fn a_member_that_lost_root_names_root_s_host_and_every_other_host() {
        let liveness = liveness();
        let error = root_lost(liveness.hosts(), 2, "silent");
        assert_eq!(error.peer(), Some(0));
        assert!(
            error.message().contains("host a of root rank 0 is lost")
                && error.message().contains("a (ranks [0, 1]), c (ranks [4])"),
            "{error}"
        );
        let error = root_lost(liveness.hosts(), 1, "silent");
        assert!(
            error.message().contains("root rank 0 on this host (a)"),
            "{error}"
        );
    }
}
