//! Tenants under hostile load, over a real socket: JWT `exp` and `nbf` claims at and past the
//! edges of the server's clocks, grant prefixes that end at a path-segment boundary, and
//! subscription ids that one tenant can neither see nor squat under another's root.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use brook::Options;
use brook::http::{AccessControl, JwtAlgorithm, JwtKey, ServerConfig};
use futures_util::StreamExt;
use serde_json::{Value, json};

use crate::http_support::{R, Resp, Server, config, token_file};

/// The HS256 secret of these tests' JWTs.
const SECRET: &[u8] = b"a shared secret of at least thirty-two bytes";

/// The audience these tests' JWTs name.
const AUDIENCE: &str = "brook-tenants";

/// A server with access control from `access`.
async fn start(access: AccessControl, mut cfg: ServerConfig) -> R<Server> {
    cfg.access = Some(Arc::new(access));
    Server::start_with(Options::default(), cfg).await
}

/// The HS256 key the server verifies these tests' JWTs with.
fn jwt_key() -> R<JwtKey> {
    Ok(JwtKey::new(JwtAlgorithm::Hs256, SECRET, AUDIENCE)?)
}

/// `Authorization` for an HS256 JWT of `claims` (the audience added).
fn jwt(mut claims: Value) -> R<String> {
    claims["aud"] = json!(AUDIENCE);
    let token = jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(SECRET),
    )?;
    Ok(format!("Bearer {token}"))
}

/// Seconds since the epoch, `ahead` from now.
fn unix(ahead: u64) -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs()
        + ahead
}

/// `Authorization: Bearer {name}-token`.
fn bearer(name: &str) -> String {
    format!("Bearer {name}-token")
}

/// Creates the text stream `path` holding `x`, with `auth`.
async fn create(server: &Server, path: &str, auth: &str) -> R {
    let r = server
        .put(
            path,
            &[("content-type", "text/plain"), ("authorization", auth)],
            "x",
        )
        .await?;
    assert_eq!(r.status, 201, "{path}: {}", r.text());
    Ok(())
}

/// Whether the server still answers (a panicking request would not take it down, but would
/// answer nothing).
async fn still_up(server: &Server) -> R {
    let r = server.get("/__brook/live", &[]).await?;
    assert_eq!(r.status, 200, "{}", r.text());
    Ok(())
}

