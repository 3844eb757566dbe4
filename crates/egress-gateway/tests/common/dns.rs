//! A tiny authoritative DNS server for the test "internet" (UDP, `A` and `AAAA` only), so a
//! gateway started with the system resolver gets the answers a test chooses, through the
//! real `getaddrinfo` path: the gateway's namespace has a `resolv.conf` naming this server
//! (`ip netns exec` mounts `/etc/netns/NAME/resolv.conf` over `/etc/resolv.conf`).
//!
//! A name maps to a sequence of answers: the n-th query of a type gets the n-th answer (the
//! last one repeats), so a name can resolve differently on its second lookup. `*.suffix` entries
//! answer every name below `suffix`. Every query is counted by name and type; an unknown name is
//! `NXDOMAIN`. Written by hand (header, one question, answers with a pointer to it): the format
//! of RFC 1035 §4.1.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};

/// Record type `A`.
const TYPE_A: u16 = 1;
/// Record type `AAAA`.
const TYPE_AAAA: u16 = 28;

#[derive(Default)]
struct Zone {
    /// Name (lowercase, no trailing dot, or `*.suffix`) → answers, one per successive lookup.
    names: HashMap<String, Vec<Vec<IpAddr>>>,
    /// (name, type) → queries seen.
    queries: HashMap<(String, u16), usize>,
}

/// The server's table and counters; clones share them.
#[derive(Clone, Default)]
pub struct Dns {
    zone: Arc<Mutex<Zone>>,
}

impl Dns {
    fn zone(&self) -> std::sync::MutexGuard<'_, Zone> {
        self.zone.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `name` answers `ips` on every lookup (addresses of both families, split by type).
    pub fn set(&self, name: &str, ips: &[&str]) {
        self.set_sequence(name, &[ips]);
    }

    /// `name`'s n-th lookup answers `answers[n]`; the last one repeats.
    pub fn set_sequence(&self, name: &str, answers: &[&[&str]]) {
        let answers = answers
            .iter()
            .map(|ips| {
                ips.iter()
                    .map(|ip| ip.parse().expect("an IP address"))
                    .collect()
            })
            .collect();
        self.zone().names.insert(name.to_ascii_lowercase(), answers);
    }

    /// How many `A` queries for `name` arrived so far.
    pub fn a_queries(&self, name: &str) -> usize {
        self.zone()
            .queries
            .get(&(name.to_ascii_lowercase(), TYPE_A))
            .copied()
            .unwrap_or(0)
    }

    /// Every query seen for `name`, whatever its type.
    pub fn queries(&self, name: &str) -> usize {
        let name = name.to_ascii_lowercase();
        self.zone()
            .queries
            .iter()
            .filter(|((n, _), _)| *n == name)
            .map(|(_, c)| *c)
            .sum()
    }

    /// The answer to one query: `None` for an unknown name.
    fn answer(&self, name: &str, qtype: u16) -> Option<Vec<IpAddr>> {
        let mut zone = self.zone();
        let seen = zone.queries.entry((name.to_owned(), qtype)).or_insert(0);
        let n = *seen;
        *seen += 1;
        let key = if zone.names.contains_key(name) {
            name.to_owned()
        } else {
            let mut found = None;
            let mut rest = name;
            while let Some((_, tail)) = rest.split_once('.') {
                let wild = format!("*.{tail}");
                if zone.names.contains_key(&wild) {
                    found = Some(wild);
                    break;
                }
                rest = tail;
            }
            found?
        };
        let answers = &zone.names[&key];
        let ips = answers.get(n).or(answers.last())?;
        Some(
            ips.iter()
                .copied()
                .filter(|ip| match qtype {
                    TYPE_A => ip.is_ipv4(),
                    TYPE_AAAA => ip.is_ipv6(),
                    _ => false,
                })
                .collect(),
        )
    }

    /// Builds the response to one query datagram, or `None` if it is not one.
    fn respond(&self, query: &[u8]) -> Option<Vec<u8>> {
        if query.len() < 12 || query[2] & 0x80 != 0 {
            return None;
        }
        // One question: its name as labels, then type and class.
        let mut at = 12;
        let mut labels = Vec::new();
        loop {
            let len = usize::from(*query.get(at)?);
            at += 1;
            if len == 0 {
                break;
            }
            if len > 63 {
                return None;
            }
            labels.push(String::from_utf8_lossy(query.get(at..at + len)?).to_ascii_lowercase());
            at += len;
        }
        let qtype = u16::from_be_bytes([*query.get(at)?, *query.get(at + 1)?]);
        let question_end = at + 4;
        query.get(..question_end)?;
        let name = labels.join(".");
        let answer = self.answer(&name, qtype);
        let rcode: u8 = if answer.is_none() { 3 } else { 0 };
        let ips = answer.unwrap_or_default();
        let mut out = Vec::with_capacity(question_end + ips.len() * 28);
        out.extend_from_slice(&query[..2]);
        // QR, AA, RD copied, RA; the rcode.
        out.push(0x84 | (query[2] & 0x01));
        out.push(0x80 | rcode);
        out.extend(1_u16.to_be_bytes());
        out.extend(u16::try_from(ips.len()).ok()?.to_be_bytes());
        out.extend([0, 0, 0, 0]);
        out.extend_from_slice(&query[12..question_end]);
        for ip in ips {
            out.extend([0xc0, 12]); // the question's name
            let (kind, data) = match ip {
                IpAddr::V4(v4) => (TYPE_A, v4.octets().to_vec()),
                IpAddr::V6(v6) => (TYPE_AAAA, v6.octets().to_vec()),
            };
            out.extend(kind.to_be_bytes());
            out.extend(1_u16.to_be_bytes()); // class IN
            out.extend(0_u32.to_be_bytes()); // TTL 0: never cached
            out.extend(u16::try_from(data.len()).ok()?.to_be_bytes());
            out.extend(data);
        }
        Some(out)
    }

    /// Serves queries on `socket` until the task is dropped.
    pub fn serve(&self, socket: std::net::UdpSocket) -> tokio::task::JoinHandle<()> {
        let dns = self.clone();
        tokio::spawn(async move {
            let socket = tokio::net::UdpSocket::from_std(socket).expect("tokio socket");
            let mut buf = [0_u8; 1500];
            loop {
                let Ok((n, from)): std::io::Result<(usize, SocketAddr)> =
                    socket.recv_from(&mut buf).await
                else {
                    continue;
                };
                if let Some(reply) = dns.respond(&buf[..n]) {
                    let _ = socket.send_to(&reply, from).await;
                }
            }
        })
    }
}
