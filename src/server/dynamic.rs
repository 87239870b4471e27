//! Applying dynamic broker configs to what the server runs: the connection
//! limits and each TLS listener's certificate (KIP-226's keystore rotation).
//!
//! The API layer stores the configs and asks this module whether a set of
//! them can be applied, then to apply it. Each time the whole set in force
//! is rebuilt over the flags, so deleting a dynamic config brings the flag's
//! value back. Nothing is swapped unless everything was built: a keystore
//! that does not load, or whose certificate names another subject than the
//! one served (Kafka refuses that unless `ssl.allow.dn.changes`, which
//! Strata does not have), leaves the listener as it was.
//!
//! A TLS listener's acceptor sits behind a lock the accept path reads once
//! per connection: a new certificate serves the next handshake, and the
//! connections already open keep the session they have.
//!
//! Strata's keystores and truststores are PEM, as its flags' files are:
//! `ssl.keystore.type` and `ssl.truststore.type` may only be PEM, a PEM
//! keystore file holds the key and the chain, and passwords are refused as
//! Kafka refuses a keystore password for PEM (and an encrypted key, which
//! `ssl.key.password` would open, cannot be read here).

use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::RwLock;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

use super::config::{parse_ip_overrides, BrokerConfig, SecurityProtocol};
use super::limits::{ConnectionLimits, Quotas};
use crate::api::broker_configs::{listener_config, Configs};
use crate::api::Reconfigure;
use crate::auth::tls::{self, ClientAuth};

/// A TLS listener's acceptor, swapped when its keystore changes.
pub(super) type TlsSwitch = Arc<RwLock<TlsAcceptor>>;

/// What a TLS listener serves.
struct TlsListener {
    name: String,
    client_auth: ClientAuth,
    acceptor: TlsSwitch,
    /// The subject and alternative names of the certificate served.
    identity: RwLock<Identity>,
}

type Identity = (Option<String>, Option<Vec<String>>);

/// The flags' PEM files.
#[derive(Clone)]
struct StaticTls {
    cert: PathBuf,
    key: PathBuf,
    ca: Option<PathBuf>,
}

pub(super) struct Runtime {
    limits: Arc<ConnectionLimits>,
    flags: Quotas,
    tls: Option<StaticTls>,
    listeners: Vec<TlsListener>,
}

