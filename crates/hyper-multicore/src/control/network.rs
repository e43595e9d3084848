//! The sockets of a control plane: the links to the peers (root rank 0: one per member;
//! a member: one to the root) and the router thread that reads them.

use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::Mutex;

use super::rendezvous;
use super::router::{self, Link, MemberRouter, RootRouter, Shared};
use crate::error::{Error, Result};

#[derive(Debug)]
pub(super) struct Network {
    /// Root: link to each member by rank (index 0 empty). Member: one link, to the root.
    pub(super) links: Vec<Option<Arc<Link>>>,
    router: Mutex<Option<JoinHandle<()>>>,
    wake: Option<UnixStream>,
}

impl Network {
    pub(super) fn root(
        shared: &Arc<Shared>,
        members: Vec<rendezvous::Connection>,
    ) -> Result<Network> {
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

    pub(super) fn member(
        shared: &Arc<Shared>,
        connection: rendezvous::Connection,
    ) -> Result<Network> {
        let writer = connection
            .stream
            .try_clone()
            .map_err(|e| Error::backend("rendezvous", "cannot clone the root connection", e))?;
        let link = Arc::new(Link::new(writer, 1));
        let router = MemberRouter {
            shared: Arc::clone(shared),
            stream: connection.stream,
            decoder: connection.decoder,
            link: Arc::clone(&link),
        };
        let handle = spawn_router(move || router.run())?;
        Ok(Network {
            links: vec![Some(link)],
            router: Mutex::new(Some(handle)),
            wake: None,
        })
    }

    pub(super) fn close(mut self, rank: usize) {
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
