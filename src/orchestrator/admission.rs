//! How fast new hotkeys may join: a token bucket per source address (`placement.new_keys`).
//!
//! In a private run a hotkey costs nothing, so without a limit a miner can flood seats with
//! keys that never work. (Grinding fresh keys for a section gets nowhere from one address: the
//! placement draw is keyed by the source address, see `repo::registry`; the limit also bounds
//! what each further address can try.) Each source address gets `burst` new keys at once and then `per_hour`; a key
//! past that is refused with 429 and a `Retry-After`, which `iota mine` waits out. Keys the
//! orchestrator already knows (a miner restarting) and keys the operator pinned are not counted.
//!
//! A source is an IPv4 address or an IPv6 /64 (what one host is normally given). Behind a
//! reverse proxy on loopback every request comes from the proxy, so with
//! `placement.new_keys.forwarded_for` the rightmost `X-Forwarded-For` entry (the address the
//! proxy itself saw; entries to its left are the client's word) is the source instead. With no
//! known address at all (an in-process router without connection info) all requests share one
//! bucket.
//!
//! Buckets live in memory: a restart refills them. At most [`MAX_SOURCES`] are held: past
//! that, full buckets (which hold nothing a fresh one would not) are dropped, and if none is
//! full, all are (one who holds that many addresses gains nothing from a reset).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;

use axum::extract::connect_info::Connected;
use axum::serve::IncomingStream;

use super::config::NewKeyLimit;

/// The most source addresses whose buckets are held at once.
pub const MAX_SOURCES: usize = 65_536;

/// The header a reverse proxy appends the client's address to.
pub const FORWARDED_FOR: &str = "x-forwarded-for";

/// The TCP peer of a connection, recorded by the server for every request
/// (`into_make_service_with_connect_info::<PeerAddr>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerAddr(pub SocketAddr);

impl Connected<IncomingStream<'_, tokio::net::TcpListener>> for PeerAddr {
    fn connect_info(stream: IncomingStream<'_, tokio::net::TcpListener>) -> Self {
        Self(*stream.remote_addr())
    }
}

impl Connected<IncomingStream<'_, super::TlsListener>> for PeerAddr {
    fn connect_info(stream: IncomingStream<'_, super::TlsListener>) -> Self {
        Self(*stream.remote_addr())
    }
}

/// Where a request comes from, as the new-key limit counts it: an IPv4 address or an IPv6 /64;
/// `None` when the server recorded no peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Source(Option<IpAddr>);

impl Source {
    /// The source of a request from `peer` carrying `forwarded` (the `X-Forwarded-For`
    /// values, in order), trusting the header only when `trust_forwarded` and the peer is a
    /// loopback proxy.
    pub fn of(peer: Option<SocketAddr>, forwarded: &[&str], trust_forwarded: bool) -> Self {
        let peer_ip = peer.map(|p| p.ip());
        let proxied = trust_forwarded && peer_ip.is_some_and(|ip| ip.is_loopback());
        let ip = if proxied {
            forwarded
                .iter()
                .flat_map(|v| v.split(','))
                .next_back()
                .and_then(|last| last.trim().parse::<IpAddr>().ok())
                .or(peer_ip)
        } else {
            peer_ip
        };
        Self(ip.map(group))
    }
}

/// An IPv4 address as it is; an IPv6 address cut to its /64 (an IPv4-mapped one to its IPv4).
fn group(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let bits = u128::from(v6) & !((1u128 << 64) - 1);
                IpAddr::V6(bits.into())
            }
        },
    }
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(IpAddr::V6(v6)) => write!(f, "{v6}/64"),
            Some(ip) => write!(f, "{ip}"),
            None => f.write_str("an unknown address"),
        }
    }
}

/// One source's bucket: tokens left at `at_ms`.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at_ms: u64,
}

/// The new-key buckets of every source.
#[derive(Debug, Default)]
pub struct NewKeys {
    buckets: Mutex<HashMap<Source, Bucket>>,
}

impl NewKeys {
    /// Takes one new key's token for `source` at `now_ms`, or says how many whole seconds
    /// until one is there.
    ///
    /// # Errors
    /// The seconds to wait (at least 1) when `source`'s bucket is empty.
    pub fn take(&self, limit: &NewKeyLimit, source: Source, now_ms: u64) -> Result<(), u64> {
        let burst = f64::from(limit.burst.max(1));
        let per_ms = f64::from(limit.per_hour) / 3_600_000.0;
        let mut buckets = self
            .buckets
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if buckets.len() >= MAX_SOURCES && !buckets.contains_key(&source) {
            buckets.retain(|_, b| refill(*b, burst, per_ms, now_ms) < burst);
            if buckets.len() >= MAX_SOURCES {
                buckets.clear();
            }
        }
        let entry = buckets.entry(source).or_insert(Bucket {
            tokens: burst,
            at_ms: now_ms,
        });
        let tokens = refill(*entry, burst, per_ms, now_ms);
        if tokens >= 1.0 {
            *entry = Bucket {
                tokens: tokens - 1.0,
                at_ms: now_ms,
            };
            return Ok(());
        }
        *entry = Bucket {
            tokens,
            at_ms: now_ms,
        };
        if per_ms <= 0.0 {
            return Err(u64::MAX / 1000);
        }
        let wait_ms = (1.0 - tokens) / per_ms;
        Err(((wait_ms / 1000.0).ceil() as u64).max(1))
    }
}

