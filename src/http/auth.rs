//! Access control for [`serve`](super::serve) and [`router`](super::router) (off unless
//! [`ServerConfig::access`](super::ServerConfig::access) is set; the embedded [`Store`] API never
//! sees it).
//!
//! A request needs one right on the stream it addresses (a fork also needs `read` on its
//! source): `read` for GET and HEAD of a stream (catch-up, long-poll, SSE), snapshot reads and
//! bootstrap; `write` for appends and closes (POST); `admin` for creating or forking (PUT),
//! deleting, publishing or deleting snapshots, retention, and every route under the reserved
//! prefixes `/__ds/` and `/__brook/` ([`reserved_route_needs`]). A grant is a right on a
//! stream-name prefix (a plain string prefix: `chat/` covers `chat/room-1`; the empty prefix
//! covers every stream). Rights are independent: `admin` does not imply `read`.
//!
//! Credentials are bearer tokens, in `Authorization: Bearer <token>` or, for clients that
//! cannot set headers (a browser's `EventSource`), an `access_token` query parameter (RFC 6750
//! 2.3). A token is either listed in a token file (only its SHA-256 is stored; the file is
//! reloaded when it changes) or a JWT verified with one configured key (HS256, RS256 or `EdDSA`;
//! `exp` required, `nbf` and `aud` checked), whose grants are the RFC 9068 `scope` claim's
//! space-separated `<right>:<prefix>` items. Prefixes listed as public readable need no token
//! for reads.
//!
//! Refusals are problem+json: 401 `UNAUTHORIZED` (no token), 401 `INVALID_TOKEN` (unknown,
//! malformed, badly signed, wrong audience, not yet valid), 401 `TOKEN_EXPIRED`, each with
//! `WWW-Authenticate: Bearer`; 403 `FORBIDDEN` outside the token's grants. A live read (SSE,
//! long-poll) admitted with an expiring token ends at the expiry: SSE with a final
//! `event: credential-expired`, a waiting long-poll with 401 `TOKEN_EXPIRED`. A catch-up read
//! admitted by a token is cached `private`, never `public`.

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::Response;
use parking_lot::{Mutex, RwLock};
use sha2::{Digest, Sha256};

use crate::StreamName;

use super::reply::problem;
use super::request::query_params;
use super::route::{Route, parse_route};

/// One right; a set of them is a bit mask.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Right {
    /// Reads of a stream, its snapshots and its bootstrap.
    Read = 1,
    /// Appends and closes.
    Write = 2,
    /// Create, fork, delete, snapshot publish and delete, retention, reserved routes.
    Admin = 4,
}

impl Right {
    /// The right named `s` (`read`, `write`, `admin`).
    fn parse(s: &str) -> Option<Right> {
        match s {
            "read" => Some(Right::Read),
            "write" => Some(Right::Write),
            "admin" => Some(Right::Admin),
            _ => None,
        }
    }

    /// The right's name.
    fn name(self) -> &'static str {
        match self {
            Right::Read => "read",
            Right::Write => "write",
            Right::Admin => "admin",
        }
    }
}

/// Rights on the streams whose names start with `prefix`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Grant {
    /// The stream-name prefix (no leading `/`; empty for every stream).
    prefix: String,
    /// The rights, a mask of [`Right`]s.
    rights: u8,
}

/// What a valid token grants.
#[derive(Clone, Debug)]
struct Principal {
    /// Its grants.
    grants: Vec<Grant>,
    /// When it stops being valid (a JWT's `exp`); `None` for a listed token.
    expires: Option<SystemTime>,
}

/// Whether some grant gives `right` on `name`.
fn allows(grants: &[Grant], right: Right, name: &str) -> bool {
    grants
        .iter()
        .any(|g| g.rights & right as u8 != 0 && name.starts_with(&g.prefix))
}

/// When the credential that admitted a request expires: put in the request's extensions for the
/// live readers, which end then.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CredentialExpiry(pub(crate) SystemTime);

impl CredentialExpiry {
    /// The expiry as a deadline on tokio's clock.
    pub(crate) fn deadline(self) -> tokio::time::Instant {
        let left = self
            .0
            .duration_since(SystemTime::now())
            .unwrap_or(Duration::ZERO);
        tokio::time::Instant::now() + left
    }
}

/// A stream-name prefix as written in a token file, a scope item or `--public-read`: a leading
/// `/` is dropped (so `/` alone is every stream).
fn normalize_prefix(p: &str) -> String {
    p.strip_prefix('/').unwrap_or(p).to_owned()
}

