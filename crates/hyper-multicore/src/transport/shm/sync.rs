//! The synchronisation words in the symmetric segment, and the barrier, signal-wait and abort
//! protocols over them.
//!
//! Every PE of a host maps the same memfd, so these words are shared by processes: they hold
//! only atomics (through [`crate::primitive`], which loom swaps out), never pointers or locks.
//! The runtime places one [`AbortWord`] and one [`CentralWords`] per segment and, per PE, two
//! [`Doorbell`]s (one for signal waits, one for barrier waits) and one [`BarrierFlags`] in the
//! segment's words and hands out references into the mapping.
//!
//! Roles:
//!
//! ```ignore
//! // every PE of the segment, collectively (`epoch` counts this PE's barriers from 1; `kind`
//! // is the segment's, the same for all):
//! barrier(kind, &words, me, pes, epoch, &abort, &WaitPolicy::new(local_pes, deadline))?;
//!
//! // a PE waiting for a signal word in its own heap, with its own doorbell:
//! wait_until(|| signal.load(Acquire) >= 1, &bells[me], &abort, &policy)?;
//! // the PE that wrote that word (SeqCst store, or any store followed by fence(SeqCst)):
//! signal.store(1, SeqCst);
//! ring(&bells[target]);
//!
//! // whoever learns that rank 3 died (the control plane's peer-loss watcher):
//! abort(&abort, 3, &central, &bells);
//! ```
//!
//! Two barriers, one per segment chosen by [`BarrierKind`]. When each PE has a core, a
//! dissemination barrier: in round k (of ⌈log2 pes⌉) PE i writes its epoch into round k's flag
//! of PE i + 2^k and waits for PE i − 2^k to do the same to its own flag (indices modulo
//! `pes`). Every PE writes only other PEs' flags and waits only on its own, so on 2 PEs a barrier
//! is both PEs' stores crossing once — no shared counter line bouncing between cores. With more
//! PEs than cores, a central counter: one arrival and one wait per PE, which costs fewer context
//! switches than ⌈log2 pes⌉ waits.
//!
//! Waiting has three phases (ARCHITECTURE.md decision 6): spin with `PAUSE` (only when every
//! local PE can have its own core, and only as long as spinning has been paying in this process
//! lately: see [`SPIN_BUDGET`]), then `sched_yield` a bounded number of times, then sleep on
//! the waiting PE's doorbell (a futex). A sleeper first counts itself in the doorbell's
//! `sleepers` word, so wakers make a system call only when someone actually sleeps; the fast path
//! of [`ring`] is one load. Each sleep lasts at most [`SLEEP_SLICE`], every phase checks the
//! deadline and the abort word, and the condition wins over an abort that races it. The clock is
//! first read when the spin phase has run for a while, so a wait that ends while spinning (a
//! barrier or a ping-pong on cores of their own) never reads it.

use std::cell::Cell;
use std::time::{Duration, Instant};

use crate::control::Progress;
use crate::primitive::{fence, spin_loop, yield_now, AtomicU32, Ordering};
use crate::sys::futex;
pub(crate) use crate::sys::segment_words::{
    AbortWord, BarrierFlags, CentralWords, Doorbell, MAX_BARRIER_ROUNDS,
};

/// `PAUSE` iterations before yielding (when spinning is allowed at all), at most: see
/// [`SpinBudget`]. Loom explores every interleaving, so there one step of each phase is enough.
const SPIN_LIMIT: u32 = if cfg!(loom) { 1 } else { 4096 };
/// The fewest looks a spin phase shrinks to ([`SpinBudget`]): enough to catch a peer whose
/// store is already crossing to this core.
const SPIN_FLOOR: u32 = if cfg!(loom) { 1 } else { 16 };
/// How many spins pass between two looks at the clock (the first look starts the deadline of a
/// [`Deadline::After`]).
const SPINS_PER_CLOCK_CHECK: u32 = 256;
/// `sched_yield` calls before going to sleep.
const YIELD_LIMIT: u32 = if cfg!(loom) { 1 } else { 64 };
/// Bit 0 of the central barrier's `generation`: set by [`abort`] so that the futex word changes
/// under a sleeping barrier waiter without releasing the barrier.
const GENERATION_ABORT_FLAG: u32 = 1;
/// What a completed round adds to `generation` (the round number lives in bits 1..).
const GENERATION_STEP: u32 = 2;
/// The longest single futex sleep: bounds how late a sleeper notices a missed wake-up, should
/// one ever happen (for example a waker process killed between its store and its wake).
pub(crate) const SLEEP_SLICE: Duration = Duration::from_millis(20);
/// The most PEs one segment (one host) can hold: one barrier flag per round.
pub(crate) const MAX_SEGMENT_PES: usize = 1 << MAX_BARRIER_ROUNDS;

