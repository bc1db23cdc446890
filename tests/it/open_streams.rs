//! The open-stream cache under more streams than it holds (`max_open_streams`): in buffered
//! mode a stream written since the last checkpoint cannot be closed, so reaching the cap asks
//! for a checkpoint instead of refusing; concurrent first lookups of one closed stream end with
//! one open stream.

use std::sync::Arc;

use brook::*;

use crate::util::typed as text;

type R = std::result::Result<(), Box<dyn std::error::Error>>;

fn name(s: &str) -> StreamName {
    StreamName::new(s).expect("valid name")
}

fn read_all(store: &Store, n: &StreamName) -> brook::Result<Vec<u8>> {
    Ok(store.read(n, &ReadRequest::from(ReadFrom::Start))?.to_vec())
}

/// Buffered, a cap of 16 and checkpoints far apart: 200 streams created and appended to in a
/// row all succeed (the cap asks for a checkpoint rather than answering `TooManyOpenStreams`),
/// then, reopened, 200 appends to streams that are all closed succeed too, and every byte
/// reads back after a second reopen.
#[test]
fn buffered_writes_to_more_streams_than_the_cap_all_succeed() -> R {
    let dir = tempfile::tempdir()?;
    let opts = Options::default()
        .with_durability(Durability::Buffered)
        .with_max_open_streams(16)
        .with_checkpoint_bytes(1 << 30);
    let store = Store::open(dir.path(), opts.clone())?;
    for i in 0..200 {
        let n = name(&format!("cap/{i}"));
        store.create(&n, text("text/plain"))?;
        store.append(&n, AppendRequest::new(format!("a{i},")))?;
    }
    drop(store);
    let store = Store::open(dir.path(), opts.clone())?;
    for i in 0..200 {
        let n = name(&format!("cap/{i}"));
        store.append(&n, AppendRequest::new(format!("b{i},")))?;
    }
    drop(store);
    let store = Store::open(dir.path(), opts)?;
    for i in 0..200 {
        let n = name(&format!("cap/{i}"));
        assert_eq!(read_all(&store, &n)?, format!("a{i},b{i},").as_bytes());
    }
    Ok(())
}

/// Many threads looking up the same closed streams at once (after a reopen, so none is open)
/// all see one stream per name: every append lands in the one stream, none is lost.
#[test]
fn concurrent_first_lookups_of_a_closed_stream_share_one_stream() -> R {
    let dir = tempfile::tempdir()?;
    let opts = Options::default()
        .with_durability(Durability::Buffered)
        .with_max_open_streams(16);
    let store = Store::open(dir.path(), opts.clone())?;
    for i in 0..8 {
        store.create(&name(&format!("race/{i}")), text("text/plain"))?;
    }
    drop(store);
    let store = Arc::new(Store::open(dir.path(), opts.clone())?);
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || -> brook::Result<()> {
                for i in 0..8 {
                    let n = name(&format!("race/{i}"));
                    store.append(&n, AppendRequest::new(format!("{t}")))?;
                }
                Ok(())
            })
        })
        .collect();
    for t in threads {
        t.join().expect("an appending thread panicked")?;
    }
    let store = Arc::try_unwrap(store).map_err(|_| "store still shared")?;
    drop(store);
    let store = Store::open(dir.path(), opts)?;
    for i in 0..8 {
        let mut got = read_all(&store, &name(&format!("race/{i}")))?;
        got.sort_unstable();
        assert_eq!(got, b"01234567", "race/{i} lost or doubled an append");
    }
    Ok(())
}
