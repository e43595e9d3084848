//! Ending the whole job from one process: [`global_exit`] (OpenSHMEM's `shmem_global_exit`).

use crate::control::global_exit::{self, Ending};
use crate::world::World;

/// Ends every process of the job with exit status `status`: this one, and each other one
/// whatever it is doing — waiting in any call (a barrier, a wait, a collective), or computing
/// without calling the library. Does not return. Not collective: any one process calls it.
///
/// The job is the world ([`World::global`], the root of [`acquire`](fn@super::acquire)`(None, …)`
/// and of the C API), reached over its control plane through root rank 0, so processes on
/// every host end, and `hmrun` exits with `status` on every host (`status` modulo 256, as for
/// `exit`). Without a world in this process, the active runtime's own control plane reaches
/// its root group's processes; without either, this process ends alone.
///
/// Every process records the status before any ends (see [`ControlPlane::global_exit`]), so
/// none reports another's ending as a lost peer: while a global exit is under way, a control
/// plane that breaks, or a [`guarded`](super::guarded) call that fails, ends its process with
/// the status instead ([`end_if_global_exit`]). This thread ends its process with `exit`
/// (`atexit` handlers run); the others end from their control-plane router threads, after
/// flushing stdout and stderr (Rust's and the C library's), with `_exit`. When several
/// processes call it at once, every process exits with the status root rank 0 heard of first.
///
/// [`ControlPlane::global_exit`]: crate::control::ControlPlane::global_exit
pub fn global_exit(status: i32) -> ! {
    if let Some(world) = World::existing() {
        world.control().global_exit(status)
    }
    // A root over a caller's channel (no world): its runtime's plane spans the root group.
    let _ = super::try_guarded("global_exit", |shmem| -> crate::Result<()> {
        shmem.control().global_exit(status)
    });
    global_exit::end(status, Ending::Exit)
}

/// The exit status of the global exit under way in this process, if one is (this process called
/// [`global_exit`], or heard of another's).
pub fn global_exit_status() -> Option<i32> {
    global_exit::announced()
}

/// If a global exit is under way in this process, ends the process with its status and does
/// not return; else returns at once. Call it where a failure would end the process with a
/// status of its own (the C API's failure path does): while a global exit is under way, a
/// failure is the others ending.
pub fn end_if_global_exit() {
    if global_exit::announced().is_some() {
        global_exit::end_if_announced()
    }
}
