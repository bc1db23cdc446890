//! DELETE of a stream, and soft deletes of fork sources.

use super::*;

/// DELETE of a missing stream is 404; deleting a source with forks soft-deletes it: 410 to every
/// operation, 409 to re-creating or forking it, and its fork still reads its data.
#[tokio::test]
async fn delete_and_soft_delete() -> TestResult {
    let t = harness()?;
    assert_eq!(
        t.send("DELETE", "/s/none", &[], Body::empty()).await.status,
        StatusCode::NOT_FOUND
    );
    t.text_stream("/s/src", "data").await;
    let r = t
        .put("/s/fork", &[CT_TEXT, ("stream-forked-from", "/s/src")], "")
        .await;
    assert_eq!(r.status, StatusCode::CREATED);
    assert_eq!(
        t.send("DELETE", "/s/src", &[], Body::empty()).await.status,
        StatusCode::NO_CONTENT
    );
    assert_problem(&t.get("/s/src", &[]).await, StatusCode::GONE, "STREAM_GONE");
    assert_eq!(t.head("/s/src", &[]).await.status, StatusCode::GONE);
    assert_eq!(
        t.post("/s/src", &[CT_TEXT], "x").await.status,
        StatusCode::GONE
    );
    assert_eq!(
        t.send("DELETE", "/s/src", &[], Body::empty()).await.status,
        StatusCode::GONE
    );
    assert_eq!(
        t.put("/s/src", &[CT_TEXT], "").await.status,
        StatusCode::CONFLICT
    );
    let r = t
        .put("/s/fork2", &[CT_TEXT, ("stream-forked-from", "/s/src")], "")
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    assert_eq!(t.get("/s/fork?offset=-1", &[]).await.text(), "data");
    Ok(())
}
