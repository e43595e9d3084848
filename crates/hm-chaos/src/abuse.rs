//! Bootstrap abuse: strangers at every rendezvous of a job, and the legitimate ranks must not
//! notice — while root rank 0's memory stays bounded.
//!
//! One job of [`PES`] PEs, launched straight from a [`JobPlan`] (the driver needs the world's
//! endpoint and secret before any PE exists, which hmrun does not expose), meets three attacks:
//!
//! - **A, the world rendezvous**: before any PE starts, the driver queues `strangers`
//!   connections at the world endpoint, cycling through every [`Stranger`] kind (junk, a
//!   `u32::MAX` length prefix, a frame one byte over the handshake cap, a truncated header, a
//!   truncated frame, a frame that fills the handshake cap and never finishes, silence, a wrong
//!   secret, a wrong group size, a rank out of range, a wrong frame kind, a malformed hello). A
//!   thread keeps adding strangers while the PEs start.
//! - **B, the runtime's rendezvous** inside `acquire` (`HYPER_MULTICORE_SHMEM_BOOTSTRAP_ENDPOINT`
//!   fixed by the driver): the same thread floods that port as soon as it listens. Its window
//!   is short, so how many strangers reached it is reported, not required.
//! - **C, an explicit control plane** (`ControlPlane::connect`): root rank 0 creates its unique
//!   ID, rank 1 presents itself (`start_joining`), and only then — rank 0 waits for the driver's
//!   word on stdin before serving — the driver queues a *duplicate claim of rank 1 with the
//!   right secret* and more strangers. The accept queue is FIFO, so the real rank 1 is judged
//!   first and the impostor must be refused as a duplicate.
//!
//! Then every PE must have succeeded, every refused stranger must have got the right reason
//! (and junk no answer at all), and root rank 0's peak resident memory (`VmHWM`) may exceed that
//! of the same job without strangers by at most [`MEMORY_BOUND_KIB`].

use std::io::{BufRead, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::ExitStatus;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use hyper_multicore::config::{Config, BOOTSTRAP_ENDPOINT, TIMEOUT_SEC};
use hyper_multicore::control::frame::{
    encode_header, write_frame, FrameDecoder, Kind, WireError, HEADER_LEN, MAX_HANDSHAKE_PAYLOAD,
    MAX_PAYLOAD,
};
use hyper_multicore::control::{ControlPlane, UniqueId, SECRET_LEN};
use hyper_multicore::launch::{JobPlan, PeStdio};
use hyper_multicore::lifecycle;
use hyper_multicore::world::World;
use rustix::process::{kill_process, Signal};
use serde::Serialize;

use crate::job::{Launcher, SystemView, JOB_TAG};
use crate::pe::emit;
use crate::points::describe_leaks;
use crate::scenario::{Record, Scenario, HEAP};

/// PEs of the job.
pub const PES: usize = 3;

/// How much more root rank 0's peak resident memory may be with strangers than without, KiB.
///
/// Each stranger costs root rank 0 at most one decoder buffer while it is pending: a read
/// asks for at least 64 KiB, and nothing above the 4 KiB handshake cap is ever kept. At most
/// 256 strangers are kept pending (older ones are dropped), so the worst case is 256 × 64 KiB
/// = 16 MiB; 24 MiB leaves room for the allocator. Without the cap, one `u32::MAX` prefix
/// would ask for 4 GiB.
pub const MEMORY_BOUND_KIB: u64 = 24 << 10;

/// One kind of unwelcome connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stranger {
    /// An HTTP request.
    Junk,
    /// A valid header announcing a `u32::MAX` payload.
    HugePrefix,
    /// A header one byte over the handshake cap.
    OverCap,
    /// Ten bytes of a header, then nothing.
    TruncatedHeader,
    /// A header announcing 100 bytes, ten of them sent.
    TruncatedFrame,
    /// A header announcing the full cap, all but a few bytes sent: the most a stranger can
    /// make root rank 0 hold.
    FullPending,
    /// Connects and says nothing.
    Silent,
    /// A well-formed hello with another job's secret.
    WrongSecret,
    /// The right secret, the wrong group size.
    WrongSize,
    /// The right secret, a rank outside the group.
    RankOutOfRange,
    /// A well-formed frame that is not a hello.
    WrongKind,
    /// A hello whose payload does not decode.
    MalformedHello,
}

