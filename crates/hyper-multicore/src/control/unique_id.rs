//! The unique ID: what root rank 0 hands to the other members so they can find it and prove they
//! belong to the same job — protocol version, endpoint and a 128-bit random secret.
//!
//! The printable form is lower-case hex, so it can travel in an environment variable:
//!
//! ```
//! use hyper_multicore::control::UniqueId;
//! let id = UniqueId::new("127.0.0.1:4000".parse().unwrap(), [7; 16]);
//! let text = id.to_string();
//! assert_eq!(text.parse::<UniqueId>().unwrap(), id);
//! assert_eq!(UniqueId::from_bytes(&id.to_bytes()).unwrap(), id);
//! ```

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener};
use std::str::FromStr;

use crate::config::Config;
use crate::error::{Error, ErrorKind, Result};

/// Version of the control-plane protocol carried in every unique ID and frame.
pub const PROTOCOL_VERSION: u8 = 3;

pub use crate::config::SECRET_LEN;

/// Identifies one rendezvous: where root rank 0 listens and the secret members must present.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct UniqueId {
    endpoint: SocketAddr,
    secret: [u8; SECRET_LEN],
}

impl fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The secret stays out of logs.
        f.debug_struct("UniqueId")
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

impl UniqueId {
    /// A unique ID for `endpoint` with the given secret.
    pub fn new(endpoint: SocketAddr, secret: [u8; SECRET_LEN]) -> Self {
        UniqueId { endpoint, secret }
    }

    /// Creates a fresh unique ID with a random secret and binds its listener (root rank 0 only).
    ///
    /// The endpoint is `config.bootstrap_endpoint`, else this host's address for other hosts
    /// (`config.host_address`; loopback in a one-host job) with an ephemeral port. The
    /// returned listener must be passed to [`crate::control::ControlPlane::connect`] on rank 0.
    pub fn create(config: &Config) -> Result<(UniqueId, BootstrapListener)> {
        let host = config
            .host_address
            .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
        let requested = config
            .bootstrap_endpoint
            .unwrap_or(SocketAddr::new(host, 0));
        let listener = bind_listener(requested).map_err(|e| {
            Error::backend(
                "create unique id",
                &format!(
                    "cannot listen on {requested} (set {} to a free local tcp://host:port)",
                    crate::config::BOOTSTRAP_ENDPOINT
                ),
                e,
            )
        })?;
        let mut endpoint = listener
            .local_addr()
            .map_err(|e| Error::backend("create unique id", "cannot read the bound address", e))?;
        if endpoint.ip().is_unspecified() {
            endpoint.set_ip(IpAddr::V4(Ipv4Addr::LOCALHOST));
        }
        let id = UniqueId::new(endpoint, random_secret()?);
        // A fresh random secret only travels over already authenticated channels: no need to
        // read the kernel's socket tables (milliseconds) for every member of every lifetime.
        let verify_owner = false;
        Ok((
            id.clone(),
            BootstrapListener {
                listener,
                id,
                verify_owner,
            },
        ))
    }

    /// Where root rank 0 listens.
    pub fn endpoint(&self) -> SocketAddr {
        self.endpoint
    }

    pub(crate) fn secret(&self) -> &[u8; SECRET_LEN] {
        &self.secret
    }

