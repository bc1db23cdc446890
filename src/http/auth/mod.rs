//! Access control for [`serve`](super::serve) and [`router`](super::router) (off unless
//! [`ServerConfig::access`](super::ServerConfig::access) is set; the embedded [`Store`] API never
//! sees it).
//!
//! A request needs one right on the stream it addresses (a fork also needs `read` on its
//! source): `read` for GET and HEAD of a stream (catch-up, long-poll, SSE), snapshot reads,
//! immutable incarnation reads (`{s}/incarnation/{token}/...`) and bootstrap; `write` for
//! appends and closes (POST); `admin` for creating or forking (PUT), deleting, publishing or
//! deleting snapshots, staging, committing or discarding snapshot parts, retention, and every
//! route under the reserved
//! prefixes `/__ds/` and `/__brook/` ([`reserved_route_needs`]). A grant is a right on a
//! stream-name prefix that ends at a path-segment boundary ([`covers`]): `app` covers `app` and
//! `app/x` but not `apple`, `chat/` covers `chat/room-1` but not `chat`, and the empty prefix
//! (`/`) covers every stream. Rights are independent: `admin` does not imply `read`.
//!
//! Credentials are bearer tokens, in `Authorization: Bearer <token>` or, for clients that
//! cannot set headers (a browser's `EventSource`), an `access_token` query parameter (RFC 6750
//! 2.3). A token is either listed in a token file ([`tokens`]: only its SHA-256 is stored; the
//! file is reloaded when it changes) or a JWT verified with one configured key ([`jwt`]: HS256,
//! RS256 or `EdDSA`; `exp` required, `nbf` and `aud` checked), whose grants are the RFC 9068
//! `scope` claim's space-separated `<right>:<prefix>` items. Prefixes listed as public readable
//! need no token for reads.
//!
//! Refusals are problem+json: 401 `UNAUTHORIZED` (no token), 401 `INVALID_TOKEN` (unknown,
//! malformed, badly signed, wrong audience, not yet valid), 401 `TOKEN_EXPIRED`, each with
//! `WWW-Authenticate: Bearer`; 403 `FORBIDDEN` outside the token's grants. A live read (SSE,
//! long-poll) admitted with an expiring token ends at the expiry: SSE with a final
//! `event: credential-expired`, a waiting long-poll with 401 `TOKEN_EXPIRED`. A catch-up read
//! admitted by a token is cached `private`, never `public`.
//!
//! A subscription belongs to its root (its id is scoped to it), so the subscription routes need
//! nothing of the token beyond the rights these checks require on that root. A staged snapshot
//! part's route gets the admitting token's grants ([`Grants`]), which name the tenant the part
//! is counted to.

mod jwt;
mod tokens;

use std::fmt;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::Response;
use parking_lot::{Mutex, RwLock};
use sha2::{Digest, Sha256};

pub use jwt::{JwtAlgorithm, JwtKey};
use tokens::{TokenFile, read_token_file, stamp_of};
pub use tokens::{check_token_line, token_hash};

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

/// Rights on the streams `prefix` [`covers`].
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

/// Whether `prefix` (normalized: no leading `/`) covers the stream `name`. A prefix ends at a
/// path-segment boundary, so that a grant on `app` is not one on `apple`: the empty prefix
/// covers every name; one ending in `/` covers the names that start with it (`chat/` covers
/// `chat/1`, not `chat`); any other covers itself and the names under it (`app` covers `app`
/// and `app/x`). A reserved route's root (`app/` of `/app/__ds/...`) is covered like a name.
fn covers(prefix: &str, name: &str) -> bool {
    name.strip_prefix(prefix).is_some_and(|rest| {
        prefix.is_empty() || prefix.ends_with('/') || rest.is_empty() || rest.starts_with('/')
    })
}

/// Whether some grant gives `right` on `name`.
fn allows(grants: &[Grant], right: Right, name: &str) -> bool {
    grants
        .iter()
        .any(|g| g.rights & right as u8 != 0 && covers(&g.prefix, name))
}

/// The grants of the token that admitted a request to stage a snapshot part, put in its
/// extensions when access control is on: they name the tenant the part is counted to.
#[derive(Clone, Debug)]
pub(crate) struct Grants(Arc<[Grant]>);

impl Grants {
    /// The tenant `name` belongs to for these grants: the longest prefix of a grant giving
    /// `admin` on it, without its trailing `/`; `None` when that is the empty prefix (a grant
    /// on every stream names no tenant).
    pub(crate) fn tenant_of(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .filter(|g| g.rights & Right::Admin as u8 != 0 && covers(&g.prefix, name))
            .map(|g| g.prefix.trim_end_matches('/'))
            .max_by_key(|p| p.len())
            .filter(|p| !p.is_empty())
    }
}

