//! The UCX transport's stand-in in builds without the `ucx` cargo feature (or under loom): it
//! cannot be constructed, and starting it fails with an error saying how to get the real one.

use std::convert::Infallible;
use std::ptr::NonNull;

use super::{Rmw, Start, Transport, Width};
use crate::error::{Error, ErrorKind, Result};
use crate::sys::mapping::{LocalSource, LocalTarget};
use crate::transport::sync;

/// Uninhabited: there is no UCX transport in this build.
#[derive(Debug)]
pub(crate) enum UcxTransport {}

/// How an operation reaches one remote peer: its root rank.
pub(crate) type UcxPeer = usize;

impl Transport for UcxTransport {
    type Prepared = Infallible;
    type Peer = UcxPeer;

    fn prepare(_: &Start<'_>) -> Result<Infallible> {
        Err(Error::new(
            ErrorKind::Unsupported,
            "initialize",
            format!(
                "some peers are reached through UCX (other hosts, or {}=ucx), but this build has \
                 no UCX transport; build hyper-multicore with its default feature `ucx` \
                 (needs libucx-dev), or run every PE of the root on one host",
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

    fn peer(&self, _: usize) -> Option<UcxPeer> {
        match *self {}
    }

    fn put(&self, _: UcxPeer, _: usize, _: LocalSource<'_>) -> Result<()> {
        match *self {}
    }

    fn get(&self, _: UcxPeer, _: usize, _: LocalTarget<'_>) -> Result<()> {
        match *self {}
    }

    fn atomic(&self, _: UcxPeer, _: usize, _: Width, _: Rmw) -> Result<u64> {
        match *self {}
    }

    fn signal(&self, _: UcxPeer, _: usize, _: Width, _: bool, _: u64) -> Result<()> {
        match *self {}
    }

    fn fence(&self) -> Result<()> {
        match *self {}
    }

    fn quiet(&self) -> Result<()> {
        match *self {}
    }

    fn local_ptr(&self, _: UcxPeer, _: usize) -> Option<NonNull<u8>> {
        match *self {}
    }
}

/// Uninhabited, as the transport (see the real `Awaited`).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Awaited {}

/// Never made (no UCX transport in this build).
pub(crate) struct Looks<'a>(&'a UcxTransport);

impl<'a> Looks<'a> {
    pub(crate) fn new(ucx: &'a UcxTransport) -> Self {
        match *ucx {}
    }

    /// Never called: there is no UCX transport to progress in this build.
    pub(crate) fn progress(&self) {
        match *self.0 {}
    }
}

/// Never used (no UCX transport in this build).
impl sync::Serving for &Looks<'_> {
    fn begin(&mut self) {
        match *self.0 {}
    }

    fn end(&mut self, _hand_over: bool) {
        match *self.0 {}
    }
}

impl UcxTransport {
    /// Never called (no UCX transport in this build).
    pub(crate) fn send_exchange(
        &self,
        _: UcxPeer,
        _: u64,
        _: &[u8],
        _: std::time::Instant,
    ) -> Result<Awaited> {
        match *self {}
    }

    /// Never called (no UCX transport in this build).
    pub(crate) fn take_exchange(&self, awaited: Awaited) -> Option<Vec<u8>> {
        match awaited {}
    }
}