/// A JWT whose `exp` is past what `SystemTime` or tokio's clock can hold (up to 2^64-1) is a
/// token that does not expire: a catch-up read, a long-poll and an SSE read it admits are
/// answered as for any valid token, and end by their own limits. An `exp` or `nbf` that is no
/// unsigned integer, and an `nbf` far in the future, are 401 `INVALID_TOKEN`. No request panics.
#[tokio::test]
async fn jwt_times_past_the_clocks_are_answered_cleanly() -> R {
    let server = start(AccessControl::new().with_jwt(jwt_key()?), config()).await?;
    let admin = jwt(json!({"exp": unix(600), "scope": "admin:far read:far"}))?;
    create(&server, "/far/s", &admin).await?;
    let tail = server
        .head("/far/s", &[("authorization", &admin)])
        .await?
        .need("stream-next-offset")?
        .to_owned();
    let far = [
        u64::MAX,
        1 << 63,
        i64::MAX as u64,
        (i64::MAX as u64) - unix(0),
        1 << 40,
    ];
    for exp in far {
        let auth = jwt(json!({"exp": exp, "scope": "read:far"}))?;
        let r = server
            .get("/far/s?offset=-1", &[("authorization", &auth)])
            .await?;
        assert_eq!((r.status, r.text().as_str()), (200, "x"), "exp {exp}");
        // At the tail, the long-poll waits its whole (test) timeout: the token does not end it.
        let r = server
            .get(
                &format!("/far/s?offset={tail}&live=long-poll"),
                &[("authorization", &auth)],
            )
            .await?;
        assert_eq!(r.status, 204, "exp {exp}: {}", r.text());
        // The SSE read ends at its own (test) lifetime, without a credential-expired event.
        let res = server
            .client
            .get(server.url("/far/s?offset=-1&live=sse"))
            .header("authorization", &auth)
            .send()
            .await?;
        assert_eq!(res.status().as_u16(), 200, "exp {exp}");
        let mut body = res.bytes_stream();
        let mut seen = String::new();
        while let Some(chunk) = tokio::time::timeout(Duration::from_secs(20), body.next()).await? {
            seen.push_str(std::str::from_utf8(&chunk?)?);
        }
        assert!(seen.contains("data:x"), "exp {exp}: {seen}");
        assert!(!seen.contains("credential-expired"), "exp {exp}: {seen}");
    }
    let refused = [
        json!({"exp": -1, "scope": "read:far"}),
        json!({"exp": 1.5e19, "scope": "read:far"}),
        json!({"exp": 1e300, "scope": "read:far"}),
        json!({"exp": "soon", "scope": "read:far"}),
        json!({"exp": u64::MAX, "nbf": u64::MAX, "scope": "read:far"}),
        json!({"exp": unix(600), "nbf": u64::MAX, "scope": "read:far"}),
        json!({"exp": unix(600), "nbf": -1, "scope": "read:far"}),
    ];
    for claims in refused {
        let auth = jwt(claims)?;
        for path in ["/far/s?offset=-1", "/far/s?offset=-1&live=sse"] {
            server
                .get(path, &[("authorization", &auth)])
                .await?
                .refused(401, "INVALID_TOKEN");
        }
    }
    still_up(&server).await
}

/// A grant's prefix ends at a path-segment boundary: `app` covers `app` and `app/x` but not
/// `apple/y`, in a token file, a JWT's scope, `--public-read` and the subscription routes'
/// roots; `chat/` covers what is under `chat/` and not `chat` itself.
#[tokio::test]
async fn grant_prefixes_end_at_a_segment_boundary() -> R {
    let dir = tempfile::tempdir()?;
    let tokens = token_file(
        dir.path(),
        &[
            ("root", "read,admin /"),
            ("app", "read,admin app"),
            ("chat", "read chat/"),
        ],
    )?;
    let access = AccessControl::new()
        .with_token_file(tokens)?
        .with_jwt(jwt_key()?)
        .with_public_read("pub");
    let server = start(access, config()).await?;
    let root = bearer("root");
    for s in [
        "app", "app/x", "apple/y", "chat", "chat/1", "chatter", "pub", "pub/a", "public/b",
    ] {
        create(&server, &format!("/{s}"), &root).await?;
    }
    let read = |path: &'static str, auth: Option<String>| {
        let server = &server;
        async move {
            let headers: Vec<(&str, &str)> = auth
                .as_deref()
                .map(|a| ("authorization", a))
                .into_iter()
                .collect();
            server
                .get(&format!("/{path}?offset=-1"), &headers)
                .await
                .map(|r: Resp| (r.status, r.code()))
        }
    };
    let ok = (200, None);
    let forbidden = (403, Some("FORBIDDEN".to_owned()));
    let scoped = jwt(json!({"exp": unix(600), "scope": "read:app read:chat/"}))?;
    for auth in [bearer("app"), scoped.clone()] {
        assert_eq!(read("app", Some(auth.clone())).await?, ok, "{auth}");
        assert_eq!(read("app/x", Some(auth.clone())).await?, ok, "{auth}");
        assert_eq!(
            read("apple/y", Some(auth.clone())).await?,
            forbidden,
            "{auth}"
        );
    }
    for auth in [bearer("chat"), scoped] {
        assert_eq!(read("chat/1", Some(auth.clone())).await?, ok, "{auth}");
        assert_eq!(read("chat", Some(auth.clone())).await?, forbidden, "{auth}");
        assert_eq!(
            read("chatter", Some(auth.clone())).await?,
            forbidden,
            "{auth}"
        );
    }
    assert_eq!(read("pub", None).await?, ok);
    assert_eq!(read("pub/a", None).await?, ok);
    assert_eq!(
        read("public/b", None).await?,
        (401, Some("UNAUTHORIZED".to_owned()))
    );
    // The subscription routes need admin on their root: `app` is admin on `app/`, not `apple/`.
    let body = r#"{"type":"pull-wake","pattern":"*","wake_stream":"x"}"#;
    let auth = bearer("app");
    let r = server
        .put(
            "/app/__ds/subscriptions/s",
            &[("authorization", &auth)],
            body,
        )
        .await?;
    assert_eq!(r.status, 201, "{}", r.text());
    server
        .put(
            "/apple/__ds/subscriptions/s",
            &[("authorization", &auth)],
            body,
        )
        .await?
        .refused(403, "FORBIDDEN");
    Ok(())
}

