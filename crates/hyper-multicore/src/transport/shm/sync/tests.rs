//! Threads of one process stand in for the PEs: the protocols only see the shared words.

use std::thread;

use super::*;

/// Every test ends (with a failure) by this deadline at the latest.
pub(super) fn deadline() -> Deadline {
    Deadline::After(Duration::from_secs(60))
}

/// Yields until `word` reads `value`; panics (rather than hangs) after a minute.
fn yield_until_equals(word: &AtomicU32, value: u32) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while word.load(Ordering::SeqCst) != value {
        assert!(Instant::now() < deadline, "word never reached {value}");
        thread::yield_now();
    }
}

pub(super) const KINDS: [BarrierKind; 2] = [BarrierKind::Dissemination, BarrierKind::Central];

fn is_timeout(outcome: Result<(), WaitError>) -> bool {
    matches!(outcome, Err(WaitError::Timeout { .. }))
}

/// `pes` threads pass `rounds` barriers; before round k each counts itself into
/// `arrived[k]`, after it each checks that everyone has arrived at round k.
fn barrier_rounds(pes: usize, rounds: usize) {
    for kind in KINDS {
        barrier_rounds_of(kind, pes, rounds);
    }
}

fn barrier_rounds_of(kind: BarrierKind, pes: usize, rounds: usize) {
    let words = TestWords::new(pes);
    let abort = AbortWord::new();
    let arrived: Vec<AtomicU32> = (0..rounds).map(|_| AtomicU32::new(0)).collect();
    let policy = WaitPolicy::new(pes, deadline());
    thread::scope(|s| {
        for me in 0..pes {
            let (words, abort, arrived, policy) = (&words, &abort, &arrived, &policy);
            s.spawn(move || {
                for (round, count) in arrived.iter().enumerate() {
                    count.fetch_add(1, Ordering::Relaxed);
                    let epoch = round as u32 + 1;
                    assert_eq!(
                        barrier(kind, words, me, pes, epoch, abort, policy),
                        Ok(()),
                        "{kind:?} barrier, round {round}"
                    );
                    assert_eq!(count.load(Ordering::Relaxed), pes as u32, "round {round}");
                }
            });
        }
    });
    for bell in &words.bells {
        assert_eq!(bell.sleepers.load(Ordering::Relaxed), 0);
    }
}

#[test]
fn barrier_holds_every_round_2_pes() {
    barrier_rounds(2, 1000);
}

#[test]
fn barrier_holds_every_round_3_pes() {
    barrier_rounds(3, 1000);
}

#[test]
fn barrier_holds_every_round_4_pes() {
    barrier_rounds(4, 1000);
}

#[test]
fn barrier_holds_every_round_7_pes() {
    barrier_rounds(7, 500);
}

#[test]
fn barrier_holds_every_round_16_pes() {
    barrier_rounds(16, 300);
}

/// One spin phase of `budget` with at most `limit` looks, whose condition turns true at look
/// `ready_at` (counted from 1; never if `None`): its outcome and the looks it took.
fn spin_phase(
    budget: &SpinBudget,
    limit: u32,
    ready_at: Option<u32>,
) -> (Option<Result<(), WaitError>>, u32) {
    let mut looks = 0;
    let mut done = || {
        looks += 1;
        ready_at.is_some_and(|at| looks >= at)
    };
    let outcome = budget.spin::<()>(
        &mut done,
        &AbortWord::new(),
        limit,
        &mut Clock::new(deadline()),
    );
    (outcome, looks)
}

#[test]
fn spins_shrink_while_they_run_out_and_grow_back_while_they_pay() {
    let budget = SpinBudget::new();
    // Phases that run out take all the budget's looks and halve it, down to the floor.
    let mut expected = SPIN_LIMIT;
    loop {
        assert_eq!(spin_phase(&budget, SPIN_LIMIT, None), (None, expected));
        let next = (expected / 2).max(SPIN_FLOOR);
        assert_eq!(budget.looks(), next);
        if next == expected {
            break;
        }
        expected = next;
    }
    assert_eq!(expected, SPIN_FLOOR);
    // A condition true at the first look tells nothing: the budget stays.
    assert_eq!(spin_phase(&budget, SPIN_LIMIT, Some(1)), (Some(Ok(())), 1));
    assert_eq!(budget.looks(), SPIN_FLOOR);
    // A wait without a spin phase (more PEs than cores) leaves it too.
    assert_eq!(spin_phase(&budget, 0, None), (None, 0));
    assert_eq!(budget.looks(), SPIN_FLOOR);
    // Phases that a later look ends double it, up to the limit.
    while expected < SPIN_LIMIT {
        assert_eq!(spin_phase(&budget, SPIN_LIMIT, Some(2)), (Some(Ok(())), 2));
        expected = (expected * 2).min(SPIN_LIMIT);
        assert_eq!(budget.looks(), expected);
    }
    assert_eq!(spin_phase(&budget, SPIN_LIMIT, Some(2)), (Some(Ok(())), 2));
    assert_eq!(budget.looks(), SPIN_LIMIT);
    // A wait allowed fewer looks than the budget (a network wait's) takes only those.
    assert_eq!(spin_phase(&budget, 8, None), (None, 8));
    assert_eq!(budget.looks(), SPIN_LIMIT / 2);
}

