//! Access control over a real socket: every right on every route family, tokens from a file
//! (reloaded when it changes) and JWTs (HS256, RS256, `EdDSA`; `exp`, `nbf`, `aud`), public-read
//! prefixes, CORS preflights, and live reads that end when their token expires.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use brook::Options;
use brook::http::{AccessControl, JwtAlgorithm, JwtKey, ServerConfig, token_hash};
use futures_util::StreamExt;

use crate::http_support::{self, R, Resp, Server, config};

/// The tokens of the matrix, as (name, grants in a token-file line).
const TOKENS: [(&str, &str); 5] = [
    ("reader", "read app/"),
    ("writer", "write app/"),
    ("admin", "admin app/"),
    ("owner", "read,write,admin app/"),
    ("root", "admin /"),
];

/// A token file granting [`TOKENS`] (each token is its own name with a `-token` suffix).
fn token_file(dir: &std::path::Path) -> R<std::path::PathBuf> {
    http_support::token_file(dir, &TOKENS)
}

/// A server with access control from `access`.
async fn start(access: AccessControl, mut cfg: ServerConfig) -> R<Server> {
    cfg.access = Some(Arc::new(access));
    Server::start_with(Options::default(), cfg).await
}

/// `Authorization: Bearer {name}-token`.
fn bearer(name: &str) -> String {
    format!("Bearer {name}-token")
}

/// One request of the matrix: method, path (with `{s}` for the stream and `{o}` for its tail),
/// extra headers, body, and the tokens that may do it.
struct Case {
    method: &'static str,
    path: &'static str,
    headers: &'static [(&'static str, &'static str)],
    body: &'static str,
    allowed: &'static [&'static str],
}

const READERS: &[&str] = &["reader", "owner"];
const WRITERS: &[&str] = &["writer", "owner"];
const ADMINS: &[&str] = &["admin", "owner", "root"];

/// Every route family, each method it serves.
const CASES: &[Case] = &[
    Case {
        method: "GET",
        path: "/{s}?offset=-1",
        headers: &[],
        body: "",
        allowed: READERS,
    },
    Case {
        method: "GET",
        path: "/{s}?offset=-1&live=long-poll",
        headers: &[],
        body: "",
        allowed: READERS,
    },
    Case {
        method: "HEAD",
        path: "/{s}",
        headers: &[],
        body: "",
        allowed: READERS,
    },
    Case {
        method: "POST",
        path: "/{s}",
        headers: &[("content-type", "text/plain")],
        body: "more",
        allowed: WRITERS,
    },
    Case {
        method: "POST",
        path: "/{s}",
        headers: &[("stream-closed", "true")],
        body: "",
        allowed: WRITERS,
    },
    Case {
        method: "PUT",
        path: "/{s}-new",
        headers: &[("content-type", "text/plain")],
        body: "",
        allowed: ADMINS,
    },
    // A fork needs admin on the new stream and read on its source.
    Case {
        method: "PUT",
        path: "/{s}-fork",
        headers: &[("stream-forked-from", "/{s}")],
        body: "",
        allowed: &["owner"],
    },
    Case {
        method: "DELETE",
        path: "/{s}",
        headers: &[],
        body: "",
        allowed: ADMINS,
    },
    Case {
        method: "PUT",
        path: "/{s}/snapshot/{o}",
        headers: &[("content-type", "application/json")],
        body: "{}",
        allowed: ADMINS,
    },
    Case {
        method: "GET",
        path: "/{s}/snapshot",
        headers: &[],
        body: "",
        allowed: READERS,
    },
    Case {
        method: "GET",
        path: "/{s}/snapshot/{o}",
        headers: &[],
        body: "",
        allowed: READERS,
    },
    Case {
        method: "DELETE",
        path: "/{s}/snapshot/{o}",
        headers: &[],
        body: "",
        allowed: ADMINS,
    },
    Case {
        method: "PUT",
        path: "/{s}/retention/{o}",
        headers: &[],
        body: "",
        allowed: ADMINS,
    },
    Case {
        method: "GET",
        path: "/{s}/bootstrap",
        headers: &[],
        body: "",
        allowed: READERS,
    },
    Case {
        method: "GET",
        path: "/__ds/subscriptions",
        headers: &[],
        body: "",
        allowed: &["root"],
    },
    Case {
        method: "POST",
        path: "/__ds/subscriptions",
        headers: &[],
        body: "{}",
        allowed: &["root"],
    },
    Case {
        method: "GET",
        path: "/__brook/metrics",
        headers: &[],
        body: "",
        allowed: &["root"],
    },
];

