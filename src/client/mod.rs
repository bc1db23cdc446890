//! A Rust client for brook or any Durable Streams server (feature `client`), with the seed's
//! conditional-write recipes as first-class operations.
//!
//! | name | what it is |
//! |---|---|
//! | [`Client`] | a base URL and a pooled HTTP client; hands out [`StreamHandle`]s, lists a brook server's streams ([`list_page`](Client::list_page)) |
//! | [`StreamHandle`] | one stream URL: create, append, read, long-poll, SSE, HEAD, DELETE, [`read_to_tail`](StreamHandle::read_to_tail) |
//! | [`PrefixCount`] | the prefix-count compare-and-set commit loop for writers sharing one log |
//! | [`Outbox`] | publishes facts committed elsewhere, exactly once and in commit order, with failover |
//! | [`SubscriptionHandle`] | a subscription: create, read, delete, links, claim/ack/release, a pull-wake [`run_worker`](SubscriptionHandle::run_worker) loop; [`verify_webhook`] checks a webhook's signature against the JWKS |
//! | [`Error`] | every refusal, with what the caller needs to act on it |
//!
//! **Incarnation tracking.** A [`StreamHandle`] remembers the `Stream-Incarnation` of the first
//! successful response and sends it on every later request, so a stream deleted and recreated at
//! the same URL answers [`Error::IncarnationChanged`] instead of silently serving another
//! stream's data. The handle keeps the old token after that error, so every later request fails
//! the same way until the caller discards what it derived from the old stream and calls
//! [`StreamHandle::accept_incarnation`] (or [`StreamHandle::forget_incarnation`]). Clones of a
//! handle share the token.
//!
//! Offsets are opaque strings ([`Position`]), as the protocol defines them, so the client works
//! with servers whose offsets are not brook's.
//!
//! ```no_run
//! use brook::client::{Append, Client, Create};
//!
//! # async fn run() -> brook::client::Result<()> {
//! let client = Client::new("http://127.0.0.1:4437")?;
//! let stream = client.stream("demo/chat");
//! stream.create(&Create::json()).await?;
//! stream.append(&Append::json(&serde_json::json!([{"text": "hi"}]))).await?;
//! let read = stream.read_to_tail(&Default::default()).await?;
//! assert_eq!(read.messages().len(), 1);
//! # Ok(()) }
//! ```

mod error;
mod outbox;
mod prefix_count;
mod sse;
mod stream;
mod subscription;
mod types;

use reqwest::header::{AUTHORIZATION, HeaderValue};

pub use error::{Error, Result};
pub use outbox::{Outbox, PublishSummary, Published};
pub use prefix_count::{Commit, PrefixCount};
pub use sse::{Control, SseEvent};
pub use stream::StreamHandle;
pub use subscription::{
    Claim, ClaimedStream, SubscriptionHandle, SubscriptionSpec, is_code, verify_webhook,
};
pub use types::{
    Append, Appended, Chunk, Create, Created, Info, ListedStream, Listing, Position, Read,
    TailData, TailRead, stream_seq,
};

/// A Durable Streams server at a base URL.
///
/// Cheap to clone: clones share one connection pool.
#[derive(Clone, Debug)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    /// `Bearer <token>` for the `Authorization` header of every request, when set (marked
    /// sensitive, so `Debug` does not print it).
    auth: Option<HeaderValue>,
}

impl Client {
    /// A client for the server at `base_url` (e.g. `http://127.0.0.1:4437`), with a fresh
    /// connection pool and no request timeout (a long-poll waits as long as the server lets it).
    pub fn new(base_url: &str) -> Result<Client> {
        let http = http_builder().build().map_err(Error::Transport)?;
        Client::with_http_client(http, base_url)
    }

    /// A client for the server at `base_url` that verifies the server's certificate against
    /// the certificate authorities in `pem` (one or more PEM `CERTIFICATE` blocks) and no
    /// other: for an `https://` server whose certificate a private CA signed. Otherwise as
    /// [`new`](Self::new), which trusts the Mozilla root set.
    ///
    /// Refused with [`Error::InvalidArgument`] when `pem` holds no certificate or one that
    /// does not parse.
    pub fn with_root_certificates(base_url: &str, pem: &[u8]) -> Result<Client> {
        let certs = reqwest::Certificate::from_pem_bundle(pem).map_err(|e| {
            Error::InvalidArgument(format!("the CA certificates do not parse: {e}"))
        })?;
        if certs.is_empty() {
            return Err(Error::InvalidArgument(
                "the CA certificates hold no PEM CERTIFICATE block".into(),
            ));
        }
        let builder = certs.into_iter().fold(
            http_builder().tls_built_in_root_certs(false),
            reqwest::ClientBuilder::add_root_certificate,
        );
        let http = builder.build().map_err(Error::Transport)?;
        Client::with_http_client(http, base_url)
    }

