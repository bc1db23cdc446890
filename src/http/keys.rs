//! The server's subscription keys: the Ed25519 key that signs webhooks and the secret that
//! signs callback and claim tokens (PROTOCOL.md 6.5, 7.1, 12.9, 12.10).
//!
//! Both are generated from the operating system's random source on first start and kept in
//! `<data-dir>/keys/` with owner-only permissions (0600, the directory 0700):
//! `webhook-ed25519.key` (the 32-byte Ed25519 seed) and `token-hmac.key` (32 bytes). Each is
//! written to a temporary file, synced, renamed into place and its directory synced, so a crash
//! leaves either no key (a new one is made) or the whole key. The `kid` is `ds_` and the RFC
//! 7638 thumbprint of the public key, so it is stable for the key's lifetime.
//!
//! A token is `base64url(payload).base64url(HMAC-SHA256(secret, payload))`, its payload the JSON
//! `{"sub","root","gen","wid","exp"}`: the subscription (its id, and the root that owns it),
//! generation and wake it was issued for, and its expiry (ms since the epoch). Tokens issued
//! before ids were scoped to their root have no `root`; they are taken as they were (their wake
//! id, 96 random bits, still fences them to their own subscription's wake). Verifying needs no server state, so a replayed token is
//! recognized by comparing its generation and wake id with the subscription's current ones.

use std::io::Write;
use std::path::Path;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use ed25519_dalek::{Signer, SigningKey};
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

/// How long a token stays valid after it is issued: 1 hour plus the lease (a token outlives
/// its wake; fencing, not expiry, is what refuses a stale one).
pub(crate) const TOKEN_LIFETIME_MS: u64 = 3_600_000;

/// The signing key, its `kid`, and the token secret.
pub(crate) struct Keys {
    signing: SigningKey,
    kid: String,
    secret: [u8; 32],
}

/// Why a token was refused.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum TokenError {
    /// Malformed, or its signature does not verify.
    Invalid,
    /// Past its expiry.
    Expired,
}

/// What a valid token was issued for.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct TokenClaims {
    /// The subscription's id.
    pub(crate) sub: String,
    /// The subscription's root; `None` in a token issued before roots were named.
    pub(crate) root: Option<String>,
    /// The generation.
    pub(crate) generation: u64,
    /// The wake id.
    pub(crate) wake_id: String,
}

