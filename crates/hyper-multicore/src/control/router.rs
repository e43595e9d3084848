//! The background side of a connected control plane: one thread per process that reads every
//! frame as it arrives, so a peer's death is noticed at once — not only when someone next waits.
//!
//! Root rank 0's router polls all member connections (plus a wake-up socket for shutdown),
//! queues contributions per rank, forwards point-to-point messages, and on a member's hang-up
//! breaks the plane and tells every survivor. A member's router reads its one connection to the
//! root. Waiting threads sleep on a condition variable with a deadline; the router wakes them.
//!
//! When every PE of the group can have a core, neither sleeps at once: a router keeps polling
//! (yielding) for [`SPIN_WINDOW`] after it received something, and a waiter watches the inbox's
//! version for as long before it sleeps, so the frames of a collective in progress meet awake
//! threads instead of paying a wake-up each.

use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::net::{Shutdown, TcpStream};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags, Timespec};

use super::frame::{write_frame, Frame, FrameDecoder, Kind, WireError};
use super::global_exit::{self, ExitRound};
use super::liveness::{local_lost, Liveness};
use super::progress::Progress;
use crate::error::{Error, ErrorKind};

/// How long a router keeps polling after it received something, and a waiter watches the inbox,
/// before either sleeps (when every PE of the group can have a core): a round trip through
/// root rank 0 takes tens of microseconds, and on a virtual machine each sleep costs about as
/// much again in wake-up latency (docs/architecture.md, "Control plane").
const SPIN_WINDOW: Duration = Duration::from_micros(200);

/// A `poll` that only looks.
const NO_WAIT: Timespec = Timespec {
    tv_sec: 0,
    tv_nsec: 0,
};

/// The write side of one connection, shared by user threads and the router.
#[derive(Debug)]
pub(crate) struct Link {
    writer: Mutex<Writer>,
}

#[derive(Debug)]
struct Writer {
    stream: TcpStream,
    next_sequence: u64,
}

impl Link {
    /// A link whose next outgoing frame has sequence number `next_sequence`.
    pub(crate) fn new(stream: TcpStream, next_sequence: u64) -> Link {
        Link {
            writer: Mutex::new(Writer {
                stream,
                next_sequence,
            }),
        }
    }

    /// Sends one frame made of `parts`.
    pub(crate) fn send(&self, kind: Kind, parts: &[&[u8]]) -> std::io::Result<()> {
        let mut writer = self.writer.lock();
        let sequence = writer.next_sequence;
        writer.next_sequence += 1;
        write_frame(&mut writer.stream, kind, sequence, parts)
    }

    /// Sends one empty frame of `kind` unless another thread is writing on this link now
    /// (then its frame reaches the peer instead); returns whether it sent.
    pub(crate) fn try_send(&self, kind: Kind) -> std::io::Result<bool> {
        let Some(mut writer) = self.writer.try_lock() else {
            return Ok(false);
        };
        let sequence = writer.next_sequence;
        writer.next_sequence += 1;
        write_frame(&mut writer.stream, kind, sequence, &[]).map(|()| true)
    }

    /// Says goodbye and shuts the connection down (best effort: the peer may be gone).
    pub(crate) fn close(&self) {
        let _ = self.send(Kind::Bye, &[]);
        let writer = self.writer.lock();
        let _ = writer.stream.shutdown(Shutdown::Both);
    }
}

/// One rank's part of a collective, as queued at root rank 0.
#[derive(Debug)]
pub(crate) struct Contribution {
    pub(crate) op: u8,
    pub(crate) sequence: u64,
    pub(crate) data: Vec<u8>,
}

/// A collective's outcome as received by a member.
#[derive(Debug)]
pub(crate) struct Outcome {
    pub(crate) sequence: u64,
    pub(crate) result: Result<Vec<u8>, WireError>,
}

/// Everything the router has received and not yet consumed.
#[derive(Debug, Default)]
pub(crate) struct Inbox {
    /// Root only: queued contributions, by rank.
    pub(crate) contributions: Vec<VecDeque<Contribution>>,
    /// Root only: ranks that said goodbye.
    pub(crate) departed: Vec<bool>,
    /// Member only: collective outcomes from root rank 0.
    pub(crate) outcomes: VecDeque<Outcome>,
    /// Member only: root rank 0 said goodbye.
    pub(crate) root_departed: bool,
    /// Point-to-point messages by (source rank, tag).
    pub(crate) mailbox: HashMap<(usize, u64), VecDeque<Vec<u8>>>,
    /// Why the plane can no longer be used (a peer was lost, calls mismatched, ...).
    pub(crate) broken: Option<WireError>,
    /// The break has been announced: on root rank 0, its aborts have gone out. Until then this
    /// process waits instead of acting on the break (a caller that fails on it may end the
    /// process at once, and the members must learn the cause first).
    pub(crate) announced: bool,
    /// Root: the last collective whose outcome is final (it is being, or has been, sent).
    pub(crate) completed: u64,
    /// The last collective root rank 0 had completed when the plane broke: its outcome still
    /// reaches every member (the root sends it before anything else on that connection).
    pub(crate) broken_after: u64,
    /// Member only: the connection to root rank 0 has ended.
    pub(crate) root_gone: bool,
    /// This process is closing the plane; hang-ups are expected now.
    pub(crate) closing: bool,
    /// Root only: the global exit under way on this plane (see `global_exit.rs`).
    pub(crate) exit_round: Option<ExitRound>,
    /// Member only: root rank 0 said to end the process for the global exit (the initiating
    /// thread of this process waits for it).
    pub(crate) exit_now: bool,
}

