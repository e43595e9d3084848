//! The control plane: small, rare messages between the members of a group — rendezvous,
//! allgather, broadcast, barrier and point-to-point — over TCP through root rank 0 (a star).
//!
//! Connections are persistent and authenticated (see [`UniqueId`]); frames carry sequence
//! numbers and a size cap (see [`frame`]). Every call has a deadline (the configured timeout by
//! default) and ends early with an [`ErrorKind::PeerLost`] error naming the rank when a member
//! dies: a background router thread per process notices the hang-up at once, root rank 0 tells
//! every survivor, and the plane stays broken from then on. Collective calls must be made in the
//! same order on every rank; a mismatch is reported on every rank as a protocol error.
//!
//! ```no_run
//! use hyper_multicore::config::Config;
//! use hyper_multicore::control::{ControlPlane, UniqueId};
//! # fn distribute(_: &UniqueId) {}
//! # let (rank, size) = (0, 2);
//! let config = Config::from_env()?;
//! // Root rank 0 creates the ID (and its listener) and gives the ID to the others somehow.
//! let (id, listener) = UniqueId::create(&config)?;
//! distribute(&id);
//! let plane = ControlPlane::connect(rank, size, &id, Some(listener), config.timeout)?;
//! let all = plane.allgather(&[rank as u8])?;
//! assert_eq!(all.len(), size);
//! plane.barrier()?;
//! # Ok::<(), hyper_multicore::Error>(())
//! ```

pub mod frame;
mod rendezvous;
mod router;
mod unique_id;

use std::os::unix::net::UnixStream;
use std::sync::Arc;

use parking_lot::Mutex;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub use unique_id::{BootstrapListener, UniqueId, PROTOCOL_VERSION, SECRET_LEN};

use frame::{Kind, WireError};
use rendezvous::VERDICT_GRACE;
use router::{broadcast_abort, Link, MemberRouter, RootRouter, Shared};

use crate::error::{Error, ErrorKind, Result};

/// A check a waiting rendezvous runs every few tens of milliseconds: an error ends the wait at
/// once with that error (for example: the group that started this rendezvous already knows a
/// member died, so waiting for it until the deadline would be pointless).
pub type Watch<'a> = &'a (dyn Fn() -> Result<()> + Sync);

/// A watch that never objects.
pub fn unwatched() -> Result<()> {
    Ok(())
}

/// The collective operations, as numbered on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
enum Collective {
    Allgather = 1,
    Broadcast = 2,
    Barrier = 3,
}

impl Collective {
    fn name(self) -> &'static str {
        match self {
            Collective::Allgather => "allgather",
            Collective::Broadcast => "broadcast",
            Collective::Barrier => "barrier",
        }
    }

    fn name_of(op: u8) -> String {
        match op {
            1 => "allgather".into(),
            2 => "broadcast".into(),
            3 => "barrier".into(),
            other => format!("unknown collective {other}"),
        }
    }
}

/// A connected control plane of one group: this process is `rank` of `size`.
///
/// All methods take `&self`; collectives from several threads are serialized (but every rank
/// must still issue the same collectives in the same order). Dropping the plane closes it:
/// peers see a clean goodbye, not a lost peer.
#[derive(Debug)]
pub struct ControlPlane {
    rank: usize,
    size: usize,
    timeout: Duration,
    collective_sequence: Mutex<u64>,
    shared: Arc<Shared>,
    network: Option<Network>,
}

#[derive(Debug)]
struct Network {
    /// Root: link to each member by rank (index 0 empty). Member: one link, to the root.
    links: Vec<Option<Arc<Link>>>,
    router: Mutex<Option<JoinHandle<()>>>,
    wake: Option<UnixStream>,
}

impl ControlPlane {
    /// Joins the group's rendezvous and returns the connected plane.
    ///
    /// Rank 0 must pass the [`BootstrapListener`] it got from [`UniqueId::create`]; the others
    /// pass `None` and connect to `id`'s endpoint (retrying until rank 0 listens). Returns when
    /// all `size` ranks have arrived, or fails at `timeout` naming the ranks that did not.
    pub fn connect(
        rank: usize,
        size: usize,
        id: &UniqueId,
        listener: Option<BootstrapListener>,
        timeout: Duration,
    ) -> Result<ControlPlane> {
        ControlPlane::connect_watched(rank, size, id, listener, timeout, &unwatched)
    }

