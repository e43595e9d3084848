//! The preflight hook of a [`restart`](fn@super::restart): a snapshot of the caller's own state
//! that must be *equal as a value* on every root rank before anything is torn down.
//!
//! The lifecycle only moves the snapshot's bytes; the hook decides what "equal" means and how a
//! value reads in an error. A plain closure returning bytes compares bytes and shows hex; a front
//! with richer values (the Python front: pickled objects compared with `==`, shown with `repr`)
//! implements [`PreflightHook`] itself.
//!
//! ```no_run
//! use hyper_multicore::lifecycle::PreflightHook;
//!
//! /// Comma-separated names whose order does not matter.
//! struct Names(Vec<String>);
//!
//! impl PreflightHook for Names {
//!     fn snapshot(&mut self) -> hyper_multicore::Result<Vec<u8>> {
//!         Ok(self.0.join(",").into_bytes())
//!     }
//!     fn same(&self, a: &[u8], b: &[u8]) -> bool {
//!         let sorted = |v: &[u8]| {
//!             let mut names: Vec<&[u8]> = v.split(|&b| b == b',').collect();
//!             names.sort();
//!             names.into_iter().map(<[u8]>::to_vec).collect::<Vec<_>>()
//!         };
//!         sorted(a) == sorted(b)
//!     }
//!     fn describe(&self, value: &[u8]) -> String {
//!         String::from_utf8_lossy(value).into_owned()
//!     }
//! }
//! ```

use crate::error::Result;

/// Longest description of one value shown in an error (characters; longer ones are cut).
pub const DESCRIBE_LIMIT: usize = 200;

/// A restart's preflight hook: takes the snapshot, compares two snapshots as values, and
/// describes one for an error message.
pub trait PreflightHook {
    /// This rank's snapshot (called once per restart, in Preflight, with no lifecycle lock
    /// borrowed: it may call [`debug_state`](super::debug_state)). An error fails Preflight on
    /// every rank (retryable).
    fn snapshot(&mut self) -> Result<Vec<u8>>;

    /// True if snapshots `a` and `b` (of two root ranks) are the same value. Must be
    /// deterministic and symmetric: every rank compares the same snapshots and must reach the
    /// same verdict. The default compares bytes.
    fn same(&self, a: &[u8], b: &[u8]) -> bool {
        a == b
    }

    /// One snapshot, for a "values differ" error (the lifecycle cuts it to
    /// [`DESCRIBE_LIMIT`] characters). The default shows the first bytes in hex and the length.
    fn describe(&self, value: &[u8]) -> String {
        hex_preview(value)
    }
}

impl<F: FnMut() -> Result<Vec<u8>>> PreflightHook for F {
    fn snapshot(&mut self) -> Result<Vec<u8>> {
        self()
    }
}

/// `0x0a0b0c… (100 bytes)`: the first 32 bytes in hex, and the length.
pub(crate) fn hex_preview(value: &[u8]) -> String {
    const SHOWN: usize = 32;
    let mut text = String::from("0x");
    for byte in value.iter().take(SHOWN) {
        text.push_str(&format!("{byte:02x}"));
    }
    if value.len() > SHOWN {
        text.push('…');
    }
    format!("{text} ({} bytes)", value.len())
}

/// `text` cut to [`DESCRIBE_LIMIT`] characters (with `…` when cut).
pub(crate) fn cut_short(mut text: String) -> String {
    if let Some((cut, _)) = text.char_indices().nth(DESCRIBE_LIMIT) {
        text.truncate(cut);
        text.push('…');
    }
    text
}

/// Groups root ranks whose values are the same by `same`: `(ranks, representative index)`, in
/// order of first appearance.
pub(crate) fn group_ranks<T>(
    values: &[T],
    same: impl Fn(&T, &T) -> bool,
) -> Vec<(Vec<usize>, usize)> {
    let mut groups: Vec<(Vec<usize>, usize)> = Vec::new();
    for (rank, value) in values.iter().enumerate() {
        match groups
            .iter_mut()
            .find(|(_, first)| same(&values[*first], value))
        {
            Some((ranks, _)) => ranks.push(rank),
            None => groups.push((vec![rank], rank)),
        }
    }
    groups
}
