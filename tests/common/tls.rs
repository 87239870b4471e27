//! Throwaway certificates made with openssl for the TLS tests.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A CA and a certificate signed by it for localhost and 127.0.0.1, usable
/// by a server and as a client certificate (subject `CN=localhost`).
pub struct Certs {
    _dir: tempfile::TempDir,
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Certs {
    /// A PEM file with the key then the certificate: Kafka's PEM keystore.
    pub fn keystore(&self) -> PathBuf {
        let path = self.cert.with_file_name("keystore.pem");
        let mut pem = std::fs::read(&self.key).unwrap();
        pem.extend(std::fs::read(&self.cert).unwrap());
        std::fs::write(&path, pem).unwrap();
        path
    }
}

pub fn certs() -> Certs {
    certs_with_subject("/CN=localhost")
}

/// Like [`certs`], with the certificate's subject `subject` (openssl's form).
pub fn certs_with_subject(subject: &str) -> Certs {
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n);
    let run = |args: &[&str]| {
        let out = Command::new("openssl").args(args).output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let s = |p: &Path| p.to_str().unwrap().to_string();
    let (ca, ca_key, cert, key, csr, ext) = (
        s(&p("ca.pem")),
        s(&p("ca.key")),
        s(&p("broker.pem")),
        s(&p("broker.key")),
        s(&p("broker.csr")),
        s(&p("ext")),
    );
    std::fs::write(
        &ext,
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n\
         keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\n",
    )
    .unwrap();
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=strata test ca",
        "-keyout",
        &ca_key,
        "-out",
        &ca,
    ]);
    run(&[
        "req", "-newkey", "rsa:2048", "-nodes", "-subj", subject, "-keyout", &key, "-out", &csr,
    ]);
    run(&[
        "x509",
        "-req",
        "-in",
        &csr,
        "-CA",
        &ca,
        "-CAkey",
        &ca_key,
        "-CAcreateserial",
        "-days",
        "2",
        "-out",
        &cert,
        "-extfile",
        &ext,
    ]);
    Certs {
        ca: ca.into(),
        cert: cert.into(),
        key: key.into(),
        _dir: dir,
    }
}
