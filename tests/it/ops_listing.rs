//! Listing by prefix through the name index: 100k streams paged in order, closure and deletes
//! reflected, the index surviving a reopen, a crash and its own loss (rebuilt from sidecars).

use std::time::Instant;

use brook::*;

use crate::util::{R, crash_image, name, typed};

/// Every name under `prefix`, page by page of `limit`, checking each page's order and cursor.
fn all_pages(store: &Store, prefix: &str, limit: usize) -> Result<Vec<StreamListing>, Error> {
    let mut out: Vec<StreamListing> = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = store.list_page(prefix, after.as_deref(), limit)?;
        assert!(page.streams.len() <= limit);
        if page.next.is_some() {
            assert_eq!(page.streams.len(), limit, "a full page before every next");
            assert_eq!(
                page.next.as_deref(),
                page.streams.last().map(|s| s.name.as_str())
            );
        }
        out.extend(page.streams);
        match page.next {
            Some(n) => after = Some(n),
            None => return Ok(out),
        }
    }
}

#[test]
fn a_hundred_thousand_streams_are_listed_by_prefix_in_pages() -> R {
    let dir = tempfile::tempdir()?;
    let opts = Options::default().with_durability(Durability::Buffered);
    let store = Store::open(dir.path(), opts.clone())?;
    let started = Instant::now();
    let mut pending = Vec::new();
    for i in 0..100_000u32 {
        let n = name(&format!("p{}/s{i:06}", i % 10));
        pending.push(store.submit_create(&n, typed("text/plain"))?);
        if pending.len() == 1000 {
            for p in pending.drain(..) {
                p.wait()?;
            }
        }
    }
    for p in pending {
        p.wait()?;
    }
    eprintln!("created 100k streams in {:?}", started.elapsed());
    store.append(&name("p3/s000003"), AppendRequest::new("abc").closing())?;
    store.delete(&name("p3/s000013"), &Guard::default())?;

    let started = Instant::now();
    let listed = all_pages(&store, "p3/", 997)?;
    eprintln!("listed 10k of 100k streams in {:?}", started.elapsed());
    assert_eq!(listed.len(), 9_999);
    assert!(
        listed
            .windows(2)
            .all(|w| w[0].name.as_str() < w[1].name.as_str())
    );
    assert!(listed.iter().all(|s| s.name.as_str().starts_with("p3/")));
    assert!(!listed.iter().any(|s| s.name.as_str() == "p3/s000013"));
    let closed = listed
        .iter()
        .find(|s| s.name.as_str() == "p3/s000003")
        .ok_or("missing")?;
    assert!(closed.closed);
    assert_eq!(closed.content_type, "text/plain");
    assert_eq!(closed.tail.bytes, 3);
    assert_eq!(store.list("p3/")?.len(), 9_999);
    assert_eq!(store.list_page("p", None, 5)?.streams.len(), 5);
    assert!(store.list_page("q", None, 5)?.streams.is_empty());

    // A reopen reads the index back.
    store.shutdown()?;
    drop(store);
    let store = Store::open(dir.path(), opts)?;
    assert_eq!(all_pages(&store, "p3/", 1000)?, listed);
    Ok(())
}

/// Creates `n` streams `{prefix}{i:05}` on `store`, waiting for each thousand together.
fn create_many(store: &Store, prefix: &str, n: u32) -> R {
    let mut pending = Vec::new();
    for i in 0..n {
        pending.push(store.submit_create(&name(&format!("{prefix}{i:05}")), typed("text/plain"))?);
        if pending.len() == 1000 {
            for p in pending.drain(..) {
                p.wait()?;
            }
        }
    }
    for p in pending {
        p.wait()?;
    }
    Ok(())
}

#[test]
fn the_index_survives_a_crash_and_is_rebuilt_when_lost() -> R {
    let dir = tempfile::tempdir()?;
    let opts = Options::default();
    let store = Store::open(dir.path(), opts.clone())?;
    create_many(&store, "a/", 1500)?;
    store.checkpoint()?;
    // The index as the checkpoint made it durable.
    let names = dir.path().join("NAMES");
    let durable = std::fs::metadata(&names)?.len();
    // Created after the checkpoint (fewer than trigger another): in the journal, and in the
    // index's unsynced tail.
    create_many(&store, "b/", 500)?;
    store.delete(&name("a/00007"), &Guard::default())?;
    let image = crash_image(store, dir.path())?;
    // The worst case for the index: its unsynced tail is lost entirely, and a torn frame
    // is left where it ended.
    let names = image.path().join("NAMES");
    assert!(std::fs::metadata(&names)?.len() > durable);
    let f = std::fs::OpenOptions::new().write(true).open(&names)?;
    f.set_len(durable + 5)?;
    drop(f);
    let store = Store::open(image.path(), opts.clone())?;
    let a = all_pages(&store, "a/", 100)?;
    let b = all_pages(&store, "b/", 100)?;
    assert_eq!(a.len(), 1499);
    assert_eq!(b.len(), 500);
    assert!(!a.iter().any(|s| s.name.as_str() == "a/00007"));
    store.shutdown()?;
    drop(store);

    // The index lost altogether is rebuilt from the sidecars.
    std::fs::remove_file(&names)?;
    let store = Store::open(image.path(), opts)?;
    assert_eq!(all_pages(&store, "a/", 1000)?, a);
    assert_eq!(all_pages(&store, "b/", 1000)?, b);
    assert_eq!(store.list("")?.len(), 1999);
    Ok(())
}
