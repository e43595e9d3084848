//! The progress thread and the hand-over between it and the PE's own threads: the thread
//! sleeps on the worker's event fd and progresses the worker while no caller serves it.

use super::*;

/// Who serves a worker's events: callers that progress it, or its progress thread.
pub(super) struct Handover {
    /// The origin of `last_call`'s times.
    pub(super) epoch: Instant,
    /// When a caller last progressed the worker: nanoseconds since `epoch` (0: never), as of
    /// one of its last [`CALLS_PER_CLOCK_READ`] progresses.
    pub(super) last_call: AtomicU64,
    /// Callers' progresses, counted (not exactly: two callers at once may count one) so that
    /// the clock is read on every [`CALLS_PER_CLOCK_READ`]th.
    pub(super) calls: AtomicU64,
    /// The progress thread sleeps on `wake` alone, leaving events to the callers.
    pub(super) standing_down: AtomicBool,
    /// A caller asked the progress thread to serve events again ([`Worker::end_serving`]).
    pub(super) take_over: AtomicBool,
    /// Ends the progress thread's sleep (a hand-over, or its stop).
    pub(super) wake: OwnedFd,
    /// Callers between [`Worker::begin_serving`] and [`Worker::end_serving`].
    pub(super) serving: AtomicUsize,
    /// [`LOOK_BACKSTOP`] in nanoseconds (tests lengthen it, so that only a peer's request can
    /// end a stand-down).
    pub(super) look_backstop: AtomicU64,
}

/// A caller's [`Worker::begin_serving`] that ends (without a hand-over) when it drops.
pub(super) struct ServingGuard<'a>(&'a Handover);

impl<'a> ServingGuard<'a> {
    pub(super) fn begin(handover: &'a Handover) -> ServingGuard<'a> {
        handover.begin_serving();
        ServingGuard(handover)
    }
}

impl Drop for ServingGuard<'_> {
    fn drop(&mut self) {
        self.0.end_serving(false);
    }
}

impl Handover {
    /// Nanoseconds since `epoch`, at least 1.
    pub(super) fn now(&self) -> u64 {
        crate::sys::nanos_since(self.epoch)
    }

    /// Records a caller's progress, reading the clock on the first of every
    /// [`CALLS_PER_CLOCK_READ`] (each read was 3 % of a 2-PE barrier's CPU time over TCP, whose
    /// waiter progresses every few hundred nanoseconds). The time recorded is then that many
    /// progresses old at most: microseconds for a caller that polls, longer for one that
    /// progresses now and then. An older time can only make the progress thread serve where it
    /// could have stood down, never stand down while no caller progresses.
    #[inline]
    pub(super) fn called(&self) {
        let calls = self.calls.load(Ordering::Relaxed);
        self.calls.store(calls.wrapping_add(1), Ordering::Relaxed);
        if calls % CALLS_PER_CLOCK_READ == 0 {
            self.last_call.store(self.now(), Ordering::Relaxed);
        }
    }

    /// How long ago a caller last progressed the worker (from `epoch` if none ever did).
    pub(super) fn since_last_call(&self) -> Duration {
        let last = self.last_call.load(Ordering::Relaxed);
        Duration::from_nanos(self.now().saturating_sub(last))
    }

    /// See [`Worker::begin_serving`].
    pub(super) fn begin_serving(&self) {
        self.serving.fetch_add(1, Ordering::SeqCst);
    }

    /// See [`Worker::end_serving`].
    pub(super) fn end_serving(&self, hand_over: bool) {
        let before = self.serving.fetch_sub(1, Ordering::SeqCst);
        debug_assert!(before > 0, "end_serving without a begin_serving");
        if hand_over {
            self.hand_over();
        }
    }

