//! The operating-system edge of the crate: the only modules allowed to use `unsafe`.
//!
//! Each file owns one kind of raw resource and states its safety contract once; everything above
//! this module uses the safe functions it exports.

#![allow(unsafe_code)]

pub(crate) mod copies;
pub(crate) mod futex;
pub(crate) mod gate;
pub(crate) mod inherited_fd;
pub(crate) mod mapped_combine;
pub(crate) mod mapping;
pub(crate) mod process_exit;
pub(crate) mod segment_words;
pub(crate) mod socket_owner;
pub(crate) mod spawn;
pub(crate) mod zero_pages;
// The UCX transport's foundation, under the transport layer's UCX route (transport/ucx/).
// Its own tests also call a few functions the transport does not (memory UCX allocates, the
// worker's event descriptor, non-blocking puts, an endpoint's close), hence the allowance
// outside test builds. Nothing in it is a shared-memory protocol, so loom builds skip it.
#[cfg(all(feature = "ucx", not(loom)))]
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) mod ucx;

/// The cores this process may run on (affinity and cgroup quota included), asked once: the
/// query reads files, far too slow for a barrier.
pub(crate) fn available_cores() -> usize {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Nanoseconds from `epoch` to now as a `u64` (saturating), at least 1: for times kept in an
/// atomic word, where 0 stands for "never".
#[cfg_attr(not(all(feature = "ucx", not(loom))), allow(dead_code))]
pub(crate) fn nanos_since(epoch: std::time::Instant) -> u64 {
    u64::try_from(epoch.elapsed().as_nanos())
        .unwrap_or(u64::MAX)
        .max(1)
}