/// Called once when the plane breaks, from whichever thread noticed.
pub(crate) type BreakHook = Box<dyn Fn(&WireError) + Send + Sync>;

/// The inbox, the condition variable its waiters sleep on, and the break hooks.
#[derive(Default)]
pub(crate) struct Shared {
    inbox: Mutex<Inbox>,
    changed: Condvar,
    /// Bumped after every change of the inbox: a waiter in its spin phase watches it without
    /// taking the lock.
    version: AtomicU64,
    /// How long waiters and the router poll before they sleep ([`SPIN_WINDOW`], or zero when
    /// the group has more PEs than this host has cores).
    spin: Duration,
    hooks: Mutex<Vec<BreakHook>>,
    /// Run by a waiter on every look of its spin phase (see [`Shared::while_spinning`]).
    spin_hook: Mutex<Option<Weak<dyn Progress>>>,
    /// Waiters with spin work asleep on `changed` (only where waiters spin at all).
    sleeping_spinners: AtomicUsize,
    /// Set by [`Nudger::nudge`] for the sleeping spinners, taken by the one it wakes.
    nudged: AtomicBool,
}

/// The tag of a [`ServeRequester`]'s messages: the routers hand them to the plane's spin work
/// ([`Progress::serve_requested`]) instead of a mailbox.
pub(crate) const SERVE_TAG: u64 = u64::from_be_bytes(*b"hm-serve");

/// Asks a peer's process to serve its spin work now: the UCX transport sends one when a request
/// to that peer has waited for the peer's progress for a while, so that a peer whose threads
/// stopped serving its worker (a PE gone computing, or a caller descheduled mid-wait) has its
/// progress thread take over — instead of that thread looking every few hundred microseconds
/// whether its callers still serve. At most one message per peer per interval the caller
/// names (its own threshold of a slow request); a message
/// that cannot be sent (the plane closed or broke) is dropped, as the wait it would speed up
/// ends with the plane's own error.
pub(crate) struct ServeRequester {
    rank: usize,
    /// Root rank 0: a link per member; a member: the one to the root.
    links: Vec<Option<Arc<Link>>>,
    epoch: Instant,
    /// Per destination: when a request last went out, in nanoseconds since `epoch` (0: never).
    sent: Box<[AtomicU64]>,
}

impl ServeRequester {
    pub(crate) fn new(rank: usize, size: usize, links: Vec<Option<Arc<Link>>>) -> ServeRequester {
        ServeRequester {
            rank,
            links,
            epoch: Instant::now(),
            sent: (0..size).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Asks rank `destination` to serve its spin work now, unless this did within `interval`.
    pub(crate) fn request(&self, destination: usize, interval: Duration) {
        let Some(last) = self.sent.get(destination) else {
            return;
        };
        let now = crate::sys::nanos_since(self.epoch);
        let previous = last.load(Ordering::Relaxed);
        if previous != 0 && now.saturating_sub(previous) < interval.as_nanos() as u64 {
            return;
        }
        if last
            .compare_exchange(previous, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
        {
            return; // another thread sends it
        }
        if let Some(link) = super::point_to_point::link_to(&self.links, self.rank, destination) {
            let header = super::point_to_point::send_header(self.rank, destination, SERVE_TAG);
            let _ = link.send(Kind::Send, &[&header]);
        }
    }
}

impl std::fmt::Debug for ServeRequester {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServeRequester")
            .field("rank", &self.rank)
            .finish_non_exhaustive()
    }
}

/// One thread's wait in [`Shared::wait_until`].
struct Waiter {
    /// The plane's spin work when the wait began.
    work: Option<Arc<dyn Progress>>,
    /// Whether it ran `work` since it last stopped spinning.
    spinning: bool,
    /// Whether a nudge sent it back to spinning during this wait.
    nudged: bool,
    /// When its spin phase ends (moved on by events it handles, and by a nudge).
    spin_until: Instant,
    deadline: Instant,
}

impl Waiter {
    /// Tells the work this waiter no longer runs it, if it did.
    fn stop_spinning(&mut self, hand_over: bool) {
        if let (true, Some(work)) = (std::mem::take(&mut self.spinning), &self.work) {
            work.end_serving(hand_over);
        }
    }
}

/// Keeps work given to [`Shared::while_spinning`] in force: waits that start after this drops
/// no longer run it (a wait already under way keeps it alive until it ends).
pub(crate) struct SpinWork {
    _work: Arc<dyn Progress>,
    shared: Arc<Shared>,
}

impl SpinWork {
    /// What the work's other threads call when they handled its events (see [`Nudger`]).
    pub(crate) fn nudger(&self) -> Nudger {
        Nudger(Arc::clone(&self.shared))
    }
}

/// Wakes the plane's waiters that went to sleep with spin work, so they spin again: called
/// after another thread (the UCX progress thread) handled events of that work, i.e. peers' traffic
/// arrives while the waiter sleeps. A waiter spins only for a window after the last events it
/// handled itself; once asleep, it would otherwise leave every later request of a long wait to
/// the progress thread, which answers each only after a wake-up. One load when no such waiter
/// sleeps.
///
/// Lock order: the UCX transport nudges from its worker's progress hook, where the progressing
/// thread may hold UCX's worker lock, and a nudge takes the inbox lock: nothing may progress a
/// UCX worker (or make any UCX call) while holding the inbox lock.
#[derive(Clone)]
pub(crate) struct Nudger(Arc<Shared>);

impl Nudger {
    /// Wakes the sleeping spinners (one of them takes the nudge and spins again).
    pub(crate) fn nudge(&self) {
        let shared = &self.0;
        if shared.sleeping_spinners.load(Ordering::SeqCst) != 0
            && !shared.nudged.swap(true, Ordering::SeqCst)
        {
            // A waiter counts itself and looks at `nudged` under the inbox lock before it
            // sleeps: taking the lock here means it is either asleep now or saw the nudge.
            drop(shared.inbox.lock());
            shared.changed.notify_all();
        }
    }
}

impl std::fmt::Debug for Nudger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nudger").finish_non_exhaustive()
    }
}

