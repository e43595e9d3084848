//! The operating-system edge of the crate: the only modules allowed to use `unsafe`.
//!
//! Each file owns one kind of raw resource and states its safety contract once; everything above
//! this module uses the safe functions it exports.

#![allow(unsafe_code)]

pub(crate) mod futex;
pub(crate) mod inherited_fd;
pub(crate) mod mapping;
pub(crate) mod segment_words;
pub(crate) mod spawn;
