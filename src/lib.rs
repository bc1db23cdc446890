//! brook: durable, append-only, URL-addressed streams on one machine.
//!
//! brook is an embedded storage engine for named append-only streams (the Durable Streams model:
//! byte or JSON streams, readable from any offset, tailable live, with compare-and-set
//! `Stream-Seq`, exactly-once producers and incarnation checks), and, with the `http` feature,
//! a server for the Durable Streams protocol with Ursula's extensions.
//!
//! ```
//! use brook::{AppendRequest, CreateOptions, Guard, Options, ReadFrom, ReadRequest, Store, StreamName};
//!
//! let dir = tempfile::tempdir()?;
//! let store = Store::open(dir.path(), Options::default())?;
//! let name = StreamName::new("chat/room-1")?;
//! let created = store.create(&name, CreateOptions::json())?;
//! let sent = store.append(&name, AppendRequest::new(r#"[{"text":"hi"},{"text":"there"}]"#))?;
//! let chunk = store.read(&name, &ReadRequest::from(ReadFrom::Start))?;
//! assert_eq!(chunk.to_vec(), br#"[{"text":"hi"},{"text":"there"}]"#);
//! // Only if the stream is still the one this call created:
//! let closed = store.close(&name, &Guard::expect(created.info.incarnation))?;
//! assert_eq!(closed.tail, sent.tail);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Requests are built with constructors and builder methods (`CreateOptions::json().ttl(60)`,
//! `AppendRequest::new(data).stream_seq(seq)`); operations that carry only preconditions take a
//! [`Guard`]; [`Options`] are set with `with_*` methods and read back by their names.
//!
//! Async callers use the calls that never block a worker ([`Store::try_append`] with
//! [`Store::commit_hint`], [`Store::try_read`], [`Store::try_head`], [`Watch`]); the `http`
//! server is built on this public API alone, webhook delivery included
//! ([`Store::take_webhook_jobs`]).
//!
//! Features: none by default (the engine); `http` adds the server (`brook serve`), the
//! [`headers`] module and the `brook` binary, and turns on the three below; `client` adds a Rust
//! client with the conditional-write recipes; `mirror` adds `brook::mirror` (copying streams to
//! another Durable Streams server, `brook mirror`); `tier` adds the cold tier on object storage
//! ([`TierOptions`], `Options::with_tier`).
#![deny(unsafe_code)]

#[cfg(feature = "client")]
pub mod client; // a Rust client for any Durable Streams server, with the conditional-write recipes
mod codec; // little-endian encoding helpers for the on-disk formats
mod digest; // BodyDigest (a producer write's identity) and TailMatch (a precondition on the tail)
mod engine; // the store's machinery: registry, streams, group commit and the fsync protocol, checkpoints, recovery
mod error; // Error, Result
mod fs; // file-system helpers: the store lock, stream directories, directory and file-system syncs, sendfile
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing; // the on-disk decoders, exposed to the fuzz crate (feature "fuzzing")
#[cfg(any(feature = "http", feature = "client"))]
pub mod headers; // wire header names and typed parsers (StreamSeqConflict, ...)
#[cfg(feature = "http")]
pub mod http; // the Durable Streams server: router, handlers, SSE/long-poll, error mapping, TLS, access control, limits
mod listing; // ListPage, StreamListing, CheckReport: listing streams, checking the store
#[cfg(feature = "mirror")]
pub mod mirror; // `brook mirror`: copies streams to any Durable Streams server, exactly once
mod name; // StreamName, Offset, Incarnation, content types
mod options; // Options, Durability
#[cfg(any(feature = "http", feature = "mirror"))]
mod portable; // names that can move to Ursula-style servers (bucket/stream)
mod retention; // retention policies (by age, by size) and the enforcer's figures
mod segment; // per-stream segment logs and mmap'd indexes
mod sidecar; // the per-stream metadata checkpoint record
mod state; // a stream's state (Stream-Seq, producers, closure) and the whole order of checks, pure
mod stats; // the engine's running figures: atomic counters and histograms, `Stats`
mod store; // Store, the public entry point
pub mod subscription; // subscriptions: configurations, links, wakes (PROTOCOL.md sections 6-7)
mod tier; // the cold tier: the per-stream tier manifest; with feature "tier", uploads, eviction and cold reads on object storage
mod types; // requests and outcomes

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

pub use digest::{BodyDigest, TailMatch};
pub use error::{Error, Result, StagedLimit};
pub use fs::sim; // the simulated disk (power cuts, injected faults) for the fault tests
#[doc(hidden)]
pub use fs::stream_files_for_descriptors;
pub use listing::{CheckReport, ListPage, StreamListing};
pub use name::{
    Incarnation, MAX_FORK_DEPTH, Offset, ReadFrom, StreamName, is_json, normalize_content_type,
};
pub use options::{Durability, Options};
pub use retention::{MAX_RETENTION_LIMIT, RetentionPolicy, RetentionStats};
pub use segment::FileRange;
pub use stats::{Histogram, Stats};
pub use store::{Commit, Pending, Store, TryAppend, Watch, WeakStore};
pub use subscription::{SubscriptionConfig, SubscriptionInfo, Wake};
#[cfg(feature = "tier")]
pub use tier::TierOptions;
pub use types::{
    AppendOutcome, AppendRequest, AppendStatus, CreateOptions, Created, Expiry, ForkFrom, Guard,
    Message, Producer, PublishParts, PublishSnapshot, Published, ReadChunk, ReadRequest,
    RetentionRequest, Snapshot, SnapshotInfo, SnapshotRequest, StagedPart, StreamInfo,
};
