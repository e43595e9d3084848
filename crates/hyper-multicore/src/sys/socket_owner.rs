//! Which user owns the other end of a loopback TCP connection: the TCP analogue of a Unix
//! socket's `SO_PEERCRED`. Asked of the kernel's socket diagnostics (`NETLINK_SOCK_DIAG`: one
//! exact look-up of the peer socket by its addresses), or, where that is refused, read from its
//! socket tables `/proc/net/tcp` and `/proc/net/tcp6` (columns `local_address rem_address …
//! uid`). No unsafe code.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use rustix::net::sockopt::Timeout;
use rustix::net::SocketType;
use rustix::net::{netlink, recv, send, socket, sockopt, AddressFamily, RecvFlags, SendFlags};

/// What the kernel says about a connection's peer socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PeerOwner {
    /// The peer socket exists and belongs to this user id.
    Uid(u32),
    /// The kernel knows no such socket (the peer is gone, or not on this host).
    NotFound,
    /// The kernel cannot be asked here (no socket diagnostics, no `/proc`): nothing can be said.
    Unknown,
}

/// The owner of the socket whose local address is `peer` and whose remote address is `local`,
/// i.e. the other end of a connection this process holds from `local` to `peer`.
///
/// Socket diagnostics find the socket in the kernel's hash table. Reading a socket table instead
/// walks every bucket of the kernel's table, which is large on a machine with much memory, once
/// per connection of a rendezvous, so it is only the fallback,
/// and there the table of the peer's likely family is read first and the other only if the
/// socket is not there.
pub(crate) fn tcp_peer_owner(local: SocketAddr, peer: SocketAddr) -> PeerOwner {
    match diagnosed_owner(local, peer) {
        Ok(owner) => owner,
        Err(_) => table_owner(local, peer),
    }
}

/// `NETLINK_SOCK_DIAG` request type: one socket of a family.
const SOCK_DIAG_BY_FAMILY: u16 = 20;
/// Netlink message types and flags.
const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 1;
/// `IPPROTO_TCP`.
const IPPROTO_TCP: u8 = 6;
/// `INET_DIAG_NOCOOKIE`: look the socket up by its addresses alone.
const NO_COOKIE: u32 = u32::MAX;
/// How long the kernel's answer may take before the tables are read instead.
const DIAG_TIMEOUT: Duration = Duration::from_secs(1);

/// [`tcp_peer_owner`] through socket diagnostics; `Err` when they cannot be used here.
fn diagnosed_owner(local: SocketAddr, peer: SocketAddr) -> rustix::io::Result<PeerOwner> {
    let canonical = |address: SocketAddr| match address.ip() {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => (IpAddr::V4(v4), address.port()),
            None => (IpAddr::V6(v6), address.port()),
        },
        v4 => (v4, address.port()),
    };
    let (source, destination) = (canonical(peer), canonical(local));
    // The family of the peer's socket: an IPv4 peer may still have connected from an IPv6
    // socket (a v4-mapped address), so both are asked in turn.
    let families: &[(u8, bool)] = match (source.0, destination.0) {
        (IpAddr::V4(_), IpAddr::V4(_)) => &[(2, false), (10, true)],
        _ => &[(10, false)],
    };
    let fd = socket(
        AddressFamily::NETLINK,
        SocketType::DGRAM,
        Some(netlink::SOCK_DIAG),
    )?;
    sockopt::set_socket_timeout(&fd, Timeout::Recv, Some(DIAG_TIMEOUT))?;
    for (sequence, &(family, mapped)) in families.iter().enumerate() {
        let request = diag_request(family, mapped, source, destination, sequence as u32 + 1);
        send(&fd, &request, SendFlags::empty())?;
        let mut answer = [0u8; 512];
        let (length, _) = recv(&fd, &mut answer, RecvFlags::empty())?;
        let ports = (source.1, destination.1);
        match parse_diag_answer(&answer[..length.min(answer.len())], ports)? {
            Some(uid) => return Ok(PeerOwner::Uid(uid)),
            None => continue,
        }
    }
    Ok(PeerOwner::NotFound)
}

