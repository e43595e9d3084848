//! The rendezvous: members connect to root rank 0 and authenticate; root rank 0 waits until every
//! rank of the group has arrived, then welcomes them all at once.
//!
//! Root rank 0 serves every connection from one `poll` loop, so a stranger that sends junk, an
//! absurd length prefix or nothing at all never delays the legitimate members: junk is dropped at
//! once, silence when its handshake time runs out or when the rendezvous completes.
//!
//! With liveness on ([`crate::config::PEER_TIMEOUT_SEC`]), root rank 0 and every member that said
//! hello beat to each other while they wait, as the connected plane does (`liveness.rs`): a host
//! lost during the rendezvous ends it within the peer timeout, not at the rendezvous's deadline.
//! Root rank 0 gives up naming the silent member and its host (and tells everyone else why);
//! a member that hears nothing from root rank 0 gives up naming root's host, which root's
//! heartbeats carry.

use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags, Timespec};
use serde::{Deserialize, Serialize};

use super::frame::{
    write_frame, Frame, FrameDecoder, Kind, WireError, MAX_HANDSHAKE_PAYLOAD, MAX_PAYLOAD,
};
use super::hosts::{this_host, HostMap};
use super::liveness::BEATS_PER_DEADLINE;
use super::unique_id::{secrets_match, BootstrapListener, UniqueId, SECRET_LEN};
use super::Watch;
use crate::config::PEER_TIMEOUT_SEC;
use crate::error::{Error, ErrorKind, Result};

/// Longest time a connection may take to say hello before it is dropped.
const HANDSHAKE_LIMIT: Duration = Duration::from_secs(10);
/// Most unauthenticated connections kept at once; beyond it the oldest is dropped.
const MAX_PENDING: usize = 256;
/// Most connections accepted before the pending ones are read again.
const ACCEPT_BATCH: usize = 32;
/// How often a waiting rendezvous runs its watch.
const WATCH_INTERVAL: Duration = Duration::from_millis(50);
/// Extra time a member waits for root rank 0's verdict after its own deadline, so that root's
/// report (which names the missing ranks) arrives before the member gives up on its own.
pub(crate) const VERDICT_GRACE: Duration = Duration::from_secs(2);
/// How long a member cut off by root rank 0 without a reason waits for its watched group to
/// name the cause (see `cut_off`), and how often it looks.
const CUT_OFF_GRACE: Duration = Duration::from_millis(250);
const CUT_OFF_LOOK: Duration = Duration::from_millis(2);

/// Heartbeats while a rendezvous waits (none with liveness off), as the connected plane's
/// watchdog sends them.
struct Beats {
    peer_timeout: Option<Duration>,
    next: Instant,
    /// What each heartbeat carries: the sender's node name (so root rank 0's name its host to
    /// a member that loses it, and the plane's router tells a member's late ones from the
    /// connected plane's, which are empty).
    payload: Vec<u8>,
}

/// Why a member's heartbeat step ended its wait.
enum BeatError {
    /// Root rank 0 fell silent past the peer timeout.
    Silent(Error),
    /// The heartbeat could not be sent.
    Send(std::io::Error),
}

impl Beats {
    fn new(peer_timeout: Option<Duration>, payload: Vec<u8>) -> Beats {
        Beats {
            peer_timeout,
            next: Instant::now(),
            payload,
        }
    }

    /// Whether a heartbeat is due now (then the next one is scheduled).
    fn due(&mut self) -> bool {
        let (Some(peer_timeout), now) = (self.peer_timeout, Instant::now()) else {
            return false;
        };
        if now < self.next {
            return false;
        }
        self.next = now + peer_timeout / BEATS_PER_DEADLINE;
        true
    }