/// Every right on every route family: a token without the right gets 403 `FORBIDDEN`, no token
/// 401 `UNAUTHORIZED`, and a token with it reaches the handler (whatever the handler answers,
/// never 401 or 403). Each attempt runs on its own freshly made stream.
#[tokio::test]
async fn every_right_on_every_route_family() -> R {
    let dir = tempfile::tempdir()?;
    let access = AccessControl::new().with_token_file(token_file(dir.path())?)?;
    let server = start(access, config()).await?;
    let root = bearer("owner");
    let mut n = 0;
    for case in CASES {
        for who in TOKENS.iter().map(|(w, _)| *w).chain(["nobody"]) {
            n += 1;
            let s = format!("app/case-{n}");
            let made = server
                .put(
                    &format!("/{s}"),
                    &[("content-type", "text/plain"), ("authorization", &root)],
                    "x",
                )
                .await?;
            assert_eq!(made.status, 201, "setup: {}", made.text());
            let tail = made.need("stream-next-offset")?.to_owned();
            let path = case.path.replace("{s}", &s).replace("{o}", &tail);
            let auth = bearer(who);
            let mut headers: Vec<(&str, String)> = case
                .headers
                .iter()
                .map(|(k, v)| (*k, v.replace("{s}", &s)))
                .collect();
            if who != "nobody" {
                headers.push(("authorization", auth));
            }
            let raw: Vec<(&str, &[u8])> = headers.iter().map(|(k, v)| (*k, v.as_bytes())).collect();
            let r = server
                .send(case.method, &path, &raw, case.body.to_owned())
                .await?;
            let what = format!(
                "{} {} as {who}: {} {}",
                case.method,
                case.path,
                r.status,
                r.text()
            );
            if who == "nobody" {
                assert_eq!(r.status, 401, "{what}");
                if case.method != "HEAD" {
                    r.refused(401, "UNAUTHORIZED");
                }
                assert!(
                    r.h("www-authenticate")
                        .is_some_and(|v| v.starts_with("Bearer")),
                    "{what}"
                );
            } else if case.allowed.contains(&who) {
                assert!(![401, 403].contains(&r.status), "{what}");
            } else {
                assert_eq!(r.status, 403, "{what}");
                if case.method != "HEAD" {
                    r.refused(403, "FORBIDDEN");
                }
            }
        }
    }
    Ok(())
}

/// An SSE read checks its token like any read: 403 outside the grants, 200 inside.
#[tokio::test]
async fn sse_reads_need_read() -> R {
    let dir = tempfile::tempdir()?;
    let access = AccessControl::new().with_token_file(token_file(dir.path())?)?;
    let server = start(access, config()).await?;
    let r = server
        .put(
            "/app/sse",
            &[
                ("content-type", "text/plain"),
                ("authorization", &bearer("owner")),
            ],
            "x",
        )
        .await?;
    assert_eq!(r.status, 201);
    for (who, want) in [("writer", 403), ("reader", 200)] {
        let r = server
            .client
            .get(server.url("/app/sse?offset=-1&live=sse"))
            .header("authorization", bearer(who))
            .send()
            .await?;
        assert_eq!(r.status().as_u16(), want, "{who}");
    }
    Ok(())
}

