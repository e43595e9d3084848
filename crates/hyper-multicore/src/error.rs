//! The one error type of the crate: every failure says which operation failed, on which rank,
//! what kind of failure it is and what the user should do about it.
//!
//! ```
//! use hyper_multicore::{Error, ErrorKind};
//! let err = Error::new(ErrorKind::InvalidArgument, "allocate", "alignment 3 is not a power of two")
//!     .on_rank(2);
//! assert_eq!(err.kind(), ErrorKind::InvalidArgument);
//! assert!(err.to_string().contains("rank 2"));
//! ```

use std::fmt;
use std::time::Duration;

/// Shorthand for results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What kind of failure an [`Error`] is; each kind implies a recovery decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The operation is not allowed in the current state (for example before initialize).
    InvalidState,
    /// An environment variable or configuration value is malformed; fix the named variable.
    InvalidConfig,
    /// An argument is out of range or inconsistent; fix the call.
    InvalidArgument,
    /// The request is valid but not supported by this build or platform.
    Unsupported,
    /// An allocation was freed twice, or a freed handle was used.
    DoubleFree,
    /// The operating system or transport failed (socket, mapping, memfd ...).
    Backend,
    /// A wait reached its deadline; the message names who did not arrive.
    Timeout,
    /// A member of the job died or left; the error names its rank.
    PeerLost,
    /// The peers sent something that breaks the protocol (mismatched collectives, bad frames).
    Protocol,
}

impl ErrorKind {
    /// Every kind, in declaration order.
    pub const ALL: [ErrorKind; 9] = [
        ErrorKind::InvalidState,
        ErrorKind::InvalidConfig,
        ErrorKind::InvalidArgument,
        ErrorKind::Unsupported,
        ErrorKind::DoubleFree,
        ErrorKind::Backend,
        ErrorKind::Timeout,
        ErrorKind::PeerLost,
        ErrorKind::Protocol,
    ];

    /// A short lower-case name, used in messages and in the Python front.
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::InvalidState => "invalid state",
            ErrorKind::InvalidConfig => "invalid config",
            ErrorKind::InvalidArgument => "invalid argument",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::DoubleFree => "double free",
            ErrorKind::Backend => "backend error",
            ErrorKind::Timeout => "timeout",
            ErrorKind::PeerLost => "peer lost",
            ErrorKind::Protocol => "protocol error",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a failed lifecycle operation (acquire, release, restart) leaves behind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Recovery {
    /// Nothing changed: fix the cause and call again; the runtime remains usable.
    Retryable,
    /// The runtime is gone and this process may not start another: restart the process.
    Terminal,
    /// The ranks could no longer agree (a peer died, an exchange timed out): the runtime cannot be
    /// managed safely any more; restart the process.
    ConvergenceFailure,
}

impl Recovery {
    /// The hint that ends every lifecycle error of this class.
    pub fn hint(self) -> &'static str {
        match self {
            Recovery::Retryable => "the runtime remains usable",
            Recovery::Terminal => "restart the process",
            Recovery::ConvergenceFailure => {
                "the runtime cannot be managed safely any more; restart the process"
            }
        }
    }
}

/// A failure of a hyper_multicore operation.
///
/// Display form: `<operation> failed [during <stage>] on rank <r>: <kind>: <message>`. One
/// pointer wide, so `Result<T, Error>` stays small on every hot path.
#[derive(Debug)]
pub struct Error(Box<Inner>);

#[derive(Debug)]
struct Inner {
    kind: ErrorKind,
    operation: String,
    rank: Option<usize>,
    message: String,
    peer: Option<usize>,
    stage: Option<String>,
    recovery: Option<Recovery>,
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

impl Error {
    /// A new error of `kind` raised by `operation`.
    pub fn new(kind: ErrorKind, operation: impl Into<String>, message: impl Into<String>) -> Self {
        Error(Box::new(Inner {
            kind,
            operation: operation.into(),
            rank: None,
            message: message.into(),
            peer: None,
            stage: None,
            recovery: None,
            source: None,
        }))
    }

