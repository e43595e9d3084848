//! The fault points: every lifecycle stage (acquire, release, restart, and a shared root's
//! growth) × every root rank × {kill, retryable, unavailable},
//! and every blocking data-plane operation × a peer killed, each with what the survivors must
//! report — and the judge that checks one job's output against it.

use std::time::Duration;

use hyper_multicore::lifecycle::{Stage, FAULT_VARIABLE};
use serde::Serialize;

use crate::job::JobRun;
use crate::probe::Leaks;
use crate::scenario::{Action, DataOp, Operation, Record, Scenario, BROADCAST_ROOT};

/// One fault point.
#[derive(Debug, Clone)]
pub struct Point {
    /// `<N>pe operation:Stage:victim:action`, or `<N>pe data:op:victim:kill`.
    pub label: String,
    /// What the PEs do.
    pub scenario: Scenario,
    /// `HYPER_MULTICORE_TEST_FAULT`, if the library injects the fault.
    pub fault: Option<String>,
    /// PEs in the job.
    pub pes: usize,
    /// The rank that dies or fails.
    pub victim: usize,
    /// Whether it dies.
    pub kill: bool,
    /// What survivors must see.
    pub expect: Expect,
    /// Which time-to-error series the point belongs to.
    pub series: &'static str,
}

/// What every survivor's error must say.
#[derive(Debug, Clone)]
pub struct Expect {
    /// The call that fails.
    pub call: &'static str,
    /// `ErrorKind` name.
    pub kind: &'static str,
    /// `Recovery` name (`None`: a data-plane error carries none).
    pub recovery: Option<&'static str>,
    /// The stage the error names.
    pub stage: Option<String>,
    /// The check after the error (`recovered`, `refused`, …).
    pub after: &'static str,
    /// A survivor may finish the call instead: its part of it does not need the victim (a
    /// member of a broadcast whose root is alive reads or receives the root's bytes and
    /// returns; nothing there waits for the other members). The loss must then surface in
    /// the next call that needs every PE, which `after` checks.
    pub may_complete: bool,
}

/// Which points to run.
#[derive(Debug, Clone, Copy)]
pub struct Selection {
    /// PEs per job.
    pub pes: usize,
}

/// Every point for `selection`.
pub fn enumerate(selection: Selection) -> Vec<Point> {
    let pes = selection.pes;
    let mut points = Vec::new();
    let actions = [Action::Kill, Action::Retryable, Action::Unavailable];
    let lifecycle_stages = [
        (Operation::Acquire, vec!["Entry", "Bootstrap", "Initialize"]),
        (
            Operation::Release,
            Stage::RELEASE.iter().map(|s| s.name()).collect(),
        ),
        (
            Operation::Restart,
            Stage::RESTART.iter().map(|s| s.name()).collect(),
        ),
        (
            Operation::Grow,
            Stage::GROW.iter().map(|s| s.name()).collect(),
        ),
    ];
    for (operation, stages) in lifecycle_stages {
        for stage in stages {
            for victim in 0..pes {
                for action in actions {
                    if let Some(point) = lifecycle_point(operation, stage, victim, action, pes) {
                        points.push(point);
                    }
                }
            }
        }
    }
    for op in DataOp::ALL {
        for victim in 0..pes {
            points.push(Point {
                label: format!("{pes}pe data:{}:{victim}:kill", op.name()),
                scenario: Scenario::DataPlane { op, victim },
                fault: None,
                pes,
                victim,
                kill: true,
                expect: Expect {
                    call: op.name(),
                    kind: "PeerLost",
                    recovery: None,
                    stage: None,
                    after: "release_refused",
                    may_complete: op == DataOp::Broadcast && victim != BROADCAST_ROOT,
                },
                series: "data-plane kill",
            });
        }
    }
    points
}