/// Public-read prefixes are readable without a token, and nothing else is: not writes to them,
/// not reads elsewhere. A preflight never needs a token.
#[tokio::test]
async fn public_reads_and_preflights_need_no_token() -> R {
    let dir = tempfile::tempdir()?;
    let access = AccessControl::new()
        .with_token_file(token_file(dir.path())?)?
        .with_public_read("/app/pub/");
    let server = start(access, config()).await?;
    let owner = bearer("owner");
    for s in ["/app/pub/news", "/app/private"] {
        let r = server
            .put(
                s,
                &[("content-type", "text/plain"), ("authorization", &owner)],
                "x",
            )
            .await?;
        assert_eq!(r.status, 201);
        // A second message, so that a chunk of the first is immutable (and cacheable).
        let r = server
            .post(
                s,
                &[("content-type", "text/plain"), ("authorization", &owner)],
                "+",
            )
            .await?;
        assert_eq!(r.status, 204);
    }
    let first = "?offset=0000000000000000_0000000000000000&max_bytes=1";
    let r = server.get(&format!("/app/pub/news{first}"), &[]).await?;
    assert_eq!((r.status, r.text().as_str()), (200, "x"));
    // Public data may be cached publicly; data a token admitted may not.
    assert!(
        r.h("cache-control")
            .is_some_and(|v| v.starts_with("public")),
        "{:?}",
        r.h("cache-control")
    );
    let r = server
        .get(
            &format!("/app/private{first}"),
            &[("authorization", &owner)],
        )
        .await?;
    assert_eq!(r.status, 200);
    assert!(
        r.h("cache-control")
            .is_some_and(|v| v.starts_with("private")),
        "{:?}",
        r.h("cache-control")
    );
    // The tail chunk too (PROTOCOL.md 10.1): `public` without a token, `private` with one.
    let r = server.get("/app/pub/news?offset=-1", &[]).await?;
    assert_eq!(
        r.h("cache-control"),
        Some("public, max-age=60, stale-while-revalidate=300")
    );
    let r = server
        .get("/app/private?offset=-1", &[("authorization", &owner)])
        .await?;
    assert_eq!(
        r.h("cache-control"),
        Some("private, max-age=60, stale-while-revalidate=300")
    );
    server
        .post("/app/pub/news", &[("content-type", "text/plain")], "y")
        .await?
        .refused(401, "UNAUTHORIZED");
    server
        .get("/app/private?offset=-1", &[])
        .await?
        .refused(401, "UNAUTHORIZED");
    let r = server
        .send(
            "OPTIONS",
            "/app/private",
            &[
                ("origin", b"https://app.example"),
                ("access-control-request-method", b"POST"),
                ("access-control-request-headers", b"authorization"),
            ],
            Vec::new(),
        )
        .await?;
    assert_eq!(r.status, 204);
    assert!(
        r.h("access-control-allow-headers")
            .is_some_and(|v| v.contains("Authorization"))
    );
    Ok(())
}

/// An unknown token is 401 `INVALID_TOKEN`; a token may also come as `access_token` in the query
/// (what a browser's `EventSource` can send).
#[tokio::test]
async fn unknown_tokens_are_refused_and_query_tokens_accepted() -> R {
    let dir = tempfile::tempdir()?;
    let access = AccessControl::new().with_token_file(token_file(dir.path())?)?;
    let server = start(access, config()).await?;
    let r = server
        .put(
            "/app/q",
            &[
                ("content-type", "text/plain"),
                ("authorization", &bearer("owner")),
            ],
            "x",
        )
        .await?;
    assert_eq!(r.status, 201);
    let r = server
        .get(
            "/app/q?offset=-1",
            &[("authorization", "Bearer not-a-token")],
        )
        .await?;
    r.refused(401, "INVALID_TOKEN");
    assert!(
        r.h("www-authenticate")
            .is_some_and(|v| v.contains("invalid_token"))
    );
    let r = server
        .get("/app/q?offset=-1&access_token=reader-token", &[])
        .await?;
    assert_eq!((r.status, r.text().as_str()), (200, "x"));
    Ok(())
}

/// Seconds since the epoch, `delta` from now.
fn unix(delta: i64) -> u64 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    now.saturating_add_signed(delta)
}

/// A signed JWT with `claims`.
fn jwt(
    alg: jsonwebtoken::Algorithm,
    key: &jsonwebtoken::EncodingKey,
    claims: &serde_json::Value,
) -> R<String> {
    Ok(jsonwebtoken::encode(
        &jsonwebtoken::Header::new(alg),
        claims,
        key,
    )?)
}