    /// Records the stage of a multi-stage operation that failed (`restart failed during Quiesce`).
    pub fn during(mut self, stage: impl Into<String>) -> Self {
        self.0.stage = Some(stage.into());
        self
    }

    /// The stage that failed, for multi-stage operations.
    pub fn stage(&self) -> Option<&str> {
        self.0.stage.as_deref()
    }

    /// Classifies a lifecycle failure (the message should end with [`Recovery::hint`]).
    pub fn with_recovery(mut self, recovery: Recovery) -> Self {
        self.0.recovery = Some(recovery);
        self
    }

    /// How to recover, for failures of the managed lifecycle.
    pub fn recovery(&self) -> Option<Recovery> {
        self.0.recovery
    }

    /// Records the rank (in the group the operation ran over) that raised the error.
    pub fn on_rank(mut self, rank: usize) -> Self {
        self.0.rank = Some(rank);
        self
    }

    /// This error, restated as a failure of `operation` (kind, message and peer kept): a loss
    /// reported elsewhere (the control plane) as the cause of a call that ended on it.
    pub(crate) fn restated_as(&self, operation: &str) -> Self {
        let error = Error::new(self.kind(), operation, self.message());
        match self.peer() {
            Some(peer) => error.with_peer(peer),
            None => error,
        }
    }

    /// Records the peer rank that was lost, timed out or misbehaved.
    pub fn with_peer(mut self, peer: usize) -> Self {
        self.0.peer = Some(peer);
        self
    }

    /// Chains an underlying cause.
    pub fn caused_by(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.0.source = Some(Box::new(source));
        self
    }

    /// An OS or transport failure of `operation`.
    pub fn backend(operation: impl Into<String>, what: &str, source: std::io::Error) -> Self {
        let message = format!("{what}: {source}");
        Error::new(ErrorKind::Backend, operation, message).caused_by(source)
    }

    /// A peer of `operation` was lost.
    pub fn peer_lost(operation: impl Into<String>, peer: usize, detail: &str) -> Self {
        let message = format!(
            "peer rank {peer} was lost ({detail}); the job cannot continue this group's work, \
             check rank {peer}'s output for its cause"
        );
        Error::new(ErrorKind::PeerLost, operation, message).with_peer(peer)
    }

    /// A wait of `operation` reached its deadline after `waited`.
    pub fn timeout(operation: impl Into<String>, waited: Duration, detail: &str) -> Self {
        let message = format!(
            "timed out after {:.1}s: {detail}; raise HYPER_MULTICORE_SHMEM_TIMEOUT_SEC if the \
             peers are only slow, else check that every rank makes the same call",
            waited.as_secs_f64()
        );
        Error::new(ErrorKind::Timeout, operation, message)
    }

    /// The kind of failure.
    pub fn kind(&self) -> ErrorKind {
        self.0.kind
    }

    /// The operation that failed (for example `"allgather"` or `"initialize"`).
    pub fn operation(&self) -> &str {
        &self.0.operation
    }

    /// The rank that raised the error, if known.
    pub fn rank(&self) -> Option<usize> {
        self.0.rank
    }

    /// The peer rank the error is about (the lost, late or misbehaving rank), if any.
    pub fn peer(&self) -> Option<usize> {
        self.0.peer
    }

    /// The message without the operation and rank prefix.
    pub fn message(&self) -> &str {
        &self.0.message
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} failed", self.0.operation)?;
        if let Some(stage) = &self.0.stage {
            write!(f, " during {stage}")?;
        }
        if let Some(rank) = self.0.rank {
            write!(f, " on rank {rank}")?;
        }
        write!(f, ": {}: {}", self.0.kind, self.0.message)
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0
            .source
            .as_deref()
            .map(|s| s as &(dyn std::error::Error + 'static))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_errors_page_explains_every_kind() {
        let page = include_str!("../../../docs/errors.md");
        for kind in ErrorKind::ALL {
            assert!(
                page.contains(&format!("`{kind:?}`")),
                "docs/errors.md misses {kind:?}"
            );
        }
    }
}