    /// A client over an HTTP client the caller configured (timeouts, proxies, TLS).
    pub fn with_http_client(http: reqwest::Client, base_url: &str) -> Result<Client> {
        let url = reqwest::Url::parse(base_url)
            .map_err(|e| Error::InvalidArgument(format!("invalid base URL {base_url:?}: {e}")))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(Error::InvalidArgument(format!(
                "the base URL {base_url:?} is not http or https"
            )));
        }
        Ok(Client {
            http,
            base: base_url.trim_end_matches('/').to_owned(),
            auth: None,
        })
    }

    /// The same client, sending `Authorization: Bearer <token>` on every request it makes and
    /// every request of the [`StreamHandle`]s and [`SubscriptionHandle`]s it hands out from now
    /// on: for a server with access control (`brook serve --auth-tokens` or `--auth-jwt-key`).
    /// A subscription request that carries its own token (a wake's claim token, in
    /// [`SubscriptionHandle::ack`]) sends that one instead.
    ///
    /// Refused with [`Error::InvalidArgument`] when `token` is empty or holds whitespace or
    /// control characters (the message does not repeat the token).
    ///
    /// ```no_run
    /// # fn run() -> brook::client::Result<()> {
    /// let token = std::env::var("BROOK_TOKEN").unwrap_or_default();
    /// let client = brook::client::Client::new("https://streams.example.com")?
    ///     .with_bearer_token(&token)?;
    /// # Ok(()) }
    /// ```
    pub fn with_bearer_token(mut self, token: &str) -> Result<Client> {
        if token.is_empty() || token.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(Error::InvalidArgument(
                "the bearer token is empty or holds whitespace or control characters".into(),
            ));
        }
        let mut value = HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
            Error::InvalidArgument("the bearer token is not a valid header value".into())
        })?;
        value.set_sensitive(true);
        self.auth = Some(value);
        Ok(self)
    }

    /// A request to `url` with the bearer token, when one is set.
    fn request(&self, method: reqwest::Method, url: String) -> reqwest::RequestBuilder {
        let rb = self.http.request(method, url);
        match &self.auth {
            Some(a) => rb.header(AUTHORIZATION, a.clone()),
            None => rb,
        }
    }

    /// The base URL, without a trailing slash.
    pub fn base_url(&self) -> &str {
        &self.base
    }

    /// A handle on the stream at `path` under the base URL (`"chat/room-1"` or
    /// `"/chat/room-1"`). Makes no request; every handle tracks its own incarnation.
    pub fn stream(&self, path: &str) -> StreamHandle {
        let url = format!("{}/{}", self.base, path.trim_start_matches('/'));
        StreamHandle::new(self.http.clone(), url, self.auth.clone())
    }

    /// A handle on the subscription `id` under the base URL, which is the stream root
    /// (`{base}/__ds/subscriptions/{id}`). Makes no request.
    pub fn subscription(&self, id: &str) -> SubscriptionHandle {
        let url = format!("{}/__ds/subscriptions/{id}", self.base);
        SubscriptionHandle::new(self.http.clone(), url, self.auth.clone())
    }

    /// One page of a brook server's listing (`GET {base}/__brook/streams`, brook's extension,
    /// not the protocol's): the live streams whose names start with `prefix` (`""`: all), in
    /// name order, after the cursor `after` (the previous page's [`Listing::next`]; `None` for
    /// the first page), at most `limit` of them (the server takes 1 to 1000 and refuses
    /// others with 400 `INVALID_ARGUMENT`). A server without the listing answers
    /// [`Error::Http`] with status 404.
    pub async fn list_page(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Listing> {
        let mut query = vec![("prefix", prefix.to_owned()), ("limit", limit.to_string())];
        if let Some(a) = after {
            query.push(("after", a.to_owned()));
        }
        let res = self
            .request(
                reqwest::Method::GET,
                format!("{}/__brook/streams", self.base),
            )
            .query(&query)
            .send()
            .await
            .map_err(Error::Transport)?;
        let status = res.status().as_u16();
        let headers = res.headers().clone();
        let body = res.bytes().await.map_err(Error::Transport)?;
        match status {
            200 => types::parse_listing(&body),
            // The generic mapping would call a 404 a missing stream; here it is a server
            // without brook's listing.
            404 => Err(Error::Http {
                status,
                code: None,
                detail: Some("the server has no /__brook/streams listing (not brook?)".into()),
            }),
            _ => Err(Error::from_reply(status, &headers, &body)),
        }
    }

    /// The server's webhook signing keys (`{base}/__ds/jwks.json`), for [`verify_webhook`].
    pub async fn webhook_jwks(&self) -> Result<serde_json::Value> {
        let res = self
            .request(
                reqwest::Method::GET,
                format!("{}/__ds/jwks.json", self.base),
            )
            .send()
            .await
            .map_err(Error::Transport)?;
        if !res.status().is_success() {
            return Err(Error::Http {
                status: res.status().as_u16(),
                code: None,
                detail: None,
            });
        }
        let bytes = res.bytes().await.map_err(Error::Transport)?;
        serde_json::from_slice(&bytes)
            .map_err(|e| Error::InvalidResponse(format!("the JWKS is not JSON: {e}")))
    }
}

/// The HTTP client every constructor starts from: connections time out after 10 s, requests
/// never (a long-poll waits as long as the server lets it).
fn http_builder() -> reqwest::ClientBuilder {
    reqwest::Client::builder().connect_timeout(std::time::Duration::from_secs(10))
}