    /// Root rank 0: beats to every member that arrived when a beat is due (and to one that
    /// just arrived), and returns the error for the first one silent past the peer timeout.
    fn among_members(&mut self, members: &mut [Option<Connection>]) -> Option<Error> {
        let peer_timeout = self.peer_timeout?;
        // A member that just arrived hears a beat at once: it names root rank 0's host, should
        // the member lose root before the next one.
        let due = self.due();
        for member in members.iter_mut().flatten() {
            if due || member.next_sequence == 0 {
                // A failed send means the member is gone: its hang-up is reported anyway.
                let _ = member.send(Kind::Heartbeat, &self.payload);
            }
        }
        let (rank, member) = members.iter().enumerate().find_map(|(rank, member)| {
            let member = member.as_ref()?;
            (member.heard.elapsed() > peer_timeout).then_some((rank, member))
        })?;
        let detail = format!(
            "rank {rank} on host {} is lost during the rendezvous: it arrived, then nothing came \
             from it for {:.1} s, past {PEER_TIMEOUT_SEC}={}; the host lost power or its \
             network, or it is frozen",
            member.host,
            member.heard.elapsed().as_secs_f64(),
            peer_timeout.as_secs_f64()
        );
        Some(Error::peer_lost("rendezvous", rank, &detail).on_rank(0))
    }

    /// Member `rank`: beats to root rank 0 when a beat is due; fails when root (on
    /// `root_host`, if its heartbeats named it) fell silent past the peer timeout.
    fn with_root(
        &mut self,
        connection: &mut Connection,
        root_host: Option<&str>,
        rank: usize,
    ) -> std::result::Result<(), BeatError> {
        let Some(peer_timeout) = self.peer_timeout else {
            return Ok(());
        };
        if self.due() {
            connection
                .send(Kind::Heartbeat, &self.payload)
                .map_err(BeatError::Send)?;
        }
        let silence = connection.heard.elapsed();
        if silence <= peer_timeout {
            return Ok(());
        }
        let endpoint = connection
            .stream
            .peer_addr()
            .map_or_else(|_| "?".to_string(), |address| address.to_string());
        let host = root_host.map_or_else(String::new, |host| format!("host {host} of "));
        let detail = format!(
            "{host}root rank 0 ({endpoint}) is lost during the rendezvous: nothing came from it \
             for {:.1} s, past {PEER_TIMEOUT_SEC}={}; the network to it failed, or that host \
             lost power or is frozen",
            silence.as_secs_f64(),
            peer_timeout.as_secs_f64()
        );
        Err(BeatError::Silent(
            Error::peer_lost("rendezvous", 0, &detail).on_rank(rank),
        ))
    }
}

/// What a member says first.
#[derive(Debug, Serialize, Deserialize)]
struct Hello {
    secret: [u8; SECRET_LEN],
    rank: u32,
    size: u32,
    /// The member's node name (see `hosts.rs`).
    host: String,
}

/// An authenticated connection, with whatever bytes already arrived after its hello.
#[derive(Debug)]
pub(crate) struct Connection {
    pub(crate) stream: TcpStream,
    pub(crate) decoder: FrameDecoder,
    /// Root rank 0: the member's node name, from its hello (empty on a member).
    host: String,
    /// The sequence number of the next frame this end sends.
    pub(crate) next_sequence: u64,
    /// When something last arrived on it.
    heard: Instant,
}

impl Connection {
    fn new(stream: TcpStream) -> Self {
        Connection {
            stream,
            decoder: FrameDecoder::new(MAX_HANDSHAKE_PAYLOAD),
            host: String::new(),
            next_sequence: 0,
            heard: Instant::now(),
        }
    }

    /// Sends one frame, numbered next.
    fn send(&mut self, kind: Kind, payload: &[u8]) -> std::io::Result<()> {
        let sequence = self.next_sequence;
        self.next_sequence += 1;
        write_frame(&mut self.stream, kind, sequence, &[payload])
    }