fn lifecycle_point(
    operation: Operation,
    stage: &str,
    victim: usize,
    action: Action,
    pes: usize,
) -> Option<Point> {
    let acquire = operation == Operation::Acquire;
    // Entry is the PE killing itself before the call: only a kill. acquire's Initialize hook
    // can only kill (see the library's fault docs).
    if acquire && (stage == "Entry" || stage == "Initialize") && action != Action::Kill {
        return None;
    }
    let fault = (stage != "Entry").then(|| {
        format!(
            "{}:{stage}:{victim}:{}",
            operation.name(),
            action.fault_name()
        )
    });
    // The classes the lifecycle page documents: acquire's failures, and those of the stages
    // before ReleaseAllocations (release: Preflight, Quiesce), leave everything as it was.
    let before_teardown = acquire
        || Stage::GROW
            .iter()
            .any(|s| s.name() == stage && s.before_teardown());
    let (kind, recovery, after) = match action {
        Action::Kill if acquire => ("PeerLost", "Retryable", "retry_refused"),
        Action::Kill => ("PeerLost", "ConvergenceFailure", "refused"),
        Action::Retryable if before_teardown => ("Backend", "Retryable", "recovered"),
        Action::Unavailable if acquire => ("Backend", "Retryable", "recovered"),
        Action::Retryable | Action::Unavailable => ("Backend", "Terminal", "refused"),
    };
    let series = match action {
        Action::Kill => "lifecycle kill",
        Action::Retryable => "injected retryable",
        Action::Unavailable => "injected unavailable",
    };
    Some(Point {
        label: format!(
            "{pes}pe {}:{stage}:{victim}:{}",
            operation.name(),
            action.name()
        ),
        scenario: Scenario::Lifecycle {
            operation,
            stage: stage.to_string(),
            victim,
            action,
        },
        fault,
        pes,
        victim,
        kill: action == Action::Kill,
        expect: Expect {
            call: operation.name(),
            kind,
            recovery: Some(recovery),
            // acquire's errors name no stage (its steps are not converged stages).
            stage: (!acquire).then(|| stage.to_string()),
            after,
            may_complete: false,
        },
        series,
    })
}

impl Point {
    /// The environment of the job.
    pub fn env(&self) -> Vec<(String, String)> {
        self.fault
            .iter()
            .map(|f| (FAULT_VARIABLE.to_string(), f.clone()))
            .collect()
    }
}

/// The verdict on one point.
#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    /// The point.
    pub label: String,
    /// Its time-to-error series.
    pub series: String,
    /// Every check held.
    pub survived: bool,
    /// The job had to be stopped by a timeout or the watchdog.
    pub hang: bool,
    /// A survivor or the machine kept something.
    pub leak: bool,
    /// hmrun's exit code.
    pub exit: Option<i32>,
    /// Each survivor's blocking time in the failing call, ms.
    pub wait_ms: Vec<f64>,
    /// Each survivor's time from the victim's self-reported death to its error, ms (only where
    /// the victim kills itself and can say when).
    pub since_death_ms: Vec<f64>,
    /// What went wrong.
    pub problems: Vec<String>,
    /// The job's wall time, s.
    pub elapsed_s: f64,
}

