//! What a request path addresses ([`Route`]), and the one match that sends each route and
//! method to its handler.
//!
//! The path is parsed once per request, by [`parse_route`]: no router table is consulted.

use axum::body::Body;
use axum::http::request::Parts;
use axum::http::{Method, Request};

use crate::StreamName;

use super::admin::RouteKind;
use super::error::ApiError;
use super::reply::Answer;
use super::{
    AppState, admin, bootstrap, immutable, read, request, snapshot, snapshot_parts, subscriptions,
    write,
};

/// What a request path addresses.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Route {
    /// `{s}`.
    Stream(StreamName),
    /// `{s}/snapshot`.
    SnapshotLatest(StreamName),
    /// `{s}/snapshot/{offset}`.
    SnapshotAt(StreamName, String),
    /// `{s}/snapshot/{offset}/parts`: stage a snapshot part.
    SnapshotPart(StreamName, String),
    /// `{s}/snapshot/parts`: the stream's staged parts (discard).
    SnapshotParts(StreamName),
    /// `{s}/incarnation/{token}/chunk/{offset}`: an immutable chunk.
    IncarnationChunk(StreamName, String, String),
    /// `{s}/incarnation/{token}/snapshot/{offset}`: an immutable snapshot.
    IncarnationSnapshot(StreamName, String, String),
    /// `{s}/retention/{offset}`.
    Retention(StreamName, String),
    /// `{s}/bootstrap`.
    Bootstrap(StreamName),
    /// `{root}__ds/{rest}`: the protocol's reserved routes (subscriptions, JWKS) under the
    /// stream root `root` (empty, or ending in `/`); `rest` has no leading `/`.
    Protocol(String, String),
    /// `__brook/{rest}`: brook's operations routes (health, metrics, listing).
    Admin(String),
}

/// The stream a path (or the part of it before a route's segments) names; an invalid name is
/// 400 `INVALID_STREAM_NAME` with the engine's reason.
fn stream_name(path: Option<&str>) -> Result<StreamName, ApiError> {
    let path = path.unwrap_or("");
    StreamName::new(path).map_err(|e| {
        let detail = match e {
            crate::Error::InvalidArgument(d) | crate::Error::TooLarge(d) => d,
            other => other.to_string(),
        };
        ApiError::bad_request("INVALID_STREAM_NAME", detail)
    })
}

/// Splits a request path into the stream it names and the extension route after it, by its last
/// segments (which [`StreamName`] reserves for exactly this).
pub(crate) fn parse_route(path: &str) -> Result<Route, ApiError> {
    let p = path.strip_prefix('/').unwrap_or(path);
    // Under a stream root (`v1/stream/__ds/...`): no stream name has a `__ds` segment, so such
    // a path fails as a stream route, and only then is it looked at as a protocol route (the
    // common request pays nothing for it).
    parse_stream_route(p).or_else(|e| protocol_route(p).ok_or(e))
}

/// `{root}__ds/{rest}` for the first `__ds` segment followed by more path.
fn protocol_route(p: &str) -> Option<Route> {
    let mut at = 0;
    for seg in p.split('/') {
        let next = at + seg.len() + 1;
        if seg == "__ds" && next <= p.len() {
            return Some(Route::Protocol(p[..at].to_owned(), p[next..].to_owned()));
        }
        at = next;
    }
    None
}

/// A path's last segments, found by one scan from its end: `cuts[i]` is the position of the
/// slash before the `i`-th segment from the end (0: the last), for the first `n` of them.
struct Tail<'a> {
    p: &'a str,
    cuts: [usize; 4],
    n: usize,
}

impl<'a> Tail<'a> {
    fn of(p: &'a str) -> Tail<'a> {
        let b = p.as_bytes();
        let mut t = Tail {
            p,
            cuts: [0; 4],
            n: 0,
        };
        let mut end = b.len();
        while t.n < t.cuts.len() {
            let Some(at) = b[..end].iter().rposition(|&c| c == b'/') else {
                break;
            };
            t.cuts[t.n] = at;
            t.n += 1;
            end = at;
        }
        t
    }

    /// The `i`-th segment from the end (0: the last), if the path has that many.
    fn seg(&self, i: usize) -> Option<&'a str> {
        let end = match i {
            0 => self.p.len(),
            _ if i <= self.n => self.cuts[i - 1],
            _ => return None,
        };
        let start = if i < self.n { self.cuts[i] + 1 } else { 0 };
        Some(&self.p[start..end])
    }

    /// The path before the `i`-th segment from the end (without its slash), if there is one.
    fn before(&self, i: usize) -> Option<&'a str> {
        (i < self.n).then(|| &self.p[..self.cuts[i]])
    }
}