/// A `SOCK_DIAG_BY_FAMILY` request for the TCP socket of `family` (2: IPv4, 10: IPv6; with
/// `mapped`, IPv4 addresses in their v6-mapped form) from `source` to `destination`.
fn diag_request(
    family: u8,
    mapped: bool,
    source: (IpAddr, u16),
    destination: (IpAddr, u16),
    sequence: u32,
) -> Vec<u8> {
    let address = |ip: IpAddr| -> [u8; 16] {
        match (ip, mapped) {
            (IpAddr::V4(v4), false) => {
                let mut bytes = [0u8; 16];
                bytes[..4].copy_from_slice(&v4.octets());
                bytes
            }
            (IpAddr::V4(v4), true) => v4.to_ipv6_mapped().octets(),
            (IpAddr::V6(v6), _) => v6.octets(),
        }
    };
    let mut message = Vec::with_capacity(72);
    // nlmsghdr: length, type, flags, sequence, port id (0: the kernel fills it in).
    message.extend_from_slice(&72u32.to_ne_bytes());
    message.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    message.extend_from_slice(&NLM_F_REQUEST.to_ne_bytes());
    message.extend_from_slice(&sequence.to_ne_bytes());
    message.extend_from_slice(&0u32.to_ne_bytes());
    // inet_diag_req_v2: family, protocol, extensions, padding, states (all).
    message.extend_from_slice(&[family, IPPROTO_TCP, 0, 0]);
    message.extend_from_slice(&u32::MAX.to_ne_bytes());
    // inet_diag_sockid: ports (network order), addresses, interface, cookie.
    message.extend_from_slice(&source.1.to_be_bytes());
    message.extend_from_slice(&destination.1.to_be_bytes());
    message.extend_from_slice(&address(source.0));
    message.extend_from_slice(&address(destination.0));
    message.extend_from_slice(&0u32.to_ne_bytes());
    message.extend_from_slice(&NO_COOKIE.to_ne_bytes());
    message.extend_from_slice(&NO_COOKIE.to_ne_bytes());
    debug_assert_eq!(message.len(), 72);
    message
}

/// The uid in a socket-diagnostics answer about the socket with these (source, destination)
/// `ports`; `None` if the kernel knows no such socket, `Err` for an answer that says
/// diagnostics are not available, or that is not about that socket or not readable.
fn parse_diag_answer(answer: &[u8], ports: (u16, u16)) -> rustix::io::Result<Option<u32>> {
    let word = |at: usize| -> Option<u32> {
        Some(u32::from_ne_bytes(answer.get(at..at + 4)?.try_into().ok()?))
    };
    let kind = answer
        .get(4..6)
        .map(|b| u16::from_ne_bytes([b[0], b[1]]))
        .ok_or(rustix::io::Errno::PROTO)?;
    if kind == NLMSG_ERROR {
        // nlmsgerr: a negative errno after the header; ENOENT means no such socket.
        let errno = word(16).ok_or(rustix::io::Errno::PROTO)? as i32;
        return match -errno {
            0 => Err(rustix::io::Errno::PROTO),
            code if code == rustix::io::Errno::NOENT.raw_os_error() => Ok(None),
            code => Err(rustix::io::Errno::from_raw_os_error(code)),
        };
    }
    if kind != SOCK_DIAG_BY_FAMILY {
        return Err(rustix::io::Errno::PROTO);
    }
    // inet_diag_msg after the 16-byte header: family, state, timer, retransmits (4 bytes), the
    // 48-byte socket id (ports first, in network order), expires, read queue, write queue, uid,
    // inode. A live socket has an inode: a zero there means a misread answer.
    let port = |at: usize| {
        answer
            .get(at..at + 2)
            .map(|b| u16::from_be_bytes([b[0], b[1]]))
    };
    let (uid, inode) = (word(16 + 4 + 48 + 12), word(16 + 4 + 48 + 16));
    match (port(20), port(22), uid, inode) {
        (Some(source), Some(destination), Some(uid), Some(inode))
            if (source, destination) == ports && inode != 0 =>
        {
            Ok(Some(uid))
        }
        _ => Err(rustix::io::Errno::PROTO),
    }
}

/// [`tcp_peer_owner`] from the socket tables in `/proc`.
fn table_owner(local: SocketAddr, peer: SocketAddr) -> PeerOwner {
    let ipv4 = match peer.ip() {
        IpAddr::V4(_) => true,
        IpAddr::V6(v6) => v6.to_ipv4_mapped().is_some(),
    };
    let tables = match ipv4 {
        true => ["/proc/net/tcp", "/proc/net/tcp6"],
        false => ["/proc/net/tcp6", "/proc/net/tcp"],
    };
    let mut readable = false;
    for table in tables {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        readable = true;
        if let Some(uid) = find_owner(&text, peer, local) {
            return PeerOwner::Uid(uid);
        }
    }
    if readable {
        PeerOwner::NotFound
    } else {
        PeerOwner::Unknown
    }
}

