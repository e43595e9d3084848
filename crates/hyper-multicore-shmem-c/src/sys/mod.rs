//! The only modules of this crate that touch memory through a raw address: the C caller's
//! buffers (a collective's source among them), the executable's data and bss made symmetric,
//! and the C helper combining `long double` values.

pub(crate) mod caller_memory;
pub(crate) mod collective_source;
pub(crate) mod long_double;
pub(crate) mod static_data;