/// The SHA-256 of a token, as a token file stores it: `sha256:<64 lowercase hex>`.
pub fn token_hash(token: &str) -> String {
    use std::fmt::Write as _;
    let digest = Sha256::digest(token.as_bytes());
    let mut out = String::with_capacity(71);
    out.push_str("sha256:");
    for b in digest {
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// Checks one token-file line as the server would read it; the error says what is wrong.
pub fn check_token_line(line: &str) -> Result<(), String> {
    parse_token_file(line).map(drop)
}

/// The parsed lines of a token file: SHA-256 of each token to its grants.
type TokenTable = HashMap<[u8; 32], Vec<Grant>>;

/// Parses a token file (format in docs/http.md): `sha256:<hex> <rights> <prefix>...` per line,
/// `#` comments and blank lines ignored. The first bad line fails the whole file.
fn parse_token_file(text: &str) -> Result<TokenTable, String> {
    let mut table = TokenTable::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let bad = |why: &str| format!("line {}: {why}", n + 1);
        let mut words = line.split_whitespace();
        let hash = words.next().unwrap_or("");
        let hex = hash
            .strip_prefix("sha256:")
            .ok_or_else(|| bad("a token is `sha256:<64 hex digits>` (see `brook token hash`)"))?;
        let digest = decode_hex32(hex).ok_or_else(|| bad("the hash is not 64 hex digits"))?;
        let rights = parse_rights(words.next().unwrap_or(""))
            .ok_or_else(|| bad("rights are a comma-separated list of read, write, admin"))?;
        let prefixes: Vec<&str> = words.collect();
        if prefixes.is_empty() {
            return Err(bad("no stream-name prefix (`/` for every stream)"));
        }
        let grants = table.entry(digest).or_default();
        for p in prefixes {
            grants.push(Grant {
                prefix: normalize_prefix(p),
                rights,
            });
        }
    }
    Ok(table)
}

/// A comma-separated list of rights as a mask; `None` when empty or with an unknown name.
fn parse_rights(s: &str) -> Option<u8> {
    let mut mask = 0;
    for name in s.split(',') {
        mask |= Right::parse(name.trim())? as u8;
    }
    (mask != 0).then_some(mask)
}

/// 64 hex digits as 32 bytes.
fn decode_hex32(hex: &str) -> Option<[u8; 32]> {
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// A token file and the table last read from it.
struct TokenFile {
    /// The file.
    path: PathBuf,
    /// Its parsed content.
    table: RwLock<TokenTable>,
    /// Its modification time and length when last read.
    seen: Mutex<Option<(SystemTime, u64)>>,
}

/// A file's modification time and length.
fn stamp_of(path: &Path) -> Option<(SystemTime, u64)> {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

/// Reads and parses a token file.
fn read_token_file(path: &Path) -> io::Result<TokenTable> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
    parse_token_file(&text).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: {e}", path.display()),
        )
    })
}

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
    fn verify(&self, token: &str) -> Result<Principal, Refusal> {
        use jsonwebtoken::errors::ErrorKind;
        /// The claims brook reads; the others (sub, jti, ...) are the issuer's business.
        #[derive(serde::Deserialize)]
        struct Claims {
            /// Seconds since the epoch.
            exp: u64,
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
            expires: Some(UNIX_EPOCH + Duration::from_secs(data.claims.exp)),
        })
    }
}

/// Who may do what on which streams: token files, a JWT key and public-read prefixes. Put one in
/// [`ServerConfig::access`](super::ServerConfig::access) to turn access control on.
#[derive(Default)]
pub struct AccessControl {
    /// Listed tokens, when a file is configured.
    tokens: Option<TokenFile>,
    /// The JWT key, when configured.
    jwt: Option<JwtKey>,
    /// Prefixes anyone may read.
    public_read: Vec<String>,
}

impl fmt::Debug for AccessControl {
    /// The token file's path, the JWT key's settings and the public prefixes; never a secret.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AccessControl")
            .field("tokens", &self.tokens.as_ref().map(|t| &t.path))
            .field("jwt", &self.jwt)
            .field("public_read", &self.public_read)
            .finish()
    }
}

impl AccessControl {
    /// Access control that admits nobody until tokens, a JWT key or public prefixes are added.
    pub fn new() -> AccessControl {
        AccessControl::default()
    }