    /// [`ControlPlane::connect`] that also gives up as soon as `watch` fails.
    pub fn connect_watched(
        rank: usize,
        size: usize,
        id: &UniqueId,
        listener: Option<BootstrapListener>,
        timeout: Duration,
        watch: Watch<'_>,
    ) -> Result<ControlPlane> {
        const OP: &str = "rendezvous";
        if size == 0 || rank >= size {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                OP,
                format!("rank {rank} is out of range for a group of {size}; need 0 <= rank < size"),
            ));
        }
        let deadline = Instant::now() + timeout;
        let shared = Arc::new(Shared::new(size));
        let network = match (rank, listener) {
            (_, _) if size == 1 => None,
            (0, Some(listener)) => {
                if listener.id() != id {
                    return Err(Error::new(
                        ErrorKind::InvalidArgument,
                        OP,
                        "the listener belongs to another unique ID; pass the listener returned \
                         together with this ID",
                    )
                    .on_rank(0));
                }
                let members = rendezvous::accept_members(listener, size, deadline, watch)?;
                Some(Network::root(&shared, members)?)
            }
            (0, None) => {
                return Err(Error::new(
                    ErrorKind::InvalidArgument,
                    OP,
                    "root rank 0 needs the listener created with the unique ID",
                )
                .on_rank(0))
            }
            (_, _) => {
                let greeted = rendezvous::greet_root(id, rank, size, deadline, watch)?;
                let connection = rendezvous::await_welcome(greeted, watch)?;
                Some(Network::member(&shared, connection)?)
            }
        };
        Ok(ControlPlane::assemble(rank, size, timeout, shared, network))
    }

    /// A member's (rank ≥ 1) rendezvous in two steps: this call connects to root rank 0 and
    /// presents itself, then returns; [`Joining::finish`] waits for everyone else. Useful to
    /// overlap the rendezvous with other start-up work.
    pub fn start_joining(
        rank: usize,
        size: usize,
        id: &UniqueId,
        timeout: Duration,
    ) -> Result<Joining> {
        if rank == 0 || rank >= size {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                "rendezvous",
                format!("start_joining is for member ranks 1..{size}, not rank {rank}"),
            ));
        }
        let deadline = Instant::now() + timeout;
        let greeted = rendezvous::greet_root(id, rank, size, deadline, &unwatched)?;
        Ok(Joining {
            greeted,
            rank,
            size,
            timeout,
        })
    }

    fn assemble(
        rank: usize,
        size: usize,
        timeout: Duration,
        shared: Arc<Shared>,
        network: Option<Network>,
    ) -> ControlPlane {
        ControlPlane {
            rank,
            size,
            timeout,
            collective_sequence: Mutex::new(0),
            shared,
            network,
        }
    }

    /// This process's rank in the group.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks in the group.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The default deadline of every call.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Gathers every rank's `data`; the result is indexed by rank. Zero-byte inputs are fine.
    pub fn allgather(&self, data: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.allgather_deadline(data, self.default_deadline())
    }

    /// [`ControlPlane::allgather`] with an explicit deadline.
    pub fn allgather_deadline(&self, data: &[u8], deadline: Instant) -> Result<Vec<Vec<u8>>> {
        let outcome = self.collective(Collective::Allgather, data, deadline, |parts| {
            encode_parts(&parts)
        })?;
        decode_parts(&outcome, self.size).ok_or_else(|| {
            self.error(
                ErrorKind::Protocol,
                "allgather",
                "root rank 0 sent a malformed allgather result",
            )
        })
    }

    /// Returns root rank 0's `data` on every rank (the other ranks' `data` is ignored).
    pub fn broadcast(&self, data: &[u8]) -> Result<Vec<u8>> {
        self.broadcast_deadline(data, self.default_deadline())
    }

    /// [`ControlPlane::broadcast`] with an explicit deadline.
    pub fn broadcast_deadline(&self, data: &[u8], deadline: Instant) -> Result<Vec<u8>> {
        let own = if self.rank == 0 { data } else { &[] };
        self.collective(Collective::Broadcast, own, deadline, |mut parts| {
            std::mem::take(&mut parts[0])
        })
    }

    /// Returns once every rank has called `barrier`.
    pub fn barrier(&self) -> Result<()> {
        self.barrier_deadline(self.default_deadline())
    }

    /// [`ControlPlane::barrier`] with an explicit deadline.
    pub fn barrier_deadline(&self, deadline: Instant) -> Result<()> {
        self.collective(Collective::Barrier, &[], deadline, |_| Vec::new())
            .map(drop)
    }

    /// Sends `data` to rank `destination` under `tag` (routed through root rank 0).
    pub fn send(&self, destination: usize, tag: u64, data: &[u8]) -> Result<()> {
        const OP: &str = "send";
        if destination >= self.size {
            return Err(self.error(
                ErrorKind::InvalidArgument,
                OP,
                &format!(
                    "destination rank {destination} is out of range for a group of {}",
                    self.size
                ),
            ));
        }
        self.check_usable(OP)?;
        if destination == self.rank {
            let data = data.to_vec();
            self.shared.update(|inbox| {
                inbox
                    .mailbox
                    .entry((self.rank, tag))
                    .or_default()
                    .push_back(data)
            });
            return Ok(());
        }
        let network = self
            .network
            .as_ref()
            .expect("a group of several ranks is networked");
        let header = send_header(self.rank, destination, tag);
        let link = if self.rank == 0 {
            &network.links[destination]
        } else {
            &network.links[0]
        };
        let link = link.as_ref().expect("links exist for every peer");
        link.send(Kind::Send, &[&header, data])
            .map_err(|e| self.lost_link(OP, e))
    }

    /// Receives the next message from rank `source` under `tag`.
    pub fn recv(&self, source: usize, tag: u64) -> Result<Vec<u8>> {
        self.recv_deadline(source, tag, self.default_deadline())
    }

    /// Receives a message from `source` under `tag` if one has arrived, without waiting.
    pub fn try_recv(&self, source: usize, tag: u64) -> Result<Option<Vec<u8>>> {
        match self.recv_deadline(source, tag, Instant::now()) {
            Ok(data) => Ok(Some(data)),
            Err(e) if e.kind() == ErrorKind::Timeout => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// [`ControlPlane::recv`] with an explicit deadline.
    pub fn recv_deadline(&self, source: usize, tag: u64, deadline: Instant) -> Result<Vec<u8>> {
        const OP: &str = "recv";
        if source >= self.size {
            return Err(self.error(
                ErrorKind::InvalidArgument,
                OP,
                &format!(
                    "source rank {source} is out of range for a group of {}",
                    self.size
                ),
            ));
        }
        let started = Instant::now();
        let received = self.shared.wait_until(deadline, |inbox| {
            if let Some(data) = inbox
                .mailbox
                .get_mut(&(source, tag))
                .and_then(|q| q.pop_front())
            {
                return Some(Ok(data));
            }
            inbox.broken.as_ref().map(|w| Err(self.rebrand(w, OP)))
        });
        received.unwrap_or_else(|| {
            Err(Error::timeout(
                OP,
                started.elapsed(),
                &format!("no message from rank {source} with tag {tag}"),
            )
            .on_rank(self.rank))
        })
    }

    /// Registers `hook` to run once, from whichever thread notices, when the plane breaks (a
    /// peer lost, collective calls mismatched …); it runs at once if the plane is broken
    /// already. The hook receives the error kind, the peer it is about (if any) and the message.
    /// Keep hooks short and non-blocking: they run on the router thread.
    pub fn on_break(&self, hook: impl Fn(ErrorKind, Option<usize>, &str) + Send + Sync + 'static) {
        self.shared.on_break(Box::new(move |wire: &WireError| {
            hook(wire.kind, wire.peer.map(|p| p as usize), &wire.message)
        }));
    }

    /// The reason the plane is broken, if it is.
    pub fn broken(&self) -> Option<Error> {
        self.check_usable("control plane").err()
    }

    /// Closes the plane: says goodbye to the peers and stops the router thread. Idempotent;
    /// also done on drop.
    pub fn close(&mut self) {
        self.shared.update(|inbox| inbox.closing = true);
        if let Some(network) = self.network.take() {
            network.close(self.rank);
        }
    }

    /// Fails if the plane is already broken.
    fn check_usable(&self, op: &str) -> Result<()> {
        // A break marked but not yet announced has its aborts still going out: wait for them,
        // so that nothing this process does about the break can overtake them.
        let broken = self
            .shared
            .wait_until(Instant::now() + VERDICT_GRACE, |inbox| {
                match &inbox.broken {
                    Some(wire) if inbox.announced => Some(Some(wire.clone())),
                    Some(_) => None,
                    None => Some(None),
                }
            })
            .unwrap_or_else(|| self.shared.update(|inbox| inbox.broken.clone()));
        match broken {
            Some(wire) => Err(self.rebrand(&wire, op)),
            None => Ok(()),
        }
    }

    /// The error for a failed write: the plane's recorded breakage if any, else a lost peer.
    fn lost_link(&self, op: &str, cause: std::io::Error) -> Error {
        if let Err(broken) = self.check_usable(op) {
            return broken;
        }
        if self.rank == 0 {
            Error::backend(op, "cannot send to a member", cause).on_rank(0)
        } else {
            Error::peer_lost(op, 0, &format!("cannot send to root rank 0: {cause}"))
                .on_rank(self.rank)
        }
    }

    fn default_deadline(&self) -> Instant {
        Instant::now() + self.timeout
    }

    fn error(&self, kind: ErrorKind, op: &str, message: &str) -> Error {
        Error::new(kind, op, message).on_rank(self.rank)
    }

    /// An error received from elsewhere, restated as a failure of `op` on this rank.
    fn rebrand(&self, wire: &WireError, op: &str) -> Error {
        let mut error = Error::new(wire.kind, op, wire.message.clone()).on_rank(self.rank);
        if let Some(peer) = wire.peer {
            error = error.with_peer(peer as usize);
        }
        error
    }

    /// Runs one collective: every rank contributes `data`; root rank 0 combines the
    /// contributions (in rank order) with `combine` and every rank returns the combined bytes.
    fn collective(
        &self,
        op: Collective,
        data: &[u8],
        deadline: Instant,
        combine: impl FnOnce(Vec<Vec<u8>>) -> Vec<u8>,
    ) -> Result<Vec<u8>> {
        let mut sequence = self.collective_sequence.lock();
        *sequence += 1;
        let Some(network) = &self.network else {
            return Ok(combine(vec![data.to_vec()]));
        };
        self.check_usable(op.name())?;
        if self.rank == 0 {
            self.root_collective(network, op, *sequence, data, deadline, combine)
        } else {
            self.member_collective(network, op, *sequence, data, deadline)
        }
    }

    fn root_collective(
        &self,
        network: &Network,
        op: Collective,
        sequence: u64,
        data: &[u8],
        deadline: Instant,
        combine: impl FnOnce(Vec<Vec<u8>>) -> Vec<u8>,
    ) -> Result<Vec<u8>> {
        let started = Instant::now();
        let size = self.size;
        let gathered = self.shared.wait_until(deadline, |inbox| {
            if let Some(wire) = &inbox.broken {
                // Not before the break is announced (its aborts have gone out): see check_usable.
                return inbox.announced.then(|| Err(self.rebrand(wire, op.name())));
            }
            if let Some(left) =
                (1..size).find(|&r| inbox.departed[r] && inbox.contributions[r].is_empty())
            {
                return Some(Err(Error::peer_lost(
                    op.name(),
                    left,
                    "it closed its control plane before joining this collective",
                )
                .on_rank(0)));
            }
            if (1..size).all(|r| !inbox.contributions[r].is_empty()) {
                let parts: Vec<_> = (1..size)
                    .map(|r| inbox.contributions[r].pop_front().expect("checked"))
                    .collect();
                return Some(Ok(parts));
            }
            None
        });
        let verdict = match gathered {
            None => {
                let missing = self.shared.update(|inbox| {
                    (1..size)
                        .filter(|&r| inbox.contributions[r].is_empty())
                        .collect::<Vec<_>>()
                });
                Err(Error::timeout(
                    op.name(),
                    started.elapsed(),
                    &format!(
                        "ranks {missing:?} did not join {} #{sequence} of a group of {size}",
                        op.name()
                    ),
                )
                .on_rank(0))
            }
            Some(Err(error)) => Err(error),
            Some(Ok(contributions)) => self
                .check_same_call(op, sequence, &contributions)
                .map(|()| contributions),
        };
        // The verdict becomes final under the inbox lock, so a break noticed by the router at
        // the same moment is ordered before it (this collective fails everywhere) or after it
        // (every member still receives this outcome: the abort says it was completed).
        let verdict = verdict.and_then(|contributions| {
            self.shared.update(|inbox| match &inbox.broken {
                Some(wire) => Err(self.rebrand(wire, op.name())),
                None => {
                    inbox.completed = sequence;
                    Ok(contributions)
                }
            })
        });
        let contributions = match verdict {
            Ok(contributions) => contributions,
            Err(error) => {
                let (wire, completed) = self.shared.break_with(&error);
                broadcast_abort(&network.links, &wire, completed, None);
                return Err(error);
            }
        };
        let mut parts = Vec::with_capacity(size);
        parts.push(data.to_vec());
        parts.extend(contributions.into_iter().map(|c| c.data));
        let combined = combine(parts);
        let header = outcome_header(sequence);
        for link in network.links.iter().flatten() {
            // A member that cannot be reached is dead; its hang-up breaks the plane for the
            // next call, and this call's result is still right for everyone else.
            let _ = link.send(Kind::Outcome, &[&header, &combined]);
        }
        Ok(combined)
    }

    fn check_same_call(
        &self,
        op: Collective,
        sequence: u64,
        contributions: &[router::Contribution],
    ) -> Result<()> {
        let differs = contributions
            .iter()
            .any(|c| c.op != op as u8 || c.sequence != sequence);
        if !differs {
            return Ok(());
        }
        let mut calls: Vec<(String, Vec<usize>)> = Vec::new();
        let described = std::iter::once((0, op as u8, sequence)).chain(
            contributions
                .iter()
                .enumerate()
                .map(|(i, c)| (i + 1, c.op, c.sequence)),
        );
        for (rank, call_op, call_sequence) in described {
            let call = format!("{} #{call_sequence}", Collective::name_of(call_op));
            match calls.iter_mut().find(|(c, _)| *c == call) {
                Some((_, ranks)) => ranks.push(rank),
                None => calls.push((call, vec![rank])),
            }
        }
        let listing: Vec<String> = calls
            .iter()
            .map(|(call, ranks)| format!("ranks {ranks:?} called {call}"))
            .collect();
        Err(Error::new(
            ErrorKind::Protocol,
            op.name(),
            format!(
                "collective calls differ across ranks: {}; every rank must make the same \
                 collective calls in the same order",
                listing.join(", ")
            ),
        )
        .on_rank(0))
    }

    fn member_collective(
        &self,
        network: &Network,
        op: Collective,
        sequence: u64,
        data: &[u8],
        deadline: Instant,
    ) -> Result<Vec<u8>> {
        let started = Instant::now();
        let mut header = [0u8; 9];
        header[0] = op as u8;
        header[1..].copy_from_slice(&sequence.to_le_bytes());
        let root = network.links[0].as_ref().expect("a member has a root link");
        root.send(Kind::Contribute, &[&header, data])
            .map_err(|e| self.lost_link(op.name(), e))?;
        let outcome = self.shared.wait_until(deadline + VERDICT_GRACE, |inbox| {
            if let Some(outcome) = inbox.outcomes.pop_front() {
                return Some(Ok(outcome));
            }
            if let Some(wire) = &inbox.broken {
                if inbox.broken_after >= sequence && !inbox.root_gone {
                    // Root rank 0 completed this collective before the break: the outcome
                    // is on its way.
                    return None;
                }
                return Some(Err(self.rebrand(wire, op.name())));
            }
            if inbox.root_departed {
                return Some(Err(Error::peer_lost(
                    op.name(),
                    0,
                    "root rank 0 closed its control plane",
                )
                .on_rank(self.rank)));
            }
            None
        });
        let outcome = match outcome {
            Some(outcome) => outcome?,
            None => {
                return Err(Error::timeout(
                    op.name(),
                    started.elapsed(),
                    &format!("root rank 0 did not complete {} #{sequence}", op.name()),
                )
                .on_rank(self.rank))
            }
        };
        if outcome.sequence != sequence {
            return Err(self.error(
                ErrorKind::Protocol,
                op.name(),
                &format!(
                    "root rank 0 answered collective #{} while this rank waits for #{sequence}",
                    outcome.sequence
                ),
            ));
        }
        outcome
            .result
            .map_err(|wire| self.rebrand(&wire, op.name()))
    }
}

/// A member that has presented itself to root rank 0; see [`ControlPlane::start_joining`].
#[derive(Debug)]
pub struct Joining {
    greeted: rendezvous::Greeted,
    rank: usize,
    size: usize,
    timeout: Duration,
}

impl Joining {
    /// Waits until every rank has arrived and returns the connected plane.
    pub fn finish(self) -> Result<ControlPlane> {
        let connection = rendezvous::await_welcome(self.greeted, &unwatched)?;
        let shared = Arc::new(Shared::new(self.size));
        let network = Network::member(&shared, connection)?;
        Ok(ControlPlane::assemble(
            self.rank,
            self.size,
            self.timeout,
            shared,
            Some(network),
        ))
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.close();
    }
}

impl Network {
    fn root(shared: &Arc<Shared>, members: Vec<rendezvous::Connection>) -> Result<Network> {
        const OP: &str = "rendezvous";
        let mut links = vec![None];
        let mut readers = vec![None];
        for member in members {
            let writer = member.stream.try_clone().map_err(|e| {
                Error::backend(OP, "cannot clone a member connection", e).on_rank(0)
            })?;
            links.push(Some(Arc::new(Link::new(writer, 1))));
            readers.push(Some((member.stream, member.decoder)));
        }
        let (wake_here, wake_router) = UnixStream::pair().map_err(|e| {
            Error::backend(OP, "cannot create the router's wake-up socket", e).on_rank(0)
        })?;
        let router = RootRouter {
            shared: Arc::clone(shared),
            links: links.clone(),
            readers,
            wake: wake_router,
        };
        let handle = spawn_router(move || router.run())?;
        Ok(Network {
            links,
            router: Mutex::new(Some(handle)),
            wake: Some(wake_here),
        })
    }

    fn member(shared: &Arc<Shared>, connection: rendezvous::Connection) -> Result<Network> {
        let writer = connection
            .stream
            .try_clone()
            .map_err(|e| Error::backend("rendezvous", "cannot clone the root connection", e))?;
        let router = MemberRouter {
            shared: Arc::clone(shared),
            stream: connection.stream,
            decoder: connection.decoder,
        };
        let handle = spawn_router(move || router.run())?;
        Ok(Network {
            links: vec![Some(Arc::new(Link::new(writer, 1)))],
            router: Mutex::new(Some(handle)),
            wake: None,
        })
    }

    fn close(mut self, rank: usize) {
        if rank == 0 {
            if let Some(wake) = self.wake.as_mut() {
                router::wake(wake);
            }
            join_router(&self.router);
            for link in self.links.iter().flatten() {
                link.close();
            }
        } else {
            for link in self.links.iter().flatten() {
                link.close();
            }
            join_router(&self.router);
        }
    }
}

fn spawn_router(run: impl FnOnce() + Send + 'static) -> Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("hm-control".into())
        .spawn(run)
        .map_err(|e| {
            Error::backend(
                "rendezvous",
                "cannot start the control-plane router thread",
                e,
            )
        })
}

fn join_router(router: &Mutex<Option<JoinHandle<()>>>) {
    if let Some(handle) = router.lock().take() {
        let _ = handle.join();
    }
}

fn send_header(source: usize, destination: usize, tag: u64) -> [u8; 16] {
    let mut header = [0u8; 16];
    header[0..4].copy_from_slice(&(source as u32).to_le_bytes());
    header[4..8].copy_from_slice(&(destination as u32).to_le_bytes());
    header[8..16].copy_from_slice(&tag.to_le_bytes());
    header
}

fn outcome_header(sequence: u64) -> [u8; 9] {
    let mut header = [0u8; 9];
    header[..8].copy_from_slice(&sequence.to_le_bytes());
    header
}

/// Encodes parts as: count u32, then each length u32, then the bytes.
fn encode_parts(parts: &[Vec<u8>]) -> Vec<u8> {
    let total: usize = parts.iter().map(Vec::len).sum();
    let mut out = Vec::with_capacity(4 + 4 * parts.len() + total);
    out.extend_from_slice(&(parts.len() as u32).to_le_bytes());
    for part in parts {
        out.extend_from_slice(&(part.len() as u32).to_le_bytes());
    }
    for part in parts {
        out.extend_from_slice(part);
    }
    out
}

fn decode_parts(bytes: &[u8], expected: usize) -> Option<Vec<Vec<u8>>> {
    let count = u32::from_le_bytes(bytes.get(0..4)?.try_into().ok()?) as usize;
    if count != expected {
        return None;
    }
    let mut offset = 4 + 4 * count;
    let mut parts = Vec::with_capacity(count);
    for i in 0..count {
        let at = 4 + 4 * i;
        let len = u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?) as usize;
        parts.push(bytes.get(offset..offset + len)?.to_vec());
        offset += len;
    }
    (offset == bytes.len()).then_some(parts)
}

/// Locks a std mutex, recovering the data if a panicking thread poisoned it.
pub(crate) fn lock_unpoisoned<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_round_trip() {
        let parts = vec![vec![], vec![1, 2, 3], vec![9; 1000]];
        assert_eq!(decode_parts(&encode_parts(&parts), 3), Some(parts));
        assert_eq!(decode_parts(&encode_parts(&[vec![1]]), 2), None);
    }
}