impl Stranger {
    /// Every kind.
    pub const ALL: [Stranger; 12] = [
        Stranger::Junk,
        Stranger::HugePrefix,
        Stranger::OverCap,
        Stranger::TruncatedHeader,
        Stranger::TruncatedFrame,
        Stranger::FullPending,
        Stranger::Silent,
        Stranger::WrongSecret,
        Stranger::WrongSize,
        Stranger::RankOutOfRange,
        Stranger::WrongKind,
        Stranger::MalformedHello,
    ];

    /// The bytes it sends to a rendezvous of `size` ranks whose secret is `secret`.
    pub fn bytes(self, secret: &[u8; SECRET_LEN], size: usize) -> Vec<u8> {
        let mut out = Vec::new();
        let frame = |out: &mut Vec<u8>, kind, payload: &[u8]| {
            write_frame(out, kind, 0, &[payload]).expect("a Vec never fails")
        };
        match self {
            Stranger::Junk => out.extend_from_slice(b"GET / HTTP/1.1\r\nHost: hyper\r\n\r\n"),
            Stranger::HugePrefix => out.extend_from_slice(&encode_header(Kind::Hello, 0, u32::MAX)),
            Stranger::OverCap => {
                out.extend_from_slice(&encode_header(Kind::Hello, 0, MAX_HANDSHAKE_PAYLOAD + 1))
            }
            Stranger::TruncatedHeader => {
                out.extend_from_slice(&encode_header(Kind::Hello, 0, 16)[..10])
            }
            Stranger::TruncatedFrame => {
                out.extend_from_slice(&encode_header(Kind::Hello, 0, 100));
                out.extend_from_slice(&[0x5a; 10]);
            }
            Stranger::FullPending => {
                out.extend_from_slice(&encode_header(Kind::Hello, 0, MAX_HANDSHAKE_PAYLOAD));
                out.resize(HEADER_LEN + MAX_HANDSHAKE_PAYLOAD as usize - 8, 0xa5);
            }
            Stranger::Silent => {}
            Stranger::WrongSecret => {
                frame(&mut out, Kind::Hello, &hello(&[0x5a; SECRET_LEN], 1, size))
            }
            Stranger::WrongSize => frame(&mut out, Kind::Hello, &hello(secret, 1, size + 1)),
            Stranger::RankOutOfRange => {
                frame(&mut out, Kind::Hello, &hello(secret, size + 5, size))
            }
            Stranger::WrongKind => frame(&mut out, Kind::Contribute, b"not a hello"),
            Stranger::MalformedHello => frame(&mut out, Kind::Hello, &[0xff; 5]),
        }
        out
    }

    /// The refusal it must get, or `None` for no answer at all.
    pub fn expected_refusal(self) -> Option<&'static str> {
        match self {
            Stranger::WrongSecret => Some("wrong secret"),
            Stranger::WrongSize => Some("size mismatch"),
            Stranger::RankOutOfRange => Some("out of range"),
            Stranger::WrongKind => Some("expected a hello"),
            Stranger::MalformedHello => Some("malformed hello"),
            _ => None,
        }
    }
}

/// A hello as the rendezvous encodes it (postcard: the 16 secret bytes, then varints, then the
/// member's host name as a length-prefixed string).
pub fn hello(secret: &[u8; SECRET_LEN], rank: usize, size: usize) -> Vec<u8> {
    let mut bytes = secret.to_vec();
    for value in [rank as u32, size as u32] {
        let mut v = value;
        loop {
            let byte = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                bytes.push(byte);
                break;
            }
            bytes.push(byte | 0x80);
        }
    }
    const HOST: &[u8] = b"hm-chaos";
    bytes.push(HOST.len() as u8);
    bytes.extend_from_slice(HOST);
    bytes
}

/// The secret inside a unique ID (its last bytes).
fn secret_of(id: &UniqueId) -> [u8; SECRET_LEN] {
    let bytes = id.to_bytes();
    bytes[bytes.len() - SECRET_LEN..]
        .try_into()
        .expect("secret length")
}

