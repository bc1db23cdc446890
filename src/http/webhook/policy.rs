//! Which addresses a webhook may reach (PROTOCOL.md 6.2 and 12.8): public unicast addresses,
//! and whatever the operator's allow list (`ServerConfig::webhook_allow`, `brook serve
//! --webhook-allow CIDR`) names. Everything that reaches this machine, its networks or no one
//! in particular is refused: loopback, unspecified, private, shared (CGNAT), link-local (the
//! cloud metadata address 169.254.169.254 among them), unique-local, site-local, multicast,
//! broadcast, documentation, benchmarking, reserved and discard-only ranges, and every IPv6
//! address outside global unicast `2000::/3`.
//!
//! IPv6 forms that carry an IPv4 address to a translator or the kernel's IPv4 stack
//! (IPv4-mapped `::ffff:0:0/96`, IPv4-translated `::ffff:0:0:0/96`, NAT64 `64:ff9b::/96`,
//! 6to4 `2002::/16`) are judged by the IPv4 address they embed, allow list included, so
//! `[::ffff:127.0.0.1]` is loopback and `[2002:a9fe:a9fe::1]` is link-local. Forms whose
//! embedded address cannot be read reliably or that no receiver uses are refused whole:
//! IPv4-compatible `::/96` (deprecated), local-use NAT64 `64:ff9b:1::/48`, and the IETF
//! protocol assignments `2001::/23` (Teredo `2001::/32` among them).
//!
//! The policy is enforced where the connection is made: [`PolicyResolver`] is the delivery
//! client's resolver, so every new connection resolves the host again and keeps only allowed
//! addresses (a name that pointed outward at creation and inward later, DNS rebinding, is
//! refused then); IP literals, which the client does not resolve, are checked by
//! [`check_literal`] before each request. Nothing is sent to a refused address: the decision
//! is made before connecting, and it reads the same whether or not anything listens there.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use futures_util::future::BoxFuture;
use ipnet::{IpNet, Ipv4Net, Ipv6Net};

/// Why an address is refused: it lies in a range webhooks may not reach.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Refused {
    /// The address refused.
    pub(crate) addr: IpAddr,
    /// For an IPv6 form that embeds an IPv4 address: the form and that address.
    pub(crate) embeds: Option<(&'static str, Ipv4Addr)>,
    /// The range, as a phrase: "a loopback address (127.0.0.0/8)".
    pub(crate) range: &'static str,
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.embeds {
            None => write!(f, "refused by policy: {} is {}", self.addr, self.range),
            Some((form, v4)) => write!(
                f,
                "refused by policy: {} is the {form} form of {v4}, {}",
                self.addr, self.range
            ),
        }
    }
}

impl std::error::Error for Refused {}

/// A host name with no address webhooks may reach: every address it resolved to is refused, or
/// it did not resolve at all. One sentence for both, so the answer does not tell whether a
/// name exists inside the operator's network.
#[derive(Debug)]
pub(crate) struct Unreachable {
    /// The host name.
    pub(crate) host: String,
    /// Why, for the server's log only: the lookup's error, or the first refusal.
    pub(crate) cause: String,
}

impl fmt::Display for Unreachable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "refused by policy: {} resolves to no address webhooks may reach",
            self.host
        )
    }
}

impl std::error::Error for Unreachable {}

/// Whether a webhook may connect to `ip`: yes if `allow` contains it (or, for an IPv6 form
/// that embeds an IPv4 address, that address), else yes only outside every refused range.
pub(crate) fn allowed(ip: IpAddr, allow: &[IpNet]) -> Result<(), Refused> {
    if allow.iter().any(|net| net.contains(&ip)) {
        return Ok(());
    }
    let refused = |range| Refused {
        addr: ip,
        embeds: None,
        range,
    };
    match ip {
        IpAddr::V4(a) => v4_refused(a).map_or(Ok(()), |range| Err(refused(range))),
        IpAddr::V6(a) => match v6_class(a) {
            V6::Global => Ok(()),
            V6::Refused(range) => Err(refused(range)),
            V6::Embeds(form, v4) => allowed(IpAddr::V4(v4), allow).map_err(|r| Refused {
                addr: ip,
                embeds: Some((form, v4)),
                range: r.range,
            }),
        },
    }
}

