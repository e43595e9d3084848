//! The synchronisation words in the symmetric segment's header, and the barrier, signal-wait and
//! abort protocols over them.
//!
//! Every PE of a host maps the same memfd, so these words are shared by processes: they hold
//! only atomics (through [`crate::primitive`], which loom swaps out), never pointers or locks.
//! The runtime places one [`BarrierWords`], one [`AbortWord`] and one [`Doorbell`] per PE in the
//! header and hands out references into the mapping.
//!
//! Roles:
//!
//! ```ignore
//! // every PE, collectively:
//! barrier(&header.barrier, pes, &header.abort, &WaitPolicy::new(local_pes, deadline))?;
//!
//! // a PE waiting for a signal word in its own heap, with its own doorbell:
//! wait_until(|| signal.load(Acquire) >= 1, &header.bells[me], &header.abort, &policy)?;
//! // the PE that wrote that word (SeqCst store, or any store followed by fence(SeqCst)):
//! signal.store(1, SeqCst);
//! ring(&header.bells[target]);
//!
//! // whoever learns that rank 3 died (the control plane's peer-loss watcher):
//! abort(&header.abort, 3, &header.barrier, &header.bells);
//! ```
//!
//! Waiting has three phases (ARCHITECTURE.md decision 6): spin with `PAUSE` (only when every
//! local PE can have its own core), then `sched_yield` a bounded number of times, then sleep on a
//! shared futex. A sleeper first counts itself in a `sleepers` word, so wakers make a system call
//! only when someone actually sleeps; the fast path of [`ring`] is one load. Each sleep lasts at
//! most [`SLEEP_SLICE`], every phase checks the deadline and the abort word, and the condition
//! wins over an abort that races it.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::primitive::{fence, spin_loop, yield_now, AtomicU32, Ordering};
use crate::sys::futex;

/// `PAUSE` iterations before yielding (when spinning is allowed at all). Loom explores every
/// interleaving, so there one step of each phase is enough.
const SPIN_LIMIT: u32 = if cfg!(loom) { 1 } else { 4096 };
/// How many spins pass between two looks at the clock.
const SPINS_PER_CLOCK_CHECK: u32 = 256;
/// `sched_yield` calls before going to sleep.
const YIELD_LIMIT: u32 = if cfg!(loom) { 1 } else { 64 };
/// The longest single futex sleep: bounds how late a sleeper notices a missed wake-up, should
/// one ever happen (for example a waker process killed between its store and its wake).
pub(crate) const SLEEP_SLICE: Duration = Duration::from_millis(20);

/// Bit 0 of the barrier's `generation`: set by [`abort`] so that the futex word changes under a
/// sleeping barrier waiter without releasing the barrier.
const GENERATION_ABORT_FLAG: u32 = 1;
/// What a completed round adds to `generation` (the round number lives in bits 1..).
const GENERATION_STEP: u32 = 2;

/// Declares `new()` (all words zero) for the in-process tests and models; the runtime gets the
/// same state from a freshly zero-filled segment. `const` normally, plain under loom (whose
/// atomics are not const-constructible).
macro_rules! zeroed_words {
    ($name:ident: $($field:ident),+) => {
        impl $name {
            /// All words zero: the state of a freshly created (zero-filled) segment.
            #[cfg(all(test, not(loom)))]
            pub(crate) const fn new() -> Self {
                Self { $($field: AtomicU32::new(0)),+ }
            }

            /// All words zero: the state of a freshly created (zero-filled) segment.
            #[cfg(loom)]
            pub(crate) fn new() -> Self {
                Self { $($field: AtomicU32::new(0)),+ }
            }
        }
    };
}

/// The central barrier's words: one per segment, on its own cache line.
#[repr(C, align(64))]
#[derive(Debug)]
pub(crate) struct BarrierWords {
    /// PEs that arrived in the current round.
    count: AtomicU32,
    /// Round number times [`GENERATION_STEP`]; the last arriver of a round bumps it, which
    /// releases the others. Bit 0 is [`GENERATION_ABORT_FLAG`].
    generation: AtomicU32,
    /// PEs asleep (or about to sleep) on `generation`.
    sleepers: AtomicU32,
}
zeroed_words!(BarrierWords: count, generation, sleepers);