    /// The opaque byte form: version, address family, address, port, secret.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut bytes = vec![PROTOCOL_VERSION];
        match self.endpoint.ip() {
            IpAddr::V4(ip) => {
                bytes.push(4);
                bytes.extend_from_slice(&ip.octets());
            }
            IpAddr::V6(ip) => {
                bytes.push(6);
                bytes.extend_from_slice(&ip.octets());
            }
        }
        bytes.extend_from_slice(&self.endpoint.port().to_be_bytes());
        bytes.extend_from_slice(&self.secret);
        bytes
    }

    /// Parses the byte form produced by [`UniqueId::to_bytes`].
    pub fn from_bytes(bytes: &[u8]) -> Result<UniqueId> {
        let bad = |why: String| {
            Error::new(
                ErrorKind::InvalidArgument,
                "parse unique id",
                format!("{why}; pass the unique ID exactly as root rank 0 created it"),
            )
        };
        let (&version, rest) = bytes
            .split_first()
            .ok_or_else(|| bad("bad length: the unique ID is empty".into()))?;
        if version != PROTOCOL_VERSION {
            return Err(bad(format!(
                "bad version: the unique ID has protocol version {version}, this build speaks \
                 version {PROTOCOL_VERSION} (mixing builds of hyper_multicore?)"
            )));
        }
        let (&family, rest) = rest
            .split_first()
            .ok_or_else(|| bad("bad length: the unique ID is truncated".into()))?;
        let address_len = match family {
            4 => 4,
            6 => 16,
            other => return Err(bad(format!("bad endpoint: unknown address family {other}"))),
        };
        let expected = address_len + 2 + SECRET_LEN;
        if rest.len() != expected {
            return Err(bad(format!(
                "bad length: expected {} bytes, got {}",
                expected + 2,
                bytes.len()
            )));
        }
        let (address, rest) = rest.split_at(address_len);
        let (port, secret) = rest.split_at(2);
        let ip = if family == 4 {
            IpAddr::V4(Ipv4Addr::from(
                <[u8; 4]>::try_from(address).expect("4 bytes"),
            ))
        } else {
            IpAddr::V6(Ipv6Addr::from(
                <[u8; 16]>::try_from(address).expect("16 bytes"),
            ))
        };
        let port = u16::from_be_bytes([port[0], port[1]]);
        if port == 0 || ip.is_unspecified() {
            return Err(bad(format!(
                "bad endpoint: {ip}:{port} cannot be connected to"
            )));
        }
        Ok(UniqueId::new(
            SocketAddr::new(ip, port),
            secret.try_into().expect("secret length checked"),
        ))
    }
}

impl fmt::Display for UniqueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for byte in self.to_bytes() {
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

impl FromStr for UniqueId {
    type Err = Error;

    fn from_str(text: &str) -> Result<UniqueId> {
        let text = text.trim();
        if text.len() % 2 != 0 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                "parse unique id",
                "bad encoding: a printable unique ID is an even number of hex digits",
            ));
        }
        let bytes: Vec<u8> = (0..text.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex checked"))
            .collect();
        UniqueId::from_bytes(&bytes)
    }
}

/// Root rank 0's listening socket for one unique ID, bound when the ID was created.
#[derive(Debug)]
pub struct BootstrapListener {
    pub(crate) listener: TcpListener,
    pub(crate) id: UniqueId,
    /// Whether loopback members must belong to this user (`rendezvous::check_owner`): for IDs
    /// whose secret lives outside this process (a launcher's environment, a derived or
    /// configured secret), not for fresh ones created here.
    pub(crate) verify_owner: bool,
}

impl BootstrapListener {
    /// Wraps an already bound listener (for example one inherited from a launcher) for `id`.
    ///
    /// Fails if the listener's port differs from the ID's endpoint port.
    pub fn from_listener(listener: TcpListener, id: UniqueId) -> Result<BootstrapListener> {
        let local = listener
            .local_addr()
            .map_err(|e| Error::backend("bootstrap", "cannot read the listener address", e))?;
        if local.port() != id.endpoint().port() {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                "bootstrap",
                format!(
                    "the listener is bound to {local} but the unique ID names {}",
                    id.endpoint()
                ),
            ));
        }
        Ok(BootstrapListener {
            listener,
            id,
            verify_owner: true,
        })
    }

    /// Binds a listener for an ID made elsewhere (a launcher's or a derived one) on its
    /// endpoint; on a host that does not own the endpoint's address (a name behind NAT, say), on
    /// every interface at the endpoint's port.
    pub fn bind(id: &UniqueId) -> Result<BootstrapListener> {
        let endpoint = id.endpoint();
        let listener = bind_listener(endpoint)
            .or_else(|e| match e.kind() {
                std::io::ErrorKind::AddrNotAvailable => {
                    let any = match endpoint.ip() {
                        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                        IpAddr::V6(_) => IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
                    };
                    bind_listener(SocketAddr::new(any, endpoint.port()))
                }
                _ => Err(e),
            })
            .map_err(|e| {
                Error::backend(
                    "bootstrap",
                    &format!(
                        "world rank 0 cannot listen on {endpoint} (set {} to a free \
                         tcp://host:port of rank 0's host)",
                        crate::config::BOOTSTRAP_ENDPOINT
                    ),
                    e,
                )
            })?;
        Ok(BootstrapListener {
            listener,
            id: id.clone(),
            verify_owner: true,
        })
    }

    /// The unique ID this listener serves.
    pub fn id(&self) -> &UniqueId {
        &self.id
    }
}

fn bind_listener(address: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(address),
        socket2::Type::STREAM.cloexec(),
        None,
    )?;
    if address.port() != 0 {
        socket.set_reuse_address(true)?;
    }
    socket.bind(&address.into())?;
    socket.listen(1024)?;
    Ok(socket.into())
}