/// The refused IPv4 ranges (IANA's special-purpose registry, RFC 6890, and 240.0.0.0/4), each
/// with the phrase a refusal names it by; the broadcast address before the reserved block.
const V4_REFUSED: &[(Ipv4Net, &str)] = &[
    (v4(0, 0, 0, 0, 8), "a \"this network\" address (0.0.0.0/8)"),
    (v4(10, 0, 0, 0, 8), "a private address (10.0.0.0/8)"),
    (
        v4(100, 64, 0, 0, 10),
        "a shared (carrier-grade NAT) address (100.64.0.0/10)",
    ),
    (v4(127, 0, 0, 0, 8), "a loopback address (127.0.0.0/8)"),
    (
        v4(169, 254, 0, 0, 16),
        "a link-local address (169.254.0.0/16)",
    ),
    (v4(172, 16, 0, 0, 12), "a private address (172.16.0.0/12)"),
    (
        v4(192, 0, 0, 0, 24),
        "an IETF protocol address (192.0.0.0/24)",
    ),
    (
        v4(192, 0, 2, 0, 24),
        "a documentation address (192.0.2.0/24)",
    ),
    (
        v4(192, 88, 99, 0, 24),
        "a 6to4 relay anycast address (192.88.99.0/24)",
    ),
    (v4(192, 168, 0, 0, 16), "a private address (192.168.0.0/16)"),
    (
        v4(198, 18, 0, 0, 15),
        "a benchmarking address (198.18.0.0/15)",
    ),
    (
        v4(198, 51, 100, 0, 24),
        "a documentation address (198.51.100.0/24)",
    ),
    (
        v4(203, 0, 113, 0, 24),
        "a documentation address (203.0.113.0/24)",
    ),
    (v4(224, 0, 0, 0, 4), "a multicast address (224.0.0.0/4)"),
    (v4(255, 255, 255, 255, 32), "the broadcast address"),
    (v4(240, 0, 0, 0, 4), "a reserved address (240.0.0.0/4)"),
];

/// The refused IPv6 ranges inside or beside global unicast, checked after the embedding forms;
/// anything else outside `2000::/3` is refused as not global unicast.
const V6_REFUSED: &[(Ipv6Net, &str)] = &[
    (
        v6([0, 0, 0, 0, 0, 0, 0, 0], 128),
        "the unspecified address (::)",
    ),
    (
        v6([0, 0, 0, 0, 0, 0, 0, 1], 128),
        "the loopback address (::1)",
    ),
    (
        v6([0, 0, 0, 0, 0, 0, 0, 0], 96),
        "a deprecated IPv4-compatible address (::/96)",
    ),
    (
        v6([0x64, 0xff9b, 1, 0, 0, 0, 0, 0], 48),
        "a local-use NAT64 address (64:ff9b:1::/48)",
    ),
    (
        v6([0x100, 0, 0, 0, 0, 0, 0, 0], 64),
        "a discard-only address (100::/64)",
    ),
    (
        v6([0x2001, 0, 0, 0, 0, 0, 0, 0], 32),
        "a Teredo address (2001::/32)",
    ),
    (
        v6([0x2001, 0, 0, 0, 0, 0, 0, 0], 23),
        "an IETF protocol address (2001::/23)",
    ),
    (
        v6([0x2001, 0xdb8, 0, 0, 0, 0, 0, 0], 32),
        "a documentation address (2001:db8::/32)",
    ),
    (
        v6([0x3fff, 0, 0, 0, 0, 0, 0, 0], 20),
        "a documentation address (3fff::/20)",
    ),
    (
        v6([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7),
        "a unique-local address (fc00::/7)",
    ),
    (
        v6([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10),
        "a link-local address (fe80::/10)",
    ),
    (
        v6([0xfec0, 0, 0, 0, 0, 0, 0, 0], 10),
        "a deprecated site-local address (fec0::/10)",
    ),
    (
        v6([0xff00, 0, 0, 0, 0, 0, 0, 0], 8),
        "a multicast address (ff00::/8)",
    ),
];

/// Global unicast: the only IPv6 space with public receivers.
const V6_GLOBAL: Ipv6Net = v6([0x2000, 0, 0, 0, 0, 0, 0, 0], 3);

const fn v4(a: u8, b: u8, c: u8, d: u8, len: u8) -> Ipv4Net {
    Ipv4Net::new_assert(Ipv4Addr::new(a, b, c, d), len)
}

const fn v6(s: [u16; 8], len: u8) -> Ipv6Net {
    let a = Ipv6Addr::new(s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]);
    Ipv6Net::new_assert(a, len)
}

fn v4_refused(a: Ipv4Addr) -> Option<&'static str> {
    V4_REFUSED
        .iter()
        .find(|(net, _)| net.contains(&a))
        .map(|(_, range)| *range)
}

