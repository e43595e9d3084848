//! The control plane: small, rare messages between the members of a group, over TCP through
//! root rank 0.
pub mod frame;
mod unique_id;

pub use unique_id::{BootstrapListener, UniqueId, PROTOCOL_VERSION, SECRET_LEN};
