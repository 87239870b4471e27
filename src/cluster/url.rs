//! The `--cluster etcd://host:port[,host:port...]/prefix` flag.
//!
//! Several clusters (or test runs) may share one etcd, so everything Strata
//! writes lives under a key prefix; without one in the URL it is `/strata`.
//! The prefix is normalised to start with `/` and not end with one, so that
//! `/strata/` and `/strata` name the same cluster. A port may be left out
//! (etcd's 2379); anything else malformed is refused rather than guessed.

use std::fmt;
use std::str::FromStr;

use super::error::ClusterError;

pub(super) const DEFAULT_PREFIX: &str = "/strata";
pub(super) const DEFAULT_PORT: u16 = 2379;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterUrl {
    /// `host:port` of each etcd member (IPv6 hosts in brackets).
    pub hosts: Vec<String>,
    /// Key prefix: starts with `/`, no trailing `/`.
    pub prefix: String,
}

impl ClusterUrl {
    /// gRPC endpoints for the etcd client.
    pub fn endpoints(&self) -> Vec<String> {
        self.hosts.iter().map(|h| format!("http://{h}")).collect()
    }
}

impl fmt::Display for ClusterUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "etcd://{}{}", self.hosts.join(","), self.prefix)
    }
}

impl FromStr for ClusterUrl {
    type Err = ClusterError;

    fn from_str(url: &str) -> Result<Self, Self::Err> {
        let bad = |reason: &str| ClusterError::InvalidUrl {
            url: url.to_string(),
            reason: reason.to_string(),
        };
        let rest = url
            .strip_prefix("etcd://")
            .ok_or_else(|| bad("must start with etcd://"))?;
        if rest.contains(['?', '#', '@']) || rest.chars().any(char::is_whitespace) {
            return Err(bad(
                "query, fragment, credentials and spaces are not supported",
            ));
        }
        let (authority, path) = match rest.find('/') {
            Some(i) => rest.split_at(i),
            None => (rest, ""),
        };
        let hosts = authority
            .split(',')
            .map(|h| parse_host(h).map_err(|r| bad(&r)))
            .collect::<Result<Vec<_>, _>>()?;
        let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
        let prefix = if segments == [""] {
            DEFAULT_PREFIX.to_string()
        } else if segments.iter().any(|s| s.is_empty()) {
            return Err(bad("empty segment in the key prefix"));
        } else {
            format!("/{}", segments.join("/"))
        };
        Ok(ClusterUrl { hosts, prefix })
    }
}

fn parse_host(host: &str) -> Result<String, String> {
    if host.is_empty() {
        return Err("empty host".into());
    }
    let (name, port) = if let Some(v6) = host.strip_prefix('[') {
        let (addr, after) = v6
            .split_once(']')
            .ok_or_else(|| format!("unclosed [ in {host:?}"))?;
        if addr.is_empty() {
            return Err(format!("empty address in {host:?}"));
        }
        let port = match after {
            "" => None,
            p => Some(
                p.strip_prefix(':')
                    .ok_or_else(|| format!("junk after ] in {host:?}"))?,
            ),
        };
        (format!("[{addr}]"), port)
    } else {
        match host.split_once(':') {
            Some((name, port)) => (name.to_string(), Some(port)),
            None => (host.to_string(), None),
        }
    };
    if name.is_empty() {
        return Err(format!("empty host name in {host:?}"));
    }
    let port = match port {
        None => DEFAULT_PORT,
        Some(p) => match p.parse::<u16>() {
            Ok(p) if p != 0 => p,
            _ => return Err(format!("bad port in {host:?}")),
        },
    };
    Ok(format!("{name}:{port}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<ClusterUrl, ClusterError> {
        s.parse()
    }

    #[test]
    fn several_hosts_and_a_prefix() {
        let u = parse("etcd://a:2379,b.example:12379,[::1]:3000/prod/strata/").unwrap();
        assert_eq!(u.hosts, ["a:2379", "b.example:12379", "[::1]:3000"]);
        assert_eq!(u.prefix, "/prod/strata");
        assert_eq!(
            u.endpoints(),
            [
                "http://a:2379",
                "http://b.example:12379",
                "http://[::1]:3000"
            ]
        );
        assert_eq!(
            u.to_string(),
            "etcd://a:2379,b.example:12379,[::1]:3000/prod/strata"
        );
        assert_eq!(parse(&u.to_string()).unwrap(), u);
    }

    #[test]
    fn prefix_and_port_default() {
        for s in ["etcd://h", "etcd://h/", "etcd://h:2379//"] {
            let u = parse(s).unwrap();
            assert_eq!(u.hosts, ["h:2379"], "{s}");
            assert_eq!(u.prefix, "/strata", "{s}");
        }
        assert_eq!(parse("etcd://[::1]/x").unwrap().hosts, ["[::1]:2379"]);
    }

    #[test]
    fn malformed_urls_are_refused() {
        for s in [
            "",
            "http://h:2379/p",
            "etcd://",
            "etcd:///p",
            "etcd://h:2379,/p",
            "etcd://,h/p",
            "etcd://h:0/p",
            "etcd://h:65536/p",
            "etcd://h:x/p",
            "etcd://h:/p",
            "etcd://:2379/p",
            "etcd://[::1/p",
            "etcd://[]:1/p",
            "etcd://[::1]x/p",
            "etcd://h/a//b",
            "etcd://h/p?x=1",
            "etcd://user@h/p",
            "etcd://h /p",
        ] {
            let e = parse(s).expect_err(s);
            assert!(matches!(e, ClusterError::InvalidUrl { .. }), "{s}: {e}");
            assert!(!e.is_retriable());
        }
    }
}