/// `b`'s tokens at `now_ms`, capped at `burst`.
fn refill(b: Bucket, burst: f64, per_ms: f64, now_ms: u64) -> f64 {
    let elapsed = now_ms.saturating_sub(b.at_ms) as f64;
    (b.tokens + elapsed * per_ms).min(burst)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(burst: u32, per_hour: u32) -> NewKeyLimit {
        NewKeyLimit {
            burst,
            per_hour,
            forwarded_for: false,
        }
    }

    /// Sources whose buckets are held.
    fn held(keys: &NewKeys) -> usize {
        keys.buckets.lock().unwrap().len()
    }

    fn src(s: &str) -> Source {
        Source::of(Some(s.parse().unwrap()), &[], false)
    }

    #[test]
    fn a_burst_then_one_key_per_interval() {
        let keys = NewKeys::default();
        let l = limit(3, 60); // one a minute
        let a = src("203.0.113.7:5000");
        for _ in 0..3 {
            assert_eq!(keys.take(&l, a, 0), Ok(()));
        }
        assert_eq!(keys.take(&l, a, 0), Err(60));
        assert_eq!(keys.take(&l, a, 30_000), Err(30));
        assert_eq!(keys.take(&l, a, 60_000), Ok(()));
        assert_eq!(keys.take(&l, a, 60_000), Err(60));
        // Another address has its own bucket.
        assert_eq!(keys.take(&l, src("198.51.100.1:1"), 60_000), Ok(()));
        // A long pause refills to the burst, not beyond it.
        for _ in 0..3 {
            assert_eq!(keys.take(&l, a, 10_000_000), Ok(()));
        }
        assert!(keys.take(&l, a, 10_000_000).is_err());
    }

    #[test]
    fn no_refill_waits_for_ever() {
        let keys = NewKeys::default();
        let l = limit(1, 0);
        let a = src("203.0.113.7:5000");
        assert_eq!(keys.take(&l, a, 0), Ok(()));
        assert!(keys.take(&l, a, u64::MAX / 2).unwrap_err() > 1_000_000_000);
    }

    #[test]
    fn sources_are_hosts_and_ipv6_64s() {
        assert_eq!(
            src("[2001:db8:1:2:aaaa::1]:1"),
            src("[2001:db8:1:2:bbbb::9]:2")
        );
        assert_ne!(src("[2001:db8:1:2::1]:1"), src("[2001:db8:1:3::1]:1"));
        assert_eq!(src("[::ffff:203.0.113.7]:1"), src("203.0.113.7:9"));
        assert_eq!(src("[2001:db8:1:2::1]:1").to_string(), "2001:db8:1:2::/64");
        assert_eq!(
            Source::of(None, &[], true).to_string(),
            "an unknown address"
        );
    }

    #[test]
    fn forwarded_for_is_trusted_only_from_a_loopback_proxy_and_only_its_own_entry() {
        let proxy = Some("127.0.0.1:40000".parse().unwrap());
        let remote = Some("198.51.100.1:40000".parse().unwrap());
        let header = ["10.9.9.9, 203.0.113.7"];
        // The proxy appended 203.0.113.7; "10.9.9.9" is what the client claimed.
        assert_eq!(Source::of(proxy, &header, true), src("203.0.113.7:1"));
        assert_eq!(Source::of(proxy, &header, false), src("127.0.0.1:1"));
        assert_eq!(Source::of(remote, &header, true), src("198.51.100.1:1"));
        assert_eq!(Source::of(proxy, &["garbage"], true), src("127.0.0.1:1"));
        // Two header lines read as one list.
        assert_eq!(
            Source::of(proxy, &["10.0.0.1", "203.0.113.9"], true),
            src("203.0.113.9:1")
        );
    }

    #[test]
    fn the_table_is_bounded_and_drops_full_buckets_first() {
        let keys = NewKeys::default();
        let l = limit(2, 3600); // one a second
        let fill = |keys: &NewKeys, base: u32, now_ms: u64| {
            for i in 0..MAX_SOURCES as u32 {
                let ip = std::net::Ipv4Addr::from(base + i);
                let s = Source::of(Some(SocketAddr::new(ip.into(), 1)), &[], false);
                assert_eq!(keys.take(&l, s, now_ms), Ok(()));
            }
        };
        fill(&keys, 0x0a00_0000, 0);
        assert_eq!(held(&keys), MAX_SOURCES);
        // Ten seconds on, every bucket is full again: all are dropped for the new source.
        assert_eq!(keys.take(&l, src("192.0.2.1:1"), 10_000), Ok(()));
        assert_eq!(held(&keys), 1);
        // None full: all are dropped all the same, so the table never grows past the bound.
        let busy = src("192.0.2.1:1");
        assert_eq!(keys.take(&l, busy, 10_000), Ok(()));
        assert!(keys.take(&l, busy, 10_000).is_err());
        fill(&keys, 0x0b00_0000, 10_000);
        assert!(held(&keys) <= MAX_SOURCES);
    }
}
