//! Meetings of a *team* — any ordered list of PEs sharing one segment, such as an OpenSHMEM
//! split team or active set — through shared memory, with no per-team state to set up.
//!
//! Every ordered pair of PEs of a segment has one counter: the signals PE `from` has sent PE
//! `to` ([`PairWords::signals`], written only by `from`, in `to`'s row), and `to` keeps how many
//! of them it consumed ([`PairWords::consumed`], written and read only by `to`). A signal is a
//! release store of the next count followed by a ring of the receiver's barrier doorbell; an
//! await consumes one signal: it waits (spin, yield, futex sleep: [`sync::wait_until`]) until
//! the count passes the number consumed so far. The k-th signal `from` sends `to` is the k-th
//! `to` awaits from `from` as long as both make their collectives in the same order — what
//! OpenSHMEM asks of PEs sharing teams — so the counters serve every team at once, and two
//! teams of disjoint PEs meet at the same time without interfering. A team's barrier is
//! a dissemination barrier over its members when each PE has a core (round k: signal member
//! `i + 2^k`, await member `i − 2^k`), else a gather to the team's first member and its release
//! (one wait per member: fewer context switches with more PEs than cores), as the segment's
//! creator chose for the whole segment ([`BarrierKind`]).
//!
//! ```ignore
//! // Every member of `slots` (segment slots, in team order), collectively:
//! team_barrier(&*segment, |i| slots[i], slots.len(), my_index, kind, abort, &policy)?;
//! ```
//!
//! Every store a member made before the barrier is visible to every member after it: each
//! signal is a release that the awaiting load acquires, and the rounds chain every member to
//! every other.

use crate::primitive::{fence, AtomicU32, Ordering};
use crate::transport::segment::{Counter, Segment};
use crate::transport::sync::{self, AbortWord, BarrierKind, Doorbell, WaitError, WaitPolicy};

/// The pair counters of the PEs of a segment, by slot, and their barrier doorbells.
pub(crate) trait PairWords {
    /// The signals PE `from` has sent PE `to`.
    fn signals(&self, to: usize, from: usize) -> &AtomicU32;
    /// The signals PE `owner` has consumed from PE `from`.
    fn consumed(&self, owner: usize, from: usize) -> &AtomicU32;
    /// The doorbell PE `pe` sleeps on while it awaits a signal (its barrier doorbell).
    fn bell(&self, pe: usize) -> &Doorbell;
}

/// Sends PE `to` one signal from PE `from` (this PE), after everything `from` wrote before.
#[inline]
pub(crate) fn signal(words: &impl PairWords, from: usize, to: usize) {
    let count = words.signals(to, from);
    // Only `from` writes this counter, so its own last store is what it reads.
    let next = count.load(Ordering::Relaxed).wrapping_add(1);
    count.store(next, Ordering::Release);
    // Orders the store before `ring`'s look at the receiver's sleepers (see `sync::ring`).
    fence(Ordering::SeqCst);
    sync::ring(words.bell(to));
}

/// Consumes one signal PE `from` sent PE `me` (this PE), waiting for it as `policy` says.
///
/// On `Err` the signal counts as consumed though it may never have come: the counters are then
/// broken for good (a timeout or an abort is terminal for them; a restart zeroes them).
#[inline]
pub(crate) fn await_signal(
    words: &impl PairWords,
    me: usize,
    from: usize,
    abort: &AbortWord,
    policy: &WaitPolicy,
) -> Result<(), WaitError> {
    let consumed = words.consumed(me, from);
    let expected = consumed.load(Ordering::Relaxed).wrapping_add(1);
    consumed.store(expected, Ordering::Relaxed);
    let count = words.signals(me, from);
    // The count only grows (modulo 2^32): `from` may already have sent later signals.
    let arrived = || count.load(Ordering::Acquire).wrapping_sub(expected) as i32 >= 0;
    if arrived() {
        return Ok(());
    }
    sync::wait_until(arrived, words.bell(me), abort, policy)
}