fn connect_and_send(endpoint: SocketAddr, bytes: &[u8]) -> Option<TcpStream> {
    let mut stream = TcpStream::connect(endpoint).ok()?;
    // The peer may already have dropped us (junk is dropped at once): that is its right.
    let _ = stream.write_all(bytes);
    Some(stream)
}

/// What a stranger got back: the refusal's message, `Ok(None)` for nothing.
fn reply(stream: &mut TcpStream) -> std::result::Result<Option<String>, String> {
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    let mut bytes = Vec::new();
    let _ = stream.read_to_end(&mut bytes); // a reset ends it too
    if bytes.is_empty() {
        return Ok(None);
    }
    let mut decoder = FrameDecoder::new(MAX_PAYLOAD);
    decoder.push(&bytes);
    match decoder.next_frame() {
        Ok(Some(frame)) if frame.kind == Kind::Reject => {
            Ok(Some(WireError::decode(&frame.payload).message))
        }
        other => Err(format!(
            "unexpected answer {other:?} ({} bytes)",
            bytes.len()
        )),
    }
}

/// The PE side.
pub fn run_pe(world: &World) -> Result<()> {
    let (rank, size) = (world.rank(), world.size());
    let timeout = Config::from_env()?.timeout;
    lifecycle::acquire(None, Some(HEAP)).context("acquire")?;
    emit(&note("acquired", ""));
    // Phase C: an explicit control plane.
    let plane = if rank == 0 {
        let (id, listener) = UniqueId::create(&Config::default())?;
        world.control().broadcast(&id.to_bytes())?;
        emit(&note("plane_id", &id.to_string()));
        let mut go = String::new();
        std::io::stdin().lock().read_line(&mut go)?;
        ControlPlane::connect(0, size, &id, Some(listener), timeout)?
    } else {
        let id = UniqueId::from_bytes(&world.control().broadcast(&[])?)?;
        if rank == 1 {
            let joining = ControlPlane::start_joining(1, size, &id, timeout)?;
            emit(&note("hello_sent", ""));
            joining.finish()?
        } else {
            ControlPlane::connect(rank, size, &id, None, timeout)?
        }
    };
    let ranks = plane.allgather(&[rank as u8])?;
    let expected: Vec<Vec<u8>> = (0..size).map(|r| vec![r as u8]).collect();
    if ranks != expected {
        bail!("the explicit plane gathered {ranks:?}");
    }
    drop(plane);
    // The runtime whose rendezvous was flooded works.
    lifecycle::guarded("all_gather", |s| {
        let out = s.allocate::<u64>(size, None)?;
        s.all_gather(&out, &[rank as u64])?;
        let mut back = vec![0u64; size];
        s.get(&mut back, &out, rank)?;
        assert_eq!(back, (0..size as u64).collect::<Vec<_>>());
        s.free(out)
    })?;
    lifecycle::release()?;
    Ok(())
}

fn note(what: &str, value: &str) -> Record {
    Record::Note {
        what: what.into(),
        value: value.into(),
    }
}

/// The figures of one bootstrap job.
#[derive(Debug, Clone, Serialize)]
pub struct AbuseJob {
    /// Strangers queued before the PEs started (phase A).
    pub before: usize,
    /// Strangers connected while the PEs started, at the world endpoint and at the runtime's.
    pub during_world: usize,
    /// Of them, at the runtime's bootstrap endpoint (phase B).
    pub during_runtime: usize,
    /// Strangers at the explicit plane (phase C), the duplicate claim included.
    pub plane: usize,
    /// Root rank 0's VmRSS and VmHWM at the end, KiB.
    pub rank0_rss_kib: u64,
    /// Root rank 0's peak.
    pub rank0_hwm_kib: u64,
    /// Wall time, s.
    pub elapsed_s: f64,
}

/// The verdict and figures of the abuse scenario.
#[derive(Debug, Clone, Serialize)]
pub struct AbuseReport {
    /// The job without strangers.
    pub control: Option<AbuseJob>,
    /// The attacked job.
    pub attacked: Option<AbuseJob>,
    /// Every check held.
    pub survived: bool,
    /// A job hung.
    pub hang: bool,
    /// Something stayed.
    pub leak: bool,
    /// What went wrong.
    pub problems: Vec<String>,
}

