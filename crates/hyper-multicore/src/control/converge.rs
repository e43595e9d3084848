//! The converged step: every rank runs a step locally, then all ranks exchange their outcomes
//! over a group channel and reach one verdict — so a failure on any rank becomes the same error
//! on every rank, naming the failing ranks (identical failures grouped:
//! `root_ranks=[1, 3]: <kind>: <message>`). Used by initialize and by every lifecycle stage.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::control::frame::WireError;
use crate::control::GroupChannel;
use crate::error::{Error, ErrorKind, Result};

/// One rank's outcome of a step, as exchanged.
#[derive(Debug, Serialize, Deserialize)]
struct Outcome<T> {
    value: Option<T>,
    failure: Option<WireError>,
    unavailable: bool,
}

/// A local step's failure: the error, and whether it means the runtime is unusable.
#[derive(Debug)]
pub(crate) struct LocalFailure {
    pub(crate) error: Error,
    pub(crate) unavailable: bool,
}

impl From<Error> for LocalFailure {
    fn from(error: Error) -> Self {
        LocalFailure {
            error,
            unavailable: false,
        }
    }
}

/// Why a converged step did not produce values.
#[derive(Debug)]
pub(crate) enum Diverged {
    /// Some ranks failed (or values differed): the same error on every rank.
    Failed {
        /// The grouped error.
        error: Error,
        /// True if any failing rank reported the runtime unusable.
        unavailable: bool,
    },
    /// The exchange itself failed (peer lost, timeout): the ranks can no longer agree.
    Exchange(Error),
}

impl Diverged {
    /// The error, whichever way the step diverged.
    pub(crate) fn into_error(self) -> Error {
        match self {
            Diverged::Failed { error, .. } | Diverged::Exchange(error) => error,
        }
    }
}

/// [`converge_step`] without the runtime-unavailable flag or value equality, as one error.
pub(crate) fn converge<T: Serialize + DeserializeOwned + std::fmt::Debug + PartialEq>(
    channel: &dyn GroupChannel,
    operation: &str,
    local: Result<T>,
) -> Result<Vec<T>> {
    converge_step(channel, operation, local.map_err(LocalFailure::from), false)
        .map_err(Diverged::into_error)
}

/// Exchanges the local outcome of a step and returns every rank's value in rank order, or one
/// verdict on every rank. With `require_equal`, values that differ across ranks fail too.
pub(crate) fn converge_step<T: Serialize + DeserializeOwned + std::fmt::Debug + PartialEq>(
    channel: &dyn GroupChannel,
    operation: &str,
    local: std::result::Result<T, LocalFailure>,
    require_equal: bool,
) -> std::result::Result<Vec<T>, Diverged> {
    let rank = channel.rank();
    let (outcome, local_error) = match local {
        Ok(value) => (
            Outcome {
                value: Some(value),
                failure: None,
                unavailable: false,
            },
            None,
        ),
        Err(LocalFailure { error, unavailable }) => (
            Outcome {
                value: None,
                failure: Some(WireError::from_error(&error)),
                unavailable,
            },
            Some(error),
        ),
    };
    let bytes = postcard::to_stdvec(&outcome).map_err(|e| {
        Diverged::Exchange(
            Error::new(
                ErrorKind::Protocol,
                operation,
                format!("cannot encode this rank's outcome: {e}"),
            )
            .on_rank(rank),
        )
    })?;
    let gathered = channel.allgather(&bytes).map_err(|e| {
        let message = format!("the ranks could not exchange their outcomes: {e}");
        let exchange = Error::new(e.kind(), operation, message).on_rank(rank);
        Diverged::Exchange(match e.peer() {
            Some(peer) => exchange.with_peer(peer).caused_by(e),
            None => exchange.caused_by(e),
        })
    })?;
    let mut values = Vec::with_capacity(gathered.len());
    let mut failures: Vec<(usize, WireError)> = Vec::new();
    let mut unavailable = false;
    for (peer, bytes) in gathered.iter().enumerate() {
        let outcome: Outcome<T> = postcard::from_bytes(bytes).map_err(|e| {
            Diverged::Exchange(
                Error::new(
                    ErrorKind::Protocol,
                    operation,
                    format!("rank {peer} sent an outcome this rank cannot decode ({e}); do all ranks run the same build?"),
                )
                .on_rank(rank),
            )
        })?;
        unavailable |= outcome.unavailable;
        match (outcome.value, outcome.failure) {
            (_, Some(failure)) => failures.push((peer, failure)),
            (Some(value), None) => values.push(value),
            (None, None) => failures.push((
                peer,
                WireError::from_error(&Error::new(ErrorKind::Protocol, operation, "empty outcome")),
            )),
        }
    }
    if !failures.is_empty() {
        let kind = failures[0].1.kind;
        let mut error = Error::new(kind, operation, describe_failures(&failures))
            .on_rank(rank)
            .with_peer(failures[0].0);
        if let Some(cause) = local_error {
            error = error.caused_by(cause);
        }
        return Err(Diverged::Failed { error, unavailable });
    }
    if require_equal && values.iter().any(|v| *v != values[0]) {
        let message = format!(
            "values differ across root ranks: {}",
            describe_values(&values)
        );
        let error = Error::new(ErrorKind::InvalidArgument, operation, message).on_rank(rank);
        return Err(Diverged::Failed {
            error,
            unavailable: false,
        });
    }
    Ok(values)
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

/// `root_ranks=[0, 2]: <value>; root_ranks=[1]: <value>`, equal values grouped (each shown
/// briefly).
fn describe_values<T: std::fmt::Debug + PartialEq>(values: &[T]) -> String {
    let mut groups: Vec<(Vec<usize>, &T)> = Vec::new();
    for (rank, value) in values.iter().enumerate() {
        match groups.iter_mut().find(|(_, v)| *v == value) {
            Some((ranks, _)) => ranks.push(rank),
            None => groups.push((vec![rank], value)),
        }
    }
    groups
        .iter()
        .map(|(ranks, value)| {
            let mut shown = format!("{value:?}");
            if shown.len() > 200 {
                let cut = (0..=200)
                    .rev()
                    .find(|&i| shown.is_char_boundary(i))
                    .unwrap_or(0);
                shown.truncate(cut);
                shown.push('…');
            }
            format!("root_ranks={ranks:?}: {shown}")
        })
        .collect::<Vec<_>>()
        .join("; ")
}