impl std::fmt::Debug for SpinWork {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpinWork").finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("inbox", &self.inbox)
            .finish_non_exhaustive()
    }
}

impl Shared {
    pub(crate) fn new(size: usize) -> Shared {
        let inbox = Inbox {
            contributions: (0..size).map(|_| VecDeque::new()).collect(),
            departed: vec![false; size],
            ..Inbox::default()
        };
        Shared {
            inbox: Mutex::new(inbox),
            changed: Condvar::new(),
            version: AtomicU64::new(0),
            spin: if size <= crate::sys::available_cores() {
                SPIN_WINDOW
            } else {
                Duration::ZERO
            },
            hooks: Mutex::new(Vec::new()),
            spin_hook: Mutex::new(None),
            sleeping_spinners: AtomicUsize::new(0),
            nudged: AtomicBool::new(false),
        }
    }

    /// Makes every waiter's spin phase run `work` (replacing any earlier work) until the
    /// returned value drops.
    pub(crate) fn while_spinning(self: &Arc<Self>, work: Arc<dyn Progress>) -> SpinWork {
        let weak = Arc::downgrade(&work);
        *self.spin_hook.lock() = Some(weak);
        SpinWork {
            _work: work,
            shared: Arc::clone(self),
        }
    }

    /// Hands a peer's request to serve the spin work now to that work, if there is any.
    fn serve_requested(&self) {
        let work = self.spin_hook.lock().as_ref().and_then(Weak::upgrade);
        if let Some(work) = work {
            work.serve_requested();
        }
    }

    /// Files a point-to-point message from `source` under `tag` (a [`SERVE_TAG`] one goes to the
    /// spin work instead) and wakes every waiter.
    fn deliver(&self, source: usize, tag: u64, data: &[u8]) {
        if tag == SERVE_TAG {
            return self.serve_requested();
        }
        let data = data.to_vec();
        self.update(|inbox| {
            inbox
                .mailbox
                .entry((source, tag))
                .or_default()
                .push_back(data)
        });
    }

    /// Reads the inbox without waking anyone.
    pub(crate) fn peek<T>(&self, read: impl FnOnce(&Inbox) -> T) -> T {
        read(&self.inbox.lock())
    }

    /// Runs `update` on the inbox and wakes every waiter.
    pub(crate) fn update<T>(&self, update: impl FnOnce(&mut Inbox) -> T) -> T {
        let result = update(&mut self.inbox.lock());
        self.version.fetch_add(1, Ordering::Release);
        self.changed.notify_all();
        result
    }

    /// Waits until `ready` returns `Some`, or `deadline` passes (then `None`).
    pub(crate) fn wait_until<T>(
        &self,
        deadline: Instant,
        mut ready: impl FnMut(&mut Inbox) -> Option<T>,
    ) -> Option<T> {
        let mut waiter = Waiter {
            work: self.spin_hook.lock().as_ref().and_then(Weak::upgrade),
            spinning: false,
            nudged: false,
            spin_until: Instant::now() + self.spin,
            deadline,
        };
        let mut inbox = self.inbox.lock();
        let outcome = loop {
            if let Some(value) = ready(&mut inbox) {
                break Some(value);
            }
            if Instant::now() >= deadline {
                break None;
            }
            inbox = self.wait_a_little(inbox, &mut waiter);
        };
        // A waiter that a nudge sent back to spinning hands the work back as it leaves: the
        // other threads had served it while it slept, and its PE may go on computing now. (Not
        // on every exit: that would wake the UCX progress thread once per barrier.)
        let nudged = waiter.nudged;
        waiter.stop_spinning(nudged);
        outcome
    }

