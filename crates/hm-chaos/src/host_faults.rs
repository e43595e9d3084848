//! Host-level faults (issue 42): a job on four network-namespace hosts on one bridge
//! ([`NamespaceHosts`]), `hmrun -n 2 --nnodes 4` on each running [`Scenario::HostFault`] PEs,
//! loses host 2 — its link cut at the switch, its processes SIGKILLed, or its processes frozen
//! (SIGSTOP) past the peer timeout — while every PE puts and passes barriers. With the wait
//! timeout left at its 120 s default and a 2 s peer timeout, every surviving host's PEs must
//! fail with `peer lost` naming host 2 and its ranks (a killed host's may name only one of its
//! ranks, as a UCX endpoint error does), the cut-off host's PEs must name root rank 0's host,
//! every agent must exit non-zero, within the watchdog, and no process of the job may be left.
//!
//! Making namespaces needs root: elsewhere the faults are skipped, saying why.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use hm_testkit::namespace_hosts::NamespaceHosts;
use hyper_multicore::config::PEER_TIMEOUT_SEC;
use rustix::process::{kill_process, Pid, Signal};
use serde::Serialize;

use crate::job::{parse_line, tagged_pids, Launcher, JOB_TAG};
use crate::scenario::{Record, Scenario};

/// Hosts of a job, PEs per host, and the host every fault takes away (not root rank 0's).
const HOSTS: usize = 4;
const PES_PER_HOST: usize = 2;
const VICTIM: usize = 2;
/// The peer timeout of these jobs, in seconds.
const PEER_TIMEOUT: &str = "2";
/// How long a job may take from its start to every agent's exit.
const WATCHDOG: Duration = Duration::from_secs(90);

/// A way to lose a host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// Its cable pulled at the switch.
    LinkCut,
    /// Its processes SIGKILLed.
    Killed,
    /// Its processes SIGSTOPped until the survivors are done.
    Frozen,
}

impl Fault {
    const ALL: [Fault; 3] = [Fault::LinkCut, Fault::Killed, Fault::Frozen];

    fn name(self) -> &'static str {
        match self {
            Fault::LinkCut => "link cut",
            Fault::Killed => "host killed",
            Fault::Frozen => "host frozen",
        }
    }
}

/// One host fault's verdict.
#[derive(Debug, Serialize)]
pub struct HostFault {
    /// The fault.
    pub label: String,
    /// Every check held.
    pub survived: bool,
    /// The watchdog had to end the job.
    pub hang: bool,
    /// Processes of the job were left.
    pub leak: bool,
    /// From the fault to the last surviving agent's exit, ms.
    pub detected_ms: Option<u64>,
    /// What went wrong.
    pub problems: Vec<String>,
}

/// The host faults of a run, or why they were skipped.
#[derive(Debug, Serialize)]
pub struct HostFaults {
    /// One per fault.
    pub faults: Vec<HostFault>,
    /// Why none ran.
    pub skipped: Option<String>,
}

/// Runs every host fault (or says why it cannot).
pub fn drive(launcher: &Launcher) -> HostFaults {
    if !rustix::process::geteuid().is_root() {
        return skipped("making network-namespace hosts needs root".into());
    }
    let mut faults = Vec::new();
    for fault in Fault::ALL {
        let tag = format!("c{}", faults.len());
        let hosts = match NamespaceHosts::create(HOSTS, &tag) {
            Ok(hosts) => hosts,
            Err(why) if faults.is_empty() => {
                return skipped(format!("cannot make namespace hosts here: {why}"))
            }
            Err(why) => {
                faults.push(verdict(fault, vec![format!("no namespace hosts: {why}")]));
                continue;
            }
        };
        faults.push(run(launcher, &hosts, fault, &tag));
    }
    HostFaults {
        faults,
        skipped: None,
    }
}

fn skipped(why: String) -> HostFaults {
    HostFaults {
        faults: Vec::new(),
        skipped: Some(why),
    }
}

fn verdict(fault: Fault, problems: Vec<String>) -> HostFault {
    HostFault {
        label: fault.name().into(),
        survived: problems.is_empty(),
        hang: false,
        leak: false,
        detected_ms: None,
        problems,
    }
}