/// How many looks this process's waits spin before they yield: [`SPIN_LIMIT`] while spinning
/// pays, halved by each spin phase that runs out (down to [`SPIN_FLOOR`]), doubled by each wait
/// that a later look of its spin phase ends. A spin pays only while the awaited PE runs on
/// another core. When other processes share the cores (a load the core count does not show),
/// the awaited PE is often waiting for a core, at times for the very core the waiter spins on:
/// the spin burns the waiter's share of the CPU for nothing, and the scheduler then makes its
/// yield wait behind the other processes for whole slices, once per wait.
static SPIN_BUDGET: SpinBudget = SpinBudget::new();

/// The adaptive length of the spin phase (see [`SPIN_BUDGET`]): process-local tuning state,
/// not a protocol word, so a plain `std` atomic (a lost update between two threads' waits only
/// delays the adaptation by one wait; under loom it stays at 1). On a cache line of its own:
/// every wait reads it, and no other thread's writes should evict it meanwhile.
#[repr(align(64))]
struct SpinBudget {
    looks: std::sync::atomic::AtomicU32,
}

/// How a wait's spin phase ended, as [`SpinBudget::record`] learns it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SpinPhase {
    /// A look after the first found the condition true: the spin paid.
    Caught,
    /// Every look found it false: the wait goes on to yield.
    RanOut,
}

impl SpinBudget {
    const fn new() -> Self {
        SpinBudget {
            looks: std::sync::atomic::AtomicU32::new(SPIN_LIMIT),
        }
    }