#[test]
fn barrier_of_one_pe_returns_at_once() {
    let words = TestWords::new(1);
    let policy = WaitPolicy::new(1, Deadline::At(Instant::now()));
    for (kind, epoch) in KINDS.into_iter().zip(1..) {
        let outcome = barrier(kind, &words, 0, 1, epoch, &AbortWord::new(), &policy);
        assert_eq!(outcome, Ok(()), "{kind:?}");
    }
}

#[test]
fn barrier_epochs_wrap_around() {
    let words = TestWords::new(2);
    let abort = AbortWord::new();
    let policy = WaitPolicy::new(2, deadline());
    // Epochs count on from just below 2^32 through zero: a flag that wrapped still counts
    // as reached, and one still at the last epoch does not.
    let start = u32::MAX - 2;
    thread::scope(|s| {
        for me in 0..2 {
            let (words, abort, policy) = (&words, &abort, &policy);
            s.spawn(move || {
                for epoch in (0..6).map(|i| start.wrapping_add(i)) {
                    let outcome = dissemination_barrier(words, me, 2, epoch, abort, policy, None);
                    assert_eq!(outcome, Ok(()));
                }
            });
        }
    });
    let lone = WaitPolicy::new(2, Deadline::After(Duration::from_millis(20)));
    let next = start.wrapping_add(6);
    assert!(is_timeout(dissemination_barrier(
        &words, 0, 2, next, &abort, &lone, None
    )));
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

/// The sleeper count a barrier wait of PE `pe` raises before it sleeps.
fn barrier_sleepers(words: &TestWords, kind: BarrierKind, pe: usize) -> &AtomicU32 {
    match kind {
        BarrierKind::Dissemination => &words.bells[pe].sleepers,
        BarrierKind::Central => &words.central.sleepers,
    }
}

fn sleepy() -> WaitPolicy {
    WaitPolicy {
        spin: false,
        deadline: deadline(),
    }
}

/// A waiter for a PE with UCX peers says when its looks begin and end: it serves from the
/// start, hands over before it sleeps after its looks, and a ring that did not make it
/// ready (peers' operations applied by the progress thread) sends it back to its looks —
/// which progress the worker and so serve the next operations — for a yield phase before
/// it sleeps again; it hands over again as it leaves those looks, and every begin has its
/// end.
#[test]
fn a_ring_without_the_change_sends_a_ucx_waiter_back_to_its_looks() {
    /// (begins, ends with a hand-over, ends without), shared with the test.
    #[derive(Default)]
    struct Counts([AtomicU32; 3]);
    struct Serves<'a>(&'a Counts);
    impl Serving for Serves<'_> {
        fn begin(&mut self) {
            self.0 .0[0].fetch_add(1, Ordering::SeqCst);
        }
        fn end(&mut self, hand_over: bool) {
            self.0 .0[if hand_over { 1 } else { 2 }].fetch_add(1, Ordering::SeqCst);
        }
    }
    let told = Counts::default();
    let count = |i: usize| told.0[i].load(Ordering::SeqCst);
    with_sleeping_waiter(Serves(&told), |bell, looks| {
        assert_eq!(
            (count(0), count(1)),
            (1, 1),
            "served, then handed over to sleep"
        );
        let asleep = looks.load(Ordering::SeqCst);
        ring(bell);
        let deadline = Instant::now() + Duration::from_secs(60);
        while looks.load(Ordering::SeqCst) < asleep + YIELD_LIMIT {
            assert!(
                Instant::now() < deadline,
                "the ring did not send it back to looking"
            );
            thread::yield_now();
        }
        yield_until_equals(&bell.sleepers, 1);
        assert!(count(0) >= 2, "it served again after the ring");
    });
    assert_eq!(
        count(0),
        count(1),
        "it handed over before each sleep and as it left"
    );
    assert_eq!(count(2), 0);
}