/// The three algorithms' key pairs: (algorithm, server key, signing key).
fn jwt_keys(
    dir: &std::path::Path,
) -> R<
    Vec<(
        JwtAlgorithm,
        JwtKey,
        jsonwebtoken::Algorithm,
        jsonwebtoken::EncodingKey,
    )>,
> {
    use jsonwebtoken::{Algorithm, EncodingKey};
    let mut out = Vec::new();
    let secret = b"a shared secret of at least thirty-two bytes";
    out.push((
        JwtAlgorithm::Hs256,
        JwtKey::new(JwtAlgorithm::Hs256, secret, "brook-test")?,
        Algorithm::HS256,
        EncodingKey::from_secret(secret),
    ));
    let ed = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519)?;
    out.push((
        JwtAlgorithm::EdDsa,
        JwtKey::new(
            JwtAlgorithm::EdDsa,
            ed.public_key_pem().as_bytes(),
            "brook-test",
        )?,
        Algorithm::EdDSA,
        EncodingKey::from_ed_pem(ed.serialize_pem().as_bytes())?,
    ));
    // RSA keys from the openssl command line (rcgen cannot make them with ring).
    let private = dir.join("rsa.pem");
    let public = dir.join("rsa.pub.pem");
    let ok = std::process::Command::new("openssl")
        .args([
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
            "-out",
        ])
        .arg(&private)
        .stderr(std::process::Stdio::null())
        .status()?
        .success()
        && std::process::Command::new("openssl")
            .args(["pkey", "-pubout", "-in"])
            .arg(&private)
            .arg("-out")
            .arg(&public)
            .status()?
            .success();
    assert!(ok, "openssl could not make an RSA key");
    out.push((
        JwtAlgorithm::Rs256,
        JwtKey::new(JwtAlgorithm::Rs256, &std::fs::read(&public)?, "brook-test")?,
        Algorithm::RS256,
        EncodingKey::from_rsa_pem(&std::fs::read(&private)?)?,
    ));
    Ok(out)
}

/// JWTs of each algorithm grant what their `scope` says; an expired one is 401 `TOKEN_EXPIRED`,
/// one for another audience, one not valid yet, one signed by another key and one naming
/// another algorithm are 401 `INVALID_TOKEN`.
#[tokio::test]
async fn jwts_of_each_algorithm_are_checked() -> R {
    let dir = tempfile::tempdir()?;
    let keys = jwt_keys(dir.path())?;
    let (_, _, other_alg, other_key) = &keys[0];
    for (i, (name, key, alg, signing)) in keys.iter().enumerate() {
        let access = AccessControl::new().with_jwt(key.clone());
        let server = start(access, config()).await?;
        let claims = |exp: i64, aud: &str, scope: &str| serde_json::json!({ "sub": "tester", "exp": unix(exp), "aud": aud, "scope": scope });
        let admin = jwt(
            *alg,
            signing,
            &claims(60, "brook-test", "admin:jwt/ read:jwt/ other:thing"),
        )?;
        let r = server
            .put(
                "/jwt/s",
                &[
                    ("content-type", "text/plain"),
                    ("authorization", &format!("Bearer {admin}")),
                ],
                "x",
            )
            .await?;
        assert_eq!(r.status, 201, "{name:?}: {}", r.text());
        let reader = format!(
            "Bearer {}",
            jwt(*alg, signing, &claims(60, "brook-test", "read:jwt/"))?
        );
        let r = server
            .get("/jwt/s?offset=-1", &[("authorization", &reader)])
            .await?;
        assert_eq!((r.status, r.text().as_str()), (200, "x"), "{name:?}");
        server
            .post(
                "/jwt/s",
                &[("content-type", "text/plain"), ("authorization", &reader)],
                "y",
            )
            .await?
            .refused(403, "FORBIDDEN");
        let refused = [
            (
                jwt(*alg, signing, &claims(-10, "brook-test", "read:jwt/"))?,
                "TOKEN_EXPIRED",
            ),
            (
                jwt(*alg, signing, &claims(60, "elsewhere", "read:jwt/"))?,
                "INVALID_TOKEN",
            ),
            (
                jwt(
                    *alg,
                    signing,
                    &serde_json::json!({ "exp": unix(60), "nbf": unix(60), "aud": "brook-test", "scope": "read:jwt/" }),
                )?,
                "INVALID_TOKEN",
            ),
            (format!("{}x", &admin[..admin.len() - 1]), "INVALID_TOKEN"),
        ];
        for (token, code) in refused {
            let r = server
                .get(
                    "/jwt/s?offset=-1",
                    &[("authorization", &format!("Bearer {token}"))],
                )
                .await?;
            r.refused(401, code);
            assert!(r.h("www-authenticate").is_some(), "{name:?} {code}");
        }
        if i > 0 {
            let forged = jwt(
                *other_alg,
                other_key,
                &claims(60, "brook-test", "read:jwt/"),
            )?;
            server
                .get(
                    "/jwt/s?offset=-1",
                    &[("authorization", &format!("Bearer {forged}"))],
                )
                .await?
                .refused(401, "INVALID_TOKEN");
        }
    }
    Ok(())
}

