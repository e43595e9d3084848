//! Point-to-point messages of a control plane: tagged, routed through root rank 0, received in
//! order per (source, tag).

use std::sync::Arc;
use std::time::Instant;

use super::frame::Kind;
use super::router::Link;
use super::ControlPlane;
use crate::error::{Error, ErrorKind, Result};

impl ControlPlane {
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
        let link =
            link_to(&network.links, self.rank, destination).expect("links exist for every peer");
        link.send(Kind::Send, &[&header, data])
            .map_err(|e| self.lost_link(OP, e))
    }

    /// Root rank 0 only: sends `data` under `tag` to every rank of `destinations` in one step
    /// that a break of the plane cannot split. Either the plane is whole, and every message is
    /// on its link before the aborts of any later break (so each destination alive to read it
    /// receives it: a receiver looks at its mailbox before at the break), or the plane has
    /// broken and none goes out. A release that one destination may act on at once (leave a
    /// barrier, then die) needs this: the others must still be released.
    pub(crate) fn send_to_all(&self, destinations: &[usize], tag: u64, data: &[u8]) -> Result<()> {
        const OP: &str = "send";
        assert_eq!(self.rank, 0, "only root rank 0 has a link to every rank");
        self.check_usable(OP)?;
        let Some(network) = &self.network else {
            return Ok(());
        };
        // The router marks a break under the inbox lock before it sends the aborts: holding the
        // lock orders every message here before them, or the break before all of them.
        let sent = self.shared.update(|inbox| {
            if inbox.broken.is_some() {
                return false;
            }
            for &destination in destinations {
                let header = send_header(0, destination, tag);
                if let Some(link) = &network.links[destination] {
                    // A destination that cannot be reached is dead; its hang-up breaks the
                    // plane for the next call, and the others are released all the same.
                    let _ = link.send(Kind::Send, &[&header, data]);
                }
            }
            true
        });
        match sent {
            true => Ok(()),
            false => Err(self.check_usable(OP).expect_err("the plane broke")),
        }
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
}

/// The link a message from `rank` to `destination` leaves on (every message goes through root
/// rank 0): root rank 0's link to the destination, or a member's one link, to the root.
pub(super) fn link_to(
    links: &[Option<Arc<Link>>],
    rank: usize,
    destination: usize,
) -> Option<&Arc<Link>> {
    match rank {
        0 => links.get(destination)?.as_ref(),
        _ => links.first()?.as_ref(),
    }
}

pub(super) fn send_header(source: usize, destination: usize, tag: u64) -> [u8; 16] {
    let mut header = [0u8; 16];
    header[0..4].copy_from_slice(&(source as u32).to_le_bytes());
    header[4..8].copy_from_slice(&(destination as u32).to_le_bytes());
    header[8..16].copy_from_slice(&tag.to_le_bytes());
    header
}
