//! The sockets of a control plane: the links to the peers (root rank 0: one per member;
//! a member: one to the root) and the router thread that reads them.

use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::Mutex;

use super::host_watch::HostSide;
use super::hosts::HostMap;
use super::liveness::{Liveness, Watchdog, Watched};
use super::rendezvous;
use super::router::{self, Link, MemberRouter, RootRouter, Shared};
use crate::error::{Error, Result};

#[derive(Debug)]
pub(super) struct Network {
    /// Root: link to each member by rank (index 0 empty). Member: one link, to the root.
    pub(super) links: Vec<Option<Arc<Link>>>,
    router: Mutex<Option<JoinHandle<()>>>,
    wake: Option<UnixStream>,
    /// Heartbeats and the silence deadline (none with liveness off).
    watchdog: Option<Watchdog>,
    /// What the router and the watchdog heard (read by tests through
    /// [`super::ControlPlane::heartbeats_received`]).
    #[cfg(feature = "fault-injection")]
    pub(super) liveness: Arc<Liveness>,
}

impl Network {
    /// Root rank 0's sockets; `side` is its part in its host's liveness, `peer_timeout` the
    /// liveness deadline (`None`: off).
    pub(super) fn root(
        shared: &Arc<Shared>,
        members: Vec<rendezvous::Connection>,
        hosts: HostMap,
        side: HostSide,
        peer_timeout: Option<std::time::Duration>,
    ) -> Result<Network> {
        const OP: &str = "rendezvous";
        let mut links = vec![None];
        let mut readers = vec![None];
        let mut probes = vec![None];
        for member in members {
            let clone = || {
                member.stream.try_clone().map_err(|e| {
                    Error::backend(OP, "cannot clone a member connection", e).on_rank(0)
                })
            };
            links.push(Some(Arc::new(Link::new(clone()?, member.next_sequence))));
            probes.push(Some(clone()?));
            readers.push(Some((member.stream, member.decoder)));
        }
        let liveness = Arc::new(Liveness::new(hosts));
        let (wake_here, wake_router) = UnixStream::pair().map_err(|e| {
            Error::backend(OP, "cannot create the router's wake-up socket", e).on_rank(0)
        })?;
        let router = RootRouter {
            shared: Arc::clone(shared),
            links: links.clone(),
            readers,
            wake: wake_router,
            liveness: Arc::clone(&liveness),
        };
        let handle = spawn_router(move || router.run())?;
        let network = Network {
            links: links.clone(),
            router: Mutex::new(Some(handle)),
            wake: Some(wake_here),
            watchdog: None,
            #[cfg(feature = "fault-injection")]
            liveness: Arc::clone(&liveness),
        };
        let watched = Watched {
            rank: 0,
            links,
            probes,
            side,
            shared: Arc::clone(shared),
            liveness,
        };
        network.watched_by(watched, peer_timeout, 0)
    }

    /// Member `rank`'s socket to root rank 0; `side` and `peer_timeout` as for
    /// [`Network::root`].
    pub(super) fn member(
        shared: &Arc<Shared>,
        connection: rendezvous::Connection,
        rank: usize,
        hosts: HostMap,
        side: HostSide,
        peer_timeout: Option<std::time::Duration>,
    ) -> Result<Network> {
        let writer = connection
            .stream
            .try_clone()
            .map_err(|e| Error::backend("rendezvous", "cannot clone the root connection", e))?;
        let probe = connection
            .stream
            .try_clone()
            .map_err(|e| Error::backend("rendezvous", "cannot clone the root connection", e))?;
        let link = Arc::new(Link::new(writer, connection.next_sequence));
        let liveness = Arc::new(Liveness::new(hosts));
        let router = MemberRouter {
            shared: Arc::clone(shared),
            stream: connection.stream,
            decoder: connection.decoder,
            link: Arc::clone(&link),
            liveness: Arc::clone(&liveness),
        };
        let handle = spawn_router(move || router.run())?;
        let network = Network {
            links: vec![Some(Arc::clone(&link))],
            router: Mutex::new(Some(handle)),
            wake: None,
            watchdog: None,
            #[cfg(feature = "fault-injection")]
            liveness: Arc::clone(&liveness),
        };
        let watched = Watched {
            rank,
            links: vec![Some(link)],
            probes: vec![Some(probe)],
            side,
            shared: Arc::clone(shared),
            liveness,
        };
        network.watched_by(watched, peer_timeout, rank)
    }

    /// Starts the plane's watchdog; a failure to start it closes the plane.
    fn watched_by(
        mut self,
        watched: Watched,
        peer_timeout: Option<std::time::Duration>,
        rank: usize,
    ) -> Result<Network> {
        match Watchdog::start(watched, peer_timeout) {
            Ok(watchdog) => {
                self.watchdog = watchdog;
                Ok(self)
            }
            Err(error) => {
                self.close(rank);
                Err(error.on_rank(rank))
            }
        }
    }

    pub(super) fn close(mut self, rank: usize) {
        if let Some(watchdog) = self.watchdog.take() {
            watchdog.stop();
        }
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

pub(super) fn spawn_router(run: impl FnOnce() + Send + 'static) -> Result<JoinHandle<()>> {
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

pub(super) fn join_router(router: &Mutex<Option<JoinHandle<()>>>) {
    if let Some(handle) = router.lock().take() {
        let _ = handle.join();
    }
}