/// An SSE connection admitted by a JWT ends when the token expires, with a final
/// `credential-expired` event (long before its own 30 s lifetime); a long-poll waiting at the
/// tail is answered 401 `TOKEN_EXPIRED` then.
#[tokio::test]
async fn live_reads_end_when_their_token_expires() -> R {
    let dir = tempfile::tempdir()?;
    let keys = jwt_keys(dir.path())?;
    let (_, key, alg, signing) = &keys[0];
    let mut cfg = config();
    cfg.sse_max_duration = Duration::from_secs(30);
    cfg.long_poll_timeout = Duration::from_secs(30);
    let server = start(AccessControl::new().with_jwt(key.clone()), cfg).await?;
    let claims = |exp: i64, scope: &str| serde_json::json!({ "exp": unix(exp), "aud": "brook-test", "scope": scope });
    let admin = format!(
        "Bearer {}",
        jwt(*alg, signing, &claims(60, "admin:live/ write:live/"))?
    );
    let r = server
        .put(
            "/live/s",
            &[("content-type", "text/plain"), ("authorization", &admin)],
            "x",
        )
        .await?;
    assert_eq!(r.status, 201);
    let tail = r.need("stream-next-offset")?.to_owned();
    let short = format!("Bearer {}", jwt(*alg, signing, &claims(2, "read:live/"))?);
    let started = Instant::now();
    let res = server
        .client
        .get(server.url("/live/s?offset=-1&live=sse"))
        .header("authorization", &short)
        .send()
        .await?;
    assert_eq!(res.status().as_u16(), 200);
    let mut body = res.bytes_stream();
    let mut seen = String::new();
    while let Some(chunk) = tokio::time::timeout(Duration::from_secs(10), body.next()).await? {
        seen.push_str(std::str::from_utf8(&chunk?)?);
    }
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the SSE connection outlived its token"
    );
    assert!(
        seen.ends_with("event: credential-expired\ndata: {\"reason\":\"credential_expired\"}\n\n"),
        "{seen}"
    );
    assert!(seen.contains("data:x"), "{seen}");
    let short = format!("Bearer {}", jwt(*alg, signing, &claims(2, "read:live/"))?);
    let started = Instant::now();
    let r = server
        .get(
            &format!("/live/s?offset={tail}&live=long-poll"),
            &[("authorization", &short)],
        )
        .await?;
    r.refused(401, "TOKEN_EXPIRED");
    assert!(started.elapsed() < Duration::from_secs(10));
    Ok(())
}