/// Checks a job's output against the point's expectations.
pub fn judge(point: &Point, run: &JobRun, runtime_timeout: Duration) -> Verdict {
    let mut problems = Vec::new();
    let mut leak = false;
    let mut wait_ms = Vec::new();
    let mut since_death_ms = Vec::new();
    let limit_ms = runtime_timeout.as_secs_f64() * 1e3 / 2.0;
    if run.hung {
        problems.push(format!(
            "hang: the job was stopped after {:.1} s",
            run.elapsed.as_secs_f64()
        ));
    }
    match (point.kill, run.exit) {
        (true, Some(0)) => problems.push("hmrun exited 0 although a rank was killed".into()),
        (false, Some(code)) if code != 0 => {
            problems.push(format!("hmrun exited {code} although no rank was killed"))
        }
        (_, None) => problems.push("hmrun was killed".into()),
        _ => {}
    }
    let death = run.of(point.victim).find_map(|r| match r {
        Record::Dying { t_ns } => Some(*t_ns),
        _ => None,
    });
    let survivors: Vec<usize> = (0..point.pes)
        .filter(|&r| !(point.kill && r == point.victim))
        .collect();
    for &rank in &survivors {
        let records: Vec<&Record> = run.of(rank).collect();
        let failure = records.iter().find_map(|r| match r {
            Record::Failed {
                call,
                kind,
                recovery,
                stage,
                peer,
                message,
                wait_ms,
                t_ns,
            } if call == point.expect.call => {
                Some((kind, recovery, stage, peer, message, *wait_ms, *t_ns))
            }
            _ => None,
        });
        let completed = records
            .iter()
            .any(|r| matches!(r, Record::Succeeded { call } if call == point.expect.call));
        if let Some((kind, recovery, stage, peer, message, waited, t_ns)) = failure {
            wait_ms.push(waited);
            if let Some(death) = death {
                since_death_ms.push(t_ns.saturating_sub(death) as f64 / 1e6);
            }
            let mut wrong = Vec::new();
            if kind != point.expect.kind {
                wrong.push(format!("kind {kind} (expected {})", point.expect.kind));
            }
            if recovery.as_deref() != point.expect.recovery {
                wrong.push(format!(
                    "recovery {recovery:?} (expected {:?})",
                    point.expect.recovery
                ));
            }
            if stage.as_deref() != point.expect.stage.as_deref() {
                wrong.push(format!(
                    "stage {stage:?} (expected {:?})",
                    point.expect.stage
                ));
            }
            let victim = point.victim;
            let named = *peer == Some(victim)
                && (point.kill || message.contains(&format!("root_ranks=[{victim}]")));
            if !named {
                wrong.push(format!("does not name rank {victim} (peer {peer:?})"));
            }
            if waited >= limit_ms {
                wrong.push(format!(
                    "took {waited:.0} ms (limit {limit_ms:.0} ms = timeout/2)"
                ));
            }
            if !wrong.is_empty() {
                problems.push(format!("rank {rank}: {}: {message}", wrong.join(", ")));
            }
        } else if !(completed && point.expect.may_complete) {
            problems.push(format!("rank {rank}: no error from {}", point.expect.call));
            continue;
        }
        let after = records.iter().find_map(|r| match r {
            Record::After { what, ok, detail } if what == point.expect.after => Some((*ok, detail)),
            _ => None,
        });
        match after {
            Some((true, _)) => {}
            Some((false, detail)) => problems.push(format!(
                "rank {rank}: {} did not hold: {detail}",
                point.expect.after
            )),
            None => problems.push(format!("rank {rank}: no {} check", point.expect.after)),
        }
        let resources = records.iter().find_map(|r| match r {
            Record::Resources { leaks, .. } => Some(leaks),
            _ => None,
        });
        match resources {
            Some(leaks) if leaks.is_empty() => {}
            Some(leaks) => {
                leak = true;
                problems.push(format!("rank {rank}: leaked {}", describe_leaks(leaks)));
            }
            None => problems.push(format!("rank {rank}: did not report its resources")),
        }
    }
    if !run.left_behind.is_empty() {
        leak = true;
        problems.push(format!("left behind: {}", run.left_behind.join(", ")));
    }
    Verdict {
        label: point.label.clone(),
        series: point.series.into(),
        survived: problems.is_empty(),
        hang: run.hung,
        leak,
        exit: run.exit,
        wait_ms,
        since_death_ms,
        problems,
        elapsed_s: run.elapsed.as_secs_f64(),
    }
}

/// One line for a leak report.
pub fn describe_leaks(leaks: &Leaks) -> String {
    format!(
        "{} fds {:?}, {} threads, {} runtime mappings {:?}",
        leaks.fds.len(),
        leaks.fds,
        leaks.threads,
        leaks.maps.len(),
        leaks.maps
    )
}