    /// Accept the tokens listed in `path` (format in docs/http.md). Fails when the file cannot
    /// be read or has a bad line (its number is in the message). [`serve`](super::serve)
    /// reloads the file when it changes (checked every
    /// [`RELOAD_CHECK_EVERY`](super::RELOAD_CHECK_EVERY)); behind [`router`](super::router),
    /// call [`AccessControl::reload_tokens`] to do so.
    pub fn with_token_file(mut self, path: impl Into<PathBuf>) -> io::Result<AccessControl> {
        let path = path.into();
        let seen = stamp_of(&path);
        let table = read_token_file(&path)?;
        self.tokens = Some(TokenFile {
            path,
            table: RwLock::new(table),
            seen: Mutex::new(seen),
        });
        Ok(self)
    }

    /// Accept JWTs verified with `key`.
    #[must_use]
    pub fn with_jwt(mut self, key: JwtKey) -> AccessControl {
        self.jwt = Some(key);
        self
    }

    /// Let anyone, without a token, read the streams whose names start with `prefix`.
    #[must_use]
    pub fn with_public_read(mut self, prefix: &str) -> AccessControl {
        self.public_read.push(normalize_prefix(prefix));
        self
    }

    /// Reads the token file again if it changed since it was last read; `Ok(true)` when the new
    /// list is in force. A file that fails to read or parse keeps the list in force.
    pub fn reload_tokens(&self) -> io::Result<bool> {
        let Some(file) = &self.tokens else {
            return Ok(false);
        };
        let now = stamp_of(&file.path);
        {
            let mut seen = file.seen.lock();
            if *seen == now {
                return Ok(false);
            }
            *seen = now;
        }
        let table = read_token_file(&file.path)?;
        *file.table.write() = table;
        Ok(true)
    }

    /// Admits or refuses a request; on admission, notes the credential's expiry in the
    /// request's extensions (for live reads) and returns whether a token admitted it.
    pub(crate) fn admit(&self, parts: &mut Parts) -> Result<Admitted, Refusal> {
        let Ok(route) = parse_route(parts.uri.path()) else {
            // An invalid path is answered 400 by the route itself: no stream is touched.
            return Ok(Admitted::Public);
        };
        let needs = needs(&route, &parts.method, &parts.headers);
        let public = needs.each().all(|(right, name)| {
            right == Right::Read
                && self
                    .public_read
                    .iter()
                    .any(|p| name.starts_with(p.as_str()))
        });
        if public {
            return Ok(Admitted::Public);
        }
        let expires = self.authorize(parts, &needs)?;
        if let Some(at) = expires {
            parts.extensions.insert(CredentialExpiry(at));
        }
        Ok(Admitted::Token)
    }

    /// Checks that the request's bearer token grants every one of `needs`; returns its expiry.
    fn authorize(&self, parts: &Parts, needs: &Needs<'_>) -> Result<Option<SystemTime>, Refusal> {
        let forbidden = |(right, name): (Right, &str)| {
            Refusal::Forbidden(if name.is_empty() {
                format!("the token does not grant {} on this route", right.name())
            } else {
                format!("the token does not grant {} on {name}", right.name())
            })
        };
        let token = bearer(parts).ok_or(Refusal::Missing)?;
        // A JWT has two dots; a listed token is whatever `brook token new` made (no dots).
        if let Some(jwt) = &self.jwt
            && token.bytes().filter(|&b| b == b'.').count() == 2
        {
            let principal = jwt.verify(&token)?;
            if let Some(missing) = needs
                .each()
                .find(|(r, n)| !allows(&principal.grants, *r, n))
            {
                return Err(forbidden(missing));
            }
            return Ok(principal.expires);
        }
        let file = self
            .tokens
            .as_ref()
            .ok_or(Refusal::Invalid("unknown token"))?;
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let table = file.table.read();
        let grants = table
            .get(&digest)
            .ok_or(Refusal::Invalid("unknown token"))?;
        if let Some(missing) = needs.each().find(|(r, n)| !allows(grants, *r, n)) {
            return Err(forbidden(missing));
        }
        Ok(None)
    }
}

/// How an admitted request got in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Admitted {
    /// No token was needed (a public read, or a path that is no route).
    Public,
    /// A token's grants admitted it: its response must not be cached for others.
    Token,
}

/// The bearer token of a request: `Authorization: Bearer <t>`, else the `access_token` query
/// parameter.
fn bearer(parts: &Parts) -> Option<String> {
    if let Some(v) = parts.headers.get(header::AUTHORIZATION) {
        let v = v.to_str().ok()?;
        let (scheme, token) = v.split_once(' ')?;
        return (scheme.eq_ignore_ascii_case("bearer") && !token.trim().is_empty())
            .then(|| token.trim().to_owned());
    }
    query_params(parts)
        .into_iter()
        .find(|(k, _)| k == "access_token")
        .map(|(_, v)| v.into_owned())
        .filter(|t| !t.is_empty())
}

