//! TLS for SSL and SASL_SSL listeners, with rustls.
//!
//! The broker's certificate chain and key, and the CA bundle that client
//! certificates must chain to, are PEM files. `--ssl-client-auth` is Kafka's
//! `ssl.client.auth`: `required` refuses a handshake without a trusted
//! client certificate, `requested` accepts one without, `none` asks for none.
//! A trusted client certificate names the principal on an SSL listener, as
//! Kafka's default principal builder does: `User:` and the subject's
//! distinguished name in RFC 2253 form (`CN=alice,OU=eng,O=Example`), the
//! same string Java's `X500Principal.getName()` gives.

use std::path::Path;
use std::sync::Arc;

use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use super::AuthError;

/// Whether an SSL listener asks clients for a certificate (ssl.client.auth).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ClientAuth {
    Required,
    Requested,
    None,
}

fn tls_err(what: &str, path: &Path, e: impl std::fmt::Display) -> AuthError {
    AuthError::Tls(format!("{what} {}: {e}", path.display()))
}

fn roots(ca: &Path) -> Result<RootCertStore, AuthError> {
    let mut roots = RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(ca).map_err(|e| tls_err("reading", ca, e))? {
        roots
            .add(c.map_err(|e| tls_err("parsing", ca, e))?)
            .map_err(|e| tls_err("adding", ca, e))?;
    }
    Ok(roots)
}

/// The server side of every TLS listener, from the PEM files the flags name.
pub(crate) fn server_config(
    cert: &Path,
    key: &Path,
    ca: Option<&Path>,
    client_auth: ClientAuth,
) -> Result<Arc<ServerConfig>, AuthError> {
    let read = |path: &Path| std::fs::read(path).map_err(|e| tls_err("reading", path, e));
    let chain = pem_chain(&read(cert)?, &cert.display().to_string())?;
    let key = pem_key(&read(key)?, &key.display().to_string())?;
    let trusted = match ca {
        Some(ca) => Some(pem_chain(&read(ca)?, &ca.display().to_string())?),
        None => None,
    };
    server_config_from(chain, key, trusted, client_auth)
}

/// The certificates of a PEM text (`what` names it in errors); at least one.
pub(crate) fn pem_chain(pem: &[u8], what: &str) -> Result<Vec<CertificateDer<'static>>, AuthError> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<_, _>>()
        .map_err(|e| AuthError::Tls(format!("parsing {what}: {e}")))?;
    if chain.is_empty() {
        return Err(AuthError::Tls(format!("no certificate in {what}")));
    }
    Ok(chain)
}

/// The private key of a PEM text, unencrypted (PKCS#8, PKCS#1 or SEC1).
pub(crate) fn pem_key(pem: &[u8], what: &str) -> Result<PrivateKeyDer<'static>, AuthError> {
    PrivateKeyDer::from_pem_slice(pem)
        .map_err(|e| AuthError::Tls(format!("reading key {what}: {e}")))
}

/// The server side of a TLS listener: `chain` and `key` are what it
/// presents, `trusted` the CAs a client certificate must chain to.
pub(crate) fn server_config_from(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    trusted: Option<Vec<CertificateDer<'static>>>,
    client_auth: ClientAuth,
) -> Result<Arc<ServerConfig>, AuthError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| AuthError::Tls(e.to_string()))?;
    let builder = match (client_auth, trusted) {
        (ClientAuth::None, _) => builder.with_no_client_auth(),
        (_, None) => {
            return Err(AuthError::Tls(
                "--ssl-client-auth requested/required needs --ssl-ca-file".into(),
            ))
        }
        (mode, Some(trusted)) => {
            let mut roots = RootCertStore::empty();
            for c in trusted {
                roots
                    .add(c)
                    .map_err(|e| AuthError::Tls(format!("trusted certificate: {e}")))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            let verifier = if mode == ClientAuth::Requested {
                verifier.allow_unauthenticated()
            } else {
                verifier
            };
            let verifier = verifier
                .build()
                .map_err(|e| AuthError::Tls(format!("trusted certificates: {e}")))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let config = builder
        .with_single_cert(chain, key)
        .map_err(|e| AuthError::Tls(format!("certificate and key: {e}")))?;
    Ok(Arc::new(config))
}

/// The client side, for the broker's own connections to a TLS listener:
/// it trusts `ca` (without one, the system's CAs, as librdkafka does) and
/// presents the broker's certificate, so that a listener requiring client
/// certificates admits it (as the certificate's subject).
pub(crate) fn client_config(
    ca: Option<&Path>,
    cert: &Path,
    key: &Path,
) -> Result<Arc<ClientConfig>, AuthError> {
    let roots = match ca {
        Some(ca) => roots(ca)?,
        None => {
            let mut roots = RootCertStore::empty();
            roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
            roots
        }
    };
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| tls_err("reading", cert, e))?
        .collect::<Result<_, _>>()
        .map_err(|e| tls_err("parsing", cert, e))?;
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| tls_err("reading key", key, e))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| AuthError::Tls(e.to_string()))?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .map_err(|e| tls_err("certificate and key", cert, e))?;
    Ok(Arc::new(config))
}