    /// One step of [`Shared::wait_until`]: a spin phase until the inbox changes or the spin
    /// window ends, or else a sleep until the inbox changes, the deadline, or a nudge (which
    /// opens a new spin window).
    fn wait_a_little<'a>(
        &'a self,
        mut inbox: MutexGuard<'a, Inbox>,
        waiter: &mut Waiter,
    ) -> MutexGuard<'a, Inbox> {
        let deadline = waiter.deadline;
        if Instant::now() < waiter.spin_until.min(deadline) {
            // The answer usually comes within tens of microseconds (a round trip through root
            // rank 0): yielding until it does costs less than a sleep and a wake-up.
            let seen = self.version.load(Ordering::Acquire);
            drop(inbox);
            while self.version.load(Ordering::Acquire) == seen
                && Instant::now() < waiter.spin_until.min(deadline)
            {
                if let Some(work) = &waiter.work {
                    if !waiter.spinning {
                        work.begin_serving();
                    }
                    waiter.spinning = true;
                    if work.progress() != 0 {
                        waiter.spin_until = Instant::now() + self.spin;
                    }
                }
                std::thread::yield_now();
            }
            return self.inbox.lock();
        }
        waiter.stop_spinning(true);
        // With spin work (and a spin phase at all), a nudge — the work's events handled
        // elsewhere meanwhile — sends this waiter back to spinning (see [`Nudger`]).
        if waiter.work.is_none() || self.spin.is_zero() {
            self.changed.wait_until(&mut inbox, deadline);
            return inbox;
        }
        self.sleeping_spinners.fetch_add(1, Ordering::SeqCst);
        if !self.nudged.load(Ordering::SeqCst) {
            self.changed.wait_until(&mut inbox, deadline);
        }
        self.sleeping_spinners.fetch_sub(1, Ordering::SeqCst);
        if self.nudged.swap(false, Ordering::SeqCst) {
            waiter.nudged = true;
            waiter.spin_until = Instant::now() + self.spin;
        }
        inbox
    }

    /// Records why the plane broke (the first reason wins), wakes every waiter and runs the
    /// hooks; returns the reason in force and the last collective completed before it (on root
    /// rank 0; 0 elsewhere).
    pub(crate) fn break_with(&self, error: &Error) -> (WireError, u64) {
        self.break_with_wire(WireError::from_error(error), None)
    }

    /// [`Shared::break_with`] for a reason received from root rank 0, which also says which
    /// collectives it completed before the break.
    pub(crate) fn break_with_wire(
        &self,
        wire: WireError,
        completed: Option<u64>,
    ) -> (WireError, u64) {
        let (reason, after, first) = self.mark_broken(wire, completed);
        if first {
            self.announce_broken(&reason);
        }
        (reason, after)
    }

    /// First half of a break: records it (so no further collective completes) without waking
    /// anyone yet. Returns the reason in force, the last completed collective, and whether this
    /// call broke the plane.
    pub(crate) fn mark_broken(
        &self,
        wire: WireError,
        completed: Option<u64>,
    ) -> (WireError, u64, bool) {
        // While a global exit is under way every break is the others ending: this process
        // ends with the global exit's status before anyone here learns of the break.
        global_exit::end_if_announced();
        let mut inbox = self.inbox.lock();
        match &inbox.broken {
            Some(existing) => (existing.clone(), inbox.broken_after, false),
            None => {
                tracing::debug!(reason = ?wire, "the control plane broke");
                inbox.broken = Some(wire.clone());
                inbox.broken_after = completed.unwrap_or(inbox.completed);
                (wire, inbox.broken_after, true)
            }
        }
    }

    /// Second half of a break: wakes every waiter and runs the hooks.
    pub(crate) fn announce_broken(&self, reason: &WireError) {
        self.inbox.lock().announced = true;
        self.version.fetch_add(1, Ordering::Release);
        self.changed.notify_all();
        for hook in self.hooks.lock().iter() {
            hook(reason);
        }
    }

    /// Adds a hook run when the plane breaks (at once if it is broken already).
    pub(crate) fn on_break(&self, hook: BreakHook) {
        let mut hooks = self.hooks.lock();
        let broken = self.inbox.lock().broken.clone();
        match broken {
            Some(reason) => hook(&reason),
            None => hooks.push(hook),
        }
    }
}

/// Parses a point-to-point payload: source u32, destination u32, tag u64, data.
pub(crate) fn parse_send(payload: &[u8]) -> Option<(usize, usize, u64, &[u8])> {
    let source = u32::from_le_bytes(payload.get(0..4)?.try_into().ok()?) as usize;
    let destination = u32::from_le_bytes(payload.get(4..8)?.try_into().ok()?) as usize;
    let tag = u64::from_le_bytes(payload.get(8..16)?.try_into().ok()?);
    Some((source, destination, tag, &payload[16..]))
}