/// Runs `asleep(bell, looks)` once a waiter on another thread (a UCX-style wait without a
/// spin phase, telling `serving`; `looks` counts its looks) sleeps; then makes it ready,
/// rings, and checks that it returned ready.
fn with_sleeping_waiter(serving: impl Serving + Send, asleep: impl FnOnce(&Doorbell, &AtomicU32)) {
    let (bell, abort) = (Doorbell::new(), AbortWord::new());
    let (flag, looks) = (AtomicU32::new(0), AtomicU32::new(0));
    let policy = sleepy();
    thread::scope(|s| {
        let waiter = s.spawn(|| {
            let ready = || {
                looks.fetch_add(1, Ordering::SeqCst);
                flag.load(Ordering::Acquire) == 1
            };
            wait_until_then(ready, &bell, &abort, &policy, 0, serving)
        });
        yield_until_equals(&bell.sleepers, 1);
        asleep(&bell, &looks);
        flag.store(1, Ordering::SeqCst);
        ring(&bell);
        assert_eq!(waiter.join().unwrap(), Ok(()));
    });
}

/// What a UCX waiter told its serving, in order; its first `served_looks` questions
/// ([`Serving::served`]) are answered yes.
#[derive(Default)]
struct Told {
    said: Vec<&'static str>,
    served_looks: u32,
}

impl Serving for &mut Told {
    fn begin(&mut self) {
        self.said.push("begin");
    }
    fn end(&mut self, hand_over: bool) {
        self.said.push(if hand_over { "hand over" } else { "end" });
    }
    fn served(&mut self) -> bool {
        let served = self.served_looks > 0;
        self.served_looks = self.served_looks.saturating_sub(1);
        served
    }
}

/// A UCX-style wait (no spin phase) on fresh words whose look is `look`, told to `told`.
fn wait_told(look: impl FnMut() -> bool, told: &mut Told) -> Result<(), WaitError> {
    let (bell, abort) = (Doorbell::new(), AbortWord::new());
    wait_until_then(look, &bell, &abort, &sleepy(), 0, told)
}

/// A wait that ends in its first looks ends its serving without a hand-over.
#[test]
fn a_ucx_waiter_ready_at_once_serves_without_handing_over() {
    let mut told = Told::default();
    assert_eq!(wait_told(|| true, &mut told), Ok(()));
    assert_eq!(told.said, ["begin", "end"]);
}

/// A UCX waiter whose looks serve peers' requests (a burst of gets from it) keeps looking
/// until [`YIELD_LIMIT`] looks in a row served nothing, rather than sleeping after that
/// many looks in all and leaving the rest of the burst to its progress thread.
#[test]
fn a_ucx_waiter_serving_a_burst_keeps_looking_until_it_ends() {
    const SERVED_LOOKS: u32 = 3 * YIELD_LIMIT;
    struct Burst<'a>(&'a AtomicU32);
    impl Serving for Burst<'_> {
        fn begin(&mut self) {}
        fn end(&mut self, _hand_over: bool) {}
        fn served(&mut self) -> bool {
            self.0.fetch_add(1, Ordering::SeqCst) < SERVED_LOOKS
        }
    }
    let asked = AtomicU32::new(0);
    with_sleeping_waiter(Burst(&asked), |_, looks| {
        assert!(
            looks.load(Ordering::SeqCst) >= SERVED_LOOKS + YIELD_LIMIT,
            "it slept after {} looks, while the burst lasted {SERVED_LOOKS} looks",
            looks.load(Ordering::SeqCst)
        );
    });
}

/// A UCX waiter that served peers' requests and then became ready in its looks hands the
/// worker over as it leaves (its PE may go on computing, and the requests may go on); one
/// that served nothing does not (see the test above).
#[test]
fn a_ucx_waiter_that_served_peers_hands_over_as_it_leaves() {
    let mut told = Told {
        served_looks: 3,
        ..Told::default()
    };
    let mut looks = 0;
    let look = || {
        looks += 1;
        looks > 10
    };
    assert_eq!(wait_told(look, &mut told), Ok(()));
    assert_eq!(told.said, ["begin", "hand over"]);
}

/// A panic unwinding out of a UCX waiter's look (a progress hook's) still ends its serving
/// (without a hand-over): a serving count left raised would keep the progress thread
/// standing down for good.
#[test]
fn a_panic_in_a_ucx_waiters_look_still_ends_its_serving() {
    let mut told = Told::default();
    let mut looks = 0;
    let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let look = || {
            looks += 1;
            assert!(looks < 5, "a hook panicked");
            false
        };
        wait_told(look, &mut told)
    }));
    assert!(unwound.is_err());
    assert_eq!(told.said, ["begin", "end"]);
}

