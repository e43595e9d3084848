//! Liveness within a host, at no network cost: a host's lowest rank (its leader, see
//! [`HostMap::leader_of`]) is the only one of its ranks that beats across hosts; the host's
//! other ranks (its locals) beat to their leader, and hear it beat, over an abstract Unix
//! socket, so a frozen local is still named and a leader that loses root rank 0 tells its locals.
//!
//! Every rank of a plane with liveness binds its own socket name before it says hello, so when
//! the welcome names the hosts a local reaches its leader at once. A local sends its rank (four
//! bytes), then one byte a beat; the leader sends one byte a beat to each local: `.` (alive), or
//! `R` (root rank 0 is lost: the leader stopped hearing it, and the local ends its plane with
//! the same verdict). The leader's watchdog reads every local's socket itself, so nothing else
//! can hold up what it hears. Both ends check the other's user (`SO_PEERCRED`).
//!
//! A local that cannot reach its leader (another network namespace under the same node name),
//! or whose leader left the plane before it, beats to root rank 0 over its own TCP connection
//! instead: root rank 0 watches every rank that beats to it. A local of root rank 0 whose
//! leader's socket ends has nothing left to watch: root's own connection reports its exit.
//!
//! ```text
//! hosts a: 0 1 2, b: 3 4:  1, 2 beat to 0 and 4 to 3 over Unix sockets; 3 and 0 beat to
//!                          each other over TCP; 0 hears one frame a beat, not four
//! ```

use std::io::{ErrorKind as IoKind, Read, Write};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags, Timespec};

use rustix::net::sockopt::socket_peercred;
use rustix::process::getuid;

use super::hosts::HostMap;
use super::liveness::Liveness;
use super::unique_id::UniqueId;

/// A beat: the sender is alive.
const BEAT: u8 = b'.';
/// Leader → local: root rank 0 is lost.
const ROOT_LOST: u8 = b'R';
/// How long a leader waits for a connecting local's rank.
const HELLO_WAIT: Duration = Duration::from_millis(100);
/// How long a new plane's leader waits for its locals to connect.
const GATHER_WAIT: Duration = Duration::from_secs(1);

/// The abstract socket name of `rank`'s local liveness socket in the plane of `secret`.
fn socket_name(secret: &[u8], rank: usize) -> Vec<u8> {
    let mut name = b"hyper_multicore/live/".to_vec();
    for byte in secret {
        name.extend_from_slice(format!("{byte:02x}").as_bytes());
    }
    name.extend_from_slice(format!("/{rank}").as_bytes());
    name
}

/// This rank's socket, bound before its hello; what it becomes once the welcome names the hosts
/// is [`Bound::into_side`].
#[derive(Debug)]
pub(crate) struct Bound {
    secret: Vec<u8>,
    rank: usize,
    /// None when the name could not be bound (then this rank's locals beat to root rank 0).
    listener: Option<UnixListener>,
}

impl Bound {
    /// Binds `rank`'s socket in the plane of `id`, of `size` ranks, unless liveness is off
    /// (`peer_timeout` `None`) or the plane has one rank.
    pub(crate) fn when_watched(
        id: &UniqueId,
        rank: usize,
        size: usize,
        peer_timeout: Option<Duration>,
    ) -> Option<Bound> {
        (size > 1 && peer_timeout.is_some()).then(|| Bound::bind(id.secret(), rank))
    }

    /// The part on its host of `hosts` of the rank that bound `bound` ([`HostSide::Alone`]
    /// with liveness off).
    pub(crate) fn side(bound: Option<Bound>, hosts: &HostMap) -> HostSide {
        bound.map_or(HostSide::Alone, |bound| bound.into_side(hosts))
    }

    /// Binds `rank`'s socket in the plane of `secret`.
    fn bind(secret: &[u8], rank: usize) -> Bound {
        let listener = SocketAddr::from_abstract_name(socket_name(secret, rank))
            .and_then(|address| UnixListener::bind_addr(&address))
            .and_then(|listener| listener.set_nonblocking(true).map(|()| listener));
        let listener = listener
            .inspect_err(|e| tracing::debug!("no local liveness socket for rank {rank}: {e}"))
            .ok();
        Bound {
            secret: secret.to_vec(),
            rank,
            listener,
        }
    }

