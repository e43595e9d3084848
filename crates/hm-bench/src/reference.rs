//! References measured in the same run as the benchmarks they are compared with.
//!
//! The control plane is a TCP star through root rank 0, so its floor is a TCP round trip on
//! loopback: a barrier needs at least one (member → root → member). [`tcp_loopback_round_trip`]
//! ping-pongs 8 bytes between two threads of the driver over a `TcpStream` with `TCP_NODELAY`,
//! timed with the same method as the operations it is compared with.
//!
//! The two threads are pinned: across two CPUs for the reference the ratios are taken against,
//! and both on one CPU for context. Unpinned, the result is bimodal: a round trip between
//! threads that share a core is a context switch, one across cores also an inter-processor
//! interrupt to wake the other, so ratios against an unpinned reference would jump between the
//! two from run to run (the report shows both placements). The PEs themselves are not pinned, so a collective between PEs that happen to share
//! a core can beat the cross-CPU round trip.
//!
//! ```ignore
//! let round_trip = reference::tcp_loopback_round_trip(&Method::new(false), Placement::CrossCpu)?;
//! println!("{}: {} ns", round_trip.name, round_trip.timing.per_op.median_ns);
//! ```

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use rustix::thread::{sched_getaffinity, sched_setaffinity, CpuSet};

use crate::stats::{time_batches, Method, Timing};

/// Bytes sent each way per round trip.
pub const PING_BYTES: usize = 8;

/// Longest either thread waits for the other's bytes before giving up.
const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// A reference measurement and what it is.
#[derive(Debug)]
pub struct Reference {
    /// What was measured, for reports (e.g. which CPUs).
    pub name: String,
    /// Its timing.
    pub timing: Timing,
}

/// Where the two threads of a round trip run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// On the first two CPUs this process may use (unpinned if it may use only one).
    CrossCpu,
    /// Both on the first CPU this process may use.
    SameCpu,
}

/// Times a ping-pong of [`PING_BYTES`] over loopback TCP between two threads placed as asked.
pub fn tcp_loopback_round_trip(method: &Method, placement: Placement) -> Result<Reference> {
    const WHAT: &str = "tcp loopback reference";
    let cpus = pinning(placement).context(WHAT)?;
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).context(WHAT)?;
    let mut client = TcpStream::connect(listener.local_addr().context(WHAT)?).context(WHAT)?;
    // The connection is already queued, so this accept does not wait.
    let (mut server, _) = listener.accept().context(WHAT)?;
    for stream in [&client, &server] {
        stream.set_nodelay(true).context(WHAT)?;
        stream.set_read_timeout(Some(IO_TIMEOUT)).context(WHAT)?;
        stream.set_write_timeout(Some(IO_TIMEOUT)).context(WHAT)?;
    }
    let echo = std::thread::spawn(move || -> Result<()> {
        pin_this_thread(cpus.map(|[_, echo]| echo))?;
        let mut buffer = [0u8; PING_BYTES];
        // Ends when the pinger hangs up (or after IO_TIMEOUT of silence).
        while server.read_exact(&mut buffer).is_ok() && server.write_all(&buffer).is_ok() {}
        Ok(())
    });
    let method = *method;
    let pinger = std::thread::spawn(move || -> Result<Timing> {
        pin_this_thread(cpus.map(|[pinger, _]| pinger))?;
        let mut buffer = [0u8; PING_BYTES];
        time_batches(&method, |ops| {
            let start = Instant::now();
            for _ in 0..ops {
                client.write_all(&buffer)?;
                client.read_exact(&mut buffer)?;
            }
            Ok(start.elapsed())
        })
        // Returning drops `client`: the echo thread sees the hang-up and ends.
    });
    let timing = pinger
        .join()
        .map_err(|_| anyhow!("the pinger thread of the {WHAT} panicked"))?
        .context(WHAT)?;
    echo.join()
        .map_err(|_| anyhow!("the echo thread of the {WHAT} panicked"))?
        .context(WHAT)?;
    let name = match cpus {
        Some([a, b]) if a == b => format!("tcp loopback round trip, both threads on cpu {a}"),
        Some([a, b]) => format!("tcp loopback round trip, threads on cpus {a} and {b}"),
        None => "tcp loopback round trip, unpinned on one cpu".to_string(),
    };
    Ok(Reference { name, timing })
}

/// The CPUs of the pinger and the echo thread for `placement`; `None` leaves them unpinned.
fn pinning(placement: Placement) -> Result<Option<[usize; 2]>> {
    let allowed = sched_getaffinity(None).context("read the CPU affinity")?;
    let mut cpus = (0..CpuSet::MAX_CPU).filter(|&cpu| allowed.is_set(cpu));
    let first = cpus.next();
    Ok(match placement {
        Placement::CrossCpu => first.zip(cpus.next()).map(|(a, b)| [a, b]),
        Placement::SameCpu => first.map(|a| [a, a]),
    })
}

/// Pins the calling thread to `cpu` (does nothing for `None`).
fn pin_this_thread(cpu: Option<usize>) -> Result<()> {
    if let Some(cpu) = cpu {
        let mut set = CpuSet::new();
        set.set(cpu);
        sched_setaffinity(None, &set).with_context(|| format!("pin a thread to cpu {cpu}"))?;
    }
    Ok(())
}
