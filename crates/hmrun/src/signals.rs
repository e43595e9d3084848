//! Relaying the signals that ask hmrun to stop (SIGINT, SIGTERM, SIGHUP) to the job supervisor.
//!
//! signal-hook's handler only writes to a self-pipe; a relay thread blocks on that pipe and hands
//! each signal to a callback, which the supervisor uses to put it on its event channel. Nothing
//! polls.
//!
//! ```text
//! let relay = SignalRelay::start(move |signal| events.send(Event::Signal(signal)).is_ok())?;
//! // ... supervise the job ...
//! relay.stop();
//! ```

use std::io;
use std::thread::{self, JoinHandle};

use rustix::process::Signal;
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::{Handle, Signals};

/// The signals hmrun catches and forwards to every rank.
pub const RELAYED: [i32; 3] = [SIGINT, SIGTERM, SIGHUP];

/// Installed handlers for [`RELAYED`] and the thread that hands received signals on.
#[derive(Debug)]
pub struct SignalRelay {
    handle: Handle,
    thread: JoinHandle<()>,
}

impl SignalRelay {
    /// Catches [`RELAYED`] from now on and calls `deliver` (on a relay thread) for each
    /// received signal, until [`SignalRelay::stop`] or until `deliver` returns `false`.
    pub fn start(mut deliver: impl FnMut(Signal) -> bool + Send + 'static) -> io::Result<Self> {
        let mut signals = Signals::new(RELAYED)?;
        let handle = signals.handle();
        let thread = thread::Builder::new()
            .name("signal relay".to_string())
            .spawn(move || {
                for raw in signals.forever() {
                    let Some(signal) = Signal::from_named_raw(raw) else {
                        continue;
                    };
                    if !deliver(signal) {
                        break;
                    }
                }
            })?;
        Ok(SignalRelay { handle, thread })
    }

    /// Stops relaying and joins the relay thread. The handlers stay installed but do nothing,
    /// so these signals are ignored from then on: call this only when hmrun is about to exit.
    pub fn stop(self) {
        self.handle.close();
        // The relay thread cannot panic; if it did, there is nothing left to relay anyway.
        let _ = self.thread.join();
    }
}
