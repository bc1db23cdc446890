//! The store's machinery (under construction).
#![allow(dead_code, unused_variables, missing_docs)]
use std::io::Read;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::error::Result;
use crate::name::{Incarnation, Offset, ReadFrom, StreamName};
use crate::options::Options;
use crate::store::Pending;
use crate::types::*;

pub(crate) struct Engine { options: Options }
pub(crate) struct Ticket;
impl Ticket {
    pub(crate) fn wait(&self) -> Result<()> { todo!() }
    pub(crate) async fn wait_async(&self) -> Result<()> { todo!() }
}
impl Engine {
    pub(crate) fn open(dir: &Path, options: Options) -> Result<Arc<Engine>> { todo!() }
    pub(crate) fn options(&self) -> &Options { &self.options }
    pub(crate) fn create(&self, name: &StreamName, req: CreateOptions) -> Result<Pending<Created>> { todo!() }
    pub(crate) fn append(&self, name: &StreamName, req: AppendRequest) -> Result<Pending<AppendOutcome>> { todo!() }
    pub(crate) fn read(&self, name: &StreamName, req: &ReadRequest) -> Result<ReadChunk> { todo!() }
    pub(crate) fn read_messages(&self, name: &StreamName, req: &ReadRequest) -> Result<(Vec<Message>, ReadChunk)> { todo!() }
    pub(crate) fn head(&self, name: &StreamName, expect: Option<&Incarnation>) -> Result<StreamInfo> { todo!() }
    pub(crate) fn touch(&self, name: &StreamName) -> Result<()> { todo!() }
    pub(crate) fn delete(&self, name: &StreamName, expect: Option<&Incarnation>) -> Result<Pending<()>> { todo!() }
    pub(crate) async fn wait(&self, name: &StreamName, after: Offset) -> Result<()> { todo!() }
    pub(crate) fn wait_blocking(&self, name: &StreamName, after: Offset, timeout: Duration) -> Result<bool> { todo!() }
    pub(crate) fn publish_snapshot(&self, name: &StreamName, offset: Offset, content_type: Option<&str>, blob: &mut dyn Read, expect_digest: Option<&str>, expect: Option<&Incarnation>) -> Result<(SnapshotInfo, StreamInfo)> { todo!() }
    pub(crate) fn snapshot(&self, name: &StreamName, offset: Option<Offset>, expect: Option<&Incarnation>) -> Result<Snapshot> { todo!() }
    pub(crate) fn delete_snapshot(&self, name: &StreamName, offset: Offset, expect: Option<&Incarnation>) -> Result<()> { todo!() }
    pub(crate) fn set_retention(&self, name: &StreamName, offset: Offset, expect: Option<&Incarnation>) -> Result<StreamInfo> { todo!() }
    pub(crate) fn list(&self, prefix: &str) -> Result<Vec<StreamName>> { todo!() }
    pub(crate) fn checkpoint(&self) -> Result<()> { todo!() }
    pub(crate) fn shutdown(&self) -> Result<()> { todo!() }
    pub(crate) fn resolve(&self, name: &StreamName, from: ReadFrom) -> Result<Offset> { todo!() }
}