    /// Reads once and returns the next complete frame; `Ok(None)` if incomplete.
    fn read_frame(&mut self) -> std::result::Result<Option<Frame>, String> {
        if let Some(frame) = self.decoder.next_frame().map_err(|e| e.to_string())? {
            return Ok(Some(frame));
        }
        match self.decoder.read_from(&mut self.stream) {
            Ok(0) => Err("the connection closed".into()),
            Ok(_) => {
                self.heard = Instant::now();
                self.decoder.next_frame().map_err(|e| e.to_string())
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => Ok(None),
            Err(e) => Err(e.to_string()),
        }
    }
}

fn reject(connection: &mut Connection, error: &Error) {
    let payload = WireError::from_error(error).encode();
    // Best effort: the peer may already be gone.
    let _ = connection.send(Kind::Reject, &payload);
}

struct Pending {
    connection: Connection,
    peer: Option<SocketAddr>,
    since: Instant,
}

/// Root rank 0's side: accepts and authenticates ranks `1..size`, returned by rank, with every
/// rank's host (sent to each member in its welcome). With a `peer_timeout`, a member that
/// arrived and then fell silent for that long ends the rendezvous.
pub(crate) fn accept_members(
    listener: BootstrapListener,
    size: usize,
    deadline: Instant,
    peer_timeout: Option<Duration>,
    watch: Watch<'_>,
) -> Result<(Vec<Connection>, HostMap)> {
    const OP: &str = "rendezvous";
    let BootstrapListener {
        listener,
        id,
        verify_owner,
    } = listener;
    listener
        .set_nonblocking(true)
        .map_err(|e| Error::backend(OP, "cannot make the listener non-blocking", e))?;
    let mut pending: Vec<Pending> = Vec::new();
    let mut members: Vec<Option<Connection>> = (0..size).map(|_| None).collect();
    let started = Instant::now();
    let mut beats = Beats::new(peer_timeout, this_host().into_bytes());

    while members.iter().skip(1).any(Option::is_none) {
        if let Err(error) = watch() {
            return Err(abandon(&listener, &mut members, &mut pending, error));
        }
        if let Some(error) = beats.among_members(&mut members) {
            return Err(abandon(&listener, &mut members, &mut pending, error));
        }
        let now = Instant::now();
        pending.retain(|p| now.duration_since(p.since) < HANDSHAKE_LIMIT);
        if now >= deadline {
            let missing: Vec<usize> = (1..size).filter(|&r| members[r].is_none()).collect();
            let arrived: Vec<usize> = (0..size)
                .filter(|&r| r == 0 || members[r].is_some())
                .collect();
            let error = Error::timeout(
                OP,
                now - started,
                &format!(
                    "ranks {missing:?} of a group of {size} never arrived (ranks {arrived:?} did)"
                ),
            )
            .on_rank(0);
            return Err(abandon(&listener, &mut members, &mut pending, error));
        }
        let wake_at = pending
            .iter()
            .map(|p| p.since + HANDSHAKE_LIMIT)
            .fold(deadline, Instant::min);
        let wait = (wake_at - now).min(WATCH_INTERVAL);
        let ready = wait_readable(&listener, &pending, &members, wait)?;

        if ready.listener {
            accept_all(&listener, &mut pending)?;
        }
        // Hellos are judged in arrival order, so the first claimant of a rank keeps it.
        let mut finished = Vec::new();
        for index in ready.pending {
            match pending[index].connection.read_frame() {
                Ok(None) => {}
                Ok(Some(frame)) => {
                    admit(
                        &id,
                        size,
                        verify_owner,
                        &mut members,
                        &mut pending[index],
                        frame,
                    );
                    finished.push(index);
                }
                Err(why) => {
                    tracing::debug!(peer = ?pending[index].peer, "dropped a bootstrap connection: {why}");
                    finished.push(index);
                }
            }
        }
        for index in finished.into_iter().rev() {
            pending.remove(index);
        }
        for rank in ready.members {
            // A member spoke or hung up before the welcome: a correct member only beats (which
            // `read_frame` records) or hangs up, and a hang-up means that process is gone.
            let member = members[rank].as_mut().expect("polled members exist");
            if let Err(why) = member.read_frame() {
                // A member that gave up because the watched group broke left for that reason.
                let error = watch().err().unwrap_or_else(|| {
                    Error::peer_lost(OP, rank, &format!("it left during the rendezvous: {why}"))
                        .on_rank(0)
                });
                members[rank] = None;
                return Err(abandon(&listener, &mut members, &mut pending, error));
            }
        }
    }

    answer_stragglers(
        &listener,
        &mut pending,
        &id,
        size,
        verify_owner,
        &mut members,
    );
    let members: Vec<Connection> = members
        .into_iter()
        .skip(1)
        .map(|member| member.expect("every member arrived"))
        .collect();
    let hosts = HostMap::new(
        std::iter::once(this_host())
            .chain(members.iter().map(|member| member.host.clone()))
            .collect(),
    );
    let welcome = hosts.encode();
    let mut connections = Vec::with_capacity(size - 1);
    for (rank, mut member) in (1..).zip(members) {
        member
            .send(Kind::Welcome, &welcome)
            .map_err(|e| Error::backend(OP, &format!("cannot welcome rank {rank}"), e))?;
        member.decoder.set_cap(MAX_PAYLOAD);
        connections.push(member);
    }
    Ok((connections, hosts))
}

/// Ends a rendezvous that failed: everyone still waiting hears why, also the connections not
/// judged yet and those still queued on the listener. A member whose hello is queued would
/// otherwise see a bare reset when the listener closes and blame root rank 0 instead of the
/// real cause (for example another member that died). Returns `error` for the caller.
fn abandon(
    listener: &std::net::TcpListener,
    members: &mut [Option<Connection>],
    pending: &mut Vec<Pending>,
    error: Error,
) -> Error {
    accept_queued(listener, pending);
    let waiting = members.iter_mut().flatten();
    for connection in waiting.chain(pending.iter_mut().map(|p| &mut p.connection)) {
        reject(connection, &error);
    }
    error
}

/// Once every rank has arrived: connections still queued or not yet judged get an answer if they
/// already said something (a wrong secret is told so; a valid hello learns its rank is taken),
/// instead of a bare reset when the listener closes. Bounded: one more accept pass and one read
/// per connection, no waiting.
fn answer_stragglers(
    listener: &std::net::TcpListener,
    pending: &mut Vec<Pending>,
    id: &UniqueId,
    size: usize,
    verify_owner: bool,
    members: &mut [Option<Connection>],
) {
    accept_queued(listener, pending);
    let Ok(ready) = wait_readable(listener, pending, &[], Duration::ZERO) else {
        return;
    };
    for index in ready.pending {
        if let Ok(Some(frame)) = pending[index].connection.read_frame() {
            admit(id, size, verify_owner, members, &mut pending[index], frame);
        }
    }
    pending.clear();
}

struct Readiness {
    listener: bool,
    pending: Vec<usize>,
    members: Vec<usize>,
}

fn wait_readable(
    listener: &std::net::TcpListener,
    pending: &[Pending],
    members: &[Option<Connection>],
    wait: Duration,
) -> Result<Readiness> {
    let member_ranks: Vec<usize> = (0..members.len())
        .filter(|&r| members[r].is_some())
        .collect();
    let mut fds = Vec::with_capacity(1 + pending.len() + member_ranks.len());
    fds.push(PollFd::new(listener, PollFlags::IN));
    for p in pending {
        fds.push(PollFd::new(&p.connection.stream, PollFlags::IN));
    }
    for &rank in &member_ranks {
        let member = members[rank].as_ref().expect("filtered");
        fds.push(PollFd::new(&member.stream, PollFlags::IN));
    }
    let timeout = Timespec::try_from(wait).unwrap_or(Timespec {
        tv_sec: i64::MAX,
        tv_nsec: 0,
    });
    match poll(&mut fds, Some(&timeout)) {
        Ok(_) | Err(rustix::io::Errno::INTR) => {}
        Err(e) => return Err(Error::backend("rendezvous", "poll failed", e.into())),
    }
    let fired = |fd: &PollFd<'_>| !fd.revents().is_empty();
    Ok(Readiness {
        listener: fired(&fds[0]),
        pending: (0..pending.len()).filter(|&i| fired(&fds[1 + i])).collect(),
        members: member_ranks
            .iter()
            .enumerate()
            .filter(|(i, _)| fired(&fds[1 + pending.len() + i]))
            .map(|(_, &rank)| rank)
            .collect(),
    })
}

/// Accepts queued connections, at most [`ACCEPT_BATCH`] per call: hellos already waiting are
/// read between batches, so a flood of strangers queued behind a member can never push it out
/// of the pending list before it was heard.
fn accept_all(listener: &std::net::TcpListener, pending: &mut Vec<Pending>) -> Result<()> {
    for _ in 0..ACCEPT_BATCH {
        match listener.accept() {
            Ok((stream, peer)) => {
                if stream.set_nonblocking(false).is_err() || stream.set_nodelay(true).is_err() {
                    continue;
                }
                if pending.len() >= MAX_PENDING {
                    pending.remove(0);
                }
                pending.push(Pending {
                    connection: Connection::new(stream),
                    peer: Some(peer),
                    since: Instant::now(),
                });
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            // A connection that died in the accept queue, or a transient shortage: the
            // rendezvous goes on.
            Err(e) => {
                tracing::debug!("accept failed: {e}");
                return Ok(());
            }
        }
    }
    Ok(())
}

/// Accepts everything queued on the listener, batch by batch, up to [`MAX_PENDING`] in all.
fn accept_queued(listener: &std::net::TcpListener, pending: &mut Vec<Pending>) {
    while pending.len() < MAX_PENDING {
        let before = pending.len();
        if accept_all(listener, pending).is_err() || pending.len() == before {
            break;
        }
    }
}

/// Checks a hello and either seats the member or rejects it with a clear reason.
fn admit(
    id: &UniqueId,
    size: usize,
    verify_owner: bool,
    members: &mut [Option<Connection>],
    entry: &mut Pending,
    frame: Frame,
) {
    let owner = if verify_owner {
        check_owner(entry)
    } else {
        Ok(())
    };
    let verdict = owner.and_then(|()| check_hello(id, size, members, &frame));
    match verdict {
        Ok((rank, host)) => {
            let stream = entry.connection.stream.try_clone();
            let Ok(stream) = stream else { return };
            tracing::debug!("rank {rank} of host {host} arrived at the rendezvous");
            members[rank] = Some(Connection {
                stream,
                decoder: std::mem::replace(
                    &mut entry.connection.decoder,
                    FrameDecoder::new(MAX_HANDSHAKE_PAYLOAD),
                ),
                host,
                next_sequence: 0,
                heard: Instant::now(),
            });
        }
        Err(error) => {
            tracing::warn!(peer = ?entry.peer, "rejected a bootstrap connection: {error}");
            reject(&mut entry.connection, &error);
        }
    }
}

/// A connection from this host must come from a process of this user (the kernel's socket
/// tables tell, as `SO_PEERCRED` does for Unix sockets): another local user cannot join even
/// with a leaked secret. Connections from other hosts are judged by the secret alone.
fn check_owner(entry: &Pending) -> Result<()> {
    use crate::sys::socket_owner::{tcp_peer_owner, PeerOwner};
    let (Some(peer), Ok(local)) = (entry.peer, entry.connection.stream.local_addr()) else {
        return Ok(());
    };
    if !peer.ip().is_loopback() {
        return Ok(());
    }
    let uid = rustix::process::getuid().as_raw();
    let refuse = |message: String| {
        Err(Error::new(ErrorKind::InvalidArgument, "rendezvous", message).on_rank(0))
    };
    match tcp_peer_owner(local, peer) {
        PeerOwner::Uid(owner) if owner == uid => Ok(()),
        PeerOwner::Uid(owner) => refuse(format!(
            "a local connection from {peer} belongs to uid {owner}, but this job runs as uid \
             {uid}; every PE of a job on one host must run as the same user"
        )),
        PeerOwner::NotFound => refuse(format!(
            "the local connection from {peer} has no owner in the kernel's socket tables (it \
             closed, or the tables are hidden); reconnect"
        )),
        PeerOwner::Unknown => Ok(()),
    }
}

fn check_hello(
    id: &UniqueId,
    size: usize,
    members: &[Option<Connection>],
    frame: &Frame,
) -> Result<(usize, String)> {
    let refuse =
        |message: String| Error::new(ErrorKind::InvalidArgument, "rendezvous", message).on_rank(0);
    if frame.kind != Kind::Hello {
        return Err(refuse(format!(
            "expected a hello frame, got {:?}",
            frame.kind
        )));
    }
    let hello: Hello = postcard::from_bytes(&frame.payload)
        .map_err(|e| refuse(format!("malformed hello: {e}")))?;
    if !secrets_match(&hello.secret, id.secret()) {
        return Err(refuse(
            "wrong secret: this connection carries another job's unique ID; pass the unique ID \
             created by this group's root rank 0"
                .into(),
        ));
    }
    if hello.size as usize != size {
        return Err(refuse(format!(
            "group size mismatch: rank {} was started with size {}, root rank 0 with size {size}; \
             start every rank with the same size",
            hello.rank, hello.size
        )));
    }
    let rank = hello.rank as usize;
    if rank == 0 || rank >= size {
        return Err(refuse(format!(
            "rank {rank} is out of range: members of a group of {size} have ranks 1..{size} \
             (rank 0 is the root)"
        )));
    }
    if members[rank].is_some() {
        return Err(refuse(format!(
            "rank {rank} has already joined (duplicate rank); give every process a distinct rank"
        )));
    }
    Ok((rank, hello.host))
}

/// A member that has connected to root rank 0 and said hello, waiting for the welcome.
#[derive(Debug)]
pub(crate) struct Greeted {
    connection: Connection,
    rank: usize,
    size: usize,
    started: Instant,
    deadline: Instant,
}

/// A member's side, first half: connects to root rank 0 (retrying while it is not yet
/// listening) and says hello.
pub(crate) fn greet_root(
    id: &UniqueId,
    rank: usize,
    size: usize,
    deadline: Instant,
    watch: Watch<'_>,
) -> Result<Greeted> {
    const OP: &str = "rendezvous";
    let started = Instant::now();
    let endpoint = id.endpoint();
    let mut backoff = Duration::from_millis(1);
    let stream = loop {
        let now = Instant::now();
        let remaining = deadline.saturating_duration_since(now);
        let attempt =
            TcpStream::connect_timeout(&endpoint, remaining.max(Duration::from_millis(1)));
        match attempt {
            Ok(stream) => break stream,
            Err(e) if now >= deadline => {
                return Err(Error::timeout(
                    OP,
                    now - started,
                    &format!(
                        "could not reach root rank 0 at {endpoint} ({e}); check that rank 0 is \
                         running and that this rank has the current unique ID"
                    ),
                )
                .on_rank(rank));
            }
            Err(e) if is_transient(&e) => {
                watch()?;
                // Root rank 0 may not be listening yet: back off and try again.
                std::thread::sleep(backoff.min(remaining));
                backoff = (backoff * 2).min(Duration::from_millis(50));
            }
            Err(e) => {
                return Err(
                    Error::backend(OP, &format!("cannot connect to {endpoint}"), e).on_rank(rank),
                )
            }
        }
    };
    let mut connection = Connection::new(stream);
    connection
        .stream
        .set_nodelay(true)
        .map_err(|e| Error::backend(OP, "cannot set TCP_NODELAY", e).on_rank(rank))?;
    let hello = Hello {
        secret: *id.secret(),
        rank: rank as u32,
        size: size as u32,
        host: this_host(),
    };
    let payload = postcard::to_stdvec(&hello).expect("a hello always serializes");
    if let Err(e) = connection.send(Kind::Hello, &payload) {
        return Err(cut_off(
            &mut connection,
            rank,
            watch,
            &format!("cannot send the hello to root rank 0: {e}"),
        ));
    }
    Ok(Greeted {
        connection,
        rank,
        size,
        started,
        deadline,
    })
}

/// A member's side, second half: waits for root rank 0's welcome (or its reason to refuse);
/// returns the connection and every rank's host, which the welcome carries. With a
/// `peer_timeout`, beats to root rank 0 while it waits and gives up when root falls silent for
/// that long.
pub(crate) fn await_welcome(
    greeted: Greeted,
    peer_timeout: Option<Duration>,
    watch: Watch<'_>,
) -> Result<(Connection, HostMap)> {
    const OP: &str = "rendezvous";
    let Greeted {
        mut connection,
        rank,
        size,
        started,
        deadline,
    } = greeted;
    let endpoint = connection.stream.peer_addr().ok();
    let verdict_deadline = deadline + VERDICT_GRACE;
    connection.decoder.set_cap(MAX_PAYLOAD);
    let mut beats = Beats::new(peer_timeout, this_host().into_bytes());
    // Root rank 0's node name, from its heartbeats.
    let mut root_host = None;
    loop {
        watch()?;
        if let Err(error) = beats.with_root(&mut connection, root_host.as_deref(), rank) {
            return Err(match error {
                BeatError::Silent(error) => error,
                BeatError::Send(e) => cut_off(
                    &mut connection,
                    rank,
                    watch,
                    &format!("cannot send a heartbeat to root rank 0: {e}"),
                ),
            });
        }
        let remaining = verdict_deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Err(Error::timeout(
                OP,
                started.elapsed(),
                "root rank 0 accepted the connection but never completed the rendezvous",
            )
            .on_rank(rank));
        }
        connection
            .stream
            .set_read_timeout(Some(remaining.min(WATCH_INTERVAL)))
            .map_err(|e| Error::backend(OP, "cannot set a read timeout", e).on_rank(rank))?;
        let frame = match connection.decoder.next_frame() {
            Ok(Some(frame)) => frame,
            Ok(None) => match connection.decoder.read_from(&mut connection.stream) {
                Ok(0) => {
                    return Err(cut_off(
                        &mut connection,
                        rank,
                        watch,
                        "root rank 0 closed the connection during the rendezvous",
                    ))
                }
                Ok(_) => {
                    connection.heard = Instant::now();
                    continue;
                }
                Err(e) if is_wait_over(&e) => continue,
                Err(e) => {
                    return Err(cut_off(
                        &mut connection,
                        rank,
                        watch,
                        &format!("connection to root rank 0 failed: {e}"),
                    ))
                }
            },
            Err(e) => {
                return Err(Error::new(
                    ErrorKind::Protocol,
                    OP,
                    format!("root rank 0 at {endpoint:?} sent an invalid frame: {e}"),
                )
                .on_rank(rank))
            }
        };
        return match frame.kind {
            Kind::Welcome => {
                connection
                    .stream
                    .set_read_timeout(None)
                    .map_err(|e| Error::backend(OP, "cannot clear the read timeout", e))?;
                let hosts = HostMap::decode(&frame.payload, size).ok_or_else(|| {
                    Error::new(
                        ErrorKind::Protocol,
                        OP,
                        format!("root rank 0's welcome does not list the hosts of {size} ranks"),
                    )
                    .on_rank(rank)
                })?;
                Ok((connection, hosts))
            }
            Kind::Reject => Err(rejection(&frame, rank)),
            Kind::Heartbeat => {
                root_host = Some(String::from_utf8_lossy(&frame.payload).into_owned());
                continue;
            }
            other => Err(Error::new(
                ErrorKind::Protocol,
                OP,
                format!("root rank 0 sent {other:?} before the welcome"),
            )
            .on_rank(rank)),
        };
    }
}

/// The error carried by root rank 0's `Reject` frame, as seen by member `rank`.
fn rejection(frame: &Frame, rank: usize) -> Error {
    let wire = WireError::decode(&frame.payload);
    let error = if wire.kind == ErrorKind::Timeout || wire.kind == ErrorKind::PeerLost {
        wire.to_error()
    } else {
        Error::new(
            wire.kind,
            "rendezvous",
            format!("root rank 0 rejected rank {rank}: {}", wire.message),
        )
    };
    error.on_rank(rank)
}

/// A member's connection to root rank 0 broke before the verdict. Root rank 0 tells everyone
/// why it abandons a rendezvous, so its reason, if already received, is the answer; next the
/// watched group's own failure (root may have left because of it); only then root rank 0
/// itself is blamed.
///
/// A connection still in root's accept queue when root abandoned the rendezvous gets no
/// reason, only a reset when the listener closes; the watched group then learns the real cause
/// (say, another member that died) moments later. So the watch gets up to [`CUT_OFF_GRACE`] to
/// object before root rank 0 is blamed (seen in the chaos suite: `acquire:Initialize:2:kill`
/// on 4 PEs once named rank 0 on rank 3 instead of the killed rank 2).
fn cut_off(connection: &mut Connection, rank: usize, watch: Watch<'_>, what: &str) -> Error {
    connection.decoder.set_cap(MAX_PAYLOAD);
    if connection.stream.set_nonblocking(true).is_ok() {
        let queued = connection.read_frame();
        let _ = connection.stream.set_nonblocking(false);
        if let Ok(Some(frame)) = queued {
            if frame.kind == Kind::Reject {
                return rejection(&frame, rank);
            }
        }
    }
    let grace_ends = Instant::now() + CUT_OFF_GRACE;
    loop {
        if let Err(error) = watch() {
            return error;
        }
        if Instant::now() >= grace_ends {
            return Error::peer_lost("rendezvous", 0, what).on_rank(rank);
        }
        std::thread::sleep(CUT_OFF_LOOK);
    }
}

fn is_transient(error: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        error.kind(),
        ConnectionRefused
            | ConnectionReset
            | TimedOut
            | WouldBlock
            | Interrupted
            | AddrNotAvailable
    )
}

