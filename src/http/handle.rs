//! The handlers' side of the one interface (`service/`): a request from head to answer.
//! Admission from the head (a CORS preflight, access control), the route's handler, the
//! headers every response carries, the metrics and the debug log line. The transport calls in
//! here only through [`Handler`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::Request;
use axum::http::request::Parts;
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};

use super::admin::RouteKind;
use super::error::ApiError;
use super::reply::{self, Answer, cors_wanted};
use super::service::Handler;
use super::{AppState, auth, route};

impl Handler for Arc<AppState> {
    type Admission = Admission;

    fn admit(&self, parts: &mut Parts, unread: Option<usize>) -> Result<Admission, (Answer, bool)> {
        let admission = admit(self, parts);
        let Some(len) = unread else {
            return Ok(admission);
        };
        if let Admission::Refused(answer) = admission {
            return Err((answer, cors_wanted(parts)));
        }
        if let Some(limit) = route::body_limit(self, parts)
            && len as u64 > limit
        {
            let e = ApiError::too_large(limit);
            self.metrics.error(e.code());
            return Err((e.into_response().into(), cors_wanted(parts)));
        }
        Ok(admission)
    }

    fn respond(
        &self,
        parts: Parts,
        body: Body,
        admission: Admission,
    ) -> impl Future<Output = (Answer, bool, HeaderMap)> + Send {
        respond_admitted(self, parts, body, admission, false)
    }

    fn handle(&self, req: Request, admin_only: bool) -> impl Future<Output = Response> + Send {
        handle(self, req, admin_only)
    }

    fn refused(&self, status: StatusCode, code: Option<&'static str>) {
        if let Some(code) = code {
            self.metrics.error(code);
        }
        self.metrics
            .request(RouteKind::Other, status, Duration::ZERO);
    }
}

/// One request, start to finish: CORS preflight (never behind access control), admission when
/// access control is on, the route's handler, then the headers every response carries; counted
/// in the metrics (and logged at debug). On the admin listener (`admin_only`) only `/__brook/`
/// routes are served.
async fn handle(app: &AppState, req: Request, admin_only: bool) -> Response {
    let (answer, cors, _) = respond(app, req, admin_only).await;
    let mut res = answer.into_response();
    reply::common_headers(res.headers_mut(), cors);
    res
}

/// What admission decided from a request's head alone, before any of its body is read.
pub(crate) enum Admission {
    /// A CORS preflight (answered without access control).
    Preflight,
    /// No access control: every request goes to its route.
    Open,
    /// Access control let it in, this way.
    Admitted(auth::Admitted),
    /// Refused: the answer, to be sent without reading the body.
    Refused(reply::Answer),
}

/// Decides from the head whether the request may proceed: a preflight, or access control's
/// verdict (which notes the credential's expiry in `parts`' extensions). Reads no body byte.
fn admit(app: &AppState, parts: &mut axum::http::request::Parts) -> Admission {
    if parts.method == Method::OPTIONS {
        return Admission::Preflight;
    }
    let Some(access) = &app.config.access else {
        return Admission::Open;
    };
    match access.admit(parts) {
        Ok(admitted) => Admission::Admitted(admitted),
        Err(refusal) => Admission::Refused(refusal.into_response(&app.edge).into()),
    }
}

/// [`handle`] without the headers every response carries: the answer (on the hot routes a
/// typed head that brook's HTTP/1.1 loop writes without a `HeaderMap`, `reply.rs`), and whether
/// it is to carry the CORS headers too. That loop writes those as constant bytes (`h1.rs`)
/// instead of inserting them into every response's map. The request's header map comes back
/// too, for that loop to reuse for its next request (its allocations, not its entries).
async fn respond(
    app: &AppState,
    req: Request,
    admin_only: bool,
) -> (reply::Answer, bool, HeaderMap) {
    let (mut parts, body) = req.into_parts();
    let admission = admit(app, &mut parts);
    respond_admitted(app, parts, body, admission, admin_only).await
}