    /// The budget now: a wait spins at most this many looks.
    #[inline]
    fn looks(&self) -> u32 {
        self.looks.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The spin phase of [`wait`]: looks until `done()` or an abort settles the wait (its
    /// outcome) or `clock`'s deadline passes (the timeout), `limit` looks at most and no more
    /// than the budget, `PAUSE` apart if `S` says so; `None` when they ran out. Learns from how
    /// the phase ended.
    #[inline]
    fn spin<S: Serving>(
        &self,
        done: &mut impl FnMut() -> bool,
        abort: &AbortWord,
        limit: u32,
        clock: &mut Clock,
    ) -> Option<Result<(), WaitError>> {
        let budget = self.looks();
        let looks = limit.min(budget);
        for look in 0..looks {
            if let Some(outcome) = settled(done, abort) {
                // A condition true at the first look says nothing about spinning (the later
                // of two PEs meeting finds the earlier one's flag already set).
                if look > 0 {
                    self.record(budget, SpinPhase::Caught);
                }
                return Some(outcome);
            }
            if look % SPINS_PER_CLOCK_CHECK == SPINS_PER_CLOCK_CHECK - 1 {
                if let Err(timeout) = clock.check() {
                    return Some(Err(timeout));
                }
            }
            if S::PAUSE_BETWEEN_LOOKS {
                spin_loop();
            }
        }
        if looks > 0 {
            self.record(budget, SpinPhase::RanOut);
        }
        None
    }

    /// Doubles the budget, `looks` when the spin phase began, after a spin that paid; halves
    /// it after one that ran out.
    #[inline]
    fn record(&self, looks: u32, phase: SpinPhase) {
        let next = match phase {
            SpinPhase::Caught => looks.saturating_mul(2).min(SPIN_LIMIT),
            SpinPhase::RanOut => (looks / 2).max(SPIN_FLOOR),
        };
        if next != looks {
            self.looks.store(next, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

/// Which barrier the PEs of a segment use: the segment's creator decides (from the local PE
/// count and its cores) and records it in the header, so that every member runs the same one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BarrierKind {
    /// [`dissemination_barrier`]: when every PE has a core of its own, so waits spin.
    Dissemination = 1,
    /// [`central_barrier`]: with more PEs than cores, where waits yield and sleep. One arrival
    /// and one wait per PE costs fewer context switches there than ⌈log2 pes⌉ waits, each of
    /// which may wait for a descheduled partner.
    Central = 2,
}

impl BarrierKind {
    /// The barrier for `pes` PEs sharing this host.
    pub(crate) fn for_pes(pes: usize) -> Self {
        if spins(pes) {
            BarrierKind::Dissemination
        } else {
            BarrierKind::Central
        }
    }

    /// The kind recorded as `word` in a segment header.
    pub(crate) fn from_word(word: u64) -> Option<Self> {
        [BarrierKind::Dissemination, BarrierKind::Central]
            .into_iter()
            .find(|kind| *kind as u64 == word)
    }
}

/// The barrier words of the PEs sharing a segment, by slot (0 to `pes` − 1).
pub(crate) trait BarrierWords {
    /// The segment's central barrier words.
    fn central(&self) -> &CentralWords;
    /// PE `pe`'s barrier flags.
    fn flags(&self, pe: usize) -> &BarrierFlags;
    /// The doorbell PE `pe`'s barrier waits sleep on: not the one its signal waits use, so that
    /// atomics and signals into its memory do not wake it while it waits in a barrier.
    fn bell(&self, pe: usize) -> &Doorbell;
}

/// Why a wait ended without its condition becoming true.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WaitError {
    /// The deadline passed first, after waiting about `waited`.
    Timeout {
        /// From the wait's first look at the clock to its last.
        waited: Duration,
    },
    /// The job was aborted because rank `lost_rank` was lost.
    Aborted {
        /// The first rank reported lost.
        lost_rank: u32,
    },
}

/// When a wait gives up.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Deadline {
    /// At this instant.
    At(Instant),
    /// This long after the wait's first look at the clock, which comes once its spin phase has
    /// run a while (a few microseconds) or before its first yield.
    After(Duration),
}

/// How to wait: spin first only if there are at least as many cores as local PEs.
#[derive(Clone, Copy, Debug)]
pub(crate) struct WaitPolicy {
    /// Busy-wait with `PAUSE` before yielding; pure spinning collapses when PEs outnumber cores.
    pub spin: bool,
    /// When the wait gives up with [`WaitError::Timeout`].
    pub deadline: Deadline,
}

impl WaitPolicy {
    /// How many looks, `PAUSE` apart, a wait of this policy takes before it yields.
    #[inline]
    pub(crate) fn spin_looks(&self) -> u32 {
        if self.spin {
            SPIN_LIMIT
        } else {
            0
        }
    }
}

#[cfg(test)]
impl WaitPolicy {
    /// The policy for `local_pes` PEs sharing this host, waiting until `deadline`.
    pub(crate) fn new(local_pes: usize, deadline: Deadline) -> Self {
        WaitPolicy {
            spin: spins(local_pes),
            deadline,
        }
    }
}

/// Whether waits of `local_pes` PEs sharing this host may spin: only when each can have a core.
pub(crate) fn spins(local_pes: usize) -> bool {
    local_pes <= crate::sys::available_cores()
}

/// The barrier of kind `kind` of the `pes` PEs whose words `words` holds, called by PE `me`
/// with its epoch (see [`dissemination_barrier`], which this one calls without carried words;
/// the central barrier needs no epoch).
#[inline]
pub(crate) fn barrier(
    kind: BarrierKind,
    words: &impl BarrierWords,
    me: usize,
    pes: usize,
    epoch: u32,
    abort: &AbortWord,
    policy: &WaitPolicy,
) -> Result<(), WaitError> {
    match kind {
        BarrierKind::Dissemination => {
            dissemination_barrier(words, me, pes, epoch, abort, policy, None)
        }
        BarrierKind::Central => central_barrier(words.central(), pes, abort, policy),
    }
}

/// The dissemination barrier of the `pes` PEs whose words `words` holds, called by PE `me`;
/// `epoch` is this barrier's number on this PE (1 for the first on these words, then 2, …;
/// every PE counts the same).
///
/// Each round's flag store is a release and the waits acquire it, so everything a PE wrote
/// before the barrier is visible to every PE after it (the rounds chain every PE to every
/// other). On `Err` the PE may have left flags behind, so the words are broken for good: a
/// timeout or abort is terminal for them (a restart zeroes them).
///
/// `carry`: words handed to the round-0 partner with the round-0 flag, which it reads back
/// with [`BarrierFlags::carried`] (word 0 is their tag: not 0, and different for each barrier
/// that carries words).
pub(crate) fn dissemination_barrier(
    words: &impl BarrierWords,
    me: usize,
    pes: usize,
    epoch: u32,
    abort: &AbortWord,
    policy: &WaitPolicy,
    carry: Option<&[u64; 4]>,
) -> Result<(), WaitError> {
    debug_assert!(me < pes && pes <= MAX_SEGMENT_PES, "PE {me} of {pes}");
    let mine = words.flags(me);
    // One clock for every round: the barrier as a whole ends by the deadline.
    let mut clock = Clock::new(policy.deadline);
    let mut distance = 1;
    let mut round = 0;
    while distance < pes {
        let partner = (me + distance) % pes;
        // A flag only grows (modulo 2^32): a partner may already be a barrier ahead. The fence
        // orders the store before `ring`'s look at the partner's sleepers.
        let theirs = words.flags(partner);
        if let (0, Some(carry)) = (round, carry) {
            theirs.carry(carry);
        }
        theirs.round(round).store(epoch, Ordering::Release);
        fence(Ordering::SeqCst);
        ring(words.bell(partner));
        let flag = mine.round(round);
        let reached = || flag.load(Ordering::Acquire).wrapping_sub(epoch) as i32 >= 0;
        let bell = words.bell(me);
        wait(
            reached,
            &bell.ring,
            &bell.sleepers,
            abort,
            policy.spin_looks(),
            &mut clock,
            (),
            false,
        )?;
        distance *= 2;
        round += 1;
    }
    Ok(())
}

/// Central counter barrier over `pes` processes (sense by generation number).
///
/// The arrival is a release and the departure an acquire: everything a PE wrote before the
/// barrier is visible to every PE after it. On `Err` the PE has still arrived, so the round is
/// broken for good: a timeout or abort is terminal for these words (a restart zeroes them).
pub(crate) fn central_barrier(
    words: &CentralWords,
    pes: usize,
    abort: &AbortWord,
    policy: &WaitPolicy,
) -> Result<(), WaitError> {
    debug_assert!(pes > 0, "a barrier needs at least one PE");
    let gen = words.generation.load(Ordering::Acquire);
    if words.count.fetch_add(1, Ordering::AcqRel) as usize == pes - 1 {
        // Last arriver: reset for the next round *before* releasing it (the next round's
        // arrivals acquire the new generation first, so they see the zero).
        words.count.store(0, Ordering::Relaxed);
        words
            .generation
            .fetch_add(GENERATION_STEP, Ordering::Release);
        // Pairs with the fence a sleeper puts between counting itself and re-reading
        // `generation`: either it sees the new generation, or this load sees it counted.
        fence(Ordering::SeqCst);
        if words.sleepers.load(Ordering::SeqCst) > 0 {
            futex::wake_all(&words.generation);
        }
        return Ok(());
    }
    let released = || round_of(words.generation.load(Ordering::Acquire)) != round_of(gen);
    let mut clock = Clock::new(policy.deadline);
    wait(
        released,
        &words.generation,
        &words.sleepers,
        abort,
        policy.spin_looks(),
        &mut clock,
        (),
        false,
    )
}

/// The round number in a central barrier's `generation` value (without the abort flag).
fn round_of(generation: u32) -> u32 {
    generation & !GENERATION_ABORT_FLAG
}

/// Waits until `ready()` is true; `bell` is the waiting PE's own doorbell.
///
/// `ready` must become true only through a store that is followed by [`ring`] on `bell` (see
/// there); it is called many times and should be a cheap load of the awaited word. Once it
/// returned true it may be called again before the wait returns, and must stay true.
pub(crate) fn wait_until(
    ready: impl FnMut() -> bool,
    bell: &Doorbell,
    abort: &AbortWord,
    policy: &WaitPolicy,
) -> Result<(), WaitError> {
    wait_on_bell(ready, bell, abort, policy, policy.spin_looks(), (), false)
}

/// [`wait_until`] for a PE with network peers, whose `ready` progresses the network transport:
/// `serving` hears when its looks begin and end (the transport's progress thread stands down
/// while they serve it, and serves again from each sleep on the doorbell), and a ring that wakes it
/// without making `ready()` true — peers' operations the progress thread applied, whose
/// progress hook rings the doorbell — sends it back to its yield phase, in which `ready`
/// serves the next ones itself. It takes `spin_looks` looks, `PAUSE` apart, before it yields
/// (when `policy` lets it spin at all; each look may cost a progress, a system call).
pub(crate) fn wait_until_then(
    ready: impl FnMut() -> bool,
    bell: &Doorbell,
    abort: &AbortWord,
    policy: &WaitPolicy,
    spin_looks: u32,
    serving: impl Serving,
) -> Result<(), WaitError> {
    let spin_looks = spin_looks.min(policy.spin_looks());
    wait_on_bell(ready, bell, abort, policy, spin_looks, serving, true)
}

/// [`wait`] on `bell` with a clock of its own.
fn wait_on_bell(
    ready: impl FnMut() -> bool,
    bell: &Doorbell,
    abort: &AbortWord,
    policy: &WaitPolicy,
    spin_looks: u32,
    serving: impl Serving,
    rewatch: bool,
) -> Result<(), WaitError> {
    let mut clock = Clock::new(policy.deadline);
    let (word, sleepers) = (&bell.ring, &bell.sleepers);
    wait(
        ready, word, sleepers, abort, spin_looks, &mut clock, serving, rewatch,
    )
}

/// Wakes the owner of `bell` if it sleeps: call it after updating a word that PE may wait on
/// (a signal store, an atomic add into its memory, a barrier flag).
///
/// The update must be a `SeqCst` store or read-modify-write, or be followed by
/// `fence(SeqCst)`: then either the sleeper's re-check sees the update, or this load sees the
/// sleeper. When nobody sleeps this costs one load of the doorbell's line.
#[inline]
pub(crate) fn ring(bell: &Doorbell) {
    if bell.sleepers.load(Ordering::SeqCst) > 0 {
        bell.ring.fetch_add(1, Ordering::SeqCst);
        futex::wake_all(&bell.ring);
    }
}

/// Marks rank `lost` as lost and wakes every sleeper: on the central barrier's `generation`
/// and on every doorbell in `bells` (pass every PE's signal and barrier doorbells).
///
/// Idempotent, and the first lost rank wins. No barrier is released (that would release one
/// the lost rank never reached): the abort flag bit of the central `generation` is set and each
/// doorbell's `ring` word is bumped instead, so a waiter that checked the abort word just before
/// this call and is about to sleep finds its futex word changed and does not sleep.
pub(crate) fn abort<'a>(
    abort: &AbortWord,
    lost: u32,
    central: &CentralWords,
    bells: impl IntoIterator<Item = &'a Doorbell>,
) {
    debug_assert!(lost < u32::MAX, "rank {lost} cannot exist");
    // Whoever was first has already been recorded; a second report changes nothing.
    let _ = abort.word.compare_exchange(
        0,
        lost.saturating_add(1),
        Ordering::SeqCst,
        Ordering::SeqCst,
    );
    central
        .generation
        .fetch_or(GENERATION_ABORT_FLAG, Ordering::SeqCst);
    futex::wake_all(&central.generation);
    for bell in bells {
        bell.ring.fetch_add(1, Ordering::SeqCst);
        futex::wake_all(&bell.ring);
    }
}

/// The rank whose loss aborted the job, if any.
#[inline]
pub(crate) fn aborted(abort: &AbortWord) -> Option<u32> {
    match abort.word.load(Ordering::Acquire) {
        0 => None,
        word => Some(word - 1),
    }
}

/// The outcome once the wait is over: `done` wins over an abort.
#[inline]
fn settled(done: &mut impl FnMut() -> bool, abort: &AbortWord) -> Option<Result<(), WaitError>> {
    if done() {
        Some(Ok(()))
    } else {
        aborted(abort).map(|lost_rank| Err(WaitError::Aborted { lost_rank }))
    }
}

/// A wait's view of the clock: its deadline, fixed at the first look.
struct Clock {
    deadline: Deadline,
    /// The first look and the deadline it fixed.
    first: Option<(Instant, Instant)>,
}

impl Clock {
    /// A clock not looked at yet.
    fn new(deadline: Deadline) -> Self {
        Clock {
            deadline,
            first: None,
        }
    }

    /// `Err(Timeout)` once the deadline has passed.
    fn check(&mut self) -> Result<Duration, WaitError> {
        let now = Instant::now();
        let (first, at) = *self.first.get_or_insert_with(|| match self.deadline {
            Deadline::At(at) => (now, at),
            Deadline::After(timeout) => (now, now + timeout),
        });
        let waited = now - first;
        match at.checked_duration_since(now) {
            Some(remaining) if !remaining.is_zero() => Ok(remaining),
            _ => Err(WaitError::Timeout { waited }),
        }
    }
}

/// [`wait_until_then`] whose every look first progresses `progress` (a network transport):
/// the waiter serves its peers' operations itself while it looks, and tells `progress` when
/// its looks begin and end, so the transport's own thread stands down meanwhile.
pub(crate) fn wait_progressing(
    mut ready: impl FnMut() -> bool,
    bell: &Doorbell,
    abort: &AbortWord,
    policy: &WaitPolicy,
    spin_looks: u32,
    progress: &impl Progress,
) -> Result<(), WaitError> {
    let looks = Progressing {
        progress,
        served: Cell::new(false),
    };
    let look = || {
        looks.look();
        ready()
    };
    wait_until_then(look, bell, abort, policy, spin_looks, &looks)
}

/// The [`Serving`] of [`wait_progressing`]: each look progresses the transport.
struct Progressing<'a, P: Progress> {
    progress: &'a P,
    /// Whether a look handled events since [`Serving::served`] last asked.
    served: Cell<bool>,
}

impl<P: Progress> Progressing<'_, P> {
    /// A look's progress.
    #[inline]
    fn look(&self) {
        if self.progress.progress() != 0 {
            self.served.set(true);
        }
    }
}