/// Runs the control job and the attacked job: `strangers` before the PEs start (at most 1000:
/// the listen queue holds 1024), half as many while they do, and `plane_strangers` at the
/// explicit plane behind rank 1's hello.
pub fn drive(launcher: &Launcher, strangers: usize, plane_strangers: usize) -> Result<AbuseReport> {
    let mut report = AbuseReport {
        control: None,
        attacked: None,
        survived: false,
        hang: false,
        leak: false,
        problems: Vec::new(),
    };
    if strangers > 1000 {
        bail!("at most 1000 strangers fit in the listen queue before the PEs start");
    }
    let control = run_job(launcher, 0, 0, &mut report)?;
    let attacked = run_job(launcher, strangers, plane_strangers, &mut report)?;
    if let (Some(control), Some(attacked)) = (&control, &attacked) {
        let extra = attacked.rank0_hwm_kib.saturating_sub(control.rank0_hwm_kib);
        if extra > MEMORY_BOUND_KIB {
            report.problems.push(format!(
                "root rank 0's VmHWM is {} KiB with strangers, {} KiB without: {extra} KiB \
                 more than the {MEMORY_BOUND_KIB} KiB bound",
                attacked.rank0_hwm_kib, control.rank0_hwm_kib
            ));
        }
    }
    report.control = control;
    report.attacked = attacked;
    report.survived = report.problems.is_empty();
    Ok(report)
}

/// Events of a directly launched job.
enum Event {
    Line(usize, String),
    Exited(usize, std::io::Result<ExitStatus>),
}