/// [`parse_route`] for paths whose stream names are valid.
fn parse_stream_route(p: &str) -> Result<Route, ApiError> {
    // The reserved prefixes first: no stream name starts with them.
    if let Some(rest) = p.strip_prefix("__ds/") {
        return Ok(Route::Protocol(String::new(), rest.to_owned()));
    }
    if let Some(rest) = p.strip_prefix("__brook/") {
        return Ok(Route::Admin(rest.to_owned()));
    }
    // One scan from the end finds every segment the routes below look at.
    let t = Tail::of(p);
    if let Some(route) = extension_route(&t)? {
        return Ok(route);
    }
    let (head, last) = (t.before(0), t.seg(0).unwrap_or(p));
    match last {
        "bootstrap" => return stream_name(head).map(Route::Bootstrap),
        "snapshot" => return stream_name(head).map(Route::SnapshotLatest),
        "retention" => {
            return Err(ApiError::bad_request(
                "INVALID_ARGUMENT",
                "retention needs an offset: PUT {stream}/retention/{offset}",
            ));
        }
        _ => {}
    }
    if head.is_some() {
        let (stream, mid) = (t.before(1), t.seg(1).unwrap_or(""));
        match mid {
            "snapshot" => return Ok(Route::SnapshotAt(stream_name(stream)?, last.to_owned())),
            "retention" => return Ok(Route::Retention(stream_name(stream)?, last.to_owned())),
            _ => {}
        }
    }
    stream_name(Some(p)).map(Route::Stream)
}

/// The routes of Ursula 0.11 that end in more than two segments after the stream:
/// `{s}/incarnation/{token}/(chunk|snapshot)/{offset}`, `{s}/snapshot/{offset}/parts` and
/// `{s}/snapshot/parts`; `None` for any other path. The stream names reserve these shapes.
fn extension_route(t: &Tail<'_>) -> Result<Option<Route>, ApiError> {
    let last = t.seg(0).unwrap_or("");
    let (s2, s3, s4, rest) = (t.seg(1), t.seg(2), t.seg(3), t.before(3));
    if let (Some(kind @ ("chunk" | "snapshot")), Some(token), Some("incarnation"), Some(_)) =
        (s2, s3, s4, rest)
    {
        let name = stream_name(rest)?;
        let (token, offset) = (token.to_owned(), last.to_owned());
        return Ok(Some(if kind == "chunk" {
            Route::IncarnationChunk(name, token, offset)
        } else {
            Route::IncarnationSnapshot(name, token, offset)
        }));
    }
    if last != "parts" {
        return Ok(None);
    }
    match (s2, s3) {
        (Some("snapshot"), Some(_)) => Ok(Some(Route::SnapshotParts(stream_name(t.before(1))?))),
        (Some(offset), Some("snapshot")) if s4.is_some() => Ok(Some(Route::SnapshotPart(
            stream_name(t.before(2))?,
            offset.to_owned(),
        ))),
        _ => Ok(None),
    }
}

/// The largest body the route `parts` addresses takes, when it is known from the head: an
/// append's or create's (`max_append_bytes`) and a snapshot's (`max_snapshot_bytes`). `None`
/// for other routes, whose handlers check their own.
pub(crate) fn body_limit(app: &AppState, parts: &Parts) -> Option<u64> {
    let writes = parts.method == Method::POST || parts.method == Method::PUT;
    match parse_route(parts.uri.path()).ok()? {
        Route::Stream(_) if writes => Some(app.store.options().max_append_bytes() as u64),
        Route::SnapshotAt(..) if parts.method == Method::PUT => {
            Some(app.store.options().max_snapshot_bytes())
        }
        Route::SnapshotPart(..) if parts.method == Method::POST => {
            Some(app.store.options().max_snapshot_bytes())
        }
        _ => None,
    }
}