fn is_wait_over(error: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(error.kind(), WouldBlock | TimedOut | Interrupted)
}

#[cfg(test)]
mod tests {
    use std::net::{TcpListener, TcpStream};

    use super::*;

    /// A member's connection whose root end closed without a word.
    fn cut_connection() -> Connection {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let stream = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        drop(listener.accept().unwrap());
        Connection::new(stream)
    }

    #[test]
    fn a_member_cut_off_without_a_reason_names_the_loss_its_group_learns_soon_after() {
        let started = Instant::now();
        let group_learns = move || {
            if started.elapsed() < Duration::from_millis(20) {
                Ok(())
            } else {
                Err(Error::peer_lost("acquire", 2, "it was killed"))
            }
        };
        let error = cut_off(&mut cut_connection(), 3, &group_learns, "reset");
        assert_eq!(error.kind(), ErrorKind::PeerLost, "{error}");
        assert_eq!(error.peer(), Some(2), "{error}");
    }

    #[test]
    fn a_member_cut_off_without_a_reason_or_a_group_loss_blames_root_rank_0() {
        let error = cut_off(
            &mut cut_connection(),
            3,
            &crate::control::unwatched,
            "reset",
        );
        assert_eq!(error.kind(), ErrorKind::PeerLost, "{error}");
        assert_eq!(error.peer(), Some(0), "{error}");
    }
}