/// A rewritten token file is in force within seconds, without a restart: a removed token stops
/// working and a new one starts; a broken file keeps the list in force.
#[tokio::test]
async fn the_token_file_is_reloaded_when_it_changes() -> R {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("tokens");
    std::fs::write(&path, format!("{} read /\n", token_hash("first")))?;
    let server = start(AccessControl::new().with_token_file(&path)?, config()).await?;
    let status = |token: &'static str| {
        let server = &server;
        async move {
            let r: Resp = server
                .get(
                    "/missing?offset=-1",
                    &[("authorization", &format!("Bearer {token}"))],
                )
                .await?;
            R::Ok(r.status)
        }
    };
    assert_eq!(status("first").await?, 404);
    assert_eq!(status("second").await?, 401);
    std::fs::write(
        &path,
        format!("# rotated\n{} read /\n", token_hash("second")),
    )?;
    let until = Instant::now() + Duration::from_secs(15);
    while status("second").await? != 404 {
        assert!(
            Instant::now() < until,
            "the new token file was never loaded"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(status("first").await?, 401);
    std::fs::write(&path, "sha256:nothex read /\n")?;
    tokio::time::sleep(brook::http::RELOAD_CHECK_EVERY * 2).await;
    assert_eq!(
        status("second").await?,
        404,
        "a broken file replaced the list"
    );
    Ok(())
}

/// `brook token new` prints a token-file line and, on stderr, the token whose hash it holds;
/// `brook token hash` prints that hash.
#[test]
fn brook_token_new_and_hash() -> R {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_brook"))
        .args(["token", "new", "read,write", "chat/", "logs/"])
        .output()?;
    assert!(out.status.success());
    let line = String::from_utf8(out.stdout)?;
    let stderr = String::from_utf8(out.stderr)?;
    let token = stderr
        .trim()
        .strip_prefix("token: ")
        .ok_or("no token on stderr")?;
    assert_eq!(
        line.trim(),
        format!("{} read,write chat/ logs/", token_hash(token))
    );
    brook::http::check_token_line(line.trim())?;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_brook"))
        .args(["token", "hash"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    std::io::Write::write_all(
        child.stdin.as_mut().ok_or("stdin")?,
        format!("{token}\n").as_bytes(),
    )?;
    let out = child.wait_with_output()?;
    assert_eq!(String::from_utf8(out.stdout)?.trim(), token_hash(token));
    let bad = std::process::Command::new(env!("CARGO_BIN_EXE_brook"))
        .args(["token", "new", "delete", "chat/"])
        .output()?;
    assert!(!bad.status.success());
    Ok(())
}

/// With access control on, what must be reachable without this server's bearer token is: the
/// JWKS (webhook receivers verify signatures with it) and a subscription's callback, ack and
/// release (each authenticated by the subscription's own token, refused by the handler with its
/// own codes, never `UNAUTHORIZED`). A pull-wake claim needs `read` on the root; managing
/// subscriptions needs `admin`.
#[tokio::test]
async fn subscription_routes_are_admitted_by_their_own_tokens() -> R {
    let dir = tempfile::tempdir()?;
    let access = AccessControl::new().with_token_file(token_file(dir.path())?)?;
    let server = start(access, config()).await?;
    let r = server.get("/__ds/jwks.json", &[]).await?;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.text().contains("Ed25519"), "{}", r.text());
    for action in ["callback", "ack", "release"] {
        let r = server
            .post(
                &format!("/__ds/subscriptions/s1/{action}"),
                &[("authorization", "Bearer nope")],
                "{}",
            )
            .await?;
        assert_ne!(
            r.code().as_deref(),
            Some("UNAUTHORIZED"),
            "{action}: {}",
            r.text()
        );
        assert_ne!(
            r.code().as_deref(),
            Some("INVALID_TOKEN"),
            "{action}: {}",
            r.text()
        );
        assert_ne!(r.status, 403, "{action}: {}", r.text());
    }
    // Under the stream root `app/`: a reader of app/ may claim, a writer may not; only an
    // admin of app/ manages the subscription.
    let path = "/app/__ds/subscriptions/s1";
    let as_who = |who: &str| bearer(who);
    let r = server
        .post(
            &format!("{path}/claim"),
            &[("authorization", &as_who("reader"))],
            "{}",
        )
        .await?;
    assert!(![401, 403].contains(&r.status), "{}", r.text());
    server
        .post(
            &format!("{path}/claim"),
            &[("authorization", &as_who("writer"))],
            "{}",
        )
        .await?
        .refused(403, "FORBIDDEN");
    server
        .put(path, &[("authorization", &as_who("reader"))], "{}")
        .await?
        .refused(403, "FORBIDDEN");
    let r = server
        .put(path, &[("authorization", &as_who("admin"))], "{}")
        .await?;
    assert!(![401, 403].contains(&r.status), "{}", r.text());
    Ok(())
}