/// Sends the request to its route's handler for its method: 405 with `Allow` for a method the
/// route does not serve. `kind` is set to what the request addressed (for the metrics), and
/// only `/__brook/` routes are served when `admin_only` (the separate admin listener). The head
/// stays the caller's (brook's HTTP/1.1 loop reuses its header map), except that the
/// subscription routes take it and leave an empty one.
pub(crate) async fn dispatch(
    app: &AppState,
    parts: &mut Parts,
    body: Body,
    kind: &mut RouteKind,
    admin_only: bool,
) -> Result<Answer, ApiError> {
    const STREAM_METHODS: &str = "GET, HEAD, PUT, POST, DELETE, OPTIONS";
    request::check_head(parts)?;
    let route = parse_route(parts.uri.path())?;
    let m = &parts.method;
    *kind = match &route {
        Route::Stream(_) => RouteKind::of_stream(m),
        Route::SnapshotLatest(_)
        | Route::SnapshotAt(..)
        | Route::SnapshotPart(..)
        | Route::SnapshotParts(_)
        | Route::IncarnationSnapshot(..) => RouteKind::Snapshot,
        Route::IncarnationChunk(..) => RouteKind::Read,
        Route::Retention(..) => RouteKind::Retention,
        Route::Bootstrap(_) => RouteKind::Bootstrap,
        Route::Protocol(..) => RouteKind::Protocol,
        Route::Admin(_) => RouteKind::Admin,
    };
    if admin_only && *kind != RouteKind::Admin {
        return Err(ApiError::no_such_route(parts.uri.path()));
    }
    match route {
        Route::Stream(name) => match *m {
            Method::GET => read::get(app, name, parts).await,
            Method::HEAD => read::head(app, name, parts).await,
            Method::PUT => Box::pin(write::create(app, name, parts, body)).await,
            Method::POST => write::append(app, name, parts, body).await,
            Method::DELETE => Box::pin(write::delete(app, name, parts)).await,
            _ => Err(ApiError::MethodNotAllowed {
                allow: STREAM_METHODS,
            }),
        },
        // Creating or appending to `{s}/snapshot` or `{s}/bootstrap` would address a stream
        // whose name collides with a route: refuse it as the invalid stream name it is.
        // (The names reserve exactly the shapes `parse_route` takes for routes, so the name
        // check always fails here.)
        Route::SnapshotLatest(_) | Route::Bootstrap(_)
            if matches!(*m, Method::PUT | Method::POST) =>
        {
            Err(stream_name(Some(parts.uri.path()))
                .err()
                .unwrap_or_else(|| ApiError::internal("a reserved route parsed as a stream name")))
        }
        Route::SnapshotLatest(name) => match *m {
            Method::GET => Box::pin(snapshot::snapshot_latest(app, name, parts))
                .await
                .map(Answer::from),
            _ => Err(ApiError::MethodNotAllowed {
                allow: "GET, OPTIONS",
            }),
        },
        Route::SnapshotAt(name, offset) => match *m {
            Method::GET => Box::pin(snapshot::snapshot_at(app, name, &offset, parts))
                .await
                .map(Answer::from),
            Method::PUT => Box::pin(snapshot::publish_snapshot(app, name, &offset, parts, body))
                .await
                .map(Answer::from),
            Method::DELETE => Box::pin(snapshot::delete_snapshot(app, name, &offset, parts))
                .await
                .map(Answer::from),
            _ => Err(ApiError::MethodNotAllowed {
                allow: "GET, PUT, DELETE, OPTIONS",
            }),
        },
        Route::SnapshotPart(name, offset) => match *m {
            Method::POST => Box::pin(snapshot_parts::stage(app, name, &offset, parts, body))
                .await
                .map(Answer::from),
            _ => Err(ApiError::MethodNotAllowed {
                allow: "POST, OPTIONS",
            }),
        },
        Route::SnapshotParts(name) => match *m {
            Method::DELETE => Box::pin(snapshot_parts::discard(app, name, parts))
                .await
                .map(Answer::from),
            _ => Err(ApiError::MethodNotAllowed {
                allow: "DELETE, OPTIONS",
            }),
        },
        Route::IncarnationChunk(name, token, offset) => match *m {
            Method::GET | Method::HEAD => {
                Box::pin(immutable::chunk(app, name, &token, &offset, parts)).await
            }
            _ => Err(ApiError::MethodNotAllowed {
                allow: "GET, HEAD, OPTIONS",
            }),
        },
        Route::IncarnationSnapshot(name, token, offset) => match *m {
            Method::GET | Method::HEAD => {
                Box::pin(immutable::snapshot(app, name, &token, &offset, parts))
                    .await
                    .map(Answer::from)
            }
            _ => Err(ApiError::MethodNotAllowed {
                allow: "GET, HEAD, OPTIONS",
            }),
        },
        Route::Retention(name, offset) => match *m {
            Method::PUT => Box::pin(snapshot::retention(app, name, &offset, parts))
                .await
                .map(Answer::from),
            _ => Err(ApiError::MethodNotAllowed {
                allow: "PUT, OPTIONS",
            }),
        },
        Route::Bootstrap(name) => match *m {
            Method::GET => Box::pin(bootstrap::bootstrap(app, name, parts))
                .await
                .map(Answer::from),
            _ => Err(ApiError::MethodNotAllowed {
                allow: "GET, OPTIONS",
            }),
        },
        Route::Protocol(root, rest) => {
            // The only handler that takes the head by value; the caller gets an empty one back.
            let parts = std::mem::replace(parts, Request::new(()).into_parts().0);
            Box::pin(subscriptions::dispatch(app, &root, &rest, parts, body))
                .await
                .map(Answer::from)
        }
        Route::Admin(rest) => Box::pin(admin::dispatch(app, &rest, parts))
            .await
            .map(Answer::from),
    }
}