/// Reads the 32-byte key `name` in `dir`, or makes, stores and returns a new one.
fn key_file(dir: &Path, name: &str) -> std::io::Result<[u8; 32]> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join(name);
    match std::fs::read(&path) {
        Ok(bytes) => {
            return <[u8; 32]>::try_from(bytes.as_slice()).map_err(|_| {
                std::io::Error::other(format!("{} is not a 32-byte key", path.display()))
            });
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let mut key = [0u8; 32];
    getrandom::getrandom(&mut key).map_err(|e| std::io::Error::other(e.to_string()))?;
    let tmp = dir.join(format!("{name}.tmp"));
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(&key)?;
    f.sync_all()?;
    std::fs::rename(&tmp, &path)?;
    std::fs::File::open(dir)?.sync_all()?;
    Ok(key)
}

impl Keys {
    /// Loads the keys from `<data_dir>/keys/`, generating any that are missing.
    pub(crate) fn load_or_create(data_dir: &Path) -> std::io::Result<Keys> {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        let dir = data_dir.join("keys");
        if !dir.exists() {
            std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
            std::fs::File::open(data_dir)?.sync_all()?;
        }
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
        let seed = key_file(&dir, "webhook-ed25519.key")?;
        let secret = key_file(&dir, "token-hmac.key")?;
        let signing = SigningKey::from_bytes(&seed);
        let x = B64.encode(signing.verifying_key().to_bytes());
        // RFC 7638: the SHA-256 of the required members in lexicographic order, no spaces.
        let thumb = Sha256::digest(format!(r#"{{"crv":"Ed25519","kty":"OKP","x":"{x}"}}"#));
        let kid = format!("ds_{}", B64.encode(&thumb[..16]));
        Ok(Keys {
            signing,
            kid,
            secret,
        })
    }

    /// The signing key's id.
    pub(crate) fn kid(&self) -> &str {
        &self.kid
    }

    /// The JWK Set of the public signing key.
    pub(crate) fn jwks(&self) -> serde_json::Value {
        serde_json::json!({
            "keys": [{
                "kty": "OKP",
                "crv": "Ed25519",
                "kid": self.kid,
                "use": "sig",
                "alg": "EdDSA",
                "x": B64.encode(self.signing.verifying_key().to_bytes()),
            }]
        })
    }

    /// The `Webhook-Signature` value for `body` sent at `t` (Unix seconds): an Ed25519
    /// signature over `"<t>.<body>"`.
    pub(crate) fn webhook_signature(&self, t: u64, body: &[u8]) -> String {
        let mut msg = Vec::with_capacity(body.len() + 21);
        msg.extend_from_slice(t.to_string().as_bytes());
        msg.push(b'.');
        msg.extend_from_slice(body);
        let sig = self.signing.sign(&msg);
        format!(
            "t={t},kid={},ed25519={}",
            self.kid,
            B64.encode(sig.to_bytes())
        )
    }

    fn mac(&self) -> Hmac<Sha256> {
        <Hmac<Sha256> as Mac>::new_from_slice(&self.secret).expect("HMAC takes keys of any length")
    }

    /// A token for the subscription `sub` under `root`, its `generation` and `wake_id`,
    /// expiring at `exp_ms`.
    pub(crate) fn token(
        &self,
        sub: &str,
        root: &str,
        generation: u64,
        wake_id: &str,
        exp_ms: u64,
    ) -> String {
        let payload = serde_json::json!(
            {"sub": sub, "root": root, "gen": generation, "wid": wake_id, "exp": exp_ms}
        )
        .to_string();
        let mut mac = self.mac();
        mac.update(payload.as_bytes());
        let tag = mac.finalize().into_bytes();
        format!("{}.{}", B64.encode(payload), B64.encode(tag))
    }

    /// Verifies a token's signature and expiry (`now_ms`), returning what it was issued for.
    pub(crate) fn verify_token(&self, token: &str, now_ms: u64) -> Result<TokenClaims, TokenError> {
        let (payload, tag) = token.split_once('.').ok_or(TokenError::Invalid)?;
        let payload = B64.decode(payload).map_err(|_| TokenError::Invalid)?;
        let tag = B64.decode(tag).map_err(|_| TokenError::Invalid)?;
        let mut mac = self.mac();
        mac.update(&payload);
        mac.verify_slice(&tag).map_err(|_| TokenError::Invalid)?;
        let v: serde_json::Value =
            serde_json::from_slice(&payload).map_err(|_| TokenError::Invalid)?;
        let field = |k: &str| v.get(k).ok_or(TokenError::Invalid);
        let exp = field("exp")?.as_u64().ok_or(TokenError::Invalid)?;
        let claims = TokenClaims {
            sub: field("sub")?
                .as_str()
                .ok_or(TokenError::Invalid)?
                .to_owned(),
            root: match v.get("root") {
                None => None,
                Some(r) => Some(r.as_str().ok_or(TokenError::Invalid)?.to_owned()),
            },
            generation: field("gen")?.as_u64().ok_or(TokenError::Invalid)?,
            wake_id: field("wid")?
                .as_str()
                .ok_or(TokenError::Invalid)?
                .to_owned(),
        };
        if exp <= now_ms {
            return Err(TokenError::Expired);
        }
        Ok(claims)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_persist_with_owner_only_modes_and_a_stable_kid() -> std::io::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir()?;
        let a = Keys::load_or_create(dir.path())?;
        let b = Keys::load_or_create(dir.path())?;
        assert_eq!(a.kid(), b.kid());
        assert!(a.kid().starts_with("ds_"));
        for f in ["webhook-ed25519.key", "token-hmac.key"] {
            let mode = std::fs::metadata(dir.path().join("keys").join(f))?
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600, "{f}");
        }
        let token = a.token("s", "v1/", 3, "w_1", 1000);
        assert_eq!(
            b.verify_token(&token, 999),
            Ok(TokenClaims {
                sub: "s".into(),
                root: Some("v1/".into()),
                generation: 3,
                wake_id: "w_1".into()
            })
        );
        assert_eq!(b.verify_token(&token, 1000), Err(TokenError::Expired));
        let mut forged = token.clone();
        forged.insert(3, 'x');
        assert_eq!(b.verify_token(&forged, 0), Err(TokenError::Invalid));
        let other = Keys::load_or_create(tempfile::tempdir()?.path())?;
        assert_eq!(other.verify_token(&token, 0), Err(TokenError::Invalid));
        Ok(())
    }

    #[test]
    fn signatures_verify_over_timestamp_dot_body() -> std::io::Result<()> {
        use ed25519_dalek::Verifier;
        let dir = tempfile::tempdir()?;
        let k = Keys::load_or_create(dir.path())?;
        let header = k.webhook_signature(1_700_000_000, b"{\"a\":1}");
        let sig = header
            .rsplit_once("ed25519=")
            .map(|(_, s)| s)
            .expect("has a signature");
        let sig = ed25519_dalek::Signature::from_slice(&B64.decode(sig).expect("base64url"))
            .expect("64 bytes");
        let vk = k.signing.verifying_key();
        assert!(vk.verify(b"1700000000.{\"a\":1}", &sig).is_ok());
        assert!(vk.verify(b"1700000001.{\"a\":1}", &sig).is_err());
        Ok(())
    }
}
