//! Exhaustive interleavings (within a preemption bound) of the protocols, with the futex
//! modelled without timeouts: a lost wake-up is reported by loom as a deadlock.
//!
//! `RUSTFLAGS="--cfg loom" cargo test -p hyper-multicore --lib --release loom_tests`

use loom::sync::Arc;
use loom::thread;

use super::*;

/// The shared words of a 2-PE job.
struct Header {
    words: TestWords,
    abort: AbortWord,
    data: [AtomicU32; 2],
}

fn header() -> Arc<Header> {
    Arc::new(Header {
        words: TestWords::new(2),
        abort: AbortWord::new(),
        data: [AtomicU32::new(0), AtomicU32::new(0)],
    })
}

const KINDS: [BarrierKind; 2] = [BarrierKind::Dissemination, BarrierKind::Central];

/// Far enough away never to matter: the model has no timeouts.
fn policy() -> WaitPolicy {
    WaitPolicy {
        spin: false,
        deadline: Deadline::After(Duration::from_secs(3600)),
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

/// [`model`] of `f` once per barrier kind, named `name (kind)`.
fn model_each_kind(
    name: &str,
    preemptions: Option<usize>,
    f: impl Fn(BarrierKind) + Copy + Sync + Send + 'static,
) {
    for kind in KINDS {
        model(&format!("{name} ({kind:?})"), preemptions, move || f(kind));
    }
}

/// Runs `f` on a new model thread with its own reference to `h`.
fn on_thread<R: Send + 'static>(
    h: &Arc<Header>,
    f: impl FnOnce(&Header) -> R + Send + 'static,
) -> thread::JoinHandle<R> {
    let h = h.clone();
    thread::spawn(move || f(&h))
}

/// Both PEs pass 2 barriers, and past barrier r each sees the other's write from before it.
#[test]
fn loom_barrier_two_pes_two_rounds() {
    model_each_kind("loom_barrier_two_pes_two_rounds", None, |kind| {
        let h = header();
        let peer = on_thread(&h, move |h| pe_rounds(kind, h, 1));
        pe_rounds(kind, &h, 0);
        peer.join().unwrap();
    });

    fn pe_rounds(kind: BarrierKind, h: &Header, me: usize) {
        for epoch in 1..=2 {
            h.data[me].store(epoch, Ordering::Relaxed);
            assert_eq!(
                barrier(kind, &h.words, me, 2, epoch, &h.abort, &policy()),
                Ok(())
            );
            assert!(
                h.data[1 - me].load(Ordering::Relaxed) >= epoch,
                "barrier {epoch}"
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
        let writer = on_thread(&h, |h| {
            h.data[0].store(1, Ordering::Release);
            fence(Ordering::SeqCst);
            ring(&h.words.bells[0]);
        });
        let ready = || h.data[0].load(Ordering::Acquire) == 1;
        let policy = WaitPolicy { spin, ..policy() };
        let bell = &h.words.bells[0];
        assert_eq!(wait_until(ready, bell, &h.abort, &policy), Ok(()));
        writer.join().unwrap();
    }
}

/// Aborts the job for the loss of rank `lost`, as the peer-loss watcher does.
fn abort_for(h: &Header, lost: u32) {
    abort(&h.abort, lost, &h.words.central, &h.words.bells);
}

/// An abort reaches a signal waiter whose condition never comes true.
#[test]
fn loom_abort_wakes_signal_waiter() {
    model("loom_abort_wakes_signal_waiter", None, || {
        let h = header();
        let aborter = on_thread(&h, |h| abort_for(h, 1));
        let never = || h.data[0].load(Ordering::Acquire) == 1;
        let lost = Err(WaitError::Aborted { lost_rank: 1 });
        let bell = &h.words.bells[0];
        assert_eq!(wait_until(never, bell, &h.abort, &policy()), lost);
        aborter.join().unwrap();
    });
}

/// An abort reaches a barrier waiter whose peer never arrives.
#[test]
fn loom_abort_wakes_barrier_waiter() {
    model_each_kind("loom_abort_wakes_barrier_waiter", None, |kind| {
        let h = header();
        let aborter = on_thread(&h, |h| abort_for(h, 1));
        let lost = Err(WaitError::Aborted { lost_rank: 1 });
        let outcome = barrier(kind, &h.words, 0, 2, 1, &h.abort, &policy());
        assert_eq!(outcome, lost);
        aborter.join().unwrap();
    });
}

/// An abort racing a barrier that completes: both PEs leave (released, or aborted only if
/// not yet released), and nobody sleeps forever. Three threads: the default bound is 3
/// preemptions.
#[test]
fn loom_abort_races_a_completing_barrier() {
    model_each_kind("loom_abort_races_a_completing_barrier", Some(3), |kind| {
        let h = header();
        let peer = on_thread(&h, move |h| {
            barrier(kind, &h.words, 1, 2, 1, &h.abort, &policy())
        });
        let aborter = on_thread(&h, |h| abort_for(h, 0));
        let mine = barrier(kind, &h.words, 0, 2, 1, &h.abort, &policy());
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
