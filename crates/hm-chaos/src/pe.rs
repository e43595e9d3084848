//! The PE side of the fault points: every PE of a job runs `hm-chaos pe '<scenario>'`, joins
//! the world, takes its resource baseline, plays its part — the victim dies or fails at the
//! point, the survivors report what they saw — then reports what it still holds.
//!
//! Survivors ignore SIGTERM: when the victim dies, hmrun stops the other ranks (SIGTERM, then
//! SIGKILL after `--grace`), and the point of the suite is to see the survivors notice the loss
//! themselves and clean up, not to see them terminated by the launcher.

use std::io::Write;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use hyper_multicore::lifecycle::{
    self, ConsumerSpec, Replacement, RootGroup, SharedRoot, FAULT_VARIABLE,
};
use hyper_multicore::shmem::{AllocationSpec, Comparison, Dtype, ReduceOp, Symmetric};
use hyper_multicore::world::World;
use hyper_multicore::{Error, Recovery};

use crate::probe::{monotonic_ns, Snapshot};
use crate::scenario::{Action, DataOp, Operation, Record, Scenario, BROADCAST_ROOT, HEAP};

/// Prints one record as a JSON line and flushes it (so it is out before a SIGKILL).
pub fn emit(record: &Record) {
    let line = serde_json::to_string(record).expect("records serialize");
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{line}").and_then(|()| stdout.flush());
}

/// Reports the moment, then SIGKILLs this process.
pub fn die() -> ! {
    emit(&Record::Dying {
        t_ns: monotonic_ns(),
    });
    let me = rustix::process::getpid();
    let _ = rustix::process::kill_process(me, rustix::process::Signal::KILL);
    unreachable!("SIGKILL cannot be caught")
}

/// Runs `call`, reports how it ended and how long it blocked, and returns its result.
pub fn timed<T>(
    call: &str,
    f: impl FnOnce() -> hyper_multicore::Result<T>,
) -> hyper_multicore::Result<T> {
    let started = Instant::now();
    let result = f();
    let wait_ms = started.elapsed().as_secs_f64() * 1e3;
    match &result {
        Ok(_) => emit(&Record::Succeeded { call: call.into() }),
        Err(error) => emit(&failed(call, error, wait_ms)),
    }
    result
}

fn failed(call: &str, error: &Error, wait_ms: f64) -> Record {
    Record::Failed {
        call: call.into(),
        kind: format!("{:?}", error.kind()),
        recovery: error.recovery().map(|r| format!("{r:?}")),
        stage: error.stage().map(str::to_string),
        peer: error.peer(),
        message: error.to_string(),
        wait_ms,
        t_ns: monotonic_ns(),
    }
}

fn after(what: &str, ok: bool, detail: impl Into<String>) {
    emit(&Record::After {
        what: what.into(),
        ok,
        detail: detail.into(),
    });
}

/// The PE entry point.
pub fn run(scenario: &str) -> Result<()> {
    let scenario: Scenario = serde_json::from_str(scenario).context("parse the scenario")?;
    // Registered, SIGTERM only sets this flag: the PE finishes its report (see the module docs).
    signal_hook::flag::register(
        signal_hook::consts::SIGTERM,
        Arc::new(AtomicBool::new(false)),
    )
    .context("install the SIGTERM handler")?;
    let world = World::global().context("join the world")?;
    let baseline = Snapshot::take();
    match scenario {
        Scenario::Lifecycle {
            operation,
            stage,
            victim,
            action,
        } => lifecycle_point(&world, operation, &stage, victim, action)?,
        Scenario::DataPlane { op, victim } => data_point(&world, op, victim)?,
        Scenario::Soak {
            cycles,
            warmup,
            sample_every,
        } => {
            crate::soak::run_pe(cycles, warmup, sample_every)?;
            report_resources(&baseline);
            // No PE may leave before every PE has sampled: a departed peer closes its
            // control-plane link, and the survivor's router thread and socket would then be
            // missing from its last sample.
            world
                .control()
                .barrier()
                .context("barrier after the last sample")?;
            return Ok(());
        }
        Scenario::Bootstrap => crate::abuse::run_pe(&world)?,
        Scenario::HostFault => host_fault(&world)?,
    }
    report_resources(&baseline);
    Ok(())
}

/// Reports what this process holds beyond `baseline`.
pub fn report_resources(baseline: &Snapshot) {
    let now = Snapshot::take();
    let leaks = now.leaks_since(baseline);
    emit(&Record::Resources {
        sockets: leaks.sockets(),
        leaks,
        rss_kib: now.rss_kib,
        hwm_kib: now.hwm_kib,
    });
}

/// Stops injecting faults in this process: "fix the cause and call again".
fn clear_fault() {
    std::env::remove_var(FAULT_VARIABLE);
}