/// The barrier of the team of `n` members whose member `i` is segment slot `member(i)` (the
/// same order on every member), called by member `index` (this PE). `kind` is the segment's
/// barrier kind: dissemination where each PE has a core, else a gather to the first member and
/// its release.
pub(crate) fn team_barrier(
    words: &impl PairWords,
    member: impl Fn(usize) -> usize,
    n: usize,
    index: usize,
    kind: BarrierKind,
    abort: &AbortWord,
    policy: &WaitPolicy,
) -> Result<(), WaitError> {
    debug_assert!(index < n, "member {index} of {n}");
    let me = member(index);
    match kind {
        BarrierKind::Dissemination => {
            let mut distance = 1;
            while distance < n {
                signal(words, me, member((index + distance) % n));
                let from = member((index + n - distance % n) % n);
                await_signal(words, me, from, abort, policy)?;
                distance *= 2;
            }
        }
        BarrierKind::Central if n > 1 => {
            if index == 0 {
                for i in 1..n {
                    await_signal(words, me, member(i), abort, policy)?;
                }
                for i in 1..n {
                    signal(words, me, member(i));
                }
            } else {
                let first = member(0);
                signal(words, me, first);
                await_signal(words, me, first, abort, policy)?;
            }
        }
        BarrierKind::Central => {}
    }
    Ok(())
}

/// Pair counters of `pes` PEs outside a segment, for the in-process tests and models.
impl PairWords for Segment {
    fn signals(&self, to: usize, from: usize) -> &AtomicU32 {
        self.counter(to, from, Counter::Sent)
            .expect("team signals are used only where the segment has them")
    }

    fn consumed(&self, owner: usize, from: usize) -> &AtomicU32 {
        self.counter(owner, from, Counter::Consumed)
            .expect("team signals are used only where the segment has them")
    }

    fn bell(&self, pe: usize) -> &Doorbell {
        &self.pe_words(pe).barrier_bell
    }
}

#[cfg(test)]
pub(crate) struct TestPairWords {
    pes: usize,
    signals: Vec<AtomicU32>,
    consumed: Vec<AtomicU32>,
    bells: Vec<Doorbell>,
}

#[cfg(test)]
impl TestPairWords {
    /// All zero, as in a fresh segment.
    pub(crate) fn new(pes: usize) -> Self {
        TestPairWords {
            pes,
            signals: (0..pes * pes).map(|_| AtomicU32::new(0)).collect(),
            consumed: (0..pes * pes).map(|_| AtomicU32::new(0)).collect(),
            bells: (0..pes).map(|_| Doorbell::new()).collect(),
        }
    }
}

#[cfg(test)]
impl PairWords for TestPairWords {
    fn signals(&self, to: usize, from: usize) -> &AtomicU32 {
        &self.signals[to * self.pes + from]
    }

    fn consumed(&self, owner: usize, from: usize) -> &AtomicU32 {
        &self.consumed[owner * self.pes + from]
    }

