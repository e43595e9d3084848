//! Collectives of a root spanning several locality groups (other hosts, or every PE on the
//! network route): the hierarchical barrier, the two-rank exchange and the gathered call words
//! of a collective allocate or free. The one-group root never comes here: its barrier and
//! argument check stay in shared memory.

use std::time::Instant;

use super::runtime::Shmem;
use crate::error::{Error, ErrorKind, Result};
use crate::transport::sync::Deadline;
use crate::transport::{word_of, words_header};

/// The control-plane tag of the leaders' messages in a spanning barrier (no other user of a
/// runtime's control plane sends point-to-point messages but these two).
const LEADERS_BARRIER_TAG: u64 = u64::from_be_bytes(*b"hm-lbarr");
/// The control-plane tag of the call words two ranks exchange in [`Shmem::gather_call_words`].
const CALL_WORDS_TAG: u64 = u64::from_be_bytes(*b"hm-callw");

impl Shmem {
    /// The barrier of a root spanning several locality groups, hierarchical: every transport's
    /// operations complete (quiet); the PEs of each group meet in their segment's shared-memory
    /// barrier; the groups' leaders (lowest ranks) meet over the control plane — each sends
    /// root rank 0 (the first leader) one message and waits for its answer, which rank 0 sends
    /// once it has heard from every leader (two leaders just trade one message each); then each
    /// group meets again in shared memory, which releases the PEs that are not leaders.
    /// Everything a PE put before it is visible after it: each quieted before its group's first
    /// meeting, which precedes its leader's message.
    #[cold]
    #[inline(never)]
    pub(crate) fn spanning_barrier(&self, operation: &str) -> Result<()> {
        self.transport
            .quiet()
            .map_err(|e| as_operation(e, operation).on_rank(self.rank))?;
        let deadline = Instant::now() + self.config.timeout;
        // A group of one PE (the only PE on its host, or any PE on the UCX route) has nobody
        // to meet in shared memory.
        let alone = self.transport.group().len() == 1;
        if !alone {
            self.segment_barrier(operation, Deadline::At(deadline))?;
        }
        self.leaders_barrier(deadline)
            .map_err(|e| as_operation(e, operation).on_rank(self.rank))?;
        if alone {
            return Ok(());
        }
        self.segment_barrier(operation, Deadline::At(deadline))
    }

    /// The leaders' part of [`Shmem::spanning_barrier`] (nothing for a PE that leads no group).
    /// Two leaders (two hosts) each tell the other and wait for the other's word: one message's
    /// time, against two for a round through root rank 0, which more leaders need.
    fn leaders_barrier(&self, deadline: Instant) -> Result<()> {
        let leaders = self.transport.leaders();
        if !leaders.contains(&self.rank) {
            return Ok(());
        }
        if let &[first, second] = leaders {
            let other = if self.rank == first { second } else { first };
            return self
                .exchange(other, LEADERS_BARRIER_TAG, &[], deadline)
                .map(drop);
        }
        if self.rank == leaders[0] {
            for &leader in &leaders[1..] {
                self.plane
                    .recv_deadline(leader, LEADERS_BARRIER_TAG, deadline)?;
            }
            // One step the loss of a leader that leaves at once cannot split (see send_to_all).
            self.plane
                .send_to_all(&leaders[1..], LEADERS_BARRIER_TAG, &[])
        } else {
            self.plane.send(leaders[0], LEADERS_BARRIER_TAG, &[])?;
            self.plane
                .recv_deadline(leaders[0], LEADERS_BARRIER_TAG, deadline)
                .map(drop)
        }
    }

    /// Sends `data` to rank `other` under `tag` and returns what `other` sent this rank under
    /// it (each side's message is on its way before either waits). Through the network
    /// transport when `other` is on the network route: this PE's thread then takes the message
    /// from the transport itself while it waits, with no hand-off through the control plane's
    /// router thread.
    fn exchange(&self, other: usize, tag: u64, data: &[u8], deadline: Instant) -> Result<Vec<u8>> {
        let Some(reached) = self.transport.network_to(other) else {
            self.plane.send(other, tag, data)?;
            return self.plane.recv_deadline(other, tag, deadline);
        };
        let (network, peer) = reached?;
        let exchange = network.send_exchange(peer, tag, data, deadline)?;
        let mut message = None;
        // A wait may look again after a look that succeeded: the message is taken only once.
        let look = || {
            if message.is_none() {
                message = network.take_exchange(exchange);
            }
            message.is_some()
        };
        let outcome = self.transport.wait_message(look, self.spin, deadline);
        self.wait_outcome("exchange", outcome, || {
            format!("waiting for rank {other}'s message")
        })?;
        Ok(message.expect("the wait ended because the message arrived"))
    }

    /// Every rank's published words of a collective heap call, over the control plane (a root
    /// spanning several groups has no argument slots every rank can read): an allgather, or
    /// with two ranks one message each way.
    pub(crate) fn gather_call_words(
        &self,
        operation: &str,
        stamped: [u64; 4],
    ) -> Result<Vec<[u64; 4]>> {
        self.transport.quiet().map_err(|e| e.on_rank(self.rank))?;
        let bytes = words_header(stamped);
        let words_of = |part: &[u8]| -> Result<[u64; 4]> {
            let words: Option<[u64; 4]> =
                (part.len() == 32).then(|| std::array::from_fn(|i| word_of(part, i)));
            words.ok_or_else(|| {
                Error::new(
                    ErrorKind::Protocol,
                    operation,
                    format!(
                        "a rank published {} bytes of call words, not 32",
                        part.len()
                    ),
                )
                .on_rank(self.rank)
            })
        };
        let failed = |e| as_operation(e, operation).on_rank(self.rank);
        if self.size == 2 {
            // Two ranks trade their words directly: one message's time, not a round.
            let other = 1 - self.rank;
            let deadline = Instant::now() + self.config.timeout;
            let theirs = self
                .exchange(other, CALL_WORDS_TAG, &bytes, deadline)
                .map_err(failed)?;
            let theirs = words_of(&theirs)?;
            return Ok(match self.rank {
                0 => vec![stamped, theirs],
                _ => vec![theirs, stamped],
            });
        }
        let parts = self.plane.allgather(&bytes).map_err(failed)?;
        parts.iter().map(|part| words_of(part)).collect()
    }
}

/// `error` as a failure of `operation` (keeping its kind, message and lost peer).
fn as_operation(error: Error, operation: &str) -> Error {
    let renamed = Error::new(error.kind(), operation, error.message());
    match error.peer() {
        Some(peer) => renamed.with_peer(peer),
        None => renamed,
    }
}
