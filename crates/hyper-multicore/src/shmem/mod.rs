//! Symmetric memory.

pub(crate) mod allocator;
