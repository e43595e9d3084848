//! The micro-benchmark of the barrier and the signal wait (threads of one process, pinned),
//! run by hand:
//!
//! `cargo test -p hyper-multicore --lib --release -- --ignored --nocapture bench_`

use std::thread;

use super::tests::{deadline, KINDS};
use super::*;

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

fn barrier_ns(kind: BarrierKind, pes: usize, rounds: u32) -> f64 {
    let words = TestWords::new(pes);
    let abort = AbortWord::new();
    let policy = WaitPolicy::new(pes, deadline());
    let cores = crate::sys::available_cores();
    let start = Instant::now();
    thread::scope(|s| {
        for me in 0..pes {
            let (words, abort, policy) = (&words, &abort, &policy);
            s.spawn(move || {
                pin_to_core(me % cores);
                for epoch in 1..=rounds {
                    barrier(kind, words, me, pes, epoch, abort, policy).unwrap();
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
    println!("cores available: {}", crate::sys::available_cores());
    let raw = report(
        "raw cache-line ping-pong, one-way",
        median_ns(|| raw_ping_pong_ns(100_000)),
    );
    let signal = report(
        "signal ping-pong, one-way",
        median_ns(|| signal_ping_pong_ns(100_000)),
    );
    println!("  signal / raw = {:.2}", signal / raw);
    for kind in KINDS {
        let b2 = median_ns(|| barrier_ns(kind, 2, 100_000));
        let b2 = report(&format!("{kind:?} barrier, 2 threads"), b2);
        println!("  barrier(2) / raw one-way = {:.2}", b2 / raw);
        let b4 = median_ns(|| barrier_ns(kind, 4, 20_000));
        report(&format!("{kind:?} barrier, 4 threads"), b4);
        let b16 = median_ns(|| barrier_ns(kind, 16, 2_000));
        report(&format!("{kind:?} barrier, 16 threads"), b16);
    }
}