/// Expiries further away than this set live reads no deadline: none lasts that long, and an
/// instant near the end of tokio's range would overflow its timer's arithmetic.
const FAR_FUTURE: Duration = Duration::from_hours(100 * 365 * 24);

/// When the credential that admitted a request expires: put in the request's extensions for the
/// live readers, which end then.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CredentialExpiry(pub(crate) SystemTime);

impl CredentialExpiry {
    /// The expiry as a deadline on tokio's clock; `None` when it is more than [`FAR_FUTURE`]
    /// away (or past what the clock can hold): the credential outlives any live read.
    pub(crate) fn deadline(self) -> Option<tokio::time::Instant> {
        let left = self
            .0
            .duration_since(SystemTime::now())
            .unwrap_or(Duration::ZERO);
        if left > FAR_FUTURE {
            return None;
        }
        tokio::time::Instant::now().checked_add(left)
    }
}

/// A stream-name prefix as written in a token file, a scope item or `--public-read`: a leading
/// `/` is dropped (so `/` alone is every stream).
fn normalize_prefix(p: &str) -> String {
    p.strip_prefix('/').unwrap_or(p).to_owned()
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

    /// Let anyone, without a token, read the streams `prefix` covers: it ends at a path-segment
    /// boundary (`news` covers `news` and `news/a`, not `newsroom`; `news/` covers `news/a`).
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
    /// request's extensions (for live reads), and for a `{root}__ds/` route its [`Grants`], and
    /// returns whether a token admitted it.
    pub(crate) fn admit(&self, parts: &mut Parts) -> Result<Admitted, Refusal> {
        let Ok(route) = parse_route(parts.uri.path()) else {
            // An invalid path is answered 400 by the route itself: no stream is touched.
            return Ok(Admitted::Public);
        };
        // A staged snapshot part is counted to the root of the grant that admits it (its
        // tenant), so that route keeps the grants.
        let part = matches!(route, Route::SnapshotPart(..));
        let needs = needs(&route, &parts.method, &parts.headers);
        let public = needs.each().all(|(right, name)| {
            right == Right::Read && self.public_read.iter().any(|p| covers(p, name))
        });
        if public {
            return Ok(Admitted::Public);
        }
        let (expires, grants) = self.authorize(parts, &needs, part)?;
        if let Some(at) = expires {
            parts.extensions.insert(CredentialExpiry(at));
        }
        if let Some(grants) = grants {
            parts.extensions.insert(Grants(grants));
        }
        Ok(Admitted::Token)
    }

    /// Checks that the request's bearer token grants every one of `needs`; returns its expiry
    /// and, when `keep`, its grants.
    fn authorize(
        &self,
        parts: &Parts,
        needs: &Needs<'_>,
        keep: bool,
    ) -> Result<Authorized, Refusal> {
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
            let grants = keep.then(|| Arc::from(principal.grants));
            return Ok((principal.expires, grants));
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
        Ok((None, keep.then(|| Arc::from(grants.as_slice()))))
    }
}

/// What a token's check found: when the credential expires, and its grants (for the routes
/// that look at them).
type Authorized = (Option<SystemTime>, Option<Arc<[Grant]>>);

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
pub(crate) fn bearer(parts: &Parts) -> Option<String> {
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
        | Route::SnapshotPart(name, _)
        | Route::SnapshotParts(name)
        | Route::IncarnationChunk(name, ..)
        | Route::IncarnationSnapshot(name, ..)
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

    /// A prefix ends at a path-segment boundary; a trailing `/` leaves out the name itself.
    #[test]
    fn prefixes_end_at_a_segment_boundary() {
        for (prefix, name, want) in [
            ("app", "app", true),
            ("app", "app/x", true),
            ("app", "app/", true),
            ("app", "apple", false),
            ("app", "apple/y", false),
            ("app", "ap", false),
            ("chat/", "chat/1", true),
            ("chat/", "chat/", true),
            ("chat/", "chat", false),
            ("chat/", "chatter", false),
            ("", "anything", true),
            ("", "", true),
            ("a/b", "a/b/c", true),
            ("a/b", "a/bc", false),
        ] {
            assert_eq!(covers(prefix, name), want, "{prefix:?} covers {name:?}");
        }
        assert_eq!(normalize_prefix("/"), "");
        assert_eq!(normalize_prefix("/app"), "app");
    }
}
