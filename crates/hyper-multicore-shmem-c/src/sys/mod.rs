//! The only module of this crate that touches memory through a C caller's pointer.

pub(crate) mod caller_memory;