/// A collective round trip on the active runtime: allocate, put to the next PE, barrier, free.
fn exercise(rank: usize, size: usize) -> hyper_multicore::Result<()> {
    lifecycle::guarded("exercise", |s| {
        let x = s.allocate::<u64>(64, None)?;
        s.put(&x, &[rank as u64; 64], (rank + 1) % size)?;
        s.barrier()?;
        s.free(x)
    })
}

fn acquire() -> hyper_multicore::Result<()> {
    lifecycle::acquire(None, Some(HEAP))
}

fn lifecycle_point(
    world: &World,
    operation: Operation,
    stage: &str,
    victim: usize,
    action: Action,
) -> Result<()> {
    let (rank, size) = (world.rank(), world.size());
    match operation {
        Operation::Acquire => {
            if stage == "Entry" && rank == victim {
                die();
            }
            match timed("acquire", acquire) {
                Ok(()) => {
                    exercise(rank, size)?;
                    lifecycle::release()?;
                }
                Err(_) if action == Action::Kill => {
                    // The group lost a member: a retry must fail too (quickly), not wait.
                    let again = timed("acquire again", acquire);
                    after("retry_refused", again.is_err(), format!("{again:?}"));
                    if again.is_ok() {
                        let _ = lifecycle::release();
                    }
                }
                Err(_) => {
                    clear_fault();
                    let again = acquire()
                        .and_then(|()| exercise(rank, size))
                        .and_then(|()| lifecycle::release());
                    after("recovered", again.is_ok(), format!("{again:?}"));
                }
            }
        }
        Operation::Release => {
            acquire().context("acquire before the release")?;
            exercise(rank, size).context("exercise before the release")?;
            if let Err(error) = timed("release", lifecycle::release) {
                settle(&error, lifecycle::release);
            }
        }
        Operation::Restart => {
            acquire().context("acquire before the restart")?;
            let a = lifecycle::guarded("allocate", |s| s.allocate::<u32>(16, None))?;
            let restart = || {
                let replacement = Replacement {
                    current: a.region(),
                    target: AllocationSpec {
                        shape: vec![32],
                        dtype: Dtype::U32,
                        alignment: None,
                    },
                    preserve: false,
                };
                lifecycle::restart(2 * HEAP, &[replacement], None)
            };
            let finish = |result: lifecycle::RestartResult| {
                lifecycle::guarded("free", |s| {
                    for record in &result.allocations {
                        s.free_id(record.id)?;
                    }
                    Ok(())
                })
                .and_then(|()| lifecycle::release())
            };
            match timed("restart", restart) {
                Ok(result) => finish(result)?,
                Err(error) => settle(&error, || restart().and_then(finish)),
            }
        }
        Operation::Grow => grow_point(rank)?,
    }
    Ok(())
}

/// A shared root of three consumers, each holding data; the first one's growable buffer
/// grows (the fault strikes a stage of that growth). A retryable failure is retried and must
/// keep the data; any other leaves the lifecycle refusing a new acquire.
fn grow_point(rank: usize) -> Result<()> {
    let root = SharedRoot::new(RootGroup::World, None);
    let spec = |name: &str, budget| ConsumerSpec::new(name, "chaos", budget, "one buffer");
    let consumers = [
        root.reserve(spec("moe0", HEAP))?,
        root.reserve(spec("moe1", HEAP / 2))?,
        root.reserve(spec("attn", HEAP / 4))?,
    ];
    root.activate().context("activate the shared root")?;
    let mut kept = Vec::new();
    for (which, consumer) in consumers.iter().enumerate().skip(1) {
        let lease = consumer.claim()?;
        let record = lease.allocate_spec(&AllocationSpec {
            shape: vec![4096],
            dtype: Dtype::U8,
            alignment: None,
        })?;
        let bytes = vec![(rank * 8 + which) as u8; 4096];
        lease.run("fill", |s| s.put_bytes(record.region(), &bytes, rank))?;
        kept.push((which, record, bytes));
    }
    let lease = consumers[0].claim()?;
    let buffer = lease.allocate_growable(&AllocationSpec {
        shape: vec![64, 1024],
        dtype: Dtype::U8,
        alignment: None,
    })?;
    let grow = || buffer.ensure_capacity(&lease, 1024).map(drop);
    let Err(error) = timed("grow", grow) else {
        anyhow::bail!("the growth succeeded under a fault");
    };
    if error.recovery() != Some(Recovery::Retryable) {
        let again = acquire();
        let refused = matches!(&again, Err(e) if e.to_string().contains("restart the process"));
        after("refused", refused, format!("{again:?}"));
        return Ok(());
    }
    clear_fault();
    let retried = grow().and_then(|()| {
        // Every consumer's data survived the failed attempt and the growth.
        for (which, record, bytes) in &kept {
            let mut now = vec![0u8; bytes.len()];
            let record = lease.current(record.id)?;
            lease.run("check", |s| s.get_bytes(&mut now, record.region(), rank))?;
            if now != *bytes {
                return Err(Error::new(
                    hyper_multicore::ErrorKind::Protocol,
                    "grow",
                    format!("consumer {which}'s data changed"),
                ));
            }
        }
        lease.free(buffer.record(&lease)?.id)?;
        lease.release()?;
        for (which, record, _) in &kept {
            let lease = consumers[*which].claim()?;
            lease.free(lease.current(record.id)?.id)?;
        }
        consumers.iter().try_for_each(|c| c.close())?;
        root.close()
    });
    after("recovered", retried.is_ok(), format!("{retried:?}"));
    Ok(())
}