/// Root rank 0's router: reads every member connection until woken through `wake`.
pub(crate) struct RootRouter {
    pub(crate) shared: Arc<Shared>,
    pub(crate) links: Vec<Option<Arc<Link>>>,
    pub(crate) readers: Vec<Option<(TcpStream, FrameDecoder)>>,
    pub(crate) wake: UnixStream,
    /// When each member was last heard; the hosts of the ranks.
    pub(crate) liveness: Arc<Liveness>,
}

impl RootRouter {
    pub(crate) fn run(mut self) {
        let mut active_until = Instant::now();
        loop {
            let open: Vec<usize> = (0..self.readers.len())
                .filter(|&r| self.readers[r].is_some())
                .collect();
            let mut fds = Vec::with_capacity(open.len() + 1);
            fds.push(PollFd::new(&self.wake, PollFlags::IN));
            for &rank in &open {
                let (stream, _) = self.readers[rank].as_ref().expect("open");
                fds.push(PollFd::new(stream, PollFlags::IN));
            }
            // While spinning, look again at the same descriptors (nothing changes between looks).
            let polled = loop {
                let spinning = Instant::now() < active_until;
                match poll(&mut fds, spinning.then_some(&NO_WAIT)) {
                    Ok(0) if spinning => std::thread::yield_now(),
                    other => break other,
                }
            };
            match polled {
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => {
                    let error = Error::new(
                        ErrorKind::Backend,
                        "control plane",
                        format!("root rank 0's router cannot poll its connections: {e}"),
                    );
                    self.abort_all(&error, None);
                    return;
                }
            }
            if !fds[0].revents().is_empty() {
                return;
            }
            let fired: Vec<usize> = open
                .iter()
                .enumerate()
                .filter(|(i, _)| !fds[i + 1].revents().is_empty())
                .map(|(_, &rank)| rank)
                .collect();
            drop(fds);
            for rank in fired {
                self.serve(rank);
            }
            active_until = Instant::now() + self.shared.spin;
        }
    }

    fn serve(&mut self, rank: usize) {
        let (stream, decoder) = self.readers[rank].as_mut().expect("open reader");
        let read = decoder.read_from(stream);
        let mut frames = Vec::new();
        let mut violation = None;
        loop {
            match decoder.next_frame() {
                Ok(Some(frame)) => frames.push(frame),
                Ok(None) => break,
                Err(e) => {
                    violation = Some(format!("rank {rank} sent an invalid frame: {e}"));
                    break;
                }
            }
        }
        for frame in frames {
            if let Err(why) = self.dispatch(rank, frame) {
                violation = Some(why);
                break;
            }
        }
        if let Some(why) = violation {
            self.readers[rank] = None;
            let error = Error::new(ErrorKind::Protocol, "control plane", why).with_peer(rank);
            self.abort_all(&error, Some(rank));
            return;
        }
        match read {
            Ok(n) if n > 0 => self.liveness.heard(rank),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            ended => {
                self.readers[rank] = None;
                let departed = self.shared.update(|inbox| inbox.departed[rank]);
                if !departed {
                    let hosts = self.liveness.hosts();
                    let host = hosts.describe(hosts.host_of(rank));
                    let detail = match ended {
                        Err(e) => format!("its connection from {host} failed: {e}"),
                        Ok(_) => format!(
                            "its connection from {host} closed without a goodbye: the process \
                             exited or was killed"
                        ),
                    };
                    let error = Error::peer_lost("control plane", rank, &detail);
                    self.abort_all(&error, Some(rank));
                }
            }
        }
    }

    fn dispatch(&mut self, rank: usize, frame: Frame) -> Result<(), String> {
        match frame.kind {
            Kind::Contribute => {
                let (op, sequence, data) = parse_contribution(frame.payload)
                    .ok_or_else(|| format!("rank {rank} sent a truncated contribution"))?;
                self.shared.update(|inbox| {
                    inbox.contributions[rank].push_back(Contribution { op, sequence, data })
                });
            }
            Kind::Send => {
                let (source, destination, tag, data) = parse_send(&frame.payload)
                    .ok_or_else(|| format!("rank {rank} sent a truncated message"))?;
                if source != rank || destination >= self.links.len() {
                    return Err(format!(
                        "rank {rank} sent a message claiming source {source}, destination \
                         {destination}"
                    ));
                }
                if destination == 0 {
                    self.shared.deliver(source, tag, data);
                } else if let Some(link) = &self.links[destination] {
                    // A failed forward means the destination is gone; its own hang-up is
                    // reported when its connection closes.
                    let _ = link.send(Kind::Send, &[&frame.payload]);
                }
            }
            Kind::Bye => self.shared.update(|inbox| inbox.departed[rank] = true),
            Kind::Exit => {
                let status = global_exit::parse_status(&frame.payload)
                    .ok_or_else(|| format!("rank {rank} sent a truncated global exit"))?;
                global_exit::serve_request(&self.shared, &self.links, status);
            }
            Kind::ExitAck => global_exit::acknowledged(&self.shared, rank),
            // One sent while the rendezvous waited carries its sender's node name: it says
            // nothing about how this member beats now.
            Kind::Heartbeat if frame.payload.is_empty() => self.liveness.heartbeat_from(rank),
            Kind::Heartbeat => {}
            Kind::Silent => self.silent_reported(rank, &frame.payload)?,
            other => return Err(format!("rank {rank} sent an unexpected {other:?} frame")),
        }
        Ok(())
    }

