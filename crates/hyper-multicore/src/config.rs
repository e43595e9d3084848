//! Every environment variable the runtime reads, its default and its error, in one table.
//!
//! [`VARIABLES`] is the single source of truth: the parser below reads exactly these names, and
//! `docs/configuration.md` lists the same rows. Invalid values are errors naming the variable —
//! never a silent fallback.
//!
//! ```
//! use hyper_multicore::config::Config;
//! let config = Config::from_lookup(|name| match name {
//!     "HYPER_MULTICORE_SHMEM_HEAP_SIZE" => Some("256M".to_string()),
//!     _ => None,
//! })
//! .unwrap();
//! assert_eq!(config.heap_size, 256 << 20);
//! ```

use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs, UdpSocket};
use std::time::Duration;

use crate::error::{Error, ErrorKind, Result};

/// One environment variable: its name, default and meaning.
#[derive(Debug, Clone, Copy)]
pub struct Variable {
    /// The variable's name.
    pub name: &'static str,
    /// The default when unset, as text.
    pub default: &'static str,
    /// What it controls and which values it accepts.
    pub meaning: &'static str,
}

/// Heap size per PE in bytes.
pub const HEAP_SIZE: &str = "HYPER_MULTICORE_SHMEM_HEAP_SIZE";
/// Deadline of every blocking wait, in seconds.
pub const TIMEOUT_SEC: &str = "HYPER_MULTICORE_SHMEM_TIMEOUT_SEC";
/// How long a host may be silent before its PEs are declared lost, in seconds, or `off`.
pub const PEER_TIMEOUT_SEC: &str = "HYPER_MULTICORE_SHMEM_PEER_TIMEOUT_SEC";
/// Address root rank 0 listens on for the bootstrap.
pub const BOOTSTRAP_ENDPOINT: &str = "HYPER_MULTICORE_SHMEM_BOOTSTRAP_ENDPOINT";
/// Log level of the runtime's tracing output.
pub const LOG_LEVEL: &str = "HYPER_MULTICORE_SHMEM_LOG_LEVEL";
/// The control plane's rendezvous secret where no private channel distributes one (torchrun):
/// 32 hex digits, or the path of a file holding them.
pub const SECRET: &str = "HYPER_MULTICORE_SHMEM_SECRET";
/// How PEs reach each other's heaps: `auto`, `shm` or `ucx` (see [`TransportMode`]).
pub const TRANSPORT: &str = "HYPER_MULTICORE_SHMEM_TRANSPORT";
/// The `ucp` library the UCX transport loads when a job first takes the UCX route (default
/// `libucp.so.0`, found by the dynamic loader): a path to use a UCX installed elsewhere.
pub const UCX_LIBRARY: &str = "HYPER_MULTICORE_UCX_LIBRARY";
/// This process's rank in the world (set by hmrun).
pub const RANK: &str = "HYPER_MULTICORE_RANK";
/// Number of processes in the world (set by hmrun).
pub const WORLD_SIZE: &str = "HYPER_MULTICORE_WORLD_SIZE";
/// This process's rank among the processes on its host (set by hmrun).
pub const LOCAL_RANK: &str = "HYPER_MULTICORE_LOCAL_RANK";
/// The world's unique ID in printable form (set by hmrun).
pub const WORLD_ID: &str = "HYPER_MULTICORE_WORLD_ID";
/// The inherited listening socket of world rank 0 (set by hmrun for rank 0 only).
pub const WORLD_LISTEN_FD: &str = "HYPER_MULTICORE_WORLD_LISTEN_FD";

/// Default heap size per PE: 1 GiB.
pub const DEFAULT_HEAP_SIZE: u64 = 1 << 30;
/// Default deadline of blocking waits: 120 s.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

/// Default liveness deadline: a host silent for 5 s is lost.
pub const DEFAULT_PEER_TIMEOUT: Duration = Duration::from_secs(5);