/// After a lifecycle error: a retryable one is fixed (the fault removed) and retried, which
/// must succeed; any other must leave the lifecycle refusing a new acquire.
fn settle(error: &Error, retry: impl FnOnce() -> hyper_multicore::Result<()>) {
    if error.recovery() == Some(Recovery::Retryable) {
        clear_fault();
        let again = retry();
        after("recovered", again.is_ok(), format!("{again:?}"));
    } else {
        let again = acquire();
        let refused = matches!(&again, Err(e) if e.to_string().contains("restart the process"));
        after("refused", refused, format!("{again:?}"));
    }
}

fn data_point(world: &World, op: DataOp, victim: usize) -> Result<()> {
    let (rank, size) = (world.rank(), world.size());
    acquire().context("acquire")?;
    let (gathered, flag, reduced, spare, arrived) = lifecycle::guarded("allocate", |s| {
        let gathered = s.allocate::<u64>(8 * size, None)?;
        let flag = s.allocate::<u64>(1, None)?;
        let reduced = s.allocate::<i64>(8, None)?;
        let spare = s.allocate::<u8>(64, None)?;
        let arrived = s.allocate::<u64>(1, None)?;
        s.barrier()?;
        Ok((gathered, flag, reduced, spare, arrived))
    })
    .context("allocate the buffers")?;
    // The victim dies once every survivor has left the barrier above (each says so with an
    // atomic add, which does not wait): dying earlier, it would end a survivor still in that
    // barrier (a lost peer ends every wait of the group), not in the operation under test.
    let survivors = size as u64 - 1;
    if rank == victim {
        lifecycle::guarded("wait for the survivors", |s| {
            s.wait_signal(&arrived, survivors, Comparison::Eq, None)
        })
        .context("wait for the survivors")?;
        die();
    }
    lifecycle::guarded("arrive", |s| s.atomic_add(&arrived, 1u64, victim))
        .context("say the barrier is left")?;
    let mine = vec![rank as u64; 8];
    let everyone = vec![rank as u64; 8 * size];
    let _ = timed(op.name(), || {
        lifecycle::guarded(op.name(), |s| match op {
            DataOp::Barrier => s.barrier(),
            // Only the victim would set it.
            DataOp::WaitSignal => s.wait_signal(&flag, 1u64, Comparison::Eq, None).map(drop),
            DataOp::AllGather => s.all_gather(&gathered, &mine),
            DataOp::Broadcast => s.broadcast(&gathered, &everyone, BROADCAST_ROOT),
            DataOp::AllToAll => s.all_to_all(&gathered, &everyone),
            DataOp::AllReduce => s.all_reduce(&reduced, &reduced, ReduceOp::Sum),
            DataOp::Allocate => s.allocate::<u8>(128, None).map(drop),
            DataOp::Free => s.free(spare),
        })
    });
    // The group is broken: release cannot converge; it must fail (not wait) and invalidate,
    // dropping the runtime, after which a new acquire is refused.
    let released = timed("release", lifecycle::release);
    let again = acquire();
    let refused = matches!(&again, Err(e) if e.to_string().contains("restart the process"));
    after(
        "release_refused",
        released.is_err() && refused,
        format!("release: {released:?}; acquire: {again:?}"),
    );
    Ok(())
}

/// A PE of a host-fault job: acquires the runtime, says it is ready (a `ready` note), then puts
/// 8 KiB to its right neighbour and passes a barrier until that fails; reports the failure,
/// releases (which must not wait) and ends the process with status 1, as a program that lost a
/// host would.
fn host_fault(world: &World) -> Result<()> {
    let (rank, size) = (world.rank(), world.size());
    acquire().context("acquire")?;
    let block = lifecycle::guarded("allocate", |s| {
        let block = s.allocate::<u8>(8 << 10, None)?;
        s.barrier()?;
        Ok(block)
    })
    .context("allocate the block")?;
    emit(&Record::Note {
        what: "ready".into(),
        value: String::new(),
    });
    let data = vec![rank as u8; 8 << 10];
    let mut round_started = Instant::now();
    let error = loop {
        let round = lifecycle::guarded("exchange", |s| {
            s.put(&block, &data, (rank + 1) % size)?;
            s.barrier()
        });
        match round {
            Ok(()) => round_started = Instant::now(),
            Err(error) => break error,
        }
    };
    emit(&failed(
        "exchange",
        &error,
        round_started.elapsed().as_secs_f64() * 1e3,
    ));
    drop(block);
    let released = lifecycle::release();
    after("released", true, format!("{released:?}"));
    std::process::exit(1)
}