impl<P: Progress> Serving for &Progressing<'_, P> {
    /// Each look progresses the transport: a system call, no pause needed between.
    const PAUSE_BETWEEN_LOOKS: bool = false;

    fn begin(&mut self) {
        self.progress.begin_serving();
    }

    fn end(&mut self, hand_over: bool) {
        self.progress.end_serving(hand_over);
    }

    fn served(&mut self) -> bool {
        self.served.replace(false)
    }
}

/// What a wait tells the other threads that serve its PE's transport work (a network
/// transport's progress thread) about its looks. The network waits progress the transport as
/// they look, so that thread stands down while they do; `()` tells nothing (the shared-memory
/// waits).
pub(crate) trait Serving {
    /// Whether the spin phase pauses (`PAUSE`) between looks: not when each look makes a
    /// system call (a network transport's progress), which leaves the core to its sibling anyway
    /// and only comes later after a pause.
    const PAUSE_BETWEEN_LOOKS: bool = true;

    /// The waiter starts looking, and so serving.
    fn begin(&mut self);
    /// It stops looking: to sleep (`hand_over`: the other threads serve again at once), or as
    /// the wait ends.
    fn end(&mut self, hand_over: bool);
    /// Whether its looks since the last call served peers' work (handled events): the yield
    /// phase then goes on, since the next request of a burst will come before a sleep ends.
    fn served(&mut self) -> bool {
        false
    }
}