/// One host's agent and what it printed.
struct Agent {
    child: Child,
    /// Its processes carry `JOB_TAG=tag`.
    tag: String,
    records: Vec<(usize, Record)>,
    lines: Vec<String>,
    exit: Option<i32>,
}

/// Runs one job on `hosts` and takes host [`VICTIM`] away by `fault`.
fn run(launcher: &Launcher, hosts: &NamespaceHosts, fault: Fault, tag: &str) -> HostFault {
    let started = Instant::now();
    let deadline = started + WATCHDOG;
    let (sender, lines) = mpsc::channel::<(usize, String)>();
    let mut agents: Vec<Agent> = Vec::new();
    for h in 0..HOSTS {
        match start_agent(launcher, hosts, h, tag, &sender) {
            Ok(agent) => agents.push(agent),
            Err(why) => {
                end_all(&mut agents);
                return verdict(fault, vec![format!("cannot start host {h}'s agent: {why}")]);
            }
        }
    }
    drop(sender);
    let mut problems = Vec::new();
    let ready = |agents: &[Agent]| {
        agents
            .iter()
            .map(|agent| {
                agent
                    .records
                    .iter()
                    .filter(|(_, r)| matches!(r, Record::Note { what, .. } if what == "ready"))
                    .count()
            })
            .sum::<usize>()
            >= HOSTS * PES_PER_HOST
    };
    let mut hang = !collect_until(&lines, &mut agents, deadline, ready);
    let victims = tagged_pids(&agents[VICTIM].tag);
    let fault_at = Instant::now();
    if !hang {
        match fault {
            Fault::LinkCut => hosts.cut(VICTIM),
            Fault::Killed => signal(&victims, Signal::KILL),
            Fault::Frozen => signal(&victims, Signal::STOP),
        }
    }
    // The survivors must end on their own (the frozen host stays frozen until they have).
    let survivors_done = |agents: &[Agent]| {
        (0..HOSTS)
            .filter(|&h| h != VICTIM)
            .all(|h| agents[h].exit.is_some())
    };
    hang |= !collect_until(&lines, &mut agents, deadline, survivors_done);
    let detected_ms = (!hang).then(|| fault_at.elapsed().as_millis() as u64);
    if fault == Fault::Frozen {
        signal(&victims, Signal::CONT);
    }
    hang |= !collect_until(&lines, &mut agents, deadline, |agents| {
        agents.iter().all(|agent| agent.exit.is_some())
    });
    if hang {
        problems.push(format!(
            "the job did not end within {} s",
            WATCHDOG.as_secs()
        ));
        end_all(&mut agents);
    }
    for (h, agent) in agents.iter().enumerate() {
        problems.extend(judge_host(h, agent, fault));
    }
    let left: Vec<u32> = agents
        .iter()
        .flat_map(|agent| {
            let until = Instant::now() + Duration::from_secs(10);
            loop {
                let left = tagged_pids(&agent.tag);
                if left.is_empty() || Instant::now() >= until {
                    break left;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        })
        .collect();
    let leak = !left.is_empty();
    if leak {
        problems.push(format!("processes of the job were left: {left:?}"));
        signal(&left, Signal::KILL);
    }
    HostFault {
        label: fault.name().into(),
        survived: problems.is_empty(),
        hang,
        leak,
        detected_ms,
        problems,
    }
}

/// Starts host `h`'s agent; its stdout lines go to `lines`.
fn start_agent(
    launcher: &Launcher,
    hosts: &NamespaceHosts,
    h: usize,
    tag: &str,
    lines: &mpsc::Sender<(usize, String)>,
) -> std::io::Result<Agent> {
    let wrapper = hosts.wrapper(h);
    let json = serde_json::to_string(&Scenario::HostFault).expect("a scenario serializes");
    let job_tag = format!("{}-{tag}-host{h}", std::process::id());
    let mut child = Command::new(&wrapper[0])
        .args(&wrapper[1..])
        .arg(&launcher.hmrun)
        .args(["-n", &PES_PER_HOST.to_string()])
        .args(["--nnodes", &HOSTS.to_string()])
        .args(["--node-rank", &h.to_string()])
        .args(["--master-addr", &NamespaceHosts::address(0)])
        .args(["--master-port", "29500"])
        .arg("--")
        .arg(&launcher.program)
        .arg("pe")
        .arg(json)
        .env(JOB_TAG, &job_tag)
        .env(PEER_TIMEOUT_SEC, PEER_TIMEOUT)
        .env(
            "HYPER_MULTICORE_SHMEM_SECRET",
            "4242424242424242424242424242c4a0",
        )
        .env("UCX_TLS", "tcp,self")
        .env("UCX_NET_DEVICES", hosts.device(h))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let stdout = child.stdout.take().expect("piped");
    let lines = lines.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines.send((h, line)).is_err() {
                return;
            }
        }
    });
    Ok(Agent {
        child,
        tag: job_tag,
        records: Vec::new(),
        lines: Vec::new(),
        exit: None,
    })
}