/// The uid column of the row with these local and remote addresses.
fn find_owner(table: &str, local: SocketAddr, remote: SocketAddr) -> Option<u32> {
    table.lines().skip(1).find_map(|line| {
        let columns: Vec<&str> = line.split_whitespace().collect();
        let (row_local, row_remote, uid) = (columns.get(1)?, columns.get(2)?, columns.get(7)?);
        (same_address(parse_address(row_local)?, local)
            && same_address(parse_address(row_remote)?, remote))
        .then(|| uid.parse().ok())
        .flatten()
    })
}

/// Equal addresses, an IPv4 address and its IPv6-mapped form counting as equal.
fn same_address(a: SocketAddr, b: SocketAddr) -> bool {
    let canonical = |ip: IpAddr| match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    };
    a.port() == b.port() && canonical(a.ip()) == canonical(b.ip())
}

/// Parses the kernel's `HEXADDR:HEXPORT` form: the address as 32-bit words in host byte order.
fn parse_address(text: &str) -> Option<SocketAddr> {
    let (address, port) = text.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |hex: &str| u32::from_str_radix(hex, 16).ok().map(u32::to_ne_bytes);
    let ip = match address.len() {
        8 => IpAddr::V4(Ipv4Addr::from(word(address)?)),
        32 => {
            let mut bytes = [0u8; 16];
            for (chunk, hex) in bytes.chunks_mut(4).zip(address.as_bytes().chunks(8)) {
                chunk.copy_from_slice(&word(std::str::from_utf8(hex).ok()?)?);
            }
            IpAddr::V6(Ipv6Addr::from(bytes))
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both ways of asking (socket diagnostics and the tables) name this user as the owner of
    /// a live loopback connection's peer, IPv4 and IPv6, and know no socket that does not exist.
    #[test]
    fn a_live_loopback_connection_is_owned_by_this_user() {
        let uid = rustix::process::getuid().as_raw();
        for host in ["127.0.0.1:0", "[::1]:0"] {
            let Ok(listener) = std::net::TcpListener::bind(host) else {
                continue; // no IPv6 loopback here
            };
            let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
            let (server, peer) = listener.accept().unwrap();
            let local = server.local_addr().unwrap();
            assert_eq!(
                diagnosed_owner(local, peer),
                Ok(PeerOwner::Uid(uid)),
                "{host}"
            );
            assert_eq!(table_owner(local, peer), PeerOwner::Uid(uid), "{host}");
            assert_eq!(tcp_peer_owner(local, peer), PeerOwner::Uid(uid), "{host}");
            drop(client);
            let mut nobody = peer;
            nobody.set_port(1);
            assert_eq!(
                diagnosed_owner(local, nobody),
                Ok(PeerOwner::NotFound),
                "{host}"
            );
            assert_eq!(table_owner(local, nobody), PeerOwner::NotFound, "{host}");
        }
    }

    /// An IPv4 client connecting to a dual-stack listener appears as a v4-mapped peer; its
    /// own socket is an IPv4 one, and it is found.
    #[test]
    fn a_v4_client_of_a_dual_stack_listener_is_found() {
        let Ok(listener) = std::net::TcpListener::bind("[::]:0") else {
            return; // no IPv6 here
        };
        let port = listener.local_addr().unwrap().port();
        let Ok(client) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
            return; // IPV6_V6ONLY listener
        };
        let (server, peer) = listener.accept().unwrap();
        let uid = rustix::process::getuid().as_raw();
        let local = server.local_addr().unwrap();
        assert_eq!(tcp_peer_owner(local, peer), PeerOwner::Uid(uid));
        assert_eq!(diagnosed_owner(local, peer), Ok(PeerOwner::Uid(uid)));
        drop(client);
    }

    #[test]
    fn kernel_address_forms_parse() {
        // The kernel prints the address words in host byte order.
        let v4 = format!("{:08X}:1F90", u32::from_ne_bytes([127, 0, 0, 1]));
        assert_eq!(parse_address(&v4), Some("127.0.0.1:8080".parse().unwrap()));
        let mut v6 = String::new();
        for chunk in Ipv6Addr::LOCALHOST.octets().chunks(4) {
            v6.push_str(&format!(
                "{:08X}",
                u32::from_ne_bytes(chunk.try_into().unwrap())
            ));
        }
        assert_eq!(
            parse_address(&format!("{v6}:0050")),
            Some("[::1]:80".parse().unwrap())
        );
        assert_eq!(parse_address("zz:1"), None);
    }
}
