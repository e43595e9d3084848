//! Which user owns the other end of a loopback TCP connection: the TCP analogue of a Unix
//! socket's `SO_PEERCRED`, read from the kernel's socket tables `/proc/net/tcp` and
//! `/proc/net/tcp6` (columns `local_address rem_address … uid`). No unsafe code.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// What the socket tables say about a connection's peer socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PeerOwner {
    /// The peer socket exists and belongs to this user id.
    Uid(u32),
    /// The tables were read but list no such socket (the peer is gone, or not on this host).
    NotFound,
    /// The tables cannot be read here (no `/proc`): nothing can be said.
    Unknown,
}

/// The owner of the socket whose local address is `peer` and whose remote address is `local`,
/// i.e. the other end of a connection this process holds from `local` to `peer`.
///
/// Reading a socket table costs milliseconds on some kernels (it walks every socket of the
/// network namespace), so the table of the peer's likely family is read first and the other
/// only if the socket is not there.
pub(crate) fn tcp_peer_owner(local: SocketAddr, peer: SocketAddr) -> PeerOwner {
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

    #[test]
    fn a_live_loopback_connection_is_owned_by_this_user() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, peer) = listener.accept().unwrap();
        let owner = tcp_peer_owner(server.local_addr().unwrap(), peer);
        assert_eq!(owner, PeerOwner::Uid(rustix::process::getuid().as_raw()));
        drop(client);
        let nobody: SocketAddr = "127.0.0.1:1".parse().unwrap();
        assert_eq!(
            tcp_peer_owner(server.local_addr().unwrap(), nobody),
            PeerOwner::NotFound
        );
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
