//! The one interface between the transport (`transport/`: the accept loop, brook's HTTP/1.1
//! loop, hyper's loops, TLS, sockets and the live writer) and the protocol handlers (routes,
//! reads, writes, SSE, snapshots, subscriptions, access control, operations routes).
//!
//! The transport frames requests and writes responses; it knows nothing of streams. It calls
//! the handlers only through [`Handler`], and a live response's frames reach its socket only
//! through a [`seat::Seat`] and its [`seat::Feed`]. The handlers never touch a socket and never
//! frame bytes for HTTP/1.1. Both sides share the server's state (`AppState`), the memory
//! budget, the error type and the response type (`reply::Answer`), and nothing else.

pub(crate) mod seat;

use std::future::Future;

use axum::body::Body;
use axum::http::request::Parts;
use axum::http::{HeaderMap, Request, StatusCode};
use axum::response::Response;

use super::reply::Answer;

/// What the transport answers requests with: the server's handlers (`Arc<AppState>`, in
/// `http/handle.rs`), or the recording handler of the differential check (`differential.rs`,
/// feature `fuzzing`).
pub(crate) trait Handler: Clone + Send + Sync + 'static {
    /// What admission decided about a request, carried to [`Handler::respond`].
    type Admission: Send;

    /// Decides from the head alone, before a body byte is read: access control, and for a body
    /// of `unread` bytes not yet read, the route's size limit. `Err` is the answer to send
    /// without reading the body (the connection then closes) and whether it carries the CORS
    /// headers. With the body at hand (`unread` is `None`) a refusal may also come back inside
    /// the admission, for [`Handler::respond`] to answer on a connection that stays open.
    #[expect(
        clippy::result_large_err,
        reason = "a refusal is the rare path, answered at once; boxing it would cost every refusal an allocation for nothing"
    )]
    fn admit(
        &self,
        parts: &mut Parts,
        unread: Option<usize>,
    ) -> Result<Self::Admission, (Answer, bool)>;

    /// The answer to an admitted request (brook's HTTP/1.1 loop), whether it carries the CORS
    /// headers, and the request's header map back (for its room).
    fn respond(
        &self,
        parts: Parts,
        body: Body,
        admission: Self::Admission,
    ) -> impl Future<Output = (Answer, bool, HeaderMap)> + Send;

    /// One whole request as hyper's loops hand it over, answered with every header a response
    /// carries; only operations routes (`/__brook/...`) when `admin_only` (the admin listener,
    /// or a probe on a connection the server cannot take).
    fn handle(&self, req: Request<Body>, admin_only: bool)
    -> impl Future<Output = Response> + Send;

    /// Counts an answer the transport gave by itself (a malformed head, a refused body, a
    /// timeout) in the server's metrics, under its problem `code` when it has one.
    fn refused(&self, status: StatusCode, code: Option<&'static str>);
}
