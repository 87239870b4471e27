//! Kafka's ACL model: bindings, the filters that select them, and the
//! decision for one request.
//!
//! A binding says that a principal, from a host, is allowed or denied an
//! operation on the resources a pattern names: one resource (LITERAL, `*`
//! meaning every resource of the type) or every resource whose name starts
//! with a prefix (PREFIXED). The decision follows Kafka's authorizer: a
//! super user may do anything; a resource no binding names at all is open
//! only with `allow.everyone.if.no.acl.found`; otherwise a matching DENY
//! wins over any ALLOW, and an ALLOW of READ, WRITE, DELETE or ALTER implies
//! DESCRIBE (ALTER_CONFIGS implies DESCRIBE_CONFIGS). Numbers are the wire
//! codes of Kafka's enums, so the API layer converts nothing.

use serde::{Deserialize, Serialize};

use crate::principal::Principal;

/// The one name a cluster resource has.
pub(crate) const CLUSTER_NAME: &str = "kafka-cluster";
/// A LITERAL resource name, principal name or host that matches all.
pub(crate) const WILDCARD: &str = "*";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub(crate) enum ResourceType {
    Any = 1,
    Topic = 2,
    Group = 3,
    Cluster = 4,
    TransactionalId = 5,
    DelegationToken = 6,
    User = 7,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub(crate) enum PatternType {
    Any = 1,
    Match = 2,
    Literal = 3,
    Prefixed = 4,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub(crate) enum Operation {
    Any = 1,
    All = 2,
    Read = 3,
    Write = 4,
    Create = 5,
    Delete = 6,
    Alter = 7,
    Describe = 8,
    ClusterAction = 9,
    DescribeConfigs = 10,
    AlterConfigs = 11,
    IdempotentWrite = 12,
    CreateTokens = 13,
    DescribeTokens = 14,
    TwoPhaseCommit = 15,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub(crate) enum Permission {
    Any = 1,
    Deny = 2,
    Allow = 3,
}

macro_rules! wire_enum {
    ($t:ty { $($v:ident),* }) => {
        impl $t {
            /// From Kafka's wire code; `None` for UNKNOWN and codes this broker does not know.
            pub(crate) fn from_code(code: i8) -> Option<$t> {
                [$(<$t>::$v),*].into_iter().find(|v| *v as i8 == code)
            }
            pub(crate) fn code(self) -> i8 {
                self as i8
            }
        }
    };
}
wire_enum!(ResourceType {
    Any,
    Topic,
    Group,
    Cluster,
    TransactionalId,
    DelegationToken,
    User
});
wire_enum!(PatternType {
    Any,
    Match,
    Literal,
    Prefixed
});
wire_enum!(Operation {
    Any,
    All,
    Read,
    Write,
    Create,
    Delete,
    Alter,
    Describe,
    ClusterAction,
    DescribeConfigs,
    AlterConfigs,
    IdempotentWrite,
    CreateTokens,
    DescribeTokens,
    TwoPhaseCommit
});
wire_enum!(Permission { Any, Deny, Allow });

/// One ACL as stored: a resource pattern and an entry.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub(crate) struct AclBinding {
    pub resource_type: ResourceType,
    pub resource_name: String,
    pub pattern_type: PatternType,
    /// `Type:name`, `User:*` for everyone.
    pub principal: String,
    pub host: String,
    pub operation: Operation,
    pub permission: Permission,
}

impl AclBinding {
    /// Kafka's checks on a new binding; the message is the error message
    /// CreateAcls answers with (INVALID_REQUEST).
    pub(crate) fn validate(&self) -> Result<(), String> {
        if self.resource_type == ResourceType::Any {
            return Err("Invalid resourceType ANY".into());
        }
        if !matches!(
            self.pattern_type,
            PatternType::Literal | PatternType::Prefixed
        ) {
            return Err(format!("Invalid patternType {:?}", self.pattern_type));
        }
        if matches!(self.operation, Operation::Any) {
            return Err("Invalid operation ANY".into());
        }
        if self.permission == Permission::Any {
            return Err("Invalid permissionType ANY".into());
        }
        if self.resource_name.is_empty() {
            return Err("Resource name must not be empty".into());
        }
        if self.resource_type == ResourceType::Cluster && self.resource_name != CLUSTER_NAME {
            return Err(format!(
                "The only valid name for the CLUSTER resource is {CLUSTER_NAME}"
            ));
        }
        if Principal::parse(&self.principal).is_none_or(|p| p.name.is_empty()) {
            return Err(format!("Could not parse principal {}", self.principal));
        }
        if self.host.is_empty() {
            return Err("Invalid null host".into());
        }
        Ok(())
    }

    /// Whether this binding names the resource `(kind, name)`.
    fn covers(&self, kind: ResourceType, name: &str) -> bool {
        self.resource_type == kind
            && match self.pattern_type {
                PatternType::Literal => {
                    self.resource_name == name || self.resource_name == WILDCARD
                }
                PatternType::Prefixed => name.starts_with(&self.resource_name),
                PatternType::Any | PatternType::Match => false,
            }
    }

    fn applies_to(&self, principal: &str, host: &str) -> bool {
        let everyone = self
            .principal
            .split_once(':')
            .is_some_and(|(_, n)| n == WILDCARD);
        (self.principal == principal || everyone) && (self.host == host || self.host == WILDCARD)
    }
}

/// Selects bindings, as DescribeAcls and DeleteAcls send it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AclFilter {
    pub resource_type: ResourceType,
    pub resource_name: Option<String>,
    pub pattern_type: PatternType,
    pub principal: Option<String>,
    pub host: Option<String>,
    pub operation: Operation,
    pub permission: Permission,
}

impl AclFilter {
    pub(crate) fn matches(&self, b: &AclBinding) -> bool {
        let kind = self.resource_type == ResourceType::Any || self.resource_type == b.resource_type;
        let pattern = match (self.pattern_type, &self.resource_name) {
            (PatternType::Any, None) => true,
            (PatternType::Any, Some(n)) => *n == b.resource_name,
            (PatternType::Match, None) => true,
            // Every binding that applies to the named resource.
            (PatternType::Match, Some(n)) => match b.pattern_type {
                PatternType::Literal => b.resource_name == *n || b.resource_name == WILDCARD,
                PatternType::Prefixed => n.starts_with(&b.resource_name),
                _ => false,
            },
            (p, name) => p == b.pattern_type && name.as_ref().is_none_or(|n| *n == b.resource_name),
        };
        kind && pattern
            && self.principal.as_ref().is_none_or(|p| *p == b.principal)
            && self.host.as_ref().is_none_or(|h| *h == b.host)
            && (self.operation == Operation::Any || self.operation == b.operation)
            && (self.permission == Permission::Any || self.permission == b.permission)
    }
}

/// How the broker decides: Kafka's `super.users` and
/// `allow.everyone.if.no.acl.found`.
#[derive(Debug, Clone, Default)]
pub struct AuthorizerSettings {
    pub super_users: Vec<String>,
    pub allow_everyone_if_no_acl_found: bool,
}

/// Whether `principal` connected from `host` may perform `op` on the
/// resource `(kind, name)`, given every binding the broker holds.
pub(crate) fn authorize(
    settings: &AuthorizerSettings,
    acls: &[AclBinding],
    principal: &Principal,
    host: &str,
    op: Operation,
    kind: ResourceType,
    name: &str,
) -> bool {
    let who = principal.to_string();
    if settings.super_users.contains(&who) {
        return true;
    }
    let mut relevant = acls.iter().filter(|b| b.covers(kind, name)).peekable();
    if relevant.peek().is_none() {
        return settings.allow_everyone_if_no_acl_found;
    }
    let mine: Vec<&AclBinding> = relevant.filter(|b| b.applies_to(&who, host)).collect();
    let denied = mine.iter().any(|b| {
        b.permission == Permission::Deny && (b.operation == op || b.operation == Operation::All)
    });
    if denied {
        return false;
    }
    mine.iter().any(|b| {
        b.permission == Permission::Allow
            && (b.operation == op || b.operation == Operation::All || implies(b.operation, op))
    })
}

/// Kafka's implied operations: what an ALLOW of `granted` also allows.
fn implies(granted: Operation, op: Operation) -> bool {
    use Operation::*;
    match op {
        Describe => matches!(granted, Read | Write | Delete | Alter),
        DescribeConfigs => granted == AlterConfigs,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acl(
        kind: ResourceType,
        name: &str,
        pattern: PatternType,
        who: &str,
        op: Operation,
        perm: Permission,
    ) -> AclBinding {
        AclBinding {
            resource_type: kind,
            resource_name: name.into(),
            pattern_type: pattern,
            principal: who.into(),
            host: WILDCARD.into(),
            operation: op,
            permission: perm,
        }
    }

    fn check(
        settings: &AuthorizerSettings,
        acls: &[AclBinding],
        who: &str,
        op: Operation,
        topic: &str,
    ) -> bool {
        let p = Principal::parse(who).unwrap();
        authorize(
            settings,
            acls,
            &p,
            "10.0.0.1",
            op,
            ResourceType::Topic,
            topic,
        )
    }

    #[test]
    fn a_prefixed_allow_and_a_literal_deny_combine_with_deny_winning() {
        use Operation::*;
        use PatternType::*;
        use Permission::*;
        use ResourceType::Topic;
        let acls = vec![
            acl(Topic, "orders-", Prefixed, "User:alice", Read, Allow),
            acl(Topic, "orders-secret", Literal, "User:alice", Read, Deny),
        ];
        let s = AuthorizerSettings::default();
        assert!(check(&s, &acls, "User:alice", Read, "orders-eu"));
        assert!(!check(&s, &acls, "User:alice", Read, "orders-secret"));
        // READ implies DESCRIBE; the deny of READ does not deny DESCRIBE.
        assert!(check(&s, &acls, "User:alice", Describe, "orders-secret"));
        assert!(!check(&s, &acls, "User:alice", Write, "orders-eu"));
        assert!(!check(&s, &acls, "User:bob", Read, "orders-eu"));
    }

    #[test]
    fn no_acl_on_a_resource_is_open_only_when_configured() {
        let acls = vec![acl(
            ResourceType::Topic,
            "a",
            PatternType::Literal,
            "User:bob",
            Operation::Read,
            Permission::Allow,
        )];
        let closed = AuthorizerSettings::default();
        let open = AuthorizerSettings {
            allow_everyone_if_no_acl_found: true,
            ..Default::default()
        };
        assert!(!check(&closed, &acls, "User:alice", Operation::Read, "b"));
        assert!(check(&open, &acls, "User:alice", Operation::Read, "b"));
        // Once a resource has ACLs, only they decide.
        assert!(!check(&open, &acls, "User:alice", Operation::Read, "a"));
    }

    #[test]
    fn super_users_wildcards_and_hosts() {
        let mut host_bound = acl(
            ResourceType::Topic,
            "*",
            PatternType::Literal,
            "User:*",
            Operation::All,
            Permission::Allow,
        );
        host_bound.host = "10.0.0.1".into();
        let acls = vec![host_bound];
        let s = AuthorizerSettings {
            super_users: vec!["User:admin".into()],
            ..Default::default()
        };
        assert!(check(&s, &acls, "User:anyone", Operation::Write, "t"));
        let p = Principal::user("anyone");
        assert!(!authorize(
            &s,
            &acls,
            &p,
            "10.0.0.2",
            Operation::Write,
            ResourceType::Topic,
            "t"
        ));
        assert!(authorize(
            &s,
            &[],
            &Principal::user("admin"),
            "h",
            Operation::Alter,
            ResourceType::Cluster,
            CLUSTER_NAME
        ));
        assert!(!authorize(
            &s,
            &[],
            &p,
            "h",
            Operation::Alter,
            ResourceType::Cluster,
            CLUSTER_NAME
        ));
    }

    #[test]
    fn filters_select_as_kafka_does() {
        use PatternType::*;
        let acls = [
            acl(
                ResourceType::Topic,
                "orders-",
                Prefixed,
                "User:a",
                Operation::Read,
                Permission::Allow,
            ),
            acl(
                ResourceType::Topic,
                "orders-1",
                Literal,
                "User:a",
                Operation::Read,
                Permission::Deny,
            ),
            acl(
                ResourceType::Topic,
                "*",
                Literal,
                "User:a",
                Operation::Read,
                Permission::Allow,
            ),
            acl(
                ResourceType::Group,
                "orders-1",
                Literal,
                "User:a",
                Operation::Read,
                Permission::Allow,
            ),
        ];
        let filter = |kind, name: Option<&str>, pattern| AclFilter {
            resource_type: kind,
            resource_name: name.map(str::to_string),
            pattern_type: pattern,
            principal: None,
            host: None,
            operation: Operation::Any,
            permission: Permission::Any,
        };
        let count = |f: AclFilter| acls.iter().filter(|b| f.matches(b)).count();
        assert_eq!(count(filter(ResourceType::Any, None, Any)), 4);
        assert_eq!(
            count(filter(ResourceType::Topic, Some("orders-1"), Match)),
            3
        );
        assert_eq!(
            count(filter(ResourceType::Topic, Some("orders-1"), Literal)),
            1
        );
        assert_eq!(count(filter(ResourceType::Any, Some("orders-1"), Any)), 2);
        assert_eq!(count(filter(ResourceType::Topic, None, Prefixed)), 1);
    }

    #[test]
    fn new_bindings_are_validated() {
        let good = acl(
            ResourceType::Cluster,
            CLUSTER_NAME,
            PatternType::Literal,
            "User:a",
            Operation::Alter,
            Permission::Allow,
        );
        assert!(good.validate().is_ok());
        let mut bad = good.clone();
        bad.resource_name = "other".into();
        assert!(bad.validate().is_err());
        let mut bad = good.clone();
        bad.principal = "alice".into();
        assert!(bad.validate().is_err());
        let mut bad = good;
        bad.pattern_type = PatternType::Match;
        assert!(bad.validate().is_err());
    }
}