/// What an IPv6 address is to the policy.
enum V6 {
    /// Global unicast outside every refused range.
    Global,
    /// In a refused range.
    Refused(&'static str),
    /// A form (named) that carries this IPv4 address: judged by it.
    Embeds(&'static str, Ipv4Addr),
}

fn v6_class(a: Ipv6Addr) -> V6 {
    let bits = a.to_bits();
    // The low 32 bits, where the mapped, translated and NAT64 forms carry their address.
    let low = Ipv4Addr::from_bits(bits as u32);
    match bits >> 32 {
        0xffff => return V6::Embeds("IPv4-mapped", low),
        0xffff_0000 => return V6::Embeds("IPv4-translated", low),
        0x0064_ff9b_0000_0000_0000_0000 => return V6::Embeds("NAT64", low),
        _ => {}
    }
    if bits >> 112 == 0x2002 {
        // 6to4 carries it in bits 16 to 47, after the 2002::/16 prefix.
        return V6::Embeds("6to4", Ipv4Addr::from_bits((bits >> 80) as u32));
    }
    if let Some((_, range)) = V6_REFUSED.iter().find(|(net, _)| net.contains(&a)) {
        return V6::Refused(range);
    }
    if V6_GLOBAL.contains(&a) {
        V6::Global
    } else {
        V6::Refused("not a global unicast address (outside 2000::/3)")
    }
}

/// Refuses a URL whose host is an IP literal outside the policy (the delivery client resolves
/// only names, so literals are checked here, before each request). A host name passes: the
/// resolver decides at connect time.
pub(crate) fn check_literal(host: &url::Host<&str>, allow: &[IpNet]) -> Result<(), Refused> {
    match host {
        url::Host::Domain(_) => Ok(()),
        url::Host::Ipv4(a) => allowed(IpAddr::V4(*a), allow),
        url::Host::Ipv6(a) => allowed(IpAddr::V6(*a), allow),
    }
}

/// How a host name is resolved: [`system_lookup`], or a table in tests (which must not ask a
/// DNS server).
pub(crate) type Lookup = fn(String) -> BoxFuture<'static, std::io::Result<Vec<IpAddr>>>;

/// The system resolver (`getaddrinfo` on a blocking thread: `/etc/hosts`, then DNS).
pub(crate) fn system_lookup(host: String) -> BoxFuture<'static, std::io::Result<Vec<IpAddr>>> {
    Box::pin(async move {
        let addrs = tokio::net::lookup_host((host.as_str(), 0)).await?;
        Ok(addrs.map(|a| a.ip()).collect())
    })
}

/// The addresses of `host` webhooks may reach, in the resolver's order; [`Unreachable`] when
/// there are none.
pub(crate) async fn reachable(
    host: &str,
    allow: &[IpNet],
    lookup: Lookup,
) -> Result<Vec<IpAddr>, Unreachable> {
    let unreachable = |cause: String| Unreachable {
        host: host.to_owned(),
        cause,
    };
    let all = lookup(host.to_owned())
        .await
        .map_err(|e| unreachable(format!("the lookup failed: {e}")))?;
    let mut first = None;
    let mut kept = Vec::with_capacity(all.len());
    for ip in all {
        match allowed(ip, allow) {
            Ok(()) => kept.push(ip),
            Err(r) => {
                first.get_or_insert(r);
            }
        }
    }
    if kept.is_empty() {
        let cause = first.map_or_else(|| "no addresses".to_owned(), |r| r.to_string());
        return Err(unreachable(cause));
    }
    Ok(kept)
}

/// The delivery client's resolver: every connection to a host name resolves it again and
/// connects only to the addresses [`allowed`] keeps (the port comes from the URL).
#[derive(Clone)]
pub(crate) struct PolicyResolver {
    allow: Arc<[IpNet]>,
    lookup: Lookup,
}

impl PolicyResolver {
    /// A resolver that asks `lookup` and keeps what `allow` and the policy let through.
    pub(crate) fn new(allow: Arc<[IpNet]>, lookup: Lookup) -> Self {
        PolicyResolver { allow, lookup }
    }
}

impl reqwest::dns::Resolve for PolicyResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let (allow, lookup) = (self.allow.clone(), self.lookup);
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let ips = reachable(&host, &allow, lookup).await?;
            let addrs: reqwest::dns::Addrs =
                Box::new(ips.into_iter().map(|ip| SocketAddr::new(ip, 0)));
            Ok(addrs)
        })
    }
}