    /// This rank's part on its host of `hosts`: the leader keeps its socket, a local drops its
    /// own and connects to its leader's.
    pub(crate) fn into_side(self, hosts: &HostMap) -> HostSide {
        let leader = hosts.leader_of(self.rank);
        if leader == self.rank {
            let expected = hosts.ranks_on(hosts.host_of(self.rank)).len() - 1;
            return match self.listener {
                Some(listener) if expected > 0 => {
                    // The locals connect as soon as they have the welcome: the leader takes
                    // them in now (those late are taken in by a later beat), so its open
                    // descriptors stay the same from the plane's first call on.
                    let mut locals = Vec::new();
                    let until = Instant::now() + GATHER_WAIT;
                    while locals.len() < expected && Instant::now() < until {
                        let mut fds = [PollFd::new(&listener, PollFlags::IN)];
                        let wait = Timespec::try_from(until - Instant::now()).ok();
                        let _ = poll(&mut fds, wait.as_ref());
                        admit_locals(self.rank, &listener, &mut locals, hosts);
                    }
                    HostSide::Leader {
                        rank: self.rank,
                        listener,
                        locals,
                    }
                }
                _ => HostSide::Alone,
            };
        }
        let reached = SocketAddr::from_abstract_name(socket_name(&self.secret, leader))
            .and_then(|address| UnixStream::connect_addr(&address))
            .and_then(|mut stream| {
                stream.write_all(&(self.rank as u32).to_le_bytes())?;
                stream.set_nonblocking(true)?;
                Ok(stream)
            })
            .ok()
            .filter(same_user);
        let link = match reached {
            Some(stream) => LeaderLink::Connected(stream),
            None => LeaderLink::Direct,
        };
        HostSide::Local { leader, link }
    }
}

fn same_user(stream: &UnixStream) -> bool {
    socket_peercred(stream).is_ok_and(|credentials| credentials.uid == getuid())
}

/// A rank's part in its host's liveness.
#[derive(Debug)]
pub(crate) enum HostSide {
    /// The only rank of its host, or a leader without a socket: beats across hosts alone.
    Alone,
    /// The host's lowest rank: beats across hosts for the host and watches its locals.
    Leader {
        rank: usize,
        listener: UnixListener,
        locals: Vec<Local>,
    },
    /// Another rank of the host, watched by its leader and watching it.
    Local { leader: usize, link: LeaderLink },
}

/// A local as its leader sees it.
#[derive(Debug)]
pub(crate) struct Local {
    rank: usize,
    stream: UnixStream,
    /// Its silence was reported already.
    reported: bool,
}

/// A local's connection to its leader.
#[derive(Debug)]
pub(crate) enum LeaderLink {
    Connected(UnixStream),
    /// Beats to root rank 0 itself (the leader could not be reached or left the plane).
    Direct,
    /// The leader, root rank 0, left: nothing to watch here.
    Ended,
}

/// What a beat of the host's liveness found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Finding {
    /// A local of this leader was silent for the given time, past the peer timeout.
    LocalSilent(usize, Duration),
    /// This local's leader was silent for the given time, past the peer timeout.
    LeaderSilent(usize, Duration),
    /// This local's leader lost root rank 0.
    RootLostByLeader(usize),
}

impl HostSide {
    /// Whether this rank beats across hosts (to root rank 0, or from it) itself.
    pub(crate) fn beats_across_hosts(&self) -> bool {
        !matches!(
            self,
            HostSide::Local {
                link: LeaderLink::Connected(_) | LeaderLink::Ended,
                ..
            }
        )
    }

    /// One beat: takes in new locals, reads what arrived (recording it in `liveness`), sends a
    /// beat, and returns what is silent past `deadline` (each silent local once) or what the
    /// leader said.
    pub(crate) fn beat(
        &mut self,
        hosts: &HostMap,
        liveness: &Liveness,
        deadline: Duration,
    ) -> Option<Finding> {
        match self {
            HostSide::Alone => None,
            HostSide::Leader {
                rank,
                listener,
                locals,
            } => {
                for rank in admit_locals(*rank, listener, locals, hosts) {
                    liveness.heard(rank);
                }
                locals.retain_mut(|local| {
                    let open = drain(&mut local.stream, |_| liveness.heard(local.rank));
                    let _ = local.stream.write(&[BEAT]);
                    open
                });
                let silent = locals
                    .iter_mut()
                    .find(|local| !local.reported && liveness.silent_for(local.rank) > deadline)?;
                silent.reported = true;
                Some(Finding::LocalSilent(
                    silent.rank,
                    liveness.silent_for(silent.rank),
                ))
            }
            HostSide::Local { leader, link } => {
                let leader = *leader;
                let LeaderLink::Connected(stream) = link else {
                    return None;
                };
                let mut root_lost = false;
                let open = drain(stream, |byte| {
                    liveness.heard(leader);
                    root_lost |= byte == ROOT_LOST;
                });
                if root_lost {
                    return Some(Finding::RootLostByLeader(leader));
                }
                if !open {
                    // The leader left the plane: from now on this local beats to root rank 0
                    // itself, and root's silence counts from now.
                    *link = if leader == 0 {
                        LeaderLink::Ended
                    } else {
                        liveness.heard(0);
                        LeaderLink::Direct
                    };
                    return None;
                }
                let _ = stream.write(&[BEAT]);
                let silence = liveness.silent_for(leader);
                (silence > deadline).then(|| {
                    // Reported once: from here this local beats to root rank 0 itself.
                    *link = LeaderLink::Direct;
                    liveness.heard(0);
                    Finding::LeaderSilent(leader, silence)
                })
            }
        }
    }