/// Every variable the runtime reads.
pub const VARIABLES: &[Variable] = &[
    Variable {
        name: HEAP_SIZE,
        default: "1G",
        meaning: "symmetric heap bytes per PE when no size is passed; a positive integer with an \
                  optional binary suffix K, M, G, T (KiB/MiB/GiB/TiB also accepted)",
    },
    Variable {
        name: TIMEOUT_SEC,
        default: "120",
        meaning: "deadline in seconds of every blocking wait (rendezvous, collectives, barriers, \
                  signal waits); a positive number, fractions allowed",
    },
    Variable {
        name: PEER_TIMEOUT_SEC,
        default: "5",
        meaning: "how long a PE's control-plane connection may stay silent before its host is \
                  declared lost (heartbeats every fifth of it, sent by the runtime's own \
                  threads, keep a busy PE alive); a positive number of seconds, fractions \
                  allowed, or off (no liveness: a vanished host is noticed only at the timeout)",
    },
    Variable {
        name: BOOTSTRAP_ENDPOINT,
        default: "tcp://127.0.0.1:0",
        meaning: "where root rank 0 listens for the rendezvous, as tcp://host:port; port 0 picks \
                  an ephemeral port",
    },
    Variable {
        name: LOG_LEVEL,
        default: "warn",
        meaning: "runtime log level: off, error, warn, info, debug or trace",
    },
    Variable {
        name: SECRET,
        default: "(unset: under torchrun the secret is derived from public launch values, with a \
                  warning)",
        meaning: "the world control plane's rendezvous secret under torchrun: 32 hex digits \
                  (128 bits), or the path of a file holding them; give every rank the same value \
                  (e.g. `export HYPER_MULTICORE_SHMEM_SECRET=$(openssl rand -hex 16)` on the \
                  launching host); the Python front under torch.distributed sets it itself",
    },
    Variable {
        name: TRANSPORT,
        default: "auto",
        meaning: "how PEs reach each other's heaps: auto (shared memory between the PEs of one \
                  host, UCX across hosts), shm (shared memory only: every PE of a root must be \
                  on one host) or ucx (every pair through UCX, also on one host: tests the \
                  remote path on one machine); every rank of a root must use the same value",
    },
    Variable {
        name: RANK,
        default: "(unset: standalone or torchrun's RANK)",
        meaning: "world rank of this process; set by hmrun",
    },
    Variable {
        name: WORLD_SIZE,
        default: "(unset: standalone or torchrun's WORLD_SIZE)",
        meaning: "number of processes in the world; set by hmrun",
    },
    Variable {
        name: LOCAL_RANK,
        default: "(unset: the world rank)",
        meaning: "rank of this process among those on its host; set by hmrun",
    },
    Variable {
        name: WORLD_ID,
        default: "(unset)",
        meaning: "printable unique ID of the world's control plane; set by hmrun",
    },
    Variable {
        name: WORLD_LISTEN_FD,
        default: "(unset)",
        meaning: "file descriptor of the listening socket hmrun hands to world rank 0; internal",
    },
];

/// Log levels accepted by [`LOG_LEVEL`].
pub const LOG_LEVELS: &[&str] = &["off", "error", "warn", "info", "debug", "trace"];

/// How PEs reach each other's heaps ([`TRANSPORT`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum TransportMode {
    /// Shared memory between the PEs of one host, UCX across hosts.
    #[default]
    Auto,
    /// Shared memory only: every PE of a root must be on one host.
    Shm,
    /// Every pair of PEs through UCX, also on one host (each PE its own locality group).
    Ucx,
}

impl TransportMode {
    /// Every mode, in the order of [`TransportMode::name`]'s values.
    pub const ALL: [TransportMode; 3] =
        [TransportMode::Auto, TransportMode::Shm, TransportMode::Ucx];

    /// The value of [`TRANSPORT`] that selects this mode.
    pub fn name(self) -> &'static str {
        match self {
            TransportMode::Auto => "auto",
            TransportMode::Shm => "shm",
            TransportMode::Ucx => "ucx",
        }
    }
}

/// Parses a value of [`TRANSPORT`] (`auto`, `shm` or `ucx`, any case).
pub fn parse_transport(text: &str) -> std::result::Result<TransportMode, String> {
    let wanted = text.trim().to_ascii_lowercase();
    TransportMode::ALL
        .into_iter()
        .find(|mode| mode.name() == wanted)
        .ok_or_else(|| "expected auto, shm or ucx".to_string())
}

/// The effective configuration of this process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Heap bytes per PE used when no explicit size is given.
    pub heap_size: u64,
    /// Deadline of every blocking wait.
    pub timeout: Duration,
    /// How long a peer's connection may be silent before it is declared lost; `None`: liveness
    /// is off.
    pub peer_timeout: Option<Duration>,
    /// Where root rank 0 listens; `None` means loopback with an ephemeral port.
    pub bootstrap_endpoint: Option<SocketAddr>,
    /// Log level name, one of [`LOG_LEVELS`].
    pub log_level: String,
    /// The address of this host that PEs on other hosts reach: where unique IDs created here
    /// listen when no bootstrap endpoint is set. `None` (a one-host job) means loopback. Found
    /// from `MASTER_ADDR` when it names another host or a non-loopback address of this one: the
    /// address of the interface that routes to it.
    pub host_address: Option<IpAddr>,
    /// How PEs reach each other's heaps.
    pub transport: TransportMode,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            heap_size: DEFAULT_HEAP_SIZE,
            timeout: DEFAULT_TIMEOUT,
            peer_timeout: Some(DEFAULT_PEER_TIMEOUT),
            bootstrap_endpoint: None,
            log_level: "warn".to_string(),
            host_address: None,
            transport: TransportMode::Auto,
        }
    }
}

