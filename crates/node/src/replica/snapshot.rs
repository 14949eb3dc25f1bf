//! Snapshots that carry the store (compaction of the log is in `compact.rs`).
//!
//! The core's own snapshot is a compaction point: its data is empty, because this member's store
//! already holds that state (durably: the log is compacted only up to what the committer made
//! durable). When the core sends a snapshot to a follower, the replica sends the store instead,
//! as etcd does (`createMergedSnapshotMessage`): an image of the store at the applied index,
//! with the metadata rewritten to that index, its term and the configuration as of it. Any
//! committed state is a valid snapshot; the leader's progress for the follower accepts an
//! acknowledgement at or above the index it asked for.
//!
//! With peers (`ReplicaConfig::images`), the image never enters the message: the replica takes
//! a read view of the store on a thread of its own (`crate::snapshot_images`) and the message
//! carries a handle to it, which the transport streams in chunks; on the receiving member the
//! message arrives with a handle to the file the chunks were written to, its checksum already
//! verified. Without peers (the simulator, tests) the message carries the image itself.
//!
//! A received image (or its file) is kept aside and the core sees the message without it. When
//! the core asks to install the snapshot, the store replaces its contents with the image
//! atomically and durably first, together with the snapshot's metadata, and only then does the
//! log record the install (`Wal::install_snapshot`): a crash before the store's commit leaves the
//! old state, and a crash after either leaves the new state. After a crash between the two the
//! store holds the image and says which snapshot it is, and the next open records the install
//! in the log before anything else (`finish_install` in `mod.rs`): without that record the
//! member's core would start behind its own store, unable to make a snapshot of it for anyone
//! until a leader's commit index passed it. The file goes last: one left by a
//! crash is removed when the transport starts, as the core no longer knows its message.

use cairn_kv::backend::Backend;
use cairn_raft::{Message, MessageBody, Snapshot, SnapshotMeta};

use cairn_storage::fs::Dir;

use super::{Observed, Replica};
use crate::config::Bug;
use crate::error::{EngineError, StorageError};

impl<D: Dir, B: Backend, T> Replica<D, B, T> {
    /// Queues messages for the transport, putting the store's image into snapshot messages.
    pub(super) fn send(&mut self, msgs: Vec<Message>) -> Result<(), StorageError> {
        for mut msg in msgs {
            if let MessageBody::Snapshot { snapshot } = &mut msg.body {
                if !self.cfg.has_bug(Bug::EmptySnapshot) {
                    match self.store_snapshot()? {
                        Some(s) => *snapshot = s,
                        None => {
                            // As if the transport had failed to send it: the core tries again.
                            self.unsent_snapshots.push(msg.to);
                            continue;
                        }
                    }
                }
            }
            self.work.messages.push(msg);
        }
        Ok(())
    }

    /// The store's state at the applied index, as a snapshot; `None` while the store is ahead
    /// of the core's applied index, when no configuration for the store's index is known. After
    /// a restart replay brings the core to the store at once: `store_batches.rs` keeps the
    /// store's durable index within the log's durable commit index, and an install the log did
    /// not record is recorded at open.
    fn store_snapshot(&mut self) -> Result<Option<Snapshot>, StorageError> {
        // Every earlier Ready is applied and advanced, so the core's configuration is the one
        // as of its applied index.
        let index = self.raft.applied_index();
        if index.0 != self.store.executed_index() {
            return Ok(None);
        }
        let data = match (&self.cfg.images, &self.outgoing_image) {
            (Some(maker), _) => match maker.make() {
                Ok(handle) => handle,
                Err(e) => {
                    tracing::warn!(index = index.0, "cannot read the store for a snapshot: {e}");
                    return Ok(None);
                }
            },
            (None, Some((at, data))) if *at == index => data.clone(),
            (None, _) => {
                let data = self.store.image()?;
                self.outgoing_image = Some((index, data.clone()));
                data
            }
        };
        let term = self.raft.term_at(index).unwrap_or(self.raft.snapshot_meta().term);
        let meta = SnapshotMeta { index, term, conf_state: self.raft.conf_state().clone() };
        Ok(Some(Snapshot { meta, data }))
    }

    /// Tells the core which snapshots could not be sent.
    pub(super) fn report_unsent_snapshots(&mut self) {
        for to in std::mem::take(&mut self.unsent_snapshots) {
            self.raft.report_snapshot(to, cairn_raft::SnapshotStatus::Failed);
        }
    }

