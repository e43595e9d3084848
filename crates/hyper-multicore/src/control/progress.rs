//! What a network transport needs from the waits and the control plane: [`Progress`], work a
//! waiter runs while it looks (the network transport's progress), so a PE waiting in a
//! collective or for a signal serves its peers' operations itself. The shared-memory waits
//! (`transport/shm/sync.rs`) and the control plane's waiters (`router.rs`) take it; neither
//! knows which network transport is behind it.

/// A network transport's progress, as its waiters drive it. Besides the waiters, the transport
/// has other threads that progress it while nobody waits (UCX: its progress thread); "serving"
/// tells them a waiter looks now, so they stand down.
pub(crate) trait Progress: Send + Sync {
    /// Progresses the transport once (one look of a waiter); returns how many events it
    /// handled (a waiter that handles some keeps looking).
    fn progress(&self) -> usize;
    /// A waiter starts looking, and so serving (before its first look, and again after a
    /// nudge or a sleep).
    fn begin_serving(&self);
    /// A waiter that looked stops: to sleep, with `hand_over` (the transport's other threads
    /// take over again at once), or as its wait ends, with `hand_over` only if it served
    /// peers' work during the wait (a wait that just got its answer leaves the other threads to
    /// notice at their next look).
    fn end_serving(&self, hand_over: bool);
    /// Runs on the control plane's router thread when a peer asks this process to serve now
    /// (see `ServeRequester`): the transport's other threads take over even if a waiter said
    /// it serves. Nothing by default (a transport without other threads).
    fn serve_requested(&self) {}
}
