//! Who a request comes from.
//!
//! Kafka names the sender of every request by a principal, `User:<name>`:
//! the SASL user, the subject of a client certificate, or `User:ANONYMOUS`
//! on a connection that proved nothing. Authentication decides it once per
//! connection; authorization, quotas and audit logs only read it, so it is a
//! plain value that lives below the layers that use it.

use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Principal {
    /// Kafka's principal type; `User` for every principal Kafka itself builds.
    pub kind: String,
    pub name: String,
}

impl Principal {
    pub(crate) const ANONYMOUS: &'static str = "ANONYMOUS";

    pub(crate) fn user(name: impl Into<String>) -> Principal {
        Principal {
            kind: "User".to_string(),
            name: name.into(),
        }
    }

    /// The principal of a connection that did not authenticate.
    pub(crate) fn anonymous() -> Principal {
        Principal::user(Principal::ANONYMOUS)
    }

    /// Parses Kafka's `Type:name` form, as ACLs and `super.users` write it.
    pub(crate) fn parse(s: &str) -> Option<Principal> {
        let (kind, name) = s.split_once(':')?;
        (!kind.is_empty()).then(|| Principal {
            kind: kind.to_string(),
            name: name.to_string(),
        })
    }
}

impl fmt::Display for Principal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.kind, self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kafka_form_round_trips() {
        let p = Principal::parse("User:alice").unwrap();
        assert_eq!(p, Principal::user("alice"));
        assert_eq!(p.to_string(), "User:alice");
        assert_eq!(Principal::parse("User:CN=a,O=b").unwrap().name, "CN=a,O=b");
        assert_eq!(Principal::parse("alice"), None);
        assert_eq!(Principal::anonymous().to_string(), "User:ANONYMOUS");
    }
}
