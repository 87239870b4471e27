//! SASL/SCRAM over a raw connection, as a Kafka client does it, with SCRAM
//! extensions (`tokenauth=true` for delegation tokens), which librdkafka
//! does not send.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use bytes::Bytes;
use hmac::{Hmac, Mac};
use kafka_protocol::messages::{
    ApiKey, SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest,
    SaslHandshakeResponse,
};
use kafka_protocol::protocol::StrBytes;
use sha2::{Digest, Sha256, Sha512};

use super::Raw;

fn hmac(sha512: bool, key: &[u8], data: &[u8]) -> Vec<u8> {
    if sha512 {
        let mut m = <Hmac<Sha512> as Mac>::new_from_slice(key).unwrap();
        m.update(data);
        m.finalize().into_bytes().to_vec()
    } else {
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key).unwrap();
        m.update(data);
        m.finalize().into_bytes().to_vec()
    }
}

/// Authenticates `raw` with `mechanism` (SCRAM-SHA-256 or -512); the
/// SaslAuthenticate answer that ended the exchange (error code 0 on success).
pub async fn authenticate(
    raw: &mut Raw,
    mechanism: &str,
    user: &str,
    password: &str,
    extensions: &str,
) -> SaslAuthenticateResponse {
    let sha512 = mechanism == "SCRAM-SHA-512";
    let hs: SaslHandshakeResponse = raw
        .call(
            ApiKey::SaslHandshake,
            1,
            &SaslHandshakeRequest::default()
                .with_mechanism(StrBytes::from_string(mechanism.to_string())),
        )
        .await;
    assert_eq!(hs.error_code, 0, "handshake");
    let nonce = "fyko+d2lbbFgONRv9qkxdawL";
    let mut first_bare = format!(
        "n={},r={nonce}",
        user.replace('=', "=3D").replace(',', "=2C")
    );
    if !extensions.is_empty() {
        first_bare = format!("{first_bare},{extensions}");
    }
    let resp: SaslAuthenticateResponse = raw
        .call(
            ApiKey::SaslAuthenticate,
            2,
            &SaslAuthenticateRequest::default()
                .with_auth_bytes(Bytes::from(format!("n,,{first_bare}"))),
        )
        .await;
    if resp.error_code != 0 {
        return resp;
    }
    let server_first = String::from_utf8(resp.auth_bytes.to_vec()).unwrap();
    let attr = |k: &str| {
        server_first
            .split(',')
            .find_map(|p| p.strip_prefix(k))
            .unwrap()
            .to_string()
    };
    let (r, s, i) = (attr("r="), attr("s="), attr("i="));
    let salt = STANDARD.decode(s).unwrap();
    let iterations: u32 = i.parse().unwrap();
    let mut salted = vec![0u8; if sha512 { 64 } else { 32 }];
    if sha512 {
        pbkdf2::pbkdf2_hmac::<Sha512>(password.as_bytes(), &salt, iterations, &mut salted);
    } else {
        pbkdf2::pbkdf2_hmac::<Sha256>(password.as_bytes(), &salt, iterations, &mut salted);
    }
    let client_key = hmac(sha512, &salted, b"Client Key");
    let stored = if sha512 {
        Sha512::digest(&client_key).to_vec()
    } else {
        Sha256::digest(&client_key).to_vec()
    };
    let without_proof = format!("c=biws,r={r}");
    let auth = format!("{first_bare},{server_first},{without_proof}");
    let sig = hmac(sha512, &stored, auth.as_bytes());
    let proof: Vec<u8> = client_key.iter().zip(&sig).map(|(a, b)| a ^ b).collect();
    let last = format!("{without_proof},p={}", STANDARD.encode(proof));
    raw.call(
        ApiKey::SaslAuthenticate,
        2,
        &SaslAuthenticateRequest::default().with_auth_bytes(Bytes::from(last)),
    )
    .await
}

/// The SCRAM password of a delegation token: its HMAC in base64.
pub fn token_password(hmac: &[u8]) -> String {
    STANDARD.encode(hmac)
}
