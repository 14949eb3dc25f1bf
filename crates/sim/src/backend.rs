//! The store's disk in the simulator: an in-memory [`Backend`] that survives a member's crash
//! the way cairn's LMDB environment does.
//!
//! cairn opens LMDB with `NO_META_SYNC`: a commit fsyncs its data pages but not its meta page,
//! and the next commit's fsync flushes the previous meta page too. So after a power loss the
//! database holds either its last commit or the one before, never a mix; an explicit sync makes
//! the last commit durable. [`SimBackend::crash`] picks one of those outcomes from the seed.
//! It can also fail a commit on demand, to drive the store's fail-stop path.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};

use cairn_kv::backend::{
    decode_alarms, decode_lease, decode_members, Backend, BackendError, BackendView, Meta, Record,
    WriteBatch,
};
use cairn_kv::{AlarmMember, Lease, LeaseId, MemberAttributes, RevisionId};

use crate::rng::Rng;

#[derive(Clone, Debug, Default)]
struct State {
    records: BTreeMap<RevisionId, Vec<u8>>,
    members: BTreeMap<u64, Vec<u8>>,
    leases: BTreeMap<LeaseId, Vec<u8>>,
    alarms: Vec<u8>,
    auth: Option<Vec<u8>>,
    meta: Meta,
    installed_from: Option<Vec<u8>>,
}

/// How to undo the last commit, while its meta page is not durable.
#[derive(Debug)]
enum Undo {
    /// Restore these records, members and leases (None: remove) and this meta.
    Changes {
        records: Vec<(RevisionId, Option<Vec<u8>>)>,
        members: Vec<(u64, Option<Vec<u8>>)>,
        leases: Vec<(LeaseId, Option<Vec<u8>>)>,
        alarms: Vec<u8>,
        /// The auth store before the commit, if the commit replaced it.
        auth: Option<Option<Vec<u8>>>,
        meta: Meta,
        /// The install's origin before the commit, if the commit replaced it.
        installed_from: Option<Option<Vec<u8>>>,
    },
    /// The commit replaced everything: restore the whole previous state.
    Whole(Arc<State>),
}

#[derive(Debug, Default)]
struct Disk {
    /// Readers get a clone of this `Arc`; a commit copies the map only if a reader still holds
    /// it, which in the single-threaded simulator is never.
    state: Arc<State>,
    undo: Option<Undo>,
    fail_next_commit: bool,
}

/// A member's store disk; clones share it (the member's store and the simulator's crash).
#[derive(Clone, Debug, Default)]
pub struct SimBackend {
    disk: Arc<Mutex<Disk>>,
}

/// A consistent view: the state when it was taken.
#[derive(Debug)]
pub struct SimView(Arc<State>);

impl SimBackend {
    fn lock(&self) -> MutexGuard<'_, Disk> {
        self.disk.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Power loss: the last commit survives unless it was not yet made durable and the seed
    /// says it is lost.
    pub fn crash(&self, rng: &mut Rng) {
        let mut disk = self.lock();
        disk.fail_next_commit = false;
        let Some(undo) = disk.undo.take() else { return };
        if !rng.chance(0.5) {
            return;
        }
        match undo {
            Undo::Whole(previous) => disk.state = previous,
            Undo::Changes { records, members, leases, alarms, auth, meta, installed_from } => {
                let state = Arc::make_mut(&mut disk.state);
                for (rev, old) in records {
                    match old {
                        Some(raw) => state.records.insert(rev, raw),
                        None => state.records.remove(&rev),
                    };
                }
                for (id, old) in members {
                    match old {
                        Some(raw) => state.members.insert(id, raw),
                        None => state.members.remove(&id),
                    };
                }
                for (id, old) in leases {
                    match old {
                        Some(raw) => state.leases.insert(id, raw),
                        None => state.leases.remove(&id),
                    };
                }
                state.alarms = alarms;
                if let Some(auth) = auth {
                    state.auth = auth;
                }
                if let Some(origin) = installed_from {
                    state.installed_from = origin;
                }
                state.meta = meta;
            }
        }
    }

    /// The next commit fails (the store must stop).
    pub fn fail_next_commit(&self) {
        self.lock().fail_next_commit = true;
    }

    /// The applied index the backend holds.
    pub fn applied_index(&self) -> u64 {
        self.lock().state.meta.applied_index
    }
}

fn injected() -> BackendError {
    BackendError::Engine(Arc::new(std::io::Error::other("injected commit failure")))
}

impl Backend for SimBackend {
    type View<'a> = SimView;

