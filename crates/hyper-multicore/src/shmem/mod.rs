//! Symmetric memory.

pub(crate) mod sync;