impl Config {
    /// Reads the configuration from the process environment.
    pub fn from_env() -> Result<Config> {
        Config::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads the configuration through `lookup` (a stand-in for the environment).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Config> {
        let mut config = Config::default();
        if let Some(text) = lookup(HEAP_SIZE) {
            config.heap_size =
                parse_size(&text).map_err(|why| invalid_variable(HEAP_SIZE, &text, &why))?;
        }
        if let Some(text) = lookup(TIMEOUT_SEC) {
            config.timeout =
                parse_seconds(&text).map_err(|why| invalid_variable(TIMEOUT_SEC, &text, &why))?;
        }
        config.peer_timeout = peer_timeout_from_lookup(&lookup)?;
        if let Some(text) = lookup(BOOTSTRAP_ENDPOINT) {
            config.bootstrap_endpoint = Some(
                parse_endpoint(&text)
                    .map_err(|why| invalid_variable(BOOTSTRAP_ENDPOINT, &text, &why))?,
            );
        }
        if let Some(text) = lookup(LOG_LEVEL) {
            let level = text.trim().to_ascii_lowercase();
            if !LOG_LEVELS.contains(&level.as_str()) {
                let why = format!("expected one of {}", LOG_LEVELS.join(", "));
                return Err(invalid_variable(LOG_LEVEL, &text, &why));
            }
            config.log_level = level;
        }
        if let Some(text) = lookup(TRANSPORT) {
            config.transport =
                parse_transport(&text).map_err(|why| invalid_variable(TRANSPORT, &text, &why))?;
        }
        if config.bootstrap_endpoint.is_none() {
            if let Some(master) = lookup("MASTER_ADDR") {
                config.host_address = address_towards(&master)
                    .map_err(|why| invalid_variable("MASTER_ADDR", &master, &why))?;
            }
        }
        Ok(config)
    }
}

fn invalid_variable(name: &str, value: &str, why: &str) -> Error {
    Error::new(
        ErrorKind::InvalidConfig,
        "read configuration",
        format!("{name}={value:?} is invalid: {why}; fix or unset {name}"),
    )
}

/// Parses a byte size such as `4096`, `64K`, `256M`, `1GiB` (binary multiples).
pub fn parse_size(text: &str) -> std::result::Result<u64, String> {
    let trimmed = text.trim();
    let digits_end = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (digits, suffix) = trimmed.split_at(digits_end);
    if digits.is_empty() {
        return Err("expected a positive integer of bytes, optionally with K, M, G or T".into());
    }
    let shift = match suffix.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        other => return Err(format!("unknown size suffix {other:?}; use K, M, G or T")),
    };
    let value: u64 = digits
        .parse()
        .map_err(|_| "the number does not fit in 64 bits".to_string())?;
    if value == 0 {
        return Err("the size must be positive".into());
    }
    value
        .checked_mul(1u64 << shift)
        .ok_or_else(|| "the size does not fit in 64 bits".to_string())
}

/// Parses a positive number of seconds such as `120` or `0.5`.
pub fn parse_seconds(text: &str) -> std::result::Result<Duration, String> {
    let value: f64 = text
        .trim()
        .parse()
        .map_err(|_| "expected a positive number of seconds".to_string())?;
    if !value.is_finite() || value <= 0.0 {
        return Err("the timeout must be a positive, finite number of seconds".into());
    }
    Duration::try_from_secs_f64(value).map_err(|_| "the timeout is too large".to_string())
}

/// Reads [`PEER_TIMEOUT_SEC`] from the process environment (the control plane reads it when it
/// connects): the default when unset, `None` for `off`, else an error naming the variable.
pub fn peer_timeout_from_env() -> Result<Option<Duration>> {
    peer_timeout_from_lookup(|name| std::env::var(name).ok())
}

fn peer_timeout_from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Option<Duration>> {
    match lookup(PEER_TIMEOUT_SEC) {
        None => Ok(Some(DEFAULT_PEER_TIMEOUT)),
        Some(text) => {
            parse_peer_timeout(&text).map_err(|why| invalid_variable(PEER_TIMEOUT_SEC, &text, &why))
        }
    }
}