/// Takes in the agents' lines and exits until `done` holds (true) or `deadline` passes (false).
fn collect_until(
    lines: &mpsc::Receiver<(usize, String)>,
    agents: &mut [Agent],
    deadline: Instant,
    done: impl Fn(&[Agent]) -> bool,
) -> bool {
    loop {
        for agent in agents.iter_mut().filter(|agent| agent.exit.is_none()) {
            if let Ok(Some(status)) = agent.child.try_wait() {
                agent.exit = Some(status.code().unwrap_or(-1));
            }
        }
        if done(agents) {
            return true;
        }
        let now = Instant::now();
        if now >= deadline {
            return false;
        }
        let wait = (deadline - now).min(Duration::from_millis(50));
        match lines.recv_timeout(wait) {
            Ok((h, line)) => match parse_line(&line) {
                Some(record) => agents[h].records.push(record),
                None => agents[h].lines.push(line),
            },
            // Every reader ended, or nothing for a while: look at the exits again.
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => std::thread::sleep(wait),
        }
    }
}

/// What host `h`'s agent must have shown for `fault`.
fn judge_host(h: usize, agent: &Agent, fault: Fault) -> Vec<String> {
    let mut problems = Vec::new();
    if agent.exit == Some(0) {
        problems.push(format!("host {h}'s hmrun exited 0 after the loss"));
    }
    if h == VICTIM && fault != Fault::LinkCut {
        return problems; // killed or frozen: nothing it says is checked
    }
    let first = VICTIM * PES_PER_HOST;
    let victim_host = format!("host hm-host-{VICTIM} (ranks [{first}, {}])", first + 1);
    let failures: Vec<(&str, Option<usize>, &str)> = agent
        .records
        .iter()
        .filter_map(|(_, record)| match record {
            Record::Failed {
                kind,
                peer,
                message,
                ..
            } => Some((kind.as_str(), *peer, message.as_str())),
            _ => None,
        })
        .collect();
    // At least one PE per host: hmrun stops a host's other PEs once one failed, and not every
    // PE yet ends its own wait in time (see docs/reliability.md, "In the chaos suite").
    if failures.is_empty() {
        problems.push(format!(
            "host {h}'s PEs reported no failure: {:?}",
            agent.lines
        ));
    }
    for (kind, peer, message) in failures {
        let named = if h == VICTIM {
            message.contains("host hm-host-0 of root rank 0 is lost")
        } else {
            message.contains(&victim_host)
                || (fault == Fault::Killed && peer.is_some_and(|p| p / PES_PER_HOST == VICTIM))
        };
        if kind != "PeerLost" || !named {
            problems.push(format!(
                "host {h}: {kind} that does not name what was lost: {message}"
            ));
        }
    }
    problems
}

/// Sends `signal` to each of `pids` (gone ones are skipped).
fn signal(pids: &[u32], signal: Signal) {
    for &pid in pids {
        if let Some(pid) = Pid::from_raw(pid as i32) {
            let _ = kill_process(pid, signal);
        }
    }
}

/// Kills every agent's processes and reaps the agents.
fn end_all(agents: &mut [Agent]) {
    for agent in agents.iter_mut() {
        signal(&tagged_pids(&agent.tag), Signal::CONT);
        signal(&tagged_pids(&agent.tag), Signal::KILL);
        let _ = agent.child.kill();
        if let Ok(status) = agent.child.wait() {
            agent.exit.get_or_insert(status.code().unwrap_or(-1));
        }
    }
}