/// The RFC 2253 subject of a DER certificate: RDNs last to first, joined by
/// commas, values escaped.
pub(crate) fn subject_dn(der: &[u8]) -> Option<String> {
    use x509_parser::prelude::*;
    let (_, cert) = X509Certificate::from_der(der).ok()?;
    let mut rdns = Vec::new();
    for rdn in cert.subject().iter() {
        let mut parts = Vec::new();
        for atv in rdn.iter() {
            let oid = atv.attr_type();
            let name = match oid.to_id_string().as_str() {
                "2.5.4.3" => "CN".to_string(),
                "2.5.4.7" => "L".to_string(),
                "2.5.4.8" => "ST".to_string(),
                "2.5.4.10" => "O".to_string(),
                "2.5.4.11" => "OU".to_string(),
                "2.5.4.6" => "C".to_string(),
                "2.5.4.9" => "STREET".to_string(),
                "0.9.2342.19200300.100.1.25" => "DC".to_string(),
                "0.9.2342.19200300.100.1.1" => "UID".to_string(),
                other => other.to_string(),
            };
            let value = match atv.as_str() {
                Ok(s) => escape(s),
                // Not a string type: RFC 2253's #hex of the DER value.
                Err(_) => {
                    let bytes = atv.attr_value().as_bytes();
                    format!(
                        "#{}",
                        bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()
                    )
                }
            };
            parts.push(format!("{name}={value}"));
        }
        rdns.push(parts.join("+"));
    }
    rdns.reverse();
    Some(rdns.join(","))
}

/// The subject alternative names of a DER certificate, sorted, as text
/// (Kafka compares them when a listener's keystore is replaced).
pub(crate) fn subject_alt_names(der: &[u8]) -> Option<Vec<String>> {
    use x509_parser::prelude::*;
    let (_, cert) = X509Certificate::from_der(der).ok()?;
    let mut names: Vec<String> = match cert.subject_alternative_name().ok()? {
        Some(ext) => ext
            .value
            .general_names
            .iter()
            .map(|n| n.to_string())
            .collect(),
        None => Vec::new(),
    };
    names.sort();
    Some(names)
}

fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let last = s.chars().count().saturating_sub(1);
    for (i, c) in s.chars().enumerate() {
        let special = matches!(c, ',' | '+' | '"' | '\\' | '<' | '>' | ';')
            || (i == 0 && (c == ' ' || c == '#'))
            || (i == last && c == ' ');
        if special {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc2253_escapes_specials() {
        assert_eq!(escape("a,b"), "a\\,b");
        assert_eq!(escape(" x "), "\\ x\\ ");
        assert_eq!(escape("#1"), "\\#1");
        assert_eq!(escape("plain"), "plain");
    }
}

#[cfg(test)]
mod cert_tests {
    use super::*;
    use std::process::Command;

    /// The subject as Java's X500Principal.getName() writes it: last RDN first.
    #[test]
    fn subject_of_an_openssl_certificate_in_rfc2253_order() {
        let dir = tempfile::tempdir().unwrap();
        let (key, pem) = (dir.path().join("k.pem"), dir.path().join("c.pem"));
        let ok = Command::new("openssl")
            .args([
                "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            ])
            .args(["-subj", "/C=US/O=Strata, Inc/OU=it/CN=client-1"])
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&pem)
            .output()
            .unwrap();
        assert!(
            ok.status.success(),
            "{}",
            String::from_utf8_lossy(&ok.stderr)
        );
        let der = CertificateDer::from_pem_file(&pem).unwrap();
        assert_eq!(
            subject_dn(&der).unwrap(),
            "CN=client-1,OU=it,O=Strata\\, Inc,C=US"
        );
        assert!(server_config(&pem, &key, None, ClientAuth::None).is_ok());
        assert!(server_config(&pem, &key, None, ClientAuth::Required).is_err());
        assert!(server_config(&pem, &key, Some(&pem), ClientAuth::Required).is_ok());
    }
}
