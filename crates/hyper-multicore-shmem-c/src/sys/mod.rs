//! The only modules of this crate that touch memory through a raw address: the C caller's
//! buffers, and the executable's data and bss made symmetric.

pub(crate) mod caller_memory;
pub(crate) mod static_data;