/// The rights a request needs: one on a stream name (empty for a reserved route), and a fork's
/// `read` on its source.
struct Needs<'a> {
    /// The right on the addressed stream (or route); `None` for a route anyone may use.
    first: Option<(Right, &'a str)>,
    /// `read` on the source of a fork.
    source: Option<StreamName>,
}

impl Needs<'_> {
    /// Each right with its stream name.
    fn each(&self) -> impl Iterator<Item = (Right, &str)> {
        self.first
            .into_iter()
            .chain(self.source.as_ref().map(|s| (Right::Read, s.as_str())))
    }
}

/// The rights a request on `route` needs (see the module doc's table).
fn needs<'a>(route: &'a Route, method: &Method, headers: &HeaderMap) -> Needs<'a> {
    let read_or = |other: Right| {
        if *method == Method::GET || *method == Method::HEAD {
            Right::Read
        } else {
            other
        }
    };
    let first = match route {
        Route::Stream(name) => {
            let right = match *method {
                Method::GET | Method::HEAD => Right::Read,
                Method::POST => Right::Write,
                _ => Right::Admin,
            };
            // A fork reads its source; an unparsable one is refused by the handler, after this.
            let source = (*method == Method::PUT)
                .then(|| headers.get(super::names::STREAM_FORKED_FROM))
                .flatten()
                .and_then(|v| v.to_str().ok())
                .and_then(|v| super::write::fork_source(v).ok());
            return Needs {
                first: Some((right, name.as_str())),
                source,
            };
        }
        Route::SnapshotLatest(name)
        | Route::Bootstrap(name)
        | Route::SnapshotAt(name, _)
        | Route::Retention(name, _) => Some((read_or(Right::Admin), name.as_str())),
        Route::Protocol(root, rest) => reserved_route_needs(Some(root), rest, method),
        Route::Admin(rest) => reserved_route_needs(None, rest, method),
    };
    Needs {
        first,
        source: None,
    }
}

/// The right a `{root}__ds/...` (`root` given) or `/__brook/...` route needs, on which prefix;
/// `None` (anyone) for what must be reachable without a bearer token of this server:
/// * the JWKS (webhook receivers fetch it to verify signatures), and a subscription's
///   `callback`, `ack` and `release` (authenticated by the subscription's own callback or claim
///   token, which the handler verifies);
/// * liveness and readiness (load balancers and orchestrators probe them).
///
/// Claiming a subscription's work (a pull-wake worker) needs `read` on the subscription's root;
/// reading, creating, deleting and linking subscriptions need `admin` there; the other
/// operations routes (metrics, listing) need `admin` on every stream.
fn reserved_route_needs<'a>(
    root: Option<&'a str>,
    rest: &str,
    method: &Method,
) -> Option<(Right, &'a str)> {
    let Some(root) = root else {
        return match rest {
            "live" | "ready" => None,
            _ => Some((Right::Admin, "")),
        };
    };
    if rest == "jwks.json" {
        return None;
    }
    let action = rest
        .strip_prefix("subscriptions/")
        .and_then(|r| r.split_once('/'))
        .map(|(_, action)| action);
    match action {
        Some("callback" | "ack" | "release") => None,
        Some("claim") if *method == Method::POST => Some((Right::Read, root)),
        _ => Some((Right::Admin, root)),
    }
}

/// Why a request is refused.
pub(crate) enum Refusal {
    /// No token.
    Missing,
    /// A token that is not valid here (the detail says why, without echoing it).
    Invalid(&'static str),
    /// A valid token past its expiry.
    Expired,
    /// A valid token that does not grant what the request needs.
    Forbidden(String),
}

impl Refusal {
    /// The problem+json response, with `WWW-Authenticate` on a 401, counted in `counters`.
    pub(crate) fn into_response(self, counters: &super::limits::EdgeCounters) -> Response {
        use std::sync::atomic::Ordering::Relaxed;
        match self {
            Refusal::Forbidden(_) => counters.forbidden.fetch_add(1, Relaxed),
            _ => counters.unauthorized.fetch_add(1, Relaxed),
        };
        let (status, code, detail, challenge) = match self {
            Refusal::Missing => (
                StatusCode::UNAUTHORIZED,
                "UNAUTHORIZED",
                "this route needs a bearer token (Authorization: Bearer <token>)".to_owned(),
                "Bearer realm=\"brook\"",
            ),
            Refusal::Invalid(why) => (
                StatusCode::UNAUTHORIZED,
                "INVALID_TOKEN",
                why.to_owned(),
                "Bearer realm=\"brook\", error=\"invalid_token\"",
            ),
            Refusal::Expired => return expired_response(),
            Refusal::Forbidden(detail) => {
                return problem(
                    StatusCode::FORBIDDEN,
                    "FORBIDDEN",
                    &detail,
                    HeaderMap::new(),
                    serde_json::Map::new(),
                );
            }
        };
        let mut headers = HeaderMap::new();
        headers.insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static(challenge),
        );
        problem(status, code, &detail, headers, serde_json::Map::new())
    }
}