    /// A leader that lost root rank 0 tells its locals.
    pub(crate) fn tell_root_lost(&mut self) {
        if let HostSide::Leader { locals, .. } = self {
            for local in locals {
                let _ = local.stream.write(&[ROOT_LOST]);
            }
        }
    }
}

/// Accepts the locals waiting on `listener` of leader `rank_here`: each must be of this user
/// and say a rank of this leader's host not connected yet. Returns the ranks taken in.
fn admit_locals(
    rank_here: usize,
    listener: &UnixListener,
    locals: &mut Vec<Local>,
    hosts: &HostMap,
) -> Vec<usize> {
    let mut admitted = Vec::new();
    let host = hosts.host_of(rank_here);
    loop {
        let mut stream = match listener.accept() {
            Ok((stream, _)) => stream,
            Err(e) if e.kind() == IoKind::Interrupted => continue,
            Err(_) => return admitted,
        };
        let mut said = [0u8; 4];
        let heard_rank = stream.set_read_timeout(Some(HELLO_WAIT)).is_ok()
            && stream.read_exact(&mut said).is_ok()
            && stream.set_nonblocking(true).is_ok();
        let rank = u32::from_le_bytes(said) as usize;
        let fits = heard_rank
            && same_user(&stream)
            && rank != rank_here
            && rank < hosts.len()
            && hosts.host_of(rank) == host
            && !locals.iter().any(|local| local.rank == rank);
        if fits {
            admitted.push(rank);
            locals.push(Local {
                rank,
                stream,
                reported: false,
            });
        } else {
            tracing::warn!("refused a local liveness connection that is not a PE of this host");
        }
    }
}

/// Reads everything waiting in `stream`, calling `byte` for each byte; returns whether the
/// stream is still open.
fn drain(stream: &mut UnixStream, mut byte: impl FnMut(u8)) -> bool {
    let mut buffer = [0u8; 64];
    loop {
        match stream.read(&mut buffer) {
            Ok(0) => return false,
            Ok(n) => buffer[..n].iter().for_each(|&b| byte(b)),
            Err(e) if e.kind() == IoKind::Interrupted => {}
            Err(e) => return e.kind() == IoKind::WouldBlock,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts() -> HostMap {
        HostMap::new(["a", "a", "a", "b"].map(String::from).to_vec())
    }

    /// A secret of this test process's own, per test.
    fn secret(test: &str) -> Vec<u8> {
        format!("{test}-{}", std::process::id()).into_bytes()
    }

    /// A leader hears its locals and they hear it; a local that stops beating is found silent
    /// once; a leader's `R` reaches its locals.
    #[test]
    fn a_leader_and_its_locals_hear_each_other_and_find_the_silent_one() {
        let (hosts, secret) = (hosts(), secret("heard"));
        let bound: Vec<Bound> = (0..4).map(|rank| Bound::bind(&secret, rank)).collect();
        let mut sides: Vec<HostSide> = bound.into_iter().map(|b| b.into_side(&hosts)).collect();
        assert!(matches!(sides[0], HostSide::Leader { .. }));
        assert!(matches!(sides[3], HostSide::Alone));
        assert!(!sides[1].beats_across_hosts() && sides[0].beats_across_hosts());
        let liveness: Vec<Liveness> = (0..4).map(|_| Liveness::new(hosts.clone())).collect();
        let deadline = Duration::from_millis(50);
        // Ranks 0 and 1 beat; rank 2 never does after its hello.
        let until = std::time::Instant::now() + Duration::from_secs(60);
        let finding = loop {
            assert!(
                std::time::Instant::now() < until,
                "never found rank 2 silent"
            );
            let _ = sides[1].beat(&hosts, &liveness[1], deadline);
            if let Some(finding) = sides[0].beat(&hosts, &liveness[0], deadline) {
                break finding;
            }
            std::thread::yield_now();
        };
        assert!(
            matches!(finding, Finding::LocalSilent(2, silence) if silence > deadline),
            "{finding:?}"
        );
        assert!(
            liveness[1].silent_for(0) < deadline,
            "rank 1 hears its leader"
        );
        sides[0].tell_root_lost();
        let told = loop {
            assert!(std::time::Instant::now() < until, "rank 1 never heard R");
            if let Some(finding) = sides[1].beat(&hosts, &liveness[1], Duration::MAX) {
                break finding;
            }
            std::thread::yield_now();
        };
        assert_eq!(told, Finding::RootLostByLeader(0));
    }

    /// A local whose leader cannot be reached beats across hosts itself.
    #[test]
    fn a_local_that_cannot_reach_its_leader_beats_across_hosts_itself() {
        let (hosts, secret) = (hosts(), secret("unreachable"));
        let side = Bound::bind(&secret, 2).into_side(&hosts);
        assert!(matches!(
            side,
            HostSide::Local {
                leader: 0,
                link: LeaderLink::Direct
            }
        ));
        assert!(side.beats_across_hosts());
    }
}