/// A PE's doorbell: writers ring it after updating a word that PE may be waiting on.
/// One per PE, on its own cache line.
#[repr(C, align(64))]
#[derive(Debug)]
pub(crate) struct Doorbell {
    /// The futex word; bumped by every ring that finds a sleeper.
    ring: AtomicU32,
    /// Waits of this PE asleep (or about to sleep) on `ring`.
    sleepers: AtomicU32,
}
zeroed_words!(Doorbell: ring, sleepers);

/// The job's abort word: 0 while healthy, `r + 1` once rank `r` was lost. One per segment, on
/// its own cache line.
#[repr(C, align(64))]
#[derive(Debug)]
pub(crate) struct AbortWord {
    word: AtomicU32,
}
zeroed_words!(AbortWord: word);

#[cfg(not(loom))]
const _: () = {
    assert!(std::mem::size_of::<BarrierWords>() == 64);
    assert!(std::mem::size_of::<Doorbell>() == 64);
    assert!(std::mem::size_of::<AbortWord>() == 64);
};

/// Why a wait ended without its condition becoming true.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WaitError {
    /// The deadline passed first.
    Timeout,
    /// The job was aborted because rank `lost_rank` was lost.
    Aborted {
        /// The first rank reported lost.
        lost_rank: u32,
    },
}

/// How to wait: spin first only if there are at least as many cores as local PEs.
#[derive(Clone, Copy, Debug)]
pub(crate) struct WaitPolicy {
    /// Busy-wait with `PAUSE` before yielding; pure spinning collapses when PEs outnumber cores.
    pub spin: bool,
    /// When the wait gives up with [`WaitError::Timeout`].
    pub deadline: Instant,
}

impl WaitPolicy {
    /// The policy for `local_pes` PEs sharing this host, waiting until `deadline`.
    pub(crate) fn new(local_pes: usize, deadline: Instant) -> Self {
        WaitPolicy {
            spin: local_pes <= available_cores(),
            deadline,
        }
    }
}