    /// Rank `reporter` found a rank of its host silent past the peer timeout (payload: that
    /// rank u32, the silence in milliseconds u32): names that rank's process lost to everyone.
    fn silent_reported(&self, reporter: usize, payload: &[u8]) -> Result<(), String> {
        let field = |at: usize| {
            let bytes = payload.get(at..at + 4)?.try_into().ok()?;
            Some(u32::from_le_bytes(bytes))
        };
        let (Some(peer), Some(millis)) = (field(0), field(4)) else {
            return Err(format!("rank {reporter} sent a truncated silence report"));
        };
        let (peer, hosts) = (peer as usize, self.liveness.hosts());
        if peer == 0 || peer == reporter || peer >= hosts.len() {
            return Err(format!(
                "rank {reporter} reported rank {peer} silent, not another member"
            ));
        }
        if hosts.host_of(peer) != hosts.host_of(reporter) {
            return Err(format!(
                "rank {reporter} reported rank {peer} silent, which runs on another host"
            ));
        }
        let ended = self
            .shared
            .peek(|inbox| inbox.departed[peer] || inbox.closing || inbox.broken.is_some());
        if !ended {
            let silence = Duration::from_millis(u64::from(millis));
            let error = local_lost(hosts, peer, reporter, silence);
            self.abort_all(&error, Some(peer));
        }
        Ok(())
    }

    /// Breaks the plane and tells every member except `skip` why (see [`abort_members`]).
    fn abort_all(&self, error: &Error, skip: Option<usize>) {
        abort_members(&self.shared, &self.links, error, skip);
    }
}

/// Root rank 0: breaks the plane with `error` and tells every member except `skip` why. The
/// aborts go out before anyone here is woken: a caller woken by the break may end this process
/// at once, and the members must then learn the real cause, not merely that root rank 0 hung up.
pub(crate) fn abort_members(
    shared: &Shared,
    links: &[Option<Arc<Link>>],
    error: &Error,
    skip: Option<usize>,
) {
    let (wire, completed, first) = shared.mark_broken(WireError::from_error(error), None);
    broadcast_abort(links, &wire, completed, skip);
    if first {
        shared.announce_broken(&wire);
    }
}

/// Sends an abort frame — the last completed collective, then `wire` — to every member link
/// except `skip`.
pub(crate) fn broadcast_abort(
    links: &[Option<Arc<Link>>],
    wire: &WireError,
    completed: u64,
    skip: Option<usize>,
) {
    let payload = wire.encode();
    for (rank, link) in links.iter().enumerate() {
        if Some(rank) == skip {
            continue;
        }
        if let Some(link) = link {
            let _ = link.send(Kind::Abort, &[&completed.to_le_bytes(), &payload]);
        }
    }
}

/// Parses a contribution payload: op u8, collective sequence u64, data.
pub(crate) fn parse_contribution(mut payload: Vec<u8>) -> Option<(u8, u64, Vec<u8>)> {
    let op = *payload.first()?;
    let sequence = u64::from_le_bytes(payload.get(1..9)?.try_into().ok()?);
    payload.drain(..9);
    Some((op, sequence, payload))
}

/// A member's router: reads the connection to root rank 0 until it closes.
pub(crate) struct MemberRouter {
    pub(crate) shared: Arc<Shared>,
    pub(crate) stream: TcpStream,
    pub(crate) decoder: FrameDecoder,
    /// The link to root rank 0 (for the router's own answers: a global exit's acknowledgement).
    pub(crate) link: Arc<Link>,
    /// When root rank 0 was last heard.
    pub(crate) liveness: Arc<Liveness>,
}

