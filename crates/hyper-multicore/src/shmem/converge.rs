//! The converged step: every rank runs a step locally, then all ranks exchange their outcomes
//! over the control plane and reach one verdict — so a failure on any rank becomes the same
//! error on every rank, naming the failing ranks (identical failures grouped:
//! `root_ranks=[1, 3]: <kind>: <message>`).

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::control::frame::WireError;
use crate::control::ControlPlane;
use crate::error::{Error, ErrorKind, Result};

/// One rank's outcome of a step, as exchanged.
#[derive(Debug, Serialize, Deserialize)]
struct Outcome<T> {
    value: Option<T>,
    failure: Option<WireError>,
}

/// Runs the exchange of a step whose local outcome is `local`; returns every rank's value in
/// rank order, or one error on every rank if any rank failed. A failure of the exchange itself
/// (peer lost, timeout) is returned as is.
pub(crate) fn converge<T: Serialize + DeserializeOwned>(
    plane: &ControlPlane,
    operation: &str,
    local: Result<T>,
) -> Result<Vec<T>> {
    let rank = plane.rank();
    let (outcome, local_error) = match local {
        Ok(value) => (
            Outcome {
                value: Some(value),
                failure: None,
            },
            None,
        ),
        Err(error) => (
            Outcome {
                value: None,
                failure: Some(WireError::from_error(&error)),
            },
            Some(error),
        ),
    };
    let bytes = postcard::to_stdvec(&outcome).map_err(|e| {
        Error::new(
            ErrorKind::Protocol,
            operation,
            format!("cannot encode this rank's outcome: {e}"),
        )
        .on_rank(rank)
    })?;
    let gathered = plane.allgather(&bytes)?;
    let mut values = Vec::with_capacity(gathered.len());
    let mut failures: Vec<(usize, WireError)> = Vec::new();
    for (peer, bytes) in gathered.iter().enumerate() {
        let outcome: Outcome<T> = postcard::from_bytes(bytes).map_err(|e| {
            Error::new(
                ErrorKind::Protocol,
                operation,
                format!("rank {peer} sent an outcome this rank cannot decode ({e}); do all ranks run the same build?"),
            )
            .on_rank(rank)
        })?;
        match (outcome.value, outcome.failure) {
            (_, Some(failure)) => failures.push((peer, failure)),
            (Some(value), None) => values.push(value),
            (None, None) => failures.push((
                peer,
                WireError::from_error(&Error::new(ErrorKind::Protocol, operation, "empty outcome")),
            )),
        }
    }
    if failures.is_empty() {
        return Ok(values);
    }
    let kind = failures[0].1.kind;
    let mut error = Error::new(kind, operation, describe_failures(&failures)).on_rank(rank);
    if let Some(first) = failures.first() {
        if let Some(peer) = first.1.peer.map(|p| p as usize).or(Some(first.0)) {
            error = error.with_peer(peer);
        }
    }
    if let Some(cause) = local_error {
        error = error.caused_by(cause);
    }
    Err(error)
}

/// `root_ranks=[1, 3]: <kind>: <message>; root_ranks=[2]: …`, identical failures grouped.
pub(crate) fn describe_failures(failures: &[(usize, WireError)]) -> String {
    let mut groups: Vec<(Vec<usize>, &WireError)> = Vec::new();
    for (rank, failure) in failures {
        let same = groups
            .iter_mut()
            .find(|(_, f)| f.kind == failure.kind && f.message == failure.message);
        match same {
            Some((ranks, _)) => ranks.push(*rank),
            None => groups.push((vec![*rank], failure)),
        }
    }
    groups
        .iter()
        .map(|(ranks, f)| format!("root_ranks={ranks:?}: {}: {}", f.kind, f.message))
        .collect::<Vec<_>>()
        .join("; ")
}