impl Serving for () {
    #[inline(always)]
    fn begin(&mut self) {}
    #[inline(always)]
    fn end(&mut self, _hand_over: bool) {}
}

/// A wait's [`Serving`] and whether its looks are on: each `begin` has one `end`, also when a
/// panic unwinds out of a look (a progress hook's), which ends it without a hand-over.
struct Looking<S: Serving> {
    inner: S,
    looking: bool,
}

impl<S: Serving> Looking<S> {
    fn begin(mut inner: S) -> Self {
        inner.begin();
        Looking {
            inner,
            looking: true,
        }
    }

    /// The looks start again after a sleep (nothing if they are on).
    fn begin_again(&mut self) {
        if !self.looking {
            self.inner.begin();
            self.looking = true;
        }
    }

    /// The looks stop (nothing if they are off).
    fn end(&mut self, hand_over: bool) {
        if std::mem::take(&mut self.looking) {
            self.inner.end(hand_over);
        }
    }
}

impl<S: Serving> Drop for Looking<S> {
    fn drop(&mut self) {
        self.end(false);
    }
}

/// Spins (`spin_looks` looks, or fewer as [`SPIN_BUDGET`] has it), yields (until [`YIELD_LIMIT`]
/// looks in a row served nothing: see [`Serving::served`]), then sleeps on the futex `word` until
/// `done()`, an abort or `clock`'s deadline. `sleepers` counts the sleepers on `word`; whoever
/// makes `done()` true changes `word` and wakes it when `sleepers` is not zero. `serving` hears
/// when the looks begin and when they end: before the first sleep after a run of looks (handing
/// over; the one look after a sleep slice that ended without a change begins nothing) and as the
/// wait ends. With `rewatch`, a wake-up by a change of `word` that did not make `done()` true sends
/// the waiter back to its yield phase before it sleeps again (the UCX waits: a ring there is peers'
/// traffic, which the waiter's looks then serve themselves), and the wait hands over again when it
/// ends in such looks.
#[allow(clippy::too_many_arguments)]
fn wait<S: Serving>(
    mut done: impl FnMut() -> bool,
    word: &AtomicU32,
    sleepers: &AtomicU32,
    abort: &AbortWord,
    spin_looks: u32,
    clock: &mut Clock,
    serving: S,
    rewatch: bool,
) -> Result<(), WaitError> {
    let mut serving = Looking::begin(serving);
    // Whether the looks served peers' work that did not end the wait (see the end).
    let mut served_peers = false;
    let outcome = 'waited: {
        if let Some(outcome) = SPIN_BUDGET.spin::<S>(&mut done, abort, spin_looks, clock) {
            break 'waited outcome;
        }
        loop {
            serving.begin_again();
            // Counts the looks since the last that served peers' work: a waiter goes on
            // serving a burst of peers' requests itself for as long as they come, where a
            // sleep would leave each to its progress thread's wake-up.
            let mut idle_looks = 0;
            while idle_looks < YIELD_LIMIT {
                if let Some(outcome) = settled(&mut done, abort) {
                    break 'waited outcome;
                }
                idle_looks = if serving.inner.served() {
                    served_peers = true;
                    0
                } else {
                    idle_looks + 1
                };
                if let Err(timeout) = clock.check() {
                    break 'waited Err(timeout);
                }
                yield_now();
            }
            loop {
                if let Some(outcome) = settled(&mut done, abort) {
                    break 'waited outcome;
                }
                let remaining = match clock.check() {
                    Ok(remaining) => remaining,
                    Err(timeout) => break 'waited Err(timeout),
                };
                serving.end(true);
                sleepers.fetch_add(1, Ordering::SeqCst);
                // Pairs with the waker's fence (or SeqCst update) before it reads `sleepers`.
                fence(Ordering::SeqCst);
                let seen = word.load(Ordering::SeqCst);
                if !done() && aborted(abort).is_none() {
                    // Returns at once if `word` moved on since `seen`: a wake-up in between is
                    // not lost.
                    futex::wait(word, seen, Some(remaining.min(SLEEP_SLICE)));
                }
                sleepers.fetch_sub(1, Ordering::SeqCst);
                if rewatch && word.load(Ordering::Relaxed) != seen {
                    served_peers = true;
                    break;
                }
            }
        }
    };
    // A waiter that served peers' requests (a yield phase that went on for them, or its looks
    // again after a ring) took their work from whoever serves while it sleeps; it hands the
    // work over as it leaves, as before it sleeps, since its PE may go on computing now. (Not on
    // every exit: that would wake the UCX progress thread once per barrier.)
    serving.end(served_peers);
    outcome
}

/// The barrier words of `pes` PEs outside a segment, for the in-process tests and models.
#[cfg(test)]
pub(crate) struct TestWords {
    central: CentralWords,
    flags: Vec<BarrierFlags>,
    pub(crate) bells: Vec<Doorbell>,
}

#[cfg(test)]
impl TestWords {
    /// All words zero, as in a fresh segment.
    pub(crate) fn new(pes: usize) -> Self {
        TestWords {
            central: CentralWords::new(),
            flags: (0..pes).map(|_| BarrierFlags::new()).collect(),
            bells: (0..pes).map(|_| Doorbell::new()).collect(),
        }
    }
}

#[cfg(test)]
impl BarrierWords for TestWords {
    fn central(&self) -> &CentralWords {
        &self.central
    }

    fn flags(&self, pe: usize) -> &BarrierFlags {
        &self.flags[pe]
    }

    fn bell(&self, pe: usize) -> &Doorbell {
        &self.bells[pe]
    }
}

#[cfg(all(test, not(loom)))]
mod bench;
#[cfg(all(test, loom))]
mod loom_tests;
#[cfg(all(test, not(loom)))]
mod tests;