/// A secret every rank derives alike from public launch values (FNV-1a, two lanes).
pub(crate) fn derived_secret(parts: &[&str]) -> [u8; SECRET_LEN] {
    let mut secret = [0u8; SECRET_LEN];
    for (lane, chunk) in secret.chunks_mut(8).enumerate() {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325 ^ (lane as u64 + 1);
        for part in parts {
            for byte in part.bytes().chain([0xff]) {
                hash ^= u64::from(byte);
                hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
            }
        }
        chunk.copy_from_slice(&hash.to_le_bytes());
    }
    secret
}

/// The secret of a world whose rendezvous secret comes from outside this process:
/// `HYPER_MULTICORE_SHMEM_SECRET` if set, else one derived from `public` (values anyone can
/// know, described by `what` in the warning this logs: the rendezvous is then unauthenticated).
pub(crate) fn world_secret(
    lookup: impl Fn(&str) -> Option<String>,
    public: &[String],
    what: &str,
) -> Result<[u8; SECRET_LEN]> {
    if let Some(secret) = crate::config::secret_from_lookup(lookup)? {
        return Ok(secret);
    }
    tracing::warn!(
        "the world's rendezvous is UNAUTHENTICATED: without {} the secret is derived from {what}, \
         which anyone can know; give every rank (every host's launcher) the same {} (32 hex \
         digits, or a file holding them)",
        crate::config::SECRET,
        crate::config::SECRET
    );
    Ok(derived_secret(
        &public.iter().map(String::as_str).collect::<Vec<_>>(),
    ))
}

/// A fresh 128-bit secret from the operating system's random source.
pub(crate) fn random_secret() -> Result<[u8; SECRET_LEN]> {
    let mut secret = [0u8; SECRET_LEN];
    getrandom::fill(&mut secret).map_err(|e| {
        Error::new(
            ErrorKind::Backend,
            "create unique id",
            format!("the OS random source failed: {e}"),
        )
    })?;
    Ok(secret)
}

/// Compares two secrets in time independent of where they differ.
pub(crate) fn secrets_match(a: &[u8; SECRET_LEN], b: &[u8; SECRET_LEN]) -> bool {
    let mut difference = 0u8;
    for (x, y) in a.iter().zip(b) {
        difference |= x ^ y;
    }
    std::hint::black_box(difference) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_v4_and_v6() {
        for endpoint in ["127.0.0.1:9", "[::1]:65535"] {
            let id = UniqueId::new(endpoint.parse().unwrap(), [0xab; 16]);
            assert_eq!(id.to_string().parse::<UniqueId>().unwrap(), id);
        }
    }

    #[test]
    fn parse_errors_say_what_is_wrong() {
        let good = UniqueId::new("127.0.0.1:9".parse().unwrap(), [1; 16]).to_bytes();
        let message = |bytes: &[u8]| UniqueId::from_bytes(bytes).unwrap_err().to_string();
        assert!(message(&[]).contains("bad length"));
        let mut wrong_version = good.clone();
        wrong_version[0] = 9;
        assert!(message(&wrong_version).contains("bad version"));
        assert!(message(&good[..good.len() - 1]).contains("bad length"));
        let mut wrong_family = good.clone();
        wrong_family[1] = 5;
        assert!(message(&wrong_family).contains("bad endpoint"));
        let zero_port = UniqueId::new("127.0.0.1:0".parse().unwrap(), [1; 16]).to_bytes();
        assert!(message(&zero_port).contains("bad endpoint"));
        assert!("xyz"
            .parse::<UniqueId>()
            .unwrap_err()
            .to_string()
            .contains("bad encoding"));
    }

    #[test]
    fn created_ids_are_fresh_and_listening() {
        let (a, listener) = UniqueId::create(&Config::default()).unwrap();
        let (b, _other) = UniqueId::create(&Config::default()).unwrap();
        assert_ne!(a.secret, b.secret);
        assert_eq!(listener.listener.local_addr().unwrap(), a.endpoint());
        assert!(!a.to_string().is_empty());
    }

    #[test]
    fn derived_secrets_depend_on_every_part() {
        assert_eq!(derived_secret(&["a", "1"]), derived_secret(&["a", "1"]));
        assert_ne!(derived_secret(&["a", "1"]), derived_secret(&["a1", ""]));
    }

    #[test]
    fn secret_comparison() {
        assert!(secrets_match(&[3; 16], &[3; 16]));
        let mut other = [3; 16];
        other[15] = 4;
        assert!(!secrets_match(&[3; 16], &other));
    }
}