fn run_job(
    launcher: &Launcher,
    strangers: usize,
    plane_strangers: usize,
    report: &mut AbuseReport,
) -> Result<Option<AbuseJob>> {
    let label = if strangers == 0 {
        "control"
    } else {
        "attacked"
    };
    let tag = format!("{}-bootstrap-{strangers}", std::process::id());
    let tmpdir = launcher.scratch.join(&tag);
    std::fs::create_dir_all(&tmpdir)?;
    let before_view = SystemView::take(&tag, &tmpdir);
    let plan = JobPlan::new(PES, &Config::default())?;
    let world_endpoint = plan.id().endpoint();
    let world_secret = secret_of(plan.id());
    let runtime_endpoint: SocketAddr = {
        let probe = TcpListener::bind("127.0.0.1:0")?;
        probe.local_addr()?
    };

    // Phase A: queued before any PE exists, so they sit ahead of the real ranks.
    let mut queued: Vec<(Stranger, TcpStream)> = Vec::new();
    for i in 0..strangers {
        let kind = Stranger::ALL[i % Stranger::ALL.len()];
        let stream = connect_and_send(world_endpoint, &kind.bytes(&world_secret, PES))
            .context("connect a stranger to the world endpoint")?;
        queued.push((kind, stream));
    }

    let started = Instant::now();
    let (events, inbox) = mpsc::channel();
    let mut pids = Vec::new();
    let mut root_stdin = None;
    for rank in 0..PES {
        let mut command = plan.command(rank, &launcher.program);
        command
            .arg("pe")
            .arg(serde_json::to_string(&Scenario::Bootstrap)?)
            .env(
                TIMEOUT_SEC,
                format!("{}", launcher.runtime_timeout.as_secs_f64()),
            )
            .env(BOOTSTRAP_ENDPOINT, format!("tcp://{runtime_endpoint}"))
            .env(JOB_TAG, &tag)
            .env("TMPDIR", &tmpdir)
            .stdin(if rank == 0 {
                PeStdio::Piped
            } else {
                PeStdio::Null
            })
            .stdout(PeStdio::Piped)
            .stderr(PeStdio::Piped);
        let mut child = command.spawn().context("spawn a PE")?;
        pids.push(child.pid());
        if rank == 0 {
            root_stdin = child.stdin.take();
        }
        let stdout = child.stdout.take().expect("piped");
        let lines = events.clone();
        // Lines go to the driver as they come (it acts on some at once); the exit waits for
        // the last of them, so a PE's final report never arrives after its exit.
        let stdout = std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(std::io::Result::ok)
            {
                let _ = lines.send(Event::Line(rank, line));
            }
        });
        let stderr = crate::job::lines_of(child.stderr.take().expect("piped"));
        let exited = events.clone();
        std::thread::spawn(move || {
            let status = child.wait();
            let _ = stdout.join();
            let _ = stderr.join().map(|lines| {
                for line in lines {
                    let _ = exited.send(Event::Line(rank, format!("stderr: {line}")));
                }
            });
            let _ = exited.send(Event::Exited(rank, status));
        });
    }
    drop(plan); // rank 0 holds the world listener now
    drop(events);

    // Phases A (continued) and B: strangers while the PEs start.
    let stop = Arc::new(AtomicBool::new(false));
    let flood = {
        let stop = Arc::clone(&stop);
        let count = strangers / 2;
        std::thread::spawn(move || {
            flood(world_endpoint, runtime_endpoint, world_secret, count, &stop)
        })
    };

    let deadline = started + Duration::from_secs(60);
    let mut plane_id: Option<UniqueId> = None;
    let mut hello_sent = false;
    let mut acquired = 0;
    let mut released_gate = false;
    let mut at_plane: Vec<(Option<Stranger>, TcpStream)> = Vec::new();
    let mut statuses: Vec<Option<ExitStatus>> = vec![None; PES];
    let mut records: Vec<(usize, Record)> = Vec::new();
    let mut other = Vec::new();
    let mut hung = false;
    while statuses.iter().any(Option::is_none) {
        let event = match inbox.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(event) => event,
            Err(_) => {
                hung = true;
                for pid in &pids {
                    let _ = kill_process(*pid, Signal::KILL);
                }
                deadline_drain(&inbox, &mut statuses);
                break;
            }
        };
        match event {
            Event::Exited(rank, status) => statuses[rank] = status.ok(),
            Event::Line(rank, line) => match serde_json::from_str::<Record>(&line) {
                Ok(record) => {
                    if let Record::Note { what, value } = &record {
                        match what.as_str() {
                            "acquired" => acquired += 1,
                            "plane_id" => plane_id = value.parse().ok(),
                            "hello_sent" => hello_sent = true,
                            _ => {}
                        }
                    }
                    records.push((rank, record));
                }
                Err(_) => other.push(format!("[{rank}] {line}")),
            },
        }
        if acquired == PES {
            stop.store(true, Ordering::Release);
        }
        if let (Some(id), true, false) = (&plane_id, hello_sent, released_gate) {
            // Phase C: rank 1 has presented itself; now the duplicate and the strangers queue
            // behind it, and only then does root rank 0 start serving.
            let secret = secret_of(id);
            if strangers > 0 {
                let duplicate = hello(&secret, 1, PES);
                let mut bytes = Vec::new();
                write_frame(&mut bytes, Kind::Hello, 0, &[&duplicate])?;
                let stream = connect_and_send(id.endpoint(), &bytes).context("duplicate claim")?;
                at_plane.push((None, stream));
                for i in 0..plane_strangers {
                    let kind = Stranger::ALL[i % Stranger::ALL.len()];
                    if let Some(stream) = connect_and_send(id.endpoint(), &kind.bytes(&secret, PES))
                    {
                        at_plane.push((Some(kind), stream));
                    }
                }
            }
            if let Some(mut stdin) = root_stdin.take() {
                writeln!(stdin, "go")?;
            }
            released_gate = true;
        }
    }
    stop.store(true, Ordering::Release);
    let (during_world, during_runtime, during) = flood.join().unwrap_or_default();
    let elapsed = started.elapsed();

    let mut problems = Vec::new();
    if hung {
        report.hang = true;
        problems.push(format!(
            "hang: the job was killed after {:.0} s",
            elapsed.as_secs_f64()
        ));
    }
    for (rank, status) in statuses.iter().enumerate() {
        if !status.is_some_and(|s| s.success()) {
            problems.push(format!("rank {rank} ended with {status:?}"));
        }
    }
    for (kind, mut stream) in queued
        .into_iter()
        .map(|(k, s)| (Some(k), s))
        .chain(at_plane)
    {
        let expected = match kind {
            Some(kind) => kind.expected_refusal(),
            None => Some("duplicate rank"),
        };
        let name = kind.map_or("duplicate rank 1".to_string(), |k| format!("{k:?}"));
        match (reply(&mut stream), expected) {
            (Ok(None), None) => {}
            (Ok(Some(message)), Some(needle)) if message.contains(needle) => {}
            (got, expected) => {
                problems.push(format!("{name}: got {got:?}, expected {expected:?}"));
            }
        }
    }
    drop(during);
    let (rss, hwm) = records
        .iter()
        .find_map(|(rank, r)| match r {
            Record::Resources {
                rss_kib, hwm_kib, ..
            } if *rank == 0 => Some((*rss_kib, *hwm_kib)),
            _ => None,
        })
        .unwrap_or((0, 0));
    for rank in 0..PES {
        match records.iter().find_map(|(r, record)| match record {
            Record::Resources { leaks, .. } if *r == rank => Some(leaks),
            _ => None,
        }) {
            Some(leaks) if leaks.is_empty() => {}
            Some(leaks) => {
                report.leak = true;
                problems.push(format!("rank {rank}: leaked {}", describe_leaks(leaks)));
            }
            None => problems.push(format!("rank {rank}: did not report its resources")),
        }
    }
    let after_view = SystemView::take(&tag, &tmpdir);
    let (left, _) = after_view.compare(&before_view);
    let _ = std::fs::remove_dir(&tmpdir);
    if !left.is_empty() {
        report.leak = true;
        problems.push(format!("left behind: {}", left.join(", ")));
    }
    if !problems.is_empty() {
        let mut output = String::new();
        for (rank, record) in &records {
            output.push_str(&format!("  [{rank}] {}\n", serde_json::to_string(record)?));
        }
        for line in &other {
            output.push_str(&format!("  {line}\n"));
        }
        for problem in problems {
            report.problems.push(format!("{label} job: {problem}"));
        }
        report
            .problems
            .push(format!("{label} job output:\n{output}"));
    }
    Ok(Some(AbuseJob {
        before: strangers,
        during_world,
        during_runtime,
        plane: if strangers > 0 {
            plane_strangers + 1
        } else {
            0
        },
        rank0_rss_kib: rss,
        rank0_hwm_kib: hwm,
        elapsed_s: elapsed.as_secs_f64(),
    }))
}