/// 401 `TOKEN_EXPIRED`: at admission, or for a long-poll whose token expired while it waited.
pub(crate) fn expired_response() -> Response {
    let mut headers = HeaderMap::new();
    headers.insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static(
            "Bearer realm=\"brook\", error=\"invalid_token\", error_description=\"the token expired\"",
        ),
    );
    problem(
        StatusCode::UNAUTHORIZED,
        "TOKEN_EXPIRED",
        "the token expired",
        headers,
        serde_json::Map::new(),
    )
}

/// The final SSE frame of a connection whose credential expired (Ursula's shape): a client
/// tells it from the stream's end, gets a fresh token and resumes from its last offset.
pub(crate) const CREDENTIAL_EXPIRED_EVENT: &[u8] =
    b"event: credential-expired\ndata: {\"reason\":\"credential_expired\"}\n\n";

/// A response to a request a token admitted: a `public` cache directive becomes `private`, so
/// no shared cache hands it to someone without the token.
pub(crate) fn private_if_token(res: &mut super::reply::Answer, admitted: Admitted) {
    use super::reply::Answer;
    if admitted != Admitted::Token {
        return;
    }
    let value = match res {
        Answer::Typed(reply, _) => reply.fixed_mut(&header::CACHE_CONTROL),
        Answer::Built(res) => res.headers_mut().get_mut(header::CACHE_CONTROL),
    };
    let Some(value) = value else {
        return;
    };
    // Catch-up and long-poll reads' directive, replaced without formatting; any other
    // `public` one by the same rule.
    if value.as_bytes() == super::read::PUBLIC_CACHE.as_bytes() {
        *value = super::read::PRIVATE_CACHE;
    } else if let Some(rest) = value.as_bytes().strip_prefix(b"public") {
        let private = [b"private".as_slice(), rest].concat();
        if let Ok(v) = HeaderValue::from_bytes(&private) {
            *value = v;
        }
    }
}

/// Reloads `access`'s token file whenever it changes, checking every `every`, until the server
/// shuts down; a file that fails to load is logged and the list in force kept.
pub(crate) async fn watch(access: Arc<AccessControl>, every: Duration, app: super::AppState) {
    loop {
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            () = app.shutting_down() => return,
        }
        match access.reload_tokens() {
            Ok(true) => tracing::info!("access tokens reloaded"),
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(error = %e, "access tokens not reloaded; keeping the list in force");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Token-file lines parse into grants; every malformed line is refused with its number.
    #[test]
    fn token_files_parse_and_bad_lines_are_refused() {
        let h = token_hash("secret");
        let text = format!("# comment\n\n{h} read,write chat/ /logs/  # trailing\n");
        let table = parse_token_file(&text).expect("valid");
        let digest = decode_hex32(h.strip_prefix("sha256:").expect("prefix")).expect("hex");
        let grants = &table[&digest];
        assert_eq!(grants.len(), 2);
        assert_eq!(grants[1].prefix, "logs/");
        assert_eq!(grants[0].rights, Right::Read as u8 | Right::Write as u8);
        for bad in [
            "md5:00 read /".to_owned(),
            "sha256:abcd read /".to_owned(),
            format!("{h} delete /"),
            format!("{h} read"),
        ] {
            let err = parse_token_file(&format!("\n{bad}")).expect_err(&bad);
            assert!(err.starts_with("line 2:"), "{err}");
        }
    }

    /// Rights are per prefix and independent.
    #[test]
    fn grants_cover_their_prefix_and_right_only() {
        let p = Principal {
            grants: vec![
                Grant {
                    prefix: "chat/".into(),
                    rights: Right::Read as u8,
                },
                Grant {
                    prefix: String::new(),
                    rights: Right::Write as u8,
                },
            ],
            expires: None,
        };
        assert!(allows(&p.grants, Right::Read, "chat/a"));
        assert!(!allows(&p.grants, Right::Read, "chatter"));
        assert!(allows(&p.grants, Right::Write, "anything"));
        assert!(!allows(&p.grants, Right::Admin, "chat/a"));
    }
}