/// The policy's refusal in an error's chain of sources, if it is there: a delivery that the
/// resolver stopped before connecting.
pub(crate) fn refusal_in<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a Unreachable> {
    let mut next = Some(e);
    while let Some(err) = next {
        if let Some(u) = err.downcast_ref::<Unreachable>() {
            return Some(u);
        }
        next = err.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("a test address")
    }

    fn nets(list: &[&str]) -> Vec<IpNet> {
        list.iter()
            .map(|s| s.parse().expect("a test CIDR"))
            .collect()
    }

    /// Every special range, by a representative address (and its edges where they matter),
    /// with the phrase the refusal names: refused with no allow list.
    #[test]
    fn special_ranges_are_refused() {
        let table: &[(&str, &str)] = &[
            ("0.0.0.0", "0.0.0.0/8"),
            ("0.1.2.3", "0.0.0.0/8"),
            ("10.0.0.1", "10.0.0.0/8"),
            ("10.255.255.255", "10.0.0.0/8"),
            ("100.64.0.1", "100.64.0.0/10"),
            ("100.127.255.254", "100.64.0.0/10"),
            ("127.0.0.1", "127.0.0.0/8"),
            ("127.255.0.9", "127.0.0.0/8"),
            ("169.254.169.254", "169.254.0.0/16"),
            ("172.16.0.1", "172.16.0.0/12"),
            ("172.31.255.255", "172.16.0.0/12"),
            ("192.0.0.170", "192.0.0.0/24"),
            ("192.0.2.1", "192.0.2.0/24"),
            ("192.88.99.1", "192.88.99.0/24"),
            ("192.168.1.1", "192.168.0.0/16"),
            ("198.18.0.1", "198.18.0.0/15"),
            ("198.19.255.255", "198.18.0.0/15"),
            ("198.51.100.7", "198.51.100.0/24"),
            ("203.0.113.9", "203.0.113.0/24"),
            ("224.0.0.1", "224.0.0.0/4"),
            ("239.255.255.250", "224.0.0.0/4"),
            ("240.0.0.1", "240.0.0.0/4"),
            ("255.255.255.255", "broadcast"),
            ("::", "unspecified"),
            ("::1", "loopback address (::1)"),
            ("::7f00:1", "IPv4-compatible"),
            ("::a9fe:a9fe", "IPv4-compatible"),
            ("::808:808", "IPv4-compatible"),
            ("::ffff:127.0.0.1", "127.0.0.0/8"),
            ("::ffff:10.0.0.1", "10.0.0.0/8"),
            ("::ffff:169.254.169.254", "169.254.0.0/16"),
            ("::ffff:0:7f00:1", "127.0.0.0/8"),
            ("64:ff9b::7f00:1", "127.0.0.0/8"),
            ("64:ff9b::a9fe:a9fe", "169.254.0.0/16"),
            ("64:ff9b::c0a8:101", "192.168.0.0/16"),
            ("64:ff9b:1::a9fe:a9fe", "64:ff9b:1::/48"),
            ("100::1", "100::/64"),
            ("2001::1", "2001::/32"),
            ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "2001::/32"),
            ("2001:2::1", "2001::/23"),
            ("2001:db8::1", "2001:db8::/32"),
            ("2002:7f00:1::1", "127.0.0.0/8"),
            ("2002:a9fe:a9fe::1", "169.254.0.0/16"),
            ("2002:a00:1::", "10.0.0.0/8"),
            ("3fff::1", "3fff::/20"),
            ("fc00::1", "fc00::/7"),
            ("fd12:3456::1", "fc00::/7"),
            ("fe80::1", "fe80::/10"),
            ("febf::1", "fe80::/10"),
            ("fec0::1", "fec0::/10"),
            ("ff02::1", "ff00::/8"),
            ("5f00::1", "2000::/3"),
            ("4000::1", "2000::/3"),
            ("1::1", "2000::/3"),
        ];
        for (addr, range) in table {
            let refused = allowed(ip(addr), &[]).expect_err(addr);
            let text = refused.to_string();
            assert!(text.starts_with("refused by policy: "), "{addr}: {text}");
            assert!(text.contains(range), "{addr}: {text} should name {range}");
        }
    }

    #[test]
    fn public_unicast_is_allowed() {
        for addr in [
            "1.1.1.1",
            "8.8.8.8",
            "9.255.255.255",
            "11.0.0.0",
            "100.63.255.255",
            "100.128.0.0",
            "126.255.255.255",
            "128.0.0.1",
            "169.253.255.255",
            "172.15.255.255",
            "172.32.0.0",
            "192.0.1.255",
            "192.167.255.255",
            "198.17.255.255",
            "198.20.0.0",
            "223.255.255.255",
            "2606:4700:4700::1111",
            "2a00:1450:4001:80b::200e",
            "2001:200::1",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
            "2002:808:808::1",
        ] {
            assert_eq!(allowed(ip(addr), &[]), Ok(()), "{addr}");
        }
    }

    #[test]
    fn the_allow_list_admits_its_ranges_and_embedded_forms_of_them() {
        let allow = nets(&["127.0.0.0/8", "10.1.0.0/16", "fd00::/8"]);
        for addr in [
            "127.0.0.1",
            "127.9.9.9",
            "10.1.2.3",
            "fd00::5",
            "::ffff:127.0.0.1",
            "64:ff9b::a01:203",
            "2002:7f00:1::1",
        ] {
            assert_eq!(allowed(ip(addr), &allow), Ok(()), "{addr}");
        }
        for addr in ["10.2.0.1", "::1", "169.254.169.254", "fe80::1", "::7f00:1"] {
            assert!(allowed(ip(addr), &allow).is_err(), "{addr}");
        }
        assert_eq!(allowed(ip("::1"), &nets(&["::1/128"])), Ok(()));
    }

    #[test]
    fn embedded_refusals_name_the_form_and_the_address() {
        let text = allowed(ip("64:ff9b::a9fe:a9fe"), &[])
            .expect_err("link-local")
            .to_string();
        assert_eq!(
            text,
            "refused by policy: 64:ff9b::a9fe:a9fe is the NAT64 form of 169.254.169.254, \
             a link-local address (169.254.0.0/16)"
        );
    }

    fn table(host: String) -> BoxFuture<'static, std::io::Result<Vec<IpAddr>>> {
        Box::pin(async move {
            match host.as_str() {
                "metadata.google.internal" => Ok(vec![ip("169.254.169.254")]),
                "rebound.test" => Ok(vec![ip("127.0.0.1"), ip("::1")]),
                "mixed.test" => Ok(vec![ip("10.0.0.1"), ip("8.8.8.8")]),
                _ => Err(std::io::Error::other("no such host")),
            }
        })
    }

    #[tokio::test]
    async fn names_keep_only_allowed_addresses() {
        let e = reachable("metadata.google.internal", &[], table)
            .await
            .expect_err("link-local only");
        assert_eq!(
            e.to_string(),
            "refused by policy: metadata.google.internal resolves to no address webhooks may reach"
        );
        assert!(e.cause.contains("169.254.0.0/16"), "{}", e.cause);
        let e = reachable("nowhere.test", &[], table)
            .await
            .expect_err("no address");
        assert!(e.to_string().starts_with("refused by policy: "), "{e}");
        assert_eq!(
            reachable("mixed.test", &[], table).await.ok(),
            Some(vec![ip("8.8.8.8")])
        );
        assert_eq!(
            reachable("rebound.test", &nets(&["127.0.0.0/8"]), table)
                .await
                .ok(),
            Some(vec![ip("127.0.0.1")])
        );
    }

    /// The delivery client with this resolver never connects to a refused address: a listener
    /// on loopback that a name resolves to is not contacted, and the error carries the
    /// refusal; with loopback allowed the same request reaches it.
    #[tokio::test]
    async fn the_resolver_refuses_before_connecting() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let port = listener.local_addr().expect("bound").port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            while let Ok((sock, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                drop(sock);
            }
        });
        let client = |allow: Vec<IpNet>| {
            reqwest::Client::builder()
                .no_proxy()
                .dns_resolver(Arc::new(PolicyResolver::new(allow.into(), table)))
                .build()
                .expect("a client")
        };
        let url = format!("http://rebound.test:{port}/hook");
        let e = client(Vec::new())
            .post(&url)
            .send()
            .await
            .expect_err("refused");
        let refusal = refusal_in(&e).expect("the refusal is in the chain");
        assert_eq!(refusal.host, "rebound.test");
        assert_eq!(accepted.load(Ordering::SeqCst), 0);
        // Allowed: the connection is made (the listener drops it, so the request fails).
        let sent = client(nets(&["127.0.0.0/8"])).post(&url).send().await;
        if let Err(e) = &sent {
            assert!(refusal_in(e).is_none(), "{e}");
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }
}
