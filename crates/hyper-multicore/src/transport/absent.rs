//! The stand-in of a network transport whose cargo feature is off (or under loom): it cannot
//! be constructed, and starting it fails on every rank with an error saying how to get a real
//! one. `transport/mod.rs` names it in place of each transport the build lacks, so the
//! router's and [`super::network::Network`]'s code is the same in every build.

use std::convert::Infallible;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Instant;

use super::interface::{Exchange, NetPeer, NetworkTransport, Rmw, Start, Transport, Width};
use crate::control::Progress;
use crate::error::{Error, ErrorKind, Result};
use crate::sys::mapping::{LocalSource, LocalTarget};

/// Uninhabited: the network transport it stands for is not in this build.
#[derive(Debug)]
pub(crate) enum Absent {}

impl Transport for Absent {
    type Prepared = Infallible;
    type Peer = NetPeer;

    fn prepare(_: &Start<'_>) -> Result<Infallible> {
        Err(Error::new(
            ErrorKind::Unsupported,
            "initialize",
            format!(
                "some peers are on other hosts (or {}=ucx), but this build has no network \
                 transport; build hyper-multicore with its default feature `ucx` (needs \
                 libucx-dev), or run every PE of the root on one host",
                crate::config::TRANSPORT
            ),
        ))
    }

    fn publish(prepared: &Infallible) -> Vec<u8> {
        match *prepared {}
    }

    fn attach(prepared: Infallible, _: &[Vec<u8>], _: &Start<'_>) -> Result<Self> {
        match prepared {}
    }

    fn peer(&self, _: usize) -> Option<NetPeer> {
        match *self {}
    }

    fn put(&self, _: NetPeer, _: usize, _: LocalSource<'_>) -> Result<()> {
        match *self {}
    }

    fn get(&self, _: NetPeer, _: usize, _: LocalTarget<'_>) -> Result<()> {
        match *self {}
    }

    fn atomic(&self, _: NetPeer, _: usize, _: Width, _: Rmw) -> Result<u64> {
        match *self {}
    }

    fn fence(&self) -> Result<()> {
        match *self {}
    }

    fn quiet(&self) -> Result<()> {
        match *self {}
    }

    fn local_ptr(&self, _: NetPeer, _: usize) -> Option<NonNull<u8>> {
        match *self {}
    }
}

impl Progress for Absent {
    fn progress(&self) -> usize {
        match *self {}
    }

    fn begin_serving(&self) {
        match *self {}
    }

    fn end_serving(&self, _: bool) {
        match *self {}
    }
}

impl NetworkTransport for Absent {
    const NAME: &'static str = "absent";

    fn send_exchange(&self, _: NetPeer, _: u64, _: &[u8], _: Instant) -> Result<Exchange> {
        match *self {}
    }

    fn take_exchange(&self, _: Exchange) -> Option<Vec<u8>> {
        match *self {}
    }

    fn plane_work(&self) -> Arc<dyn Progress> {
        match *self {}
    }
}