    fn view(&self) -> Result<SimView, BackendError> {
        Ok(SimView(self.lock().state.clone()))
    }

    fn commit(&self, batch: WriteBatch) -> Result<(), BackendError> {
        let mut disk = self.lock();
        if std::mem::take(&mut disk.fail_next_commit) {
            return Err(injected());
        }
        let state = Arc::make_mut(&mut disk.state);
        let mut undo = Vec::with_capacity(batch.puts.len() + batch.deletes.len());
        for (rev, raw) in batch.puts {
            undo.push((rev, state.records.insert(rev, raw)));
        }
        for rev in batch.deletes {
            if let Some(old) = state.records.remove(&rev) {
                undo.push((rev, Some(old)));
            }
        }
        let mut members: Vec<_> = batch
            .members
            .into_iter()
            .map(|(id, raw)| (id, state.members.insert(id, raw)))
            .collect();
        let mut leases: Vec<_> = batch
            .leases
            .into_iter()
            .map(|(id, change)| match change {
                Some(raw) => (id, state.leases.insert(id, raw)),
                None => (id, state.leases.remove(&id)),
            })
            .collect();
        let auth = batch.auth.map(|raw| state.auth.replace(raw));
        let installed_from = batch.installed_from.map(|raw| state.installed_from.replace(raw));
        let old_meta = state.meta;
        let old_alarms = match batch.alarms {
            Some(alarms) => std::mem::replace(&mut state.alarms, alarms),
            None => state.alarms.clone(),
        };
        if let Some(meta) = batch.meta {
            state.meta = meta;
        }
        // Undo in reverse, so a revision (or member) written twice gets its first old value back.
        undo.reverse();
        members.reverse();
        leases.reverse();
        disk.undo = Some(Undo::Changes {
            records: undo,
            members,
            leases,
            alarms: old_alarms,
            auth,
            meta: old_meta,
            installed_from,
        });
        Ok(())
    }

    fn replace(&self, batch: WriteBatch) -> Result<(), BackendError> {
        let mut disk = self.lock();
        if std::mem::take(&mut disk.fail_next_commit) {
            return Err(injected());
        }
        let records = batch.puts.into_iter().collect();
        let members = batch.members.into_iter().collect();
        let leases =
            batch.leases.into_iter().filter_map(|(id, raw)| raw.map(|raw| (id, raw))).collect();
        let meta = batch.meta.unwrap_or_default();
        let alarms = batch.alarms.unwrap_or_else(|| disk.state.alarms.clone());
        let (auth, installed_from) = (batch.auth, batch.installed_from);
        let state =
            Arc::new(State { records, members, leases, alarms, auth, meta, installed_from });
        let previous = std::mem::replace(&mut disk.state, state);
        disk.undo = Some(Undo::Whole(previous));
        Ok(())
    }

    fn sync(&self) -> Result<(), BackendError> {
        self.lock().undo = None;
        Ok(())
    }

    fn size_bytes(&self) -> u64 {
        self.lock().state.records.values().map(|r| r.len() as u64 + 12).sum()
    }
}

impl BackendView for SimView {
    fn get(&self, rev: RevisionId) -> Result<Option<Record>, BackendError> {
        self.0.records.get(&rev).map(|r| Record::decode(r)).transpose()
    }

    fn scan(
        &self,
        from: RevisionId,
        visit: &mut dyn FnMut(RevisionId, Record) -> bool,
    ) -> Result<(), BackendError> {
        for (rev, raw) in self.0.records.range(from..) {
            if !visit(*rev, Record::decode(raw)?) {
                break;
            }
        }
        Ok(())
    }

    fn meta(&self) -> Result<Meta, BackendError> {
        Ok(self.0.meta)
    }

    fn members(&self) -> Result<BTreeMap<u64, MemberAttributes>, BackendError> {
        decode_members(&self.0.members)
    }

    fn leases(&self) -> Result<BTreeMap<LeaseId, Lease>, BackendError> {
        self.0.leases.iter().map(|(id, raw)| Ok((*id, decode_lease(*id, raw)?))).collect()
    }

    fn alarms(&self) -> Result<BTreeSet<AlarmMember>, BackendError> {
        decode_alarms(&self.0.alarms)
    }
    fn auth(&self) -> Result<Option<Vec<u8>>, BackendError> {
        Ok(self.0.auth.clone())
    }

    fn installed_from(&self) -> Result<Option<Vec<u8>>, BackendError> {
        Ok(self.0.installed_from.clone())
    }
}