/// The cores this process may run on (affinity and cgroup quota included), asked once: the
/// query reads files, far too slow for a barrier.
fn available_cores() -> usize {
    static CORES: OnceLock<usize> = OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Central counter barrier over `pes` processes (sense by generation number).
///
/// The arrival is a release and the departure an acquire: everything a PE wrote before the
/// barrier is visible to every PE after it. On `Err` the PE has still arrived, so the round is
/// broken for good: a timeout or abort is terminal for these words (a restart zeroes them).
pub(crate) fn barrier(
    words: &BarrierWords,
    pes: u32,
    abort: &AbortWord,
    policy: &WaitPolicy,
) -> Result<(), WaitError> {
    debug_assert!(pes > 0, "a barrier needs at least one PE");
    let gen = words.generation.load(Ordering::Acquire);
    if words.count.fetch_add(1, Ordering::AcqRel) == pes.wrapping_sub(1) {
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
    wait(released, &words.generation, &words.sleepers, abort, policy)
}

/// The round number in a `generation` value (without the abort flag).
fn round_of(generation: u32) -> u32 {
    generation & !GENERATION_ABORT_FLAG
}

/// Waits until `ready()` is true; `bell` is the waiting PE's own doorbell.
///
/// `ready` must become true only through a store that is followed by [`ring`] on `bell` (see
/// there); it is called many times and should be a cheap load of the awaited word.
pub(crate) fn wait_until(
    ready: impl FnMut() -> bool,
    bell: &Doorbell,
    abort: &AbortWord,
    policy: &WaitPolicy,
) -> Result<(), WaitError> {
    wait(ready, &bell.ring, &bell.sleepers, abort, policy)
}

/// Wakes the owner of `bell` if it sleeps: call it after updating a word that PE may wait on
/// (a signal store, an atomic add into its memory).
///
/// The update must be a `SeqCst` store or read-modify-write, or be followed by
/// `fence(SeqCst)`: then either the sleeper's re-check sees the update, or this load sees the
/// sleeper. When nobody sleeps this costs one load of the doorbell's line.
pub(crate) fn ring(bell: &Doorbell) {
    if bell.sleepers.load(Ordering::SeqCst) > 0 {
        bell.ring.fetch_add(1, Ordering::SeqCst);
        futex::wake_all(&bell.ring);
    }
}

/// Marks rank `lost` as lost and wakes every sleeper (on the barrier and on every doorbell).
///
/// Idempotent, and the first lost rank wins. The barrier's round number is not bumped (that
/// would release a barrier the lost rank never reached); instead the abort flag bit of its
/// `generation` is set, so that a barrier waiter that checked the abort word just before this
/// call and is about to sleep on `generation` finds the word changed and does not sleep — the
/// same way the doorbells' `ring` words are bumped.
pub(crate) fn abort<'a>(
    abort: &AbortWord,
    lost: u32,
    barrier: &BarrierWords,
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
    barrier
        .generation
        .fetch_or(GENERATION_ABORT_FLAG, Ordering::SeqCst);
    futex::wake_all(&barrier.generation);
    for bell in bells {
        bell.ring.fetch_add(1, Ordering::SeqCst);
        futex::wake_all(&bell.ring);
    }
}

/// The rank whose loss aborted the job, if any.
pub(crate) fn aborted(abort: &AbortWord) -> Option<u32> {
    match abort.word.load(Ordering::Acquire) {
        0 => None,
        word => Some(word - 1),
    }
}

/// The outcome once the wait is over: `done` wins over an abort.
fn settled(done: &mut impl FnMut() -> bool, abort: &AbortWord) -> Option<Result<(), WaitError>> {
    if done() {
        Some(Ok(()))
    } else {
        aborted(abort).map(|lost_rank| Err(WaitError::Aborted { lost_rank }))
    }
}

/// Spins, yields, then sleeps on the futex `word` until `done()`, an abort or the deadline.
/// `sleepers` counts the sleepers on `word`; whoever makes `done()` true changes `word` and wakes
/// it when `sleepers` is not zero.
fn wait(
    mut done: impl FnMut() -> bool,
    word: &AtomicU32,
    sleepers: &AtomicU32,
    abort: &AbortWord,
    policy: &WaitPolicy,
) -> Result<(), WaitError> {
    if policy.spin {
        for spin in 0..SPIN_LIMIT {
            if let Some(outcome) = settled(&mut done, abort) {
                return outcome;
            }
            if spin % SPINS_PER_CLOCK_CHECK == SPINS_PER_CLOCK_CHECK - 1
                && Instant::now() >= policy.deadline
            {
                return Err(WaitError::Timeout);
            }
            spin_loop();
        }
    }
    for _ in 0..YIELD_LIMIT {
        if let Some(outcome) = settled(&mut done, abort) {
            return outcome;
        }
        if Instant::now() >= policy.deadline {
            return Err(WaitError::Timeout);
        }
        yield_now();
    }
    loop {
        if let Some(outcome) = settled(&mut done, abort) {
            return outcome;
        }
        let remaining = policy.deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Err(WaitError::Timeout);
        }
        sleepers.fetch_add(1, Ordering::SeqCst);
        // Pairs with the waker's fence (or SeqCst update) before it reads `sleepers`.
        fence(Ordering::SeqCst);
        let seen = word.load(Ordering::SeqCst);
        if !done() && aborted(abort).is_none() {
            // Returns at once if `word` moved on since `seen`: a wake-up in between is not lost.
            futex::wait(word, seen, Some(remaining.min(SLEEP_SLICE)));
        }
        sleepers.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    //! Threads of one process stand in for the PEs: the protocols only see the shared words.

    use std::thread;

    use super::*;

    /// Every test ends (with a failure) by this deadline at the latest.
    fn deadline() -> Instant {
        Instant::now() + Duration::from_secs(60)
    }

    /// Yields until `word` reads `value`; panics (rather than hangs) after the test deadline.
    fn yield_until_equals(word: &AtomicU32, value: u32) {
        let deadline = deadline();
        while word.load(Ordering::SeqCst) != value {
            assert!(Instant::now() < deadline, "word never reached {value}");
            thread::yield_now();
        }
    }

    /// `pes` threads pass `rounds` barriers; before round k each counts itself into
    /// `arrived[k]`, after it each checks that everyone has arrived at round k.
    fn barrier_rounds(pes: u32, rounds: usize) {
        let words = BarrierWords::new();
        let abort = AbortWord::new();
        let arrived: Vec<AtomicU32> = (0..rounds).map(|_| AtomicU32::new(0)).collect();
        let policy = WaitPolicy::new(pes as usize, deadline());
        thread::scope(|s| {
            for _ in 0..pes {
                s.spawn(|| {
                    for (round, count) in arrived.iter().enumerate() {
                        count.fetch_add(1, Ordering::Relaxed);
                        assert_eq!(
                            barrier(&words, pes, &abort, &policy),
                            Ok(()),
                            "round {round}"
                        );
                        assert_eq!(count.load(Ordering::Relaxed), pes, "round {round}");
                    }
                });
            }
        });
        assert_eq!(words.count.load(Ordering::Relaxed), 0);
        assert_eq!(words.sleepers.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn barrier_holds_every_round_2_pes() {
        barrier_rounds(2, 1000);
    }

    #[test]
    fn barrier_holds_every_round_4_pes() {
        barrier_rounds(4, 1000);
    }

    #[test]
    fn barrier_holds_every_round_8_pes() {
        barrier_rounds(8, 1000);
    }

    #[test]
    fn barrier_holds_every_round_16_pes() {
        barrier_rounds(16, 1000);
    }

    #[test]
    fn barrier_of_one_pe_returns_at_once() {
        let words = BarrierWords::new();
        let policy = WaitPolicy::new(1, Instant::now());
        for _ in 0..3 {
            assert_eq!(barrier(&words, 1, &AbortWord::new(), &policy), Ok(()));
        }
    }

    /// `pairs` independent pairs of threads bounce a signal `rounds` times with
    /// `wait_until` + `ring`, each thread waiting on its own doorbell.
    fn ping_pong(pairs: usize, rounds: u32) {
        let bells: Vec<Doorbell> = (0..2 * pairs).map(|_| Doorbell::new()).collect();
        let signals: Vec<AtomicU32> = (0..2 * pairs).map(|_| AtomicU32::new(0)).collect();
        let abort = AbortWord::new();
        let policy = WaitPolicy::new(2 * pairs, deadline());
        let (bells, signals, abort, policy) = (&bells, &signals, &abort, &policy);
        thread::scope(|s| {
            for pair in 0..pairs {
                let (ping, pong) = (2 * pair, 2 * pair + 1);
                s.spawn(move || {
                    for i in 1..=rounds {
                        signals[pong].store(i, Ordering::SeqCst);
                        ring(&bells[pong]);
                        let back = || signals[ping].load(Ordering::Acquire) == i;
                        assert_eq!(wait_until(back, &bells[ping], abort, policy), Ok(()));
                    }
                });
                s.spawn(move || {
                    for i in 1..=rounds {
                        let came = || signals[pong].load(Ordering::Acquire) == i;
                        assert_eq!(wait_until(came, &bells[pong], abort, policy), Ok(()));
                        signals[ping].store(i, Ordering::SeqCst);
                        ring(&bells[ping]);
                    }
                });
            }
        });
        for bell in bells {
            assert_eq!(bell.sleepers.load(Ordering::Relaxed), 0);
        }
    }

    #[test]
    fn signal_ping_pong_2_threads() {
        ping_pong(1, 10_000);
    }

    #[test]
    fn signal_ping_pong_4_threads() {
        // More threads than cores on the 2-core machines here: yields and sleeps happen.
        ping_pong(2, 10_000);
    }

    #[test]
    fn ring_wakes_a_sleeping_signal_waiter() {
        let bell = Doorbell::new();
        let signal = AtomicU32::new(0);
        let done = AtomicU32::new(0);
        let abort = AbortWord::new();
        let policy = WaitPolicy {
            spin: false,
            deadline: deadline(),
        };
        thread::scope(|s| {
            s.spawn(|| {
                for i in 1..=200 {
                    let ready = || signal.load(Ordering::Acquire) == i;
                    assert_eq!(wait_until(ready, &bell, &abort, &policy), Ok(()));
                    done.store(i, Ordering::SeqCst);
                }
            });
            for i in 1..=200 {
                // The waiter has counted itself as a sleeper: it sleeps or is about to.
                yield_until_equals(&bell.sleepers, 1);
                signal.store(i, Ordering::SeqCst);
                ring(&bell);
                yield_until_equals(&done, i);
            }
        });
    }

    #[test]
    fn last_arriver_wakes_a_sleeping_barrier_waiter() {
        let words = BarrierWords::new();
        let abort = AbortWord::new();
        let policy = WaitPolicy {
            spin: false,
            deadline: deadline(),
        };
        thread::scope(|s| {
            s.spawn(|| {
                for _ in 0..200 {
                    assert_eq!(barrier(&words, 2, &abort, &policy), Ok(()));
                }
            });
            for _ in 0..200 {
                yield_until_equals(&words.sleepers, 1);
                assert_eq!(barrier(&words, 2, &abort, &policy), Ok(()));
            }
        });
    }

    #[test]
    fn signal_wait_times_out() {
        let policy = WaitPolicy::new(1, Instant::now() + Duration::from_millis(50));
        let result = wait_until(|| false, &Doorbell::new(), &AbortWord::new(), &policy);
        assert_eq!(result, Err(WaitError::Timeout));
    }

    #[test]
    fn barrier_times_out_when_a_pe_never_arrives() {
        let policy = WaitPolicy::new(2, Instant::now() + Duration::from_millis(50));
        let result = barrier(&BarrierWords::new(), 2, &AbortWord::new(), &policy);
        assert_eq!(result, Err(WaitError::Timeout));
    }

    #[test]
    fn past_deadline_is_a_try() {
        for spin in [false, true] {
            let policy = WaitPolicy {
                spin,
                deadline: Instant::now(),
            };
            let (bell, abort) = (Doorbell::new(), AbortWord::new());
            assert_eq!(wait_until(|| true, &bell, &abort, &policy), Ok(()));
            assert_eq!(
                wait_until(|| false, &bell, &abort, &policy),
                Err(WaitError::Timeout)
            );
        }
    }

    #[test]
    fn abort_wakes_a_sleeping_barrier_waiter() {
        let words = BarrierWords::new();
        let abort_word = AbortWord::new();
        let policy = WaitPolicy {
            spin: false,
            deadline: deadline(),
        };
        thread::scope(|s| {
            let waiter = s.spawn(|| barrier(&words, 2, &abort_word, &policy));
            yield_until_equals(&words.sleepers, 1);
            abort(&abort_word, 1, &words, &[]);
            assert_eq!(
                waiter.join().unwrap(),
                Err(WaitError::Aborted { lost_rank: 1 })
            );
        });
    }

    #[test]
    fn abort_wakes_a_sleeping_signal_waiter() {
        let words = BarrierWords::new();
        let bells = [Doorbell::new(), Doorbell::new()];
        let abort_word = AbortWord::new();
        let policy = WaitPolicy {
            spin: false,
            deadline: deadline(),
        };
        thread::scope(|s| {
            let waiter = s.spawn(|| wait_until(|| false, &bells[1], &abort_word, &policy));
            yield_until_equals(&bells[1].sleepers, 1);
            abort(&abort_word, 3, &words, &bells);
            assert_eq!(
                waiter.join().unwrap(),
                Err(WaitError::Aborted { lost_rank: 3 })
            );
        });
    }

    #[test]
    fn first_abort_wins_and_a_true_condition_beats_it() {
        let words = BarrierWords::new();
        let abort_word = AbortWord::new();
        assert_eq!(aborted(&abort_word), None);
        abort(&abort_word, 2, &words, &[]);
        abort(&abort_word, 5, &words, &[]);
        assert_eq!(aborted(&abort_word), Some(2));
        let policy = WaitPolicy {
            spin: true,
            deadline: deadline(),
        };
        let bell = Doorbell::new();
        assert_eq!(wait_until(|| true, &bell, &abort_word, &policy), Ok(()));
        let lost = Err(WaitError::Aborted { lost_rank: 2 });
        assert_eq!(wait_until(|| false, &bell, &abort_word, &policy), lost);
        assert_eq!(barrier(&words, 2, &abort_word, &policy), lost);
    }

    #[test]
    fn rank_zero_lost_is_reported() {
        let abort_word = AbortWord::new();
        abort(&abort_word, 0, &BarrierWords::new(), &[]);
        assert_eq!(aborted(&abort_word), Some(0));
    }

    /// Pins the calling thread to one core (best effort: benchmarks only).
    fn pin_to_core(core: usize) {
        let mut set = rustix::thread::CpuSet::new();
        set.set(core);
        let _ = rustix::thread::sched_setaffinity(None, &set);
    }

    /// Median over 11 trials of `trial()`, which returns nanoseconds per operation.
    fn median_ns(mut trial: impl FnMut() -> f64) -> (f64, f64, f64) {
        trial(); // warm-up
        let mut samples: Vec<f64> = (0..11).map(|_| trial()).collect();
        samples.sort_by(f64::total_cmp);
        (samples[0], samples[5], samples[10])
    }

    fn barrier_ns(pes: u32, rounds: u32) -> f64 {
        let words = BarrierWords::new();
        let abort = AbortWord::new();
        let policy = WaitPolicy::new(pes as usize, deadline());
        let cores = available_cores();
        let start = Instant::now();
        thread::scope(|s| {
            for pe in 0..pes {
                let (words, abort, policy) = (&words, &abort, &policy);
                s.spawn(move || {
                    pin_to_core(pe as usize % cores);
                    for _ in 0..rounds {
                        barrier(words, pes, abort, policy).unwrap();
                    }
                });
            }
        });
        start.elapsed().as_nanos() as f64 / f64::from(rounds)
    }

    /// One-way latency of a bare cache-line ping-pong between two pinned threads.
    fn raw_ping_pong_ns(rounds: u32) -> f64 {
        #[repr(align(64))]
        struct Line(AtomicU32);
        let line = Line(AtomicU32::new(0));
        let start = Instant::now();
        thread::scope(|s| {
            for side in 0..2u32 {
                let line = &line;
                s.spawn(move || {
                    pin_to_core(side as usize);
                    for i in 0..rounds {
                        while line.0.load(Ordering::Acquire) != 2 * i + side {
                            spin_loop();
                        }
                        line.0.store(2 * i + side + 1, Ordering::Release);
                    }
                });
            }
        });
        start.elapsed().as_nanos() as f64 / f64::from(2 * rounds)
    }

    /// One-way latency of signal store + `ring` / `wait_until` between two pinned threads.
    fn signal_ping_pong_ns(rounds: u32) -> f64 {
        #[repr(align(64))]
        struct Line(AtomicU32);
        let signals = [Line(AtomicU32::new(0)), Line(AtomicU32::new(0))];
        let bells = [Doorbell::new(), Doorbell::new()];
        let abort = AbortWord::new();
        let policy = WaitPolicy::new(2, deadline());
        let start = Instant::now();
        thread::scope(|s| {
            for side in 0..2usize {
                let (signals, bells, abort, policy) = (&signals, &bells, &abort, &policy);
                s.spawn(move || {
                    pin_to_core(side);
                    let other = 1 - side;
                    for i in 1..=rounds {
                        if side == 1 {
                            let ready = || signals[side].0.load(Ordering::Acquire) == i;
                            wait_until(ready, &bells[side], abort, policy).unwrap();
                        }
                        signals[other].0.store(i, Ordering::SeqCst);
                        ring(&bells[other]);
                        if side == 0 {
                            let ready = || signals[side].0.load(Ordering::Acquire) == i;
                            wait_until(ready, &bells[side], abort, policy).unwrap();
                        }
                    }
                });
            }
        });
        start.elapsed().as_nanos() as f64 / f64::from(2 * rounds)
    }

    /// `cargo test -p hyper-multicore --lib --release -- --ignored --nocapture bench_`
    #[test]
    #[ignore = "benchmark: run by hand with --release --nocapture"]
    fn bench_barrier_and_signal() {
        let report = |what: &str, (min, median, max): (f64, f64, f64)| {
            println!("{what:<36} median {median:>9.1} ns  (min {min:.1}, max {max:.1})");
            median
        };
        println!("cores available: {}", available_cores());
        let raw = report(
            "raw cache-line ping-pong, one-way",
            median_ns(|| raw_ping_pong_ns(100_000)),
        );
        let signal = report(
            "signal ping-pong, one-way",
            median_ns(|| signal_ping_pong_ns(100_000)),
        );
        println!("  signal / raw = {:.2}", signal / raw);
        let b2 = report("barrier, 2 threads", median_ns(|| barrier_ns(2, 100_000)));
        println!("  barrier(2) / raw one-way = {:.2}", b2 / raw);
        report("barrier, 4 threads", median_ns(|| barrier_ns(4, 20_000)));
        report("barrier, 16 threads", median_ns(|| barrier_ns(16, 2_000)));
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    //! Exhaustive interleavings (within a preemption bound) of the protocols, with the futex
    //! modelled without timeouts: a lost wake-up is reported by loom as a deadlock.
    //!
    //! `RUSTFLAGS="--cfg loom" cargo test -p hyper-multicore --lib --release loom_tests`

    use loom::sync::Arc;
    use loom::thread;

    use super::*;

    /// The shared header of a 2-PE job.
    struct Header {
        barrier: BarrierWords,
        abort: AbortWord,
        bells: [Doorbell; 2],
        data: [AtomicU32; 2],
    }

    fn header() -> Arc<Header> {
        Arc::new(Header {
            barrier: BarrierWords::new(),
            abort: AbortWord::new(),
            bells: [Doorbell::new(), Doorbell::new()],
            data: [AtomicU32::new(0), AtomicU32::new(0)],
        })
    }

    /// Far enough away never to matter: the model has no timeouts.
    fn policy() -> WaitPolicy {
        WaitPolicy {
            spin: false,
            deadline: Instant::now() + Duration::from_secs(3600),
        }
    }

    /// Explores `f` with at most `preemptions` preemptions (`None`: every interleaving) unless
    /// `LOOM_MAX_PREEMPTIONS` says otherwise, and prints how many executions that took.
    fn model(name: &str, preemptions: Option<usize>, f: impl Fn() + Sync + Send + 'static) {
        let mut builder = loom::model::Builder::new();
        if builder.preemption_bound.is_none() {
            builder.preemption_bound = preemptions;
        }
        // A plain std counter: it lives outside the model.
        let executions = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = executions.clone();
        builder.check(move || {
            counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            f();
        });
        let executions = executions.load(std::sync::atomic::Ordering::Relaxed);
        match builder.preemption_bound {
            Some(bound) => println!("{name}: {executions} executions (preemption bound {bound})"),
            None => println!("{name}: {executions} executions (complete)"),
        }
    }

    /// Both PEs pass 2 rounds, and past round r each sees the other's write from before it.
    #[test]
    fn loom_barrier_two_pes_two_rounds() {
        model("loom_barrier_two_pes_two_rounds", None, || {
            let h = header();
            let peer = {
                let h = h.clone();
                thread::spawn(move || pe_rounds(&h, 1))
            };
            pe_rounds(&h, 0);
            peer.join().unwrap();
        });

        fn pe_rounds(h: &Header, me: usize) {
            for round in 1..=2 {
                h.data[me].store(round, Ordering::Relaxed);
                assert_eq!(barrier(&h.barrier, 2, &h.abort, &policy()), Ok(()));
                assert!(
                    h.data[1 - me].load(Ordering::Relaxed) >= round,
                    "round {round}"
                );
            }
        }
    }

    /// One waiter, one writer: the waiter always wakes (no lost wake-up).
    #[test]
    fn loom_signal_wait_and_ring() {
        model("loom_signal_wait_and_ring", None, || {
            signal_wait_and_ring(false)
        });
        model("loom_signal_wait_and_ring (spin)", None, || {
            signal_wait_and_ring(true)
        });

        fn signal_wait_and_ring(spin: bool) {
            let h = header();
            let writer = {
                let h = h.clone();
                thread::spawn(move || {
                    h.data[0].store(1, Ordering::Release);
                    fence(Ordering::SeqCst);
                    ring(&h.bells[0]);
                })
            };
            let ready = || h.data[0].load(Ordering::Acquire) == 1;
            let policy = WaitPolicy { spin, ..policy() };
            assert_eq!(wait_until(ready, &h.bells[0], &h.abort, &policy), Ok(()));
            writer.join().unwrap();
        }
    }

    /// An abort reaches a signal waiter whose condition never comes true.
    #[test]
    fn loom_abort_wakes_signal_waiter() {
        model("loom_abort_wakes_signal_waiter", None, || {
            let h = header();
            let aborter = {
                let h = h.clone();
                thread::spawn(move || abort(&h.abort, 1, &h.barrier, &h.bells))
            };
            let never = || h.data[0].load(Ordering::Acquire) == 1;
            let lost = Err(WaitError::Aborted { lost_rank: 1 });
            assert_eq!(wait_until(never, &h.bells[0], &h.abort, &policy()), lost);
            aborter.join().unwrap();
        });
    }

    /// An abort reaches a barrier waiter whose peer never arrives.
    #[test]
    fn loom_abort_wakes_barrier_waiter() {
        model("loom_abort_wakes_barrier_waiter", None, || {
            let h = header();
            let aborter = {
                let h = h.clone();
                thread::spawn(move || abort(&h.abort, 1, &h.barrier, &h.bells))
            };
            let lost = Err(WaitError::Aborted { lost_rank: 1 });
            assert_eq!(barrier(&h.barrier, 2, &h.abort, &policy()), lost);
            aborter.join().unwrap();
        });
    }

    /// An abort racing a barrier that completes: both PEs leave (released, or aborted only if
    /// not yet released), and nobody sleeps forever. Three threads: every interleaving takes
    /// 15 million executions (13 minutes), so the default bound is 3 preemptions.
    #[test]
    fn loom_abort_races_a_completing_barrier() {
        model("loom_abort_races_a_completing_barrier", Some(3), || {
            let h = header();
            let peer = {
                let h = h.clone();
                thread::spawn(move || barrier(&h.barrier, 2, &h.abort, &policy()))
            };
            let aborter = {
                let h = h.clone();
                thread::spawn(move || abort(&h.abort, 0, &h.barrier, &h.bells))
            };
            let mine = barrier(&h.barrier, 2, &h.abort, &policy());
            let theirs = peer.join().unwrap();
            aborter.join().unwrap();
            for outcome in [mine, theirs] {
                assert!(matches!(
                    outcome,
                    Ok(()) | Err(WaitError::Aborted { lost_rank: 0 })
                ));
            }
        });
    }
}