/// Subscription ids belong to the root that owns them: a tenant reading, deleting, linking or
/// claiming an id another tenant took reaches its own (none: 404), and creating it makes its
/// own, whatever the other's configuration; the other tenant's is untouched by all of it.
#[tokio::test]
async fn subscription_ids_are_scoped_to_their_tenant() -> R {
    let dir = tempfile::tempdir()?;
    let tokens = token_file(
        dir.path(),
        &[
            ("alice", "read,write,admin alice"),
            ("bob", "read,write,admin bob"),
        ],
    )?;
    let server = start(AccessControl::new().with_token_file(tokens)?, config()).await?;
    let (alice, bob) = (bearer("alice"), bearer("bob"));
    create(&server, "/alice/wake", &alice).await?;
    create(&server, "/bob/wake", &bob).await?;
    let body = r#"{"type":"pull-wake","pattern":"*","wake_stream":"wake"}"#;
    let r = server
        .put(
            "/alice/__ds/subscriptions/shared",
            &[("authorization", &alice)],
            body,
        )
        .await?;
    assert_eq!(r.status, 201, "{}", r.text());
    let answer = |r: Resp| (r.status, r.code());
    let bobs = |id: &str| format!("/bob/__ds/subscriptions/{id}");
    let auth = [("authorization", bob.as_str())];
    for id in ["shared", "never-made"] {
        let what = format!("bob on {id}");
        let get = answer(server.get(&bobs(id), &auth).await?);
        assert_eq!(get, (404, Some("SUBSCRIPTION_NOT_FOUND".into())), "{what}");
        let claim = answer(
            server
                .post(&format!("{}/claim", bobs(id)), &auth, "{}")
                .await?,
        );
        assert_eq!(claim, get, "{what}");
        let link = server
            .post(
                &format!("{}/streams", bobs(id)),
                &auth,
                r#"{"streams":["wake"]}"#,
            )
            .await?;
        assert_eq!(answer(link), get, "{what}");
        assert_eq!(
            answer(server.delete(&bobs(id), &auth).await?),
            get,
            "{what}"
        );
    }
    // Bob's token gives nothing under alice's root.
    server
        .put("/alice/__ds/subscriptions/other", &auth, body)
        .await?
        .refused(403, "FORBIDDEN");
    // Bob's own `shared`, with another configuration than alice's.
    let other = r#"{"type":"pull-wake","pattern":"x/*","wake_stream":"wake"}"#;
    let r = server.put(&bobs("shared"), &auth, other).await?;
    assert_eq!(r.status, 201, "{}", r.text());
    let r = server.get(&bobs("shared"), &auth).await?;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.text().contains(r#""pattern":"x/*""#), "{}", r.text());
    // Alice's subscription is untouched by all of it.
    let r = server
        .get(
            "/alice/__ds/subscriptions/shared",
            &[("authorization", &alice)],
        )
        .await?;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.text().contains(r#""pattern":"*""#), "{}", r.text());
    Ok(())
}