fn identity(chain: &[CertificateDer<'_>]) -> Identity {
    let leaf = chain.first().map(|c| c.as_ref()).unwrap_or_default();
    (tls::subject_dn(leaf), tls::subject_alt_names(leaf))
}

impl Runtime {
    /// The runtime of the listeners `bind_listeners` made: `acceptors` are
    /// the TLS listeners' (name, protocol, acceptor).
    pub(super) fn new(
        config: &BrokerConfig,
        limits: Arc<ConnectionLimits>,
        acceptors: Vec<(String, SecurityProtocol, TlsSwitch)>,
    ) -> anyhow::Result<Runtime> {
        let tls = match (&config.ssl_cert_file, &config.ssl_key_file) {
            (Some(cert), Some(key)) => Some(StaticTls {
                cert: cert.clone(),
                key: key.clone(),
                ca: config.ssl_ca_file.clone(),
            }),
            _ => None,
        };
        let served = match &tls {
            Some(t) => identity(&tls::pem_chain(
                &std::fs::read(&t.cert)?,
                &t.cert.display().to_string(),
            )?),
            None => (None, None),
        };
        let listeners = acceptors
            .into_iter()
            .map(|(name, protocol, acceptor)| TlsListener {
                name,
                client_auth: match protocol {
                    SecurityProtocol::Ssl => config.ssl_client_auth.into(),
                    _ => ClientAuth::None,
                },
                acceptor,
                identity: RwLock::new(served.clone()),
            })
            .collect();
        Ok(Runtime {
            flags: limits.quotas(),
            limits,
            tls,
            listeners,
        })
    }

    fn quotas(&self, configs: &Configs) -> Result<Quotas, String> {
        let count = |name: &str, flag: usize| -> Result<usize, String> {
            match configs.get(name) {
                None => Ok(flag),
                Some(v) => v.trim().parse().map_err(|_| {
                    format!("Invalid value {v} for configuration {name}: Not a number of type INT")
                }),
            }
        };
        let overrides = match configs.get("max.connections.per.ip.overrides") {
            None => self.flags.overrides.clone(),
            Some(v) => {
                parse_ip_overrides(v)
                    .map_err(|e| {
                        format!(
                        "Invalid value {v} for configuration max.connections.per.ip.overrides: {e}"
                    )
                    })?
                    .0
            }
        };
        let quotas = Quotas {
            max: count("max.connections", self.flags.max)?,
            per_ip: count("max.connections.per.ip", self.flags.per_ip)?,
            overrides,
        };
        // Kafka's check: an address may be refused everything only by name.
        let changed = ["max.connections.per.ip", "max.connections.per.ip.overrides"]
            .iter()
            .any(|n| configs.contains_key(*n));
        if changed && quotas.per_ip == 0 && quotas.overrides.is_empty() {
            return Err("Value must be greater than or equal to 1 for max.connections.per.ip if there is no max.connections.per.ip.overrides".into());
        }
        Ok(quotas)
    }

    /// The acceptor `configs` make for `listener`, with the identity it serves.
    fn acceptor(
        &self,
        listener: &TlsListener,
        configs: &Configs,
    ) -> Result<(TlsAcceptor, Identity), String> {
        let prefix = format!("listener.name.{}.", listener.name.to_ascii_lowercase());
        let get = |base: &str| configs.get(&format!("{prefix}{base}")).map(String::as_str);
        let name = |base: &str| format!("{prefix}{base}");
        for (kind, password) in [
            ("ssl.keystore.type", "ssl.keystore.password"),
            ("ssl.truststore.type", "ssl.truststore.password"),
        ] {
            if let Some(t) = get(kind).filter(|t| !t.eq_ignore_ascii_case("PEM")) {
                return Err(format!(
                    "Invalid value {t} for configuration {}: Strata reads PEM key and trust stores only",
                    name(kind)
                ));
            }
            if get(password).is_some() {
                return Err(format!(
                    "{} cannot be specified with PEM format: a PEM store has no password",
                    name(password)
                ));
            }
        }
        if get("ssl.key.password").is_some() {
            return Err(format!(
                "{}: encrypted private keys are not supported; give the key unencrypted",
                name("ssl.key.password")
            ));
        }
        let fail = |e: crate::auth::AuthError| e.to_string();
        let read = |config: &str, path: &str| {
            std::fs::read(path).map_err(|e| format!("{}: reading {path}: {e}", name(config)))
        };
        let inline = (
            get("ssl.keystore.certificate.chain"),
            get("ssl.keystore.key"),
        );
        let (chain, key): (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) =
            match (get("ssl.keystore.location"), inline) {
                (Some(_), (Some(_), _) | (_, Some(_))) => {
                    return Err(format!(
                        "{} cannot be given with {} or {}",
                        name("ssl.keystore.location"),
                        name("ssl.keystore.certificate.chain"),
                        name("ssl.keystore.key")
                    ))
                }
                (Some(path), _) => {
                    let pem = read("ssl.keystore.location", path)?;
                    (
                        tls::pem_chain(&pem, path).map_err(fail)?,
                        tls::pem_key(&pem, path).map_err(fail)?,
                    )
                }
                (None, (Some(chain), Some(key))) => (
                    tls::pem_chain(chain.as_bytes(), &name("ssl.keystore.certificate.chain"))
                        .map_err(fail)?,
                    tls::pem_key(key.as_bytes(), &name("ssl.keystore.key")).map_err(fail)?,
                ),
                (None, (Some(_), None) | (None, Some(_))) => {
                    return Err(format!(
                        "{} and {} must be given together",
                        name("ssl.keystore.certificate.chain"),
                        name("ssl.keystore.key")
                    ))
                }
                (None, (None, None)) => {
                    let t = self.tls.as_ref().ok_or("no keystore for a TLS listener")?;
                    let read = |p: &PathBuf| {
                        std::fs::read(p).map_err(|e| format!("reading {}: {e}", p.display()))
                    };
                    let what = |p: &PathBuf| p.display().to_string();
                    (
                        tls::pem_chain(&read(&t.cert)?, &what(&t.cert)).map_err(fail)?,
                        tls::pem_key(&read(&t.key)?, &what(&t.key)).map_err(fail)?,
                    )
                }
            };
        let trusted = match (
            get("ssl.truststore.location"),
            get("ssl.truststore.certificates"),
        ) {
            (Some(_), Some(_)) => {
                return Err(format!(
                    "{} cannot be given with {}",
                    name("ssl.truststore.location"),
                    name("ssl.truststore.certificates")
                ))
            }
            (Some(path), None) => {
                Some(tls::pem_chain(&read("ssl.truststore.location", path)?, path).map_err(fail)?)
            }
            (None, Some(pem)) => Some(
                tls::pem_chain(pem.as_bytes(), &name("ssl.truststore.certificates"))
                    .map_err(fail)?,
            ),
            (None, None) => match self.tls.as_ref().and_then(|t| t.ca.as_ref()) {
                Some(ca) => Some(
                    tls::pem_chain(
                        &std::fs::read(ca).map_err(|e| format!("reading {}: {e}", ca.display()))?,
                        &ca.display().to_string(),
                    )
                    .map_err(fail)?,
                ),
                None => None,
            },
        };
        let new = identity(&chain);
        let served = listener.identity.read().clone();
        if new.0 != served.0 {
            return Err(format!(
                "Validation of dynamic config update of SSLFactory failed: Keystore DistinguishedName does not match: existing={}, new={}",
                served.0.unwrap_or_default(),
                new.0.unwrap_or_default()
            ));
        }
        if new.1 != served.1 {
            return Err(format!(
                "Validation of dynamic config update of SSLFactory failed: Keystore SubjectAltNames do not match: existing={:?}, new={:?}",
                served.1.unwrap_or_default(),
                new.1.unwrap_or_default()
            ));
        }
        let config =
            tls::server_config_from(chain, key, trusted, listener.client_auth).map_err(|e| {
                format!("Validation of dynamic config update of SSLFactory failed: {e}")
            })?;
        Ok((TlsAcceptor::from(config), new))
    }
}

impl Reconfigure for Runtime {
    fn reconfigure(&self, configs: &Configs, apply: bool) -> Result<(), String> {
        let quotas = self.quotas(configs)?;
        for name in configs.keys() {
            if let Some((listener, _)) = listener_config(name) {
                if !self
                    .listeners
                    .iter()
                    .any(|l| l.name.eq_ignore_ascii_case(listener))
                {
                    return Err(format!(
                        "{name}: this broker has no SSL or SASL_SSL listener named {}",
                        listener.to_ascii_uppercase()
                    ));
                }
            }
        }
        let acceptors = self
            .listeners
            .iter()
            .map(|l| self.acceptor(l, configs))
            .collect::<Result<Vec<_>, String>>()?;
        if apply {
            self.limits.set(quotas);
            for (listener, (acceptor, identity)) in self.listeners.iter().zip(acceptors) {
                *listener.acceptor.write() = acceptor;
                *listener.identity.write() = identity;
            }
        }
        Ok(())
    }
}