    /// Takes the image off an incoming snapshot message. Returns the message for the core, or
    /// `None` if the image is unusable: a peer's bad snapshot is dropped (the leader sends
    /// another), never installed, and never a reason to stop. So is a snapshot older than what
    /// the store has executed: installing it would take the store back in time (the core can
    /// know less than the store after a crash between the store's install and the log's
    /// record of it). The leader's next snapshot is newer. One at exactly the executed index
    /// holds the state the store holds, and is installed: a member whose store is ahead of its
    /// log (an empty log, after such a crash) would otherwise wait for the cluster's next write
    /// to catch up, forever in an idle cluster (the simulator found a learner stuck so).
    pub(super) fn accept_snapshot_image(&mut self, mut msg: Message) -> Option<Message> {
        let MessageBody::Snapshot { snapshot } = &mut msg.body else { return Some(msg) };
        let data = std::mem::take(&mut snapshot.data);
        let index = snapshot.meta.index.0;
        let file = self.cfg.images.as_ref().and_then(|m| m.received_index(&data));
        let usable = index >= self.store.executed_index()
            && match file {
                Some(at) => at.is_ok_and(|i| i == index),
                None if self.cfg.has_bug(Bug::EmptySnapshot) && data.is_empty() => true,
                None => {
                    cairn_kv::snapshot::decode_meta(&data).is_ok_and(|m| m.applied_index == index)
                }
            };
        if !usable {
            self.remove_received(&data);
            return None;
        }
        self.drop_incoming_image();
        self.incoming_image = Some((snapshot.meta.clone(), data));
        Some(msg)
    }

    /// Whether a received snapshot waits for the next [`Replica::process`] to install it (the
    /// simulator aims disk faults at installs with it).
    pub fn has_snapshot_to_install(&self) -> bool {
        self.incoming_image.is_some()
    }

    /// Lets go of a received image the core did not install, removing its file.
    pub(super) fn drop_incoming_image(&mut self) {
        if let Some((_, data)) = self.incoming_image.take() {
            self.remove_received(&data);
        }
    }

    fn remove_received(&self, data: &[u8]) {
        if let Some(m) = &self.cfg.images {
            m.remove_received(data);
        }
    }

    /// Replaces the store with the image that came with `meta`, durably, then records the
    /// install in the log and makes that durable too.
    pub(super) fn install_snapshot(&mut self, meta: &SnapshotMeta) -> Result<(), StorageError> {
        let missing = || StorageError::SnapshotMissing { index: meta.index };
        let data = match self.incoming_image.take() {
            Some((m, data)) if m == *meta => data,
            Some((_, data)) => {
                self.remove_received(&data);
                return Err(missing());
            }
            None => return Err(missing()),
        };
        // The store keeps the snapshot's metadata with the image, so that a crash before the
        // log's record below is finished at the next open (`finish_install`).
        let mut origin = Vec::new();
        cairn_storage::codec::encode_snapshot_meta(meta, &mut origin);
        let origin = Some(origin);
        // From the file it was received into, read piece by piece: never whole in memory.
        let (installed, file) = match self.cfg.images.as_ref().and_then(|m| m.open_received(&data))
        {
            Some(opened) => {
                let (reader, len) = opened.map_err(|_| missing())?;
                (self.store.install_recorded(reader, len, origin), Some(data))
            }
            None if data.is_empty() && self.cfg.has_bug(Bug::EmptySnapshot) => {
                let image = cairn_kv::snapshot::empty_image(meta.index.0);
                (self.store.install_recorded(&image[..], image.len() as u64, origin), None)
            }
            None => (self.store.install_recorded(&data[..], data.len() as u64, origin), None),
        };
        let installed = installed.map_err(|e| StorageError::Snapshot(std::sync::Arc::new(e)))?;
        if installed.applied_index != meta.index.0 {
            return Err(missing());
        }
        self.wal.install_snapshot(meta)?;
        // Replay counts everything up to the snapshot committed.
        self.syncs.commit_written = self.syncs.commit_written.max(meta.index);
        self.sync_wal()?;
        if let Some(handle) = file {
            // Installed and recorded: the file is of no more use (a crash before this leaves it
            // to the transport's start, which removes it).
            self.remove_received(&handle);
        }
        tracing::info!(
            index = meta.index.0,
            term = meta.term.0,
            "installed a snapshot from the leader"
        );
        if let Some(m) = &self.cfg.metrics {
            crate::metrics::EngineMetrics::add(&m.snapshots_installed, 1);
        }
        self.store_durable = meta.index;
        // The image brought the cluster's attributes for this member, whatever they are.
        self.unsettle_publisher();
        self.work.membership = true;
        // Proposals this member appended as leader up to the snapshot are covered by it or were
        // replaced; which, the image cannot tell. Their outcome is unknown.
        let covered: Vec<_> =
            self.proposal_index.range(..=meta.index).map(|(i, id)| (*i, *id)).collect();
        for (index, id) in covered {
            self.proposal_index.remove(&index);
            if let Some(p) = self.proposals.take(&id) {
                self.work.answers.push((p.token, Err(EngineError::LeaderChanged)));
            }
        }
        if self.cfg.observe {
            self.work.observed.push(Observed::Installed(meta.clone()));
        }
        Ok(())
    }
}