    /// Has the progress thread serve events again: at once if it stands down (woken), else at
    /// its next round. The store comes before the look at `standing_down`, and the thread
    /// stores `standing_down` before it looks at `take_over` (both SeqCst): either it sees the
    /// request before it sleeps, or this sees it standing down and wakes it.
    ///
    /// The callers' last progress stops counting as recent (`last_call` back to never): a
    /// waiter that served peers as it looked hands over as it leaves to compute, and the thread
    /// must not take its last looks for a caller still polling and stand down again at the
    /// next event (the release store before `take_over` orders it for the thread's swap). The
    /// next caller's progress records its time at once (`calls` back to 0), so that a caller
    /// that polls again has the thread stand down as before.
    pub(super) fn hand_over(&self) {
        self.calls.store(0, Ordering::Relaxed);
        self.last_call.store(0, Ordering::Relaxed);
        self.take_over.store(true, Ordering::SeqCst);
        if self.standing_down.load(Ordering::SeqCst) {
            self.ring();
        }
    }

    /// [`Handover::hand_over`] that also wakes the thread when it sleeps armed (see
    /// [`Worker::serve_now`]).
    pub(super) fn take_over_now(&self) {
        self.take_over.store(true, Ordering::SeqCst);
        self.ring();
    }

    pub(super) fn ring(&self) {
        // A write of 1 makes the eventfd readable, which ends the thread's poll at once.
        let _ = rustix::io::write(&self.wake, &1u64.to_ne_bytes());
    }
}

pub(super) fn progress_loop(worker: &WorkerHandle, stop: &AtomicBool) {
    let handover = &worker.handover;
    let wake = handover.wake.as_fd();
    // Whether the last round served (or woke to serve) rather than stood down.
    let mut served = true;
    while !stop.load(Ordering::Acquire) {
        // A stand-down look that finds a caller progressing just now leaves the events to it:
        // progressing too would only take the worker's lock from that caller (or wait for it,
        // when this thread preempted it holding the lock).
        let caller_polls = !served
            && !handover.take_over.load(Ordering::SeqCst)
            && handover.since_last_call() < RECENT_CALLER;
        if !caller_polls {
            while worker.progress_events() != 0 {}
        }
        let take_over = handover.take_over.swap(false, Ordering::SeqCst);
        let caller_serves = handover.serving.load(Ordering::SeqCst) != 0
            || handover.since_last_call() < RECENT_CALLER;
        if caller_serves && !take_over {
            handover.standing_down.store(true, Ordering::SeqCst);
            if !handover.take_over.load(Ordering::SeqCst) {
                let backstop = handover.look_backstop.load(Ordering::Relaxed);
                sleep_on([wake], Duration::from_nanos(backstop));
            }
            handover.standing_down.store(false, Ordering::SeqCst);
            drain(wake);
            served = false;
            continue;
        }
        served = true;
        match worker.arm() {
            Ok(true) => {
                worker.sleep(wake, PROGRESS_SLEEP_CAP);
                drain(wake);
            }
            Ok(false) => std::thread::yield_now(),
            Err(error) => {
                tracing::warn!("progress thread: {error}");
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
}

/// Sleeps until one of `fds` is readable or `timeout` passes.
pub(super) fn sleep_on<const N: usize>(fds: [BorrowedFd<'_>; N], timeout: Duration) {
    let mut polled = fds.each_ref().map(|fd| PollFd::new(fd, PollFlags::IN));
    // EINTR and friends: the caller re-checks its state and deadline either way.
    let _ = poll(&mut polled, Some(&timespec(timeout)));
}

/// Empties a nonblocking eventfd (empty already is fine).
pub(super) fn drain(eventfd: BorrowedFd<'_>) {
    let mut counter = [0u8; 8];
    let _ = rustix::io::read(eventfd, &mut counter);
}

pub(super) fn timespec(duration: Duration) -> Timespec {
    Timespec {
        tv_sec: i64::try_from(duration.as_secs()).unwrap_or(i64::MAX),
        tv_nsec: duration.subsec_nanos().into(),
    }
}

/// A thread that progresses a [`Worker`] whenever its event fd fires (see
/// [`Worker::start_progress_thread`]); dropping it stops and joins the thread.
pub struct ProgressThread {
    pub(super) stop: Arc<AtomicBool>,
    pub(super) worker: Arc<WorkerHandle>,
    pub(super) thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for ProgressThread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProgressThread").finish_non_exhaustive()
    }
}

impl Drop for ProgressThread {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        self.worker.handover.ring();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