/// Parses a value of [`PEER_TIMEOUT_SEC`]: a positive number of seconds, or `off` (`None`).
pub fn parse_peer_timeout(text: &str) -> std::result::Result<Option<Duration>, String> {
    if text.trim().eq_ignore_ascii_case("off") {
        return Ok(None);
    }
    parse_seconds(text)
        .map(Some)
        .map_err(|why| format!("{why}, or off"))
}

/// Parses `tcp://host:port` into a socket address (host names are resolved).
pub fn parse_endpoint(text: &str) -> std::result::Result<SocketAddr, String> {
    let rest = text
        .trim()
        .strip_prefix("tcp://")
        .ok_or_else(|| "expected tcp://host:port".to_string())?;
    let host_port = rest.trim_end_matches('/');
    if let Ok(address) = host_port.parse::<SocketAddr>() {
        return Ok(address);
    }
    host_port
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {host_port:?}: {e}"))?
        .next()
        .ok_or_else(|| format!("{host_port:?} resolves to no address"))
}

/// Bytes of the job secret (the unique ID's, [`SECRET`]'s 32 hex digits).
pub const SECRET_LEN: usize = 16;

/// Reads [`SECRET`]: `Ok(None)` when unset; the secret when it holds 32 hex digits or names a
/// file holding them; else an error naming the variable.
pub fn secret_from_lookup(
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<Option<[u8; SECRET_LEN]>> {
    let Some(text) = lookup(SECRET) else {
        return Ok(None);
    };
    let text = text.trim();
    if let Some(secret) = parse_secret(text) {
        return Ok(Some(secret));
    }
    let content = std::fs::read_to_string(text).map_err(|e| {
        invalid_variable(
            SECRET,
            "(hidden)",
            &format!("it is neither 32 hex digits nor a readable file ({e})"),
        )
    })?;
    parse_secret(content.trim()).map(Some).ok_or_else(|| {
        invalid_variable(
            SECRET,
            text,
            "the file does not hold 32 hex digits (128 bits)",
        )
    })
}

fn parse_secret(text: &str) -> Option<[u8; SECRET_LEN]> {
    let mut secret = [0u8; SECRET_LEN];
    if text.len() != 2 * secret.len() || !text.is_ascii() {
        return None;
    }
    for (byte, pair) in secret.iter_mut().zip(text.as_bytes().chunks(2)) {
        *byte = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
    }
    Some(secret)
}

/// The address of this host's interface that routes to `host` (a name or an address), or
/// `None` when `host` is a loopback address (a one-host job).
fn address_towards(host: &str) -> std::result::Result<Option<IpAddr>, String> {
    let target = (host.trim(), 9)
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve it: {e}"))?
        .next()
        .ok_or_else(|| "it resolves to no address".to_string())?;
    if target.ip().is_loopback() {
        return Ok(None);
    }
    let unspecified = match target {
        SocketAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        SocketAddr::V6(_) => IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
    };
    // Connecting a datagram socket sends nothing; it only asks the kernel for the route.
    let socket = UdpSocket::bind((unspecified, 0))
        .and_then(|socket| socket.connect(target).map(|()| socket))
        .and_then(|socket| socket.local_addr())
        .map_err(|e| format!("no route to {target}: {e}"))?;
    Ok(Some(socket.ip()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config_with(name: &'static str, value: &str) -> Result<Config> {
        let value = value.to_string();
        Config::from_lookup(move |n| (n == name).then(|| value.clone()))
    }

    #[test]
    fn sizes_accept_binary_suffixes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("256M"), Ok(256 << 20));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size(" 2g "), Ok(2 << 30));
    }

    #[test]
    fn bad_sizes_name_the_variable() {
        for bad in [
            "0",
            "-1",
            "12Q",
            "",
            "M",
            "99999999999999999999",
            "20000000T",
        ] {
            let err = config_with(HEAP_SIZE, bad).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidConfig);
            assert!(err.to_string().contains(HEAP_SIZE), "{err}");
        }
    }

    #[test]
    fn timeouts_must_be_positive_numbers() {
        assert_eq!(
            config_with(TIMEOUT_SEC, "0.5").unwrap().timeout,
            Duration::from_millis(500)
        );
        for bad in ["0", "-3", "soon", "inf", "NaN"] {
            let err = config_with(TIMEOUT_SEC, bad).unwrap_err();
            assert!(err.to_string().contains(TIMEOUT_SEC), "{err}");
        }
    }

    #[test]
    fn peer_timeouts_are_positive_numbers_or_off() {
        assert_eq!(Config::default().peer_timeout, Some(DEFAULT_PEER_TIMEOUT));
        assert_eq!(
            config_with(PEER_TIMEOUT_SEC, "2.5").unwrap().peer_timeout,
            Some(Duration::from_millis(2500))
        );
        assert_eq!(
            config_with(PEER_TIMEOUT_SEC, "OFF").unwrap().peer_timeout,
            None
        );
        for bad in ["0", "-1", "never", "inf"] {
            let err = config_with(PEER_TIMEOUT_SEC, bad).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidConfig);
            assert!(err.to_string().contains(PEER_TIMEOUT_SEC), "{err}");
        }
    }

    #[test]
    fn endpoints_need_the_tcp_scheme() {
        let config = config_with(BOOTSTRAP_ENDPOINT, "tcp://127.0.0.1:5000").unwrap();
        assert_eq!(
            config.bootstrap_endpoint,
            Some("127.0.0.1:5000".parse().unwrap())
        );
        assert!(config_with(BOOTSTRAP_ENDPOINT, "127.0.0.1:5000").is_err());
        assert!(config_with(BOOTSTRAP_ENDPOINT, "tcp://127.0.0.1").is_err());
    }

    #[test]
    fn log_levels_are_checked() {
        assert_eq!(config_with(LOG_LEVEL, "DEBUG").unwrap().log_level, "debug");
        assert!(config_with(LOG_LEVEL, "loud").is_err());
    }

    #[test]
    fn transports_are_auto_shm_or_ucx() {
        assert_eq!(Config::default().transport, TransportMode::Auto);
        for (text, mode) in [
            ("auto", TransportMode::Auto),
            ("shm", TransportMode::Shm),
            (" UCX ", TransportMode::Ucx),
        ] {
            assert_eq!(config_with(TRANSPORT, text).unwrap().transport, mode);
        }
        for bad in ["", "tcp", "shm,ucx", "rdma"] {
            let err = config_with(TRANSPORT, bad).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidConfig);
            assert!(err.to_string().contains(TRANSPORT), "{err}");
            assert!(err.to_string().contains("auto, shm or ucx"), "{err}");
        }
    }

    #[test]
    fn the_configuration_page_lists_every_variable() {
        let page = include_str!("../../../docs/configuration.md");
        for variable in VARIABLES {
            assert!(
                page.contains(variable.name),
                "docs/configuration.md misses {}",
                variable.name
            );
        }
    }

    #[test]
    fn secrets_are_hex_or_a_file_of_hex() {
        let hex = "00112233445566778899aabbccddeeff";
        let expected: [u8; 16] = std::array::from_fn(|i| (i as u8) * 0x11);
        let lookup = |value: String| move |n: &str| (n == SECRET).then(|| value.clone());
        assert_eq!(secret_from_lookup(|_| None).unwrap(), None);
        assert_eq!(
            secret_from_lookup(lookup(hex.into())).unwrap(),
            Some(expected)
        );
        let file = std::env::temp_dir().join(format!("hm-secret-{}", std::process::id()));
        std::fs::write(&file, format!("{hex}\n")).unwrap();
        let from_file = secret_from_lookup(lookup(file.display().to_string()));
        std::fs::write(&file, "not hex").unwrap();
        let bad_file = secret_from_lookup(lookup(file.display().to_string()));
        std::fs::remove_file(&file).unwrap();
        assert_eq!(from_file.unwrap(), Some(expected));
        for bad in [bad_file, secret_from_lookup(lookup("0011".into()))] {
            let error = bad.unwrap_err();
            assert_eq!(error.kind(), ErrorKind::InvalidConfig);
            assert!(error.to_string().contains(SECRET), "{error}");
        }
    }

    #[test]
    fn the_host_address_is_the_interface_towards_the_master() {
        assert_eq!(
            config_with("MASTER_ADDR", "127.0.0.1")
                .unwrap()
                .host_address,
            None
        );
        assert_eq!(
            config_with("MASTER_ADDR", "localhost")
                .unwrap()
                .host_address,
            None
        );
        // An address of this host routes to itself.
        let own = std::net::UdpSocket::bind("0.0.0.0:0")
            .and_then(|s| s.connect("198.18.0.1:9").map(|()| s))
            .and_then(|s| s.local_addr())
            .map(|a| a.ip());
        if let Ok(own) = own {
            let config = config_with("MASTER_ADDR", &own.to_string()).unwrap();
            assert_eq!(config.host_address, Some(own));
        }
        let error = config_with("MASTER_ADDR", "no-such-host.invalid").unwrap_err();
        assert!(error.to_string().contains("MASTER_ADDR"), "{error}");
    }

    #[test]
    fn defaults_apply_when_unset() {
        assert_eq!(Config::from_lookup(|_| None).unwrap(), Config::default());
    }
}