    fn bell(&self, pe: usize) -> &Doorbell {
        &self.bells[pe]
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    //! Threads of one process stand in for the PEs: the protocol only sees the shared words.

    use std::sync::atomic::AtomicUsize;
    use std::thread;
    use std::time::Duration;

    use super::*;
    use crate::transport::sync::Deadline;

    const KINDS: [BarrierKind; 2] = [BarrierKind::Dissemination, BarrierKind::Central];

    fn policy(spin: bool) -> WaitPolicy {
        WaitPolicy {
            spin,
            deadline: Deadline::After(Duration::from_secs(60)),
        }
    }

    /// Teams `teams` (lists of slots of a segment of `pes`) each pass `rounds` barriers at the
    /// same time; before round k every member counts itself into its team's `arrived[k]`, after
    /// it every member checks that the whole team did.
    fn teams_meet(pes: usize, teams: &[Vec<usize>], rounds: usize) {
        for kind in KINDS {
            let words = TestPairWords::new(pes);
            let abort = AbortWord::new();
            let arrived: Vec<Vec<AtomicUsize>> = teams
                .iter()
                .map(|_| (0..rounds).map(|_| AtomicUsize::new(0)).collect())
                .collect();
            let spin = pes <= crate::sys::available_cores();
            thread::scope(|s| {
                for (team, members) in teams.iter().enumerate() {
                    for index in 0..members.len() {
                        let (words, abort, arrived) = (&words, &abort, &arrived);
                        s.spawn(move || {
                            for (round, count) in arrived[team].iter().enumerate() {
                                count.fetch_add(1, Ordering::Relaxed);
                                let outcome = team_barrier(
                                    words,
                                    |i| members[i],
                                    members.len(),
                                    index,
                                    kind,
                                    abort,
                                    &policy(spin),
                                );
                                assert_eq!(outcome, Ok(()), "{kind:?}, team {team}, round {round}");
                                assert_eq!(
                                    count.load(Ordering::Relaxed),
                                    members.len(),
                                    "{kind:?}, team {team}, round {round}"
                                );
                            }
                        });
                    }
                }
            });
        }
    }

    #[test]
    fn a_team_of_every_pe_meets_every_round() {
        for pes in [2, 3, 5, 8] {
            teams_meet(pes, &[(0..pes).collect()], 300);
        }
    }

    #[test]
    fn disjoint_teams_meet_at_the_same_time() {
        // The even and the odd slots, each in an order of its own.
        teams_meet(7, &[vec![6, 0, 4, 2], vec![1, 5, 3]], 300);
    }

    #[test]
    fn a_team_of_one_meets_alone() {
        let words = TestPairWords::new(3);
        for kind in KINDS {
            let abort = AbortWord::new();
            let outcome = team_barrier(&words, |_| 2, 1, 0, kind, &abort, &policy(true));
            assert_eq!(outcome, Ok(()));
        }
    }

    #[test]
    fn signals_sent_ahead_are_consumed_in_order() {
        let words = TestPairWords::new(2);
        let abort = AbortWord::new();
        for _ in 0..3 {
            signal(&words, 0, 1);
        }
        for _ in 0..3 {
            assert_eq!(await_signal(&words, 1, 0, &abort, &policy(true)), Ok(()));
        }
        let deadline = WaitPolicy {
            spin: false,
            deadline: Deadline::After(Duration::from_millis(20)),
        };
        assert!(matches!(
            await_signal(&words, 1, 0, &abort, &deadline),
            Err(WaitError::Timeout { .. })
        ));
    }

    #[test]
    fn an_abort_ends_an_await() {
        let words = TestPairWords::new(2);
        let abort = AbortWord::new();
        let central = sync::CentralWords::new();
        thread::scope(|s| {
            s.spawn(|| {
                thread::sleep(Duration::from_millis(30));
                sync::abort(&abort, 0, &central, &words.bells);
            });
            let outcome = await_signal(&words, 1, 0, &abort, &policy(false));
            assert_eq!(outcome, Err(WaitError::Aborted { lost_rank: 0 }));
        });
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    //! The team barrier of two and three PEs under every interleaving (within a preemption
    //! bound), the futex modelled without timeouts: a lost wake-up is a deadlock to loom.
    //!
    //! `RUSTFLAGS="--cfg loom" cargo test -p hyper-multicore --lib --release loom_tests`

    use loom::sync::Arc;
    use loom::thread;
    use std::time::Duration;

    use super::*;
    use crate::transport::sync::Deadline;

    fn policy() -> WaitPolicy {
        WaitPolicy {
            spin: false,
            deadline: Deadline::After(Duration::from_secs(3600)),
        }
    }

    /// Each of `pes` PEs writes its data word, passes one team barrier of kind `kind`, and
    /// reads every other PE's data word: it must see every write.
    fn barrier_publishes(pes: usize, kind: BarrierKind) {
        let mut builder = loom::model::Builder::new();
        if builder.preemption_bound.is_none() {
            builder.preemption_bound = Some(2);
        }
        builder.check(move || {
            let words = Arc::new((
                TestPairWords::new(pes),
                AbortWord::new(),
                (0..pes).map(|_| AtomicU32::new(0)).collect::<Vec<_>>(),
            ));
            let members: Vec<usize> = (0..pes).collect();
            let threads: Vec<_> = (1..pes)
                .map(|index| {
                    let (words, members) = (Arc::clone(&words), members.clone());
                    thread::spawn(move || {
                        let (pairs, abort, data) = &*words;
                        data[index].store(1, Ordering::Relaxed);
                        team_barrier(pairs, |i| members[i], pes, index, kind, abort, &policy())
                            .unwrap();
                        for word in data.iter() {
                            assert_eq!(word.load(Ordering::Relaxed), 1);
                        }
                    })
                })
                .collect();
            let (pairs, abort, data) = &*words;
            data[0].store(1, Ordering::Relaxed);
            team_barrier(pairs, |i| members[i], pes, 0, kind, abort, &policy()).unwrap();
            for word in data.iter() {
                assert_eq!(word.load(Ordering::Relaxed), 1);
            }
            for thread in threads {
                thread.join().unwrap();
            }
        });
    }

    #[test]
    fn team_barrier_of_two_publishes_every_write() {
        barrier_publishes(2, BarrierKind::Dissemination);
        barrier_publishes(2, BarrierKind::Central);
    }

    #[test]
    fn team_barrier_of_three_publishes_every_write() {
        barrier_publishes(3, BarrierKind::Central);
    }
}