impl MemberRouter {
    pub(crate) fn run(mut self) {
        let mut active_until = Instant::now();
        loop {
            // Frames that arrived together with the welcome are already buffered.
            loop {
                match self.decoder.next_frame() {
                    Ok(Some(frame)) => self.dispatch(frame),
                    Ok(None) => break,
                    Err(e) => {
                        self.lose_root(format!("root rank 0 sent an invalid frame: {e}"));
                        return;
                    }
                }
            }
            if Instant::now() < active_until {
                let mut fds = [PollFd::new(&self.stream, PollFlags::IN)];
                if matches!(poll(&mut fds, Some(&NO_WAIT)), Ok(0)) {
                    std::thread::yield_now();
                    continue;
                }
            }
            match self.decoder.read_from(&mut self.stream) {
                Ok(n) if n > 0 => {
                    self.liveness.heard(0);
                    active_until = Instant::now() + self.shared.spin;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                ended => {
                    let expected = self.shared.update(|i| {
                        i.root_gone = true;
                        i.closing || i.root_departed
                    });
                    if !expected {
                        self.lose_root(match ended {
                            Err(e) => format!("the connection to root rank 0 failed: {e}"),
                            Ok(_) => "root rank 0 closed its connection without a goodbye: the \
                                      process exited or was killed"
                                .to_string(),
                        });
                    }
                    return;
                }
            }
        }
    }

    fn dispatch(&mut self, frame: Frame) {
        match frame.kind {
            Kind::Heartbeat => {}
            Kind::Outcome => {
                let outcome = parse_outcome(&frame.payload);
                match outcome {
                    Some(outcome) => self.shared.update(|i| i.outcomes.push_back(outcome)),
                    None => self.lose_root("root rank 0 sent a truncated outcome".into()),
                }
            }
            Kind::Send => match parse_send(&frame.payload) {
                Some((source, _, tag, data)) => self.shared.deliver(source, tag, data),
                None => self.lose_root("root rank 0 forwarded a truncated message".into()),
            },
            Kind::Abort => match frame.payload.split_first_chunk::<8>() {
                Some((completed, wire)) => {
                    let completed = u64::from_le_bytes(*completed);
                    self.shared
                        .break_with_wire(WireError::decode(wire), Some(completed));
                }
                None => self.lose_root("root rank 0 sent a truncated abort".into()),
            },
            Kind::Bye => self.shared.update(|inbox| inbox.root_departed = true),
            Kind::Exit => match global_exit::parse_status(&frame.payload) {
                Some(status) => {
                    // Recorded before the acknowledgement leaves: nothing this process notices
                    // of the others ending from then on is taken for a lost peer.
                    global_exit::record(status);
                    // A failed send means root rank 0 is gone; its hang-up is handled next.
                    let _ = self.link.send(Kind::ExitAck, &[]);
                }
                None => self.lose_root("root rank 0 sent a truncated global exit".into()),
            },
            Kind::ExitNow => match global_exit::parse_status(&frame.payload) {
                Some(status) => global_exit::exit_now(&self.shared, status),
                None => self.lose_root("root rank 0 sent a truncated global exit".into()),
            },
            other => self.lose_root(format!("root rank 0 sent an unexpected {other:?} frame")),
        }
    }

    fn lose_root(&self, detail: String) {
        let error = Error::peer_lost("control plane", 0, &detail);
        self.shared.update(|inbox| inbox.root_gone = true);
        self.shared.break_with(&error);
    }
}

/// Parses an outcome payload: collective sequence u64, status u8 (0 ok, 1 error), then data or
/// an encoded [`WireError`].
fn parse_outcome(payload: &[u8]) -> Option<Outcome> {
    let sequence = u64::from_le_bytes(payload.get(0..8)?.try_into().ok()?);
    let status = *payload.get(8)?;
    let body = &payload[9..];
    let result = match status {
        0 => Ok(body.to_vec()),
        _ => Err(WireError::decode(body)),
    };
    Some(Outcome { sequence, result })
}

/// Wakes root rank 0's router so it exits.
pub(crate) fn wake(wake: &mut UnixStream) {
    let _ = wake.write_all(&[1]);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome() -> Outcome {
        Outcome {
            sequence: 1,
            result: Ok(Vec::new()),
        }
    }

    /// An update wakes a waiter whether it comes during the waiter's spin phase or after the
    /// waiter fell asleep on the condition variable (no lost wake-up in either phase).
    #[test]
    fn a_waiter_sees_updates_made_while_it_spins_and_while_it_sleeps() {
        let shared = Arc::new(Shared::new(1));
        assert_eq!(shared.spin, SPIN_WINDOW, "one PE always has a core");
        for delay in [Duration::ZERO, SPIN_WINDOW * 20] {
            let updater = Arc::clone(&shared);
            let thread = std::thread::spawn(move || {
                // Places the update in the waiter's spin phase, or well past it.
                std::thread::sleep(delay);
                updater.update(|inbox| inbox.outcomes.push_back(outcome()));
            });
            let deadline = Instant::now() + Duration::from_secs(30);
            let seen = shared.wait_until(deadline, |inbox| inbox.outcomes.pop_front());
            thread.join().unwrap();
            assert_eq!(seen.map(|o| o.sequence), Some(1), "after {delay:?}");
        }
    }

    /// A waiter that fell asleep with spin work runs the work again when another thread
    /// handled the work's events (a nudge), and hands the work back when that wait ends.
    #[test]
    fn a_nudge_sends_a_sleeping_spinner_back_to_its_work() {
        #[derive(Default)]
        struct Counts {
            spins: AtomicUsize,
            starts: AtomicUsize,
            /// Stops that handed the work over.
            stops: AtomicUsize,
            running: AtomicBool,
            /// Whether the last stop handed the work over.
            handed_over: AtomicBool,
        }
        struct Work(Arc<Counts>);
        impl Progress for Work {
            fn progress(&self) -> usize {
                assert!(
                    self.0.running.load(Ordering::SeqCst),
                    "spun before starting"
                );
                self.0.spins.fetch_add(1, Ordering::SeqCst);
                0
            }
            fn begin_serving(&self) {
                assert!(
                    !self.0.running.swap(true, Ordering::SeqCst),
                    "started twice"
                );
                self.0.starts.fetch_add(1, Ordering::SeqCst);
            }
            fn end_serving(&self, hand_over: bool) {
                assert!(
                    self.0.running.swap(false, Ordering::SeqCst),
                    "stopped twice"
                );
                self.0.handed_over.store(hand_over, Ordering::SeqCst);
                if hand_over {
                    self.0.stops.fetch_add(1, Ordering::SeqCst);
                }
            }
        }
        let until = |what: &str, done: &dyn Fn() -> bool| {
            let deadline = Instant::now() + Duration::from_secs(60);
            while !done() {
                assert!(Instant::now() < deadline, "never: {what}");
                std::thread::yield_now();
            }
        };
        let shared = Arc::new(Shared::new(1));
        let counts = Arc::new(Counts::default());
        let work = shared.while_spinning(Arc::new(Work(Arc::clone(&counts))));
        let waiter = {
            let shared = Arc::clone(&shared);
            std::thread::spawn(move || {
                let deadline = Instant::now() + Duration::from_secs(60);
                shared.wait_until(deadline, |inbox| inbox.outcomes.pop_front())
            })
        };
        until("asleep after its spin window", &|| {
            shared.sleeping_spinners.load(Ordering::SeqCst) == 1
        });
        assert!(
            counts.stops.load(Ordering::SeqCst) >= 1,
            "handed back before sleeping"
        );
        let spins = counts.spins.load(Ordering::SeqCst);
        work.nudger().nudge();
        until("spinning again", &|| {
            counts.spins.load(Ordering::SeqCst) > spins
        });
        shared.update(|inbox| inbox.outcomes.push_back(outcome()));
        assert_eq!(waiter.join().unwrap().map(|o| o.sequence), Some(1));
        assert!(
            !counts.running.load(Ordering::SeqCst),
            "the wait stopped its work as it ended"
        );
        // As it ended, or before sleeping again if its new window passed first.
        assert!(
            counts.handed_over.load(Ordering::SeqCst),
            "the nudged wait handed its work back"
        );
        assert_eq!(
            counts.starts.load(Ordering::SeqCst),
            2,
            "a start per spin phase"
        );
    }

    /// A waiter whose answer comes while it spins stops its work as it leaves, without
    /// handing it over (the work's other threads stay stood down: a barrier's wait would
    /// otherwise wake them each time).
    #[test]
    fn a_spinner_answered_stops_its_work_without_handing_it_over() {
        /// What the waiter told its work, in order.
        type Told = Arc<Mutex<Vec<&'static str>>>;
        /// Answers the wait from the waiter's first spin, so the answer comes while it spins.
        struct Work {
            told: Told,
            shared: Arc<Shared>,
            answered: AtomicBool,
        }
        impl Progress for Work {
            fn progress(&self) -> usize {
                if !self.answered.swap(true, Ordering::SeqCst) {
                    self.shared
                        .update(|inbox| inbox.outcomes.push_back(outcome()));
                }
                0
            }
            fn begin_serving(&self) {
                self.told.lock().push("start");
            }
            fn end_serving(&self, hand_over: bool) {
                let what = if hand_over { "hand over" } else { "stop" };
                self.told.lock().push(what);
            }
        }
        // A waiter descheduled past its whole spin window sleeps without spinning; that try
        // tells nothing (the test answers it itself) and is made again.
        for _ in 0..20 {
            let shared = Arc::new(Shared::new(1));
            let told = Told::default();
            let _work = shared.while_spinning(Arc::new(Work {
                told: Arc::clone(&told),
                shared: Arc::clone(&shared),
                answered: AtomicBool::new(false),
            }));
            let waiter = {
                let shared = Arc::clone(&shared);
                std::thread::spawn(move || {
                    let deadline = Instant::now() + Duration::from_secs(60);
                    shared.wait_until(deadline, |inbox| inbox.outcomes.pop_front())
                })
            };
            let deadline = Instant::now() + Duration::from_secs(60);
            while !waiter.is_finished() {
                if told.lock().is_empty() && shared.sleeping_spinners.load(Ordering::SeqCst) != 0 {
                    shared.update(|inbox| inbox.outcomes.push_back(outcome()));
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "the waiter neither spun nor slept"
                );
                std::thread::yield_now();
            }
            assert_eq!(waiter.join().unwrap().map(|o| o.sequence), Some(1));
            let told = told.lock().clone();
            if told.is_empty() {
                continue;
            }
            assert_eq!(told, ["start", "stop"]);
            return;
        }
        panic!("the waiter slept without spinning in 20 tries");
    }

    #[test]
    fn a_group_with_more_pes_than_cores_never_spins() {
        let shared = Shared::new(crate::sys::available_cores() + 1);
        assert_eq!(shared.spin, Duration::ZERO);
    }
}
