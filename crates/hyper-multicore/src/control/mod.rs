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

mod channel;
mod collectives;
pub(crate) mod converge;
pub mod frame;
pub(crate) mod global_exit;
mod host_watch;
mod hosts;
mod liveness;
mod network;
mod point_to_point;
mod progress;
mod rendezvous;
mod router;
pub(crate) mod unique_id;

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

pub use channel::{ChannelMode, GroupChannel};
pub use hosts::TEST_HOST_VARIABLE;
pub(crate) use progress::Progress;
pub(crate) use router::{Nudger, ServeRequester, SpinWork};
pub use unique_id::{BootstrapListener, UniqueId, PROTOCOL_VERSION, SECRET_LEN};

use frame::WireError;
use network::Network;
pub(crate) use rendezvous::VERDICT_GRACE;
use router::Shared;

use crate::error::{Error, ErrorKind, Result};

/// A check a waiting rendezvous runs every few tens of milliseconds: an error ends the wait at
/// once with that error (for example: the group that started this rendezvous already knows a
/// member died, so waiting for it until the deadline would be pointless).
pub type Watch<'a> = &'a (dyn Fn() -> Result<()> + Sync);

/// A watch that never objects.
pub fn unwatched() -> Result<()> {
    Ok(())
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
impl ControlPlane {
    /// Makes every waiter of this plane run `work` while it spins (replacing any earlier work)
    /// until the returned value drops.
    pub(crate) fn while_spinning(&self, work: Arc<dyn Progress>) -> SpinWork {
        self.shared.while_spinning(work)
    }

    /// What asks a peer's process to serve this plane's spin work now (see
    /// [`ServeRequester`]); None for a plane of one rank.
    pub(crate) fn serve_requester(&self) -> Option<ServeRequester> {
        let network = self.network.as_ref()?;
        Some(ServeRequester::new(
            self.rank,
            self.size,
            network.links.clone(),
        ))
    }

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
        let peer_timeout = crate::config::peer_timeout_from_env()?;
        let bound = host_watch::Bound::when_watched(id, rank, size, peer_timeout);
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
                let (members, hosts) =
                    rendezvous::accept_members(listener, size, deadline, peer_timeout, watch)?;
                let side = host_watch::Bound::side(bound, &hosts);
                Some(Network::root(&shared, members, hosts, side, peer_timeout)?)
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
                let (connection, hosts) = rendezvous::await_welcome(greeted, peer_timeout, watch)?;
                let side = host_watch::Bound::side(bound, &hosts);
                Some(Network::member(
                    &shared,
                    connection,
                    rank,
                    hosts,
                    side,
                    peer_timeout,
                )?)
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
        let peer_timeout = crate::config::peer_timeout_from_env()?;
        let bound = host_watch::Bound::when_watched(id, rank, size, peer_timeout);
        let greeted = rendezvous::greet_root(id, rank, size, deadline, &unwatched)?;
        Ok(Joining {
            greeted,
            bound,
            peer_timeout,
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

    /// Registers `hook` to run once, from whichever thread notices, when the plane breaks (a
    /// peer lost, collective calls mismatched …); it runs at once if the plane is broken
    /// already. The hook receives the error kind, the peer it is about (if any) and the message.
    /// Keep hooks short and non-blocking: they run on the router thread.
    pub fn on_break(&self, hook: impl Fn(ErrorKind, Option<usize>, &str) + Send + Sync + 'static) {
        self.shared.on_break(Box::new(move |wire: &WireError| {
            hook(wire.kind, wire.peer.map(|p| p as usize), &wire.message)
        }));
    }

    /// Test-only (`fault-injection` builds): on root rank 0, the heartbeat frames received from
    /// each rank so far — across hosts only each host's leader (its lowest rank) beats to root
    /// rank 0; empty on a member or in a plane of one rank.
    #[cfg(feature = "fault-injection")]
    pub fn heartbeats_received(&self) -> Vec<u64> {
        match &self.network {
            Some(network) if self.rank == 0 => network.liveness.heartbeats(),
            _ => Vec::new(),
        }
    }

    /// The reason the plane is broken, if it is.
    pub fn broken(&self) -> Option<Error> {
        self.check_usable("control plane").err()
    }

    /// The reason the plane is broken, waiting up to `grace` for one: for a caller that learnt
    /// of a loss another way (a same-host PE's shared abort word) and wants this plane's own,
    /// more precise report — which names the lost host — as it arrives moments later.
    pub(crate) fn broken_within(&self, grace: Duration) -> Option<Error> {
        announced_break(&self.shared, grace).map(|wire| self.rebrand(&wire, "control plane"))
    }

    /// [`ControlPlane::broken_within`] for a transport, which outlives the borrow of the plane
    /// it starts with: its root's abort word tells it of a loss, and this plane's report names
    /// the lost host.
    pub(crate) fn loss_report(&self) -> LossReport {
        LossReport(Arc::clone(&self.shared))
    }

    /// On root rank 0, breaks the plane with `error` (a peer loss this process saw outside the
    /// plane, e.g. through UCX) and tells every member, unless the plane is broken already;
    /// nothing on a member. So members waiting on root rank 0 learn which rank was lost instead
    /// of waiting out their deadlines when root gives up on the loss.
    pub(crate) fn announce_loss(&self, error: &Error) {
        let Some(network) = self.network.as_ref().filter(|_| self.rank == 0) else {
            return;
        };
        if self.shared.update(|inbox| inbox.broken.is_some()) {
            return;
        }
        let (wire, completed) = self.shared.break_with(error);
        router::broadcast_abort(&network.links, &wire, completed, None);
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
}

/// A plane's report of the loss that broke it (see [`ControlPlane::loss_report`]).
pub(crate) struct LossReport(Arc<Shared>);

impl LossReport {
    /// The loss that broke the plane, waiting up to `grace` for one.
    pub(crate) fn within(&self, grace: Duration) -> Option<Error> {
        announced_break(&self.0, grace).map(|wire| wire.to_error())
    }
}

impl std::fmt::Debug for LossReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LossReport").finish_non_exhaustive()
    }
}

/// The reason `shared`'s plane broke, once announced, waiting up to `grace` for one.
fn announced_break(shared: &Shared, grace: Duration) -> Option<WireError> {
    shared.wait_until(Instant::now() + grace, |inbox| {
        inbox.broken.as_ref().filter(|_| inbox.announced).cloned()
    })
}

/// A member that has presented itself to root rank 0; see [`ControlPlane::start_joining`].
#[derive(Debug)]
pub struct Joining {
    greeted: rendezvous::Greeted,
    /// This rank's local liveness socket (none with liveness off).
    bound: Option<host_watch::Bound>,
    peer_timeout: Option<Duration>,
    rank: usize,
    size: usize,
    timeout: Duration,
}

impl Joining {
    /// Waits until every rank has arrived and returns the connected plane.
    pub fn finish(self) -> Result<ControlPlane> {
        let (connection, hosts) =
            rendezvous::await_welcome(self.greeted, self.peer_timeout, &unwatched)?;
        let side = host_watch::Bound::side(self.bound, &hosts);
        let shared = Arc::new(Shared::new(self.size));
        let network = Network::member(
            &shared,
            connection,
            self.rank,
            hosts,
            side,
            self.peer_timeout,
        )?;
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