/// [`respond`] for a request whose head was admitted already ([`admit`]): brook's HTTP/1.1
/// loop admits a head before it reads the body.
///
/// Not an `async fn`: what admission decided is settled before the future is made, so the
/// future (boxed per request by that loop) keeps neither the admission (a refusal's answer) nor
/// its arguments twice, only what the route's handler needs across its waits.
fn respond_admitted(
    app: &AppState,
    mut parts: axum::http::request::Parts,
    body: Body,
    admission: Admission,
    admin_only: bool,
) -> impl Future<Output = (reply::Answer, bool, HeaderMap)> + Send {
    let started = Instant::now();
    let cors = cors_wanted(&parts);
    // Boxed (a preflight, a refusal): the common request's future holds no answer but its own.
    let settled = match admission {
        Admission::Preflight => Err(Box::new((
            RouteKind::Preflight,
            reply::preflight(&parts.headers).into(),
        ))),
        Admission::Refused(answer) => Err(Box::new((RouteKind::Other, answer))),
        Admission::Open => Ok(None),
        Admission::Admitted(admitted) => Ok(Some(admitted)),
    };
    async move {
        // Only a server logging at debug copies the method and path for its request line.
        let logged = app
            .log_requests
            .then(|| Box::new((parts.method.clone(), parts.uri.path().to_owned())));
        let (kind, res) = match settled {
            Err(settled) => *settled,
            Ok(admitted) => {
                let mut kind = RouteKind::Other;
                let dispatched = route::dispatch(app, &mut parts, body, &mut kind, admin_only);
                let mut res = match dispatched.await {
                    Ok(res) => res,
                    Err(e) => {
                        app.metrics.error(e.code());
                        e.into_response().into()
                    }
                };
                if let Some(admitted) = admitted {
                    auth::private_if_token(&mut res, admitted);
                }
                (kind, res)
            }
        };
        app.metrics.request_since(kind, res.status(), started);
        if let Some(logged) = logged {
            log_request(&logged.0, &logged.1, &res, started.elapsed());
        }
        (res, cors, parts.headers)
    }
}

/// The request's `debug` line: method, path, status, body bytes (`-` when the body streams
/// with no known length: SSE, bootstrap) and the time to the response head.
fn log_request(method: &Method, path: &str, res: &reply::Answer, took: Duration) {
    let bytes = http_body::Body::size_hint(res.body()).exact();
    tracing::debug!(
        %method,
        path,
        status = res.status().as_u16(),
        bytes = bytes.map_or_else(|| "-".to_owned(), |n| n.to_string()),
        micros = took.as_micros() as u64,
        "request"
    );
}

#[cfg(test)]
mod tests {
    /// The size of what a function of four arguments returns.
    fn size4<A, B, C, D, R>(_: fn(A, B, C, D) -> R) -> usize {
        std::mem::size_of::<R>()
    }

    /// The size of what a function of five arguments returns.
    fn size5<A, B, C, D, E, R>(_: fn(A, B, C, D, E) -> R) -> usize {
        std::mem::size_of::<R>()
    }

    /// brook's HTTP/1.1 loop boxes a request's future and moves it into its box, once per
    /// request: its size is copied every time, and past about 1 KiB glibc's `malloc` and `free`
    /// leave their per-thread cache (docs/benchmarks/history.md, issue 51's second round). The
    /// reads, the rarer routes and an append's body still to be read are boxed on their own, so
    /// what is left is the append's durability wait: 2,032 bytes before, here far less.
    #[test]
    fn the_request_future_is_small() {
        let append = size4(super::super::write::append);
        let request = size5(super::respond_admitted);
        println!("append future: {append} bytes; request future: {request} bytes");
        assert!(append <= 640, "an append's future is {append} bytes");
        assert!(request <= 1152, "a request's future is {request} bytes");
    }
}