#[test]
fn ring_wakes_a_sleeping_signal_waiter() {
    let bell = Doorbell::new();
    let signal = AtomicU32::new(0);
    let done = AtomicU32::new(0);
    let abort = AbortWord::new();
    let policy = sleepy();
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
fn partner_wakes_a_sleeping_barrier_waiter() {
    for kind in KINDS {
        let words = TestWords::new(2);
        let abort = AbortWord::new();
        let policy = sleepy();
        let sleepers = barrier_sleepers(&words, kind, 1);
        thread::scope(|s| {
            s.spawn(|| {
                for epoch in 1..=200 {
                    let outcome = barrier(kind, &words, 1, 2, epoch, &abort, &policy);
                    assert_eq!(outcome, Ok(()), "{kind:?}");
                }
            });
            for epoch in 1..=200 {
                yield_until_equals(sleepers, 1);
                let outcome = barrier(kind, &words, 0, 2, epoch, &abort, &policy);
                assert_eq!(outcome, Ok(()), "{kind:?}");
            }
        });
    }
}

#[test]
fn signal_wait_times_out() {
    let policy = WaitPolicy::new(1, Deadline::After(Duration::from_millis(50)));
    let outcome = wait_until(|| false, &Doorbell::new(), &AbortWord::new(), &policy);
    let Err(WaitError::Timeout { waited }) = outcome else {
        panic!("expected a timeout, got {outcome:?}");
    };
    assert!(waited >= Duration::from_millis(50), "waited {waited:?}");
}

#[test]
fn barrier_times_out_when_a_pe_never_arrives() {
    let policy = WaitPolicy::new(2, Deadline::After(Duration::from_millis(50)));
    for kind in KINDS {
        let words = TestWords::new(2);
        let outcome = barrier(kind, &words, 0, 2, 1, &AbortWord::new(), &policy);
        assert!(is_timeout(outcome), "{kind:?}");
    }
}

#[test]
fn past_deadline_is_a_try() {
    for spin in [false, true] {
        let policy = WaitPolicy {
            spin,
            deadline: Deadline::At(Instant::now()),
        };
        let (bell, abort) = (Doorbell::new(), AbortWord::new());
        assert_eq!(wait_until(|| true, &bell, &abort, &policy), Ok(()));
        assert!(is_timeout(wait_until(|| false, &bell, &abort, &policy)));
    }
}

#[test]
fn abort_wakes_a_sleeping_barrier_waiter() {
    for kind in KINDS {
        let words = TestWords::new(2);
        let abort_word = AbortWord::new();
        let policy = sleepy();
        let sleepers = barrier_sleepers(&words, kind, 1);
        thread::scope(|s| {
            let waiter = s.spawn(|| barrier(kind, &words, 1, 2, 1, &abort_word, &policy));
            yield_until_equals(sleepers, 1);
            abort(&abort_word, 0, &words.central, &words.bells);
            assert_eq!(
                waiter.join().unwrap(),
                Err(WaitError::Aborted { lost_rank: 0 }),
                "{kind:?}"
            );
        });
    }
}

#[test]
fn abort_wakes_a_sleeping_signal_waiter() {
    let bells = [Doorbell::new(), Doorbell::new()];
    let abort_word = AbortWord::new();
    let policy = sleepy();
    thread::scope(|s| {
        let waiter = s.spawn(|| wait_until(|| false, &bells[1], &abort_word, &policy));
        yield_until_equals(&bells[1].sleepers, 1);
        abort(&abort_word, 3, &CentralWords::new(), &bells);
        assert_eq!(
            waiter.join().unwrap(),
            Err(WaitError::Aborted { lost_rank: 3 })
        );
    });
}

#[test]
fn first_abort_wins_and_a_true_condition_beats_it() {
    let words = TestWords::new(2);
    let abort_word = AbortWord::new();
    assert_eq!(aborted(&abort_word), None);
    abort(&abort_word, 2, &words.central, &words.bells);
    abort(&abort_word, 5, &words.central, &words.bells);
    assert_eq!(aborted(&abort_word), Some(2));
    let policy = WaitPolicy {
        spin: true,
        deadline: deadline(),
    };
    let bell = Doorbell::new();
    assert_eq!(wait_until(|| true, &bell, &abort_word, &policy), Ok(()));
    let lost = Err(WaitError::Aborted { lost_rank: 2 });
    assert_eq!(wait_until(|| false, &bell, &abort_word, &policy), lost);
    for kind in KINDS {
        assert_eq!(barrier(kind, &words, 0, 2, 1, &abort_word, &policy), lost);
    }
}

#[test]
fn rank_zero_lost_is_reported() {
    let abort_word = AbortWord::new();
    abort(&abort_word, 0, &CentralWords::new(), &[]);
    assert_eq!(aborted(&abort_word), Some(0));
}
