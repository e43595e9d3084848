//! The collectives of a control plane — allgather, broadcast, barrier — run as one protocol:
//! every rank contributes, root rank 0 combines the contributions in rank order and sends the
//! outcome (or the reason the collective failed) to every member.

use std::time::Instant;

use super::frame::Kind;
use super::network::Network;
use super::rendezvous::VERDICT_GRACE;
use super::router::{self, broadcast_abort};
use super::ControlPlane;
use crate::error::{Error, ErrorKind, Result};

/// The collective operations, as numbered on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(super) enum Collective {
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
impl ControlPlane {
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

pub(super) fn outcome_header(sequence: u64) -> [u8; 9] {
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
