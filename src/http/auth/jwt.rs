//! JWT access tokens (RFC 9068 style): one key and algorithm, the audience and optionally the
//! issuer they must name, `exp` required and exact, `nbf` checked; the grants are the `scope`
//! claim's `<right>:<prefix>` items.

use std::fmt;
use std::io;
use std::time::{Duration, UNIX_EPOCH};

use super::{Grant, Principal, Refusal, Right, normalize_prefix};

/// The signature algorithms a JWT key may be for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JwtAlgorithm {
    /// HMAC with SHA-256: the key file holds the shared secret (trailing whitespace dropped).
    Hs256,
    /// RSA PKCS#1 v1.5 with SHA-256: the key file holds the PEM public key.
    Rs256,
    /// Ed25519: the key file holds the PEM public key.
    EdDsa,
}

impl std::str::FromStr for JwtAlgorithm {
    type Err = String;

    /// `HS256`, `RS256` or `EdDSA` (case-insensitive).
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_uppercase().as_str() {
            "HS256" => Ok(JwtAlgorithm::Hs256),
            "RS256" => Ok(JwtAlgorithm::Rs256),
            "EDDSA" => Ok(JwtAlgorithm::EdDsa),
            _ => Err(format!(
                "unknown JWT algorithm {s:?} (HS256, RS256 or EdDSA)"
            )),
        }
    }
}

/// The key JWTs are verified with, the audience they must name, and optionally their issuer.
#[derive(Clone)]
pub struct JwtKey {
    /// The verification key.
    key: jsonwebtoken::DecodingKey,
    /// The only algorithm accepted (a token naming another is refused).
    algorithm: jsonwebtoken::Algorithm,
    /// The `aud` a token must carry.
    audience: String,
    /// The `iss` a token must carry, when set.
    issuer: Option<String>,
}

impl fmt::Debug for JwtKey {
    /// The algorithm, audience and issuer; never the key.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JwtKey")
            .field("algorithm", &self.algorithm)
            .field("audience", &self.audience)
            .field("issuer", &self.issuer)
            .finish_non_exhaustive()
    }
}

impl JwtKey {
    /// A key for `algorithm` from `bytes` (the HS256 secret, or a PEM public key), accepting
    /// tokens whose `aud` is `audience`.
    pub fn new(algorithm: JwtAlgorithm, bytes: &[u8], audience: &str) -> io::Result<JwtKey> {
        use jsonwebtoken::{Algorithm, DecodingKey};
        let bad = |e: jsonwebtoken::errors::Error| {
            io::Error::new(io::ErrorKind::InvalidData, format!("JWT key: {e}"))
        };
        let (key, algorithm) = match algorithm {
            JwtAlgorithm::Hs256 => {
                let secret = bytes.trim_ascii_end();
                if secret.len() < 32 {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "JWT key: an HS256 secret must be at least 32 bytes",
                    ));
                }
                (DecodingKey::from_secret(secret), Algorithm::HS256)
            }
            JwtAlgorithm::Rs256 => (
                DecodingKey::from_rsa_pem(bytes).map_err(bad)?,
                Algorithm::RS256,
            ),
            JwtAlgorithm::EdDsa => (
                DecodingKey::from_ed_pem(bytes).map_err(bad)?,
                Algorithm::EdDSA,
            ),
        };
        Ok(JwtKey {
            key,
            algorithm,
            audience: audience.to_owned(),
            issuer: None,
        })
    }

    /// Also require `iss` to be `issuer`.
    #[must_use]
    pub fn with_issuer(mut self, issuer: &str) -> JwtKey {
        self.issuer = Some(issuer.to_owned());
        self
    }

    /// The token's grants and expiry, or why it is refused.
    pub(super) fn verify(&self, token: &str) -> Result<Principal, Refusal> {
        use jsonwebtoken::errors::ErrorKind;
        /// The claims brook reads; the others (sub, jti, ...) are the issuer's business.
        #[derive(serde::Deserialize)]
        struct Claims {
            /// Seconds since the epoch: any `u64`, even one past what the clocks can hold.
            exp: u64,
            /// Seconds since the epoch; read only so that one that is no `u64` is refused
            /// (jsonwebtoken checks it only when it parses).
            #[serde(default, rename = "nbf")]
            _nbf: Option<u64>,
            /// Space-separated `<right>:<prefix>` items (unknown items are ignored).
            #[serde(default)]
            scope: String,
        }
        let mut v = jsonwebtoken::Validation::new(self.algorithm);
        v.set_audience(&[&self.audience]);
        if let Some(iss) = &self.issuer {
            v.set_issuer(&[iss]);
        }
        v.set_required_spec_claims(&["exp", "aud"]);
        v.validate_nbf = true;
        // The expiry is exact: a live read ends at `exp`, and so does the token's admission.
        v.leeway = 0;
        let data =
            jsonwebtoken::decode::<Claims>(token, &self.key, &v).map_err(|e| match e.kind() {
                ErrorKind::ExpiredSignature => Refusal::Expired,
                ErrorKind::InvalidAudience => {
                    Refusal::Invalid("the token's audience is not this server")
                }
                ErrorKind::ImmatureSignature => {
                    Refusal::Invalid("the token is not valid yet (nbf)")
                }
                ErrorKind::InvalidSignature => {
                    Refusal::Invalid("the token's signature does not verify")
                }
                ErrorKind::InvalidAlgorithm => {
                    Refusal::Invalid("the token is signed with another algorithm")
                }
                _ => Refusal::Invalid("the token is not a valid JWT for this server"),
            })?;
        let mut grants = Vec::new();
        for item in data.claims.scope.split_whitespace() {
            let Some((right, prefix)) = item.split_once(':') else {
                continue;
            };
            if let Some(right) = Right::parse(right) {
                grants.push(Grant {
                    prefix: normalize_prefix(prefix),
                    rights: right as u8,
                });
            }
        }
        Ok(Principal {
            grants,
            // An `exp` past what `SystemTime` can hold (up to 2^64-1 s) is a token that does
            // not expire on this server's clock.
            expires: UNIX_EPOCH.checked_add(Duration::from_secs(data.claims.exp)),
        })
    }
}
