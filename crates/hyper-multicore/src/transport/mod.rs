//! The transport layer: how this PE reaches every peer's heap.
//!
//! Every transport is a sibling behind one trait, [`Transport`] (`interface.rs`), with one
//! start-up and teardown (Sandia OpenSHMEM's init/startup/fini; see docs/architecture.md):
//!
//! ```text
//! prepare (local setup) → publish (bytes for peers) → exchange (control plane) → attach → agree
//! teardown: Drop (local only, never collective)
//! ```
//!
//! and the same operations: put/get (blocking and non-blocking), atomics on 32/64-bit words,
//! signal set/add (which wakes the target's waiter), fence, quiet and `local_ptr`.
//!
//! - `shm/`: the shared-memory transport (segment, hand-off, the waits and barriers);
//! - `network.rs`: the network transports ([`Network`]: UCX in `ucx.rs`, `absent.rs` standing
//!   in for one whose feature is off) and what adding one takes;
//! - `routes.rs`: the router, one `Route::{Local, Net}` per peer, computed once at initialize
//!   ([`Transports`]);
//! - `locality.rs`: which PEs share a host, and so a segment.
//!
//! ```ignore
//! let transports = Transports::start(&start)?;           // collective, at initialize
//! transports.put(pe, offset_in_heap, (&bytes).into())?; // match on routes[pe]
//! ```

mod interface;
mod locality;
mod network;
mod routes;
pub(crate) mod shm;
// The network transports' modules, and the stand-in for each this build lacks (loom builds
// model the shared-memory protocols only).
#[cfg(all(feature = "ucx", not(loom)))]
mod ucx;
#[cfg(all(feature = "ucx", not(loom)))]
use ucx::UcxTransport;
#[cfg(not(all(feature = "ucx", not(loom))))]
mod absent;
#[cfg(not(all(feature = "ucx", not(loom))))]
use absent::Absent as UcxTransport;

pub use interface::SignalOp;
pub(crate) use interface::{Rmw, Start, Transport, Width};
pub use locality::TEST_HOST_VARIABLE;
pub(crate) use locality::{host_identity, Locality};
// The test-only probes on `Shmem` read the network transports' counters.
#[cfg(feature = "fault-injection")]
pub(crate) use network::Network;
pub(crate) use network::{word_of, words_header};
pub use routes::TransportState;
pub(crate) use routes::{Route, Transports};
pub(crate) use shm::{segment, sync};
