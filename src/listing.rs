//! Listing streams by prefix, a page at a time ([`Store::list_page`](crate::Store::list_page)):
//! the request and the page it returns.

use crate::name::{Offset, StreamName};

/// One stream in a listing: its name and the metadata a listing shows without opening it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct StreamListing {
    /// The stream's name.
    pub name: StreamName,
    /// Its content type.
    pub content_type: String,
    /// Its durable tail (where the next append goes).
    pub tail: Offset,
    /// Whether it is closed.
    pub closed: bool,
}

/// What [`Store::check`](crate::Store::check) found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CheckReport {
    /// Stream directories with a valid sidecar.
    pub streams: u64,
    /// Of those, soft-deleted or expired streams, whose data was not read.
    pub skipped: u64,
    /// Messages read and checked against their index CRCs.
    pub messages: u64,
    /// Bytes read (in the stored representation).
    pub bytes: u64,
    /// One line per damaged stream or file; empty when nothing is damaged.
    pub damaged: Vec<String>,
    /// The stream directories the damage is in, each once: what
    /// [`Store::quarantine`](crate::Store::quarantine) (`brook check --repair`) moves aside.
    pub damaged_dirs: Vec<std::path::PathBuf>,
}

/// A page of a listing: streams in name order, and where the next page starts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ListPage {
    /// The streams of this page, in name order.
    pub streams: Vec<StreamListing>,
    /// The cursor of the next page (the last name of this one); `None` on the last page.
    pub next: Option<String>,
}