fn deadline_drain(inbox: &mpsc::Receiver<Event>, statuses: &mut [Option<ExitStatus>]) {
    while let Ok(event) = inbox.recv_timeout(Duration::from_secs(10)) {
        if let Event::Exited(rank, status) = event {
            statuses[rank] = status.ok();
        }
    }
}

/// Connects up to `count` strangers to the world endpoint and `count` to the runtime's
/// bootstrap endpoint (which listens only while `acquire` rendezvouses) until `stop`.
/// Returns (at the world endpoint, at the runtime endpoint, the streams — kept open until the
/// driver has read the PEs' reports).
fn flood(
    world: SocketAddr,
    runtime: SocketAddr,
    secret: [u8; SECRET_LEN],
    count: usize,
    stop: &AtomicBool,
) -> (usize, usize, Vec<TcpStream>) {
    let mut streams = Vec::new();
    let (mut at_world, mut at_runtime) = (0, 0);
    let mut i = 0;
    while !stop.load(Ordering::Acquire) && (at_world < count || at_runtime < count) {
        let kind = Stranger::ALL[i % Stranger::ALL.len()];
        i += 1;
        let mut connected = false;
        if at_world < count {
            if let Some(stream) = connect_and_send(world, &kind.bytes(&secret, PES)) {
                streams.push(stream);
                at_world += 1;
                connected = true;
            }
        }
        if at_runtime < count {
            // Refused until rank 0 listens there, and again after the rendezvous.
            if let Some(stream) = connect_and_send(runtime, &kind.bytes(&[0; SECRET_LEN], PES)) {
                streams.push(stream);
                at_runtime += 1;
                connected = true;
            }
        }
        if !connected {
            // Nobody listens (yet, or any more): pace the attempts so the attack does not take
            // a core from the PEs on this two-core machine. Pacing, not synchronisation.
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    (at_world, at_runtime, streams)
}
