//! The etcd data model in plain Rust: revisions, key-values, requests and responses.

use std::fmt;

use bytes::Bytes;

/// A store revision (etcd's "main revision"). The empty store is at revision 1; every effective
/// mutating request adds one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Revision(pub i64);

impl Revision {
    /// The revision of an empty store.
    pub const INITIAL: Revision = Revision(1);
    /// The compaction point of a store never compacted. etcd starts it below zero too, so a first
    /// compaction at revision 0 succeeds (and a second fails as compacted).
    pub const NEVER_COMPACTED: Revision = Revision(-1);

    /// The revision after this one.
    pub fn next(self) -> Revision {
        Revision(self.0 + 1)
    }
}

impl fmt::Display for Revision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Where one change sits: its request's revision and its order within that request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RevisionId {
    /// The request's revision.
    pub main: Revision,
    /// The change's place within its request (a transaction makes several), from 0.
    pub sub: u32,
}

/// A lease id; 0 means no lease.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LeaseId(pub i64);

/// A key's state at some revision, as etcd's `mvccpb.KeyValue`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyValue {
    /// The key.
    pub key: Bytes,
    /// Revision of the last creation. Equal to `mod_revision` on creation.
    pub create_revision: Revision,
    /// Revision of the last modification.
    pub mod_revision: Revision,
    /// 1 on creation, +1 per modification; a deletion resets it.
    pub version: i64,
    /// The value (empty when the read asked for keys only).
    pub value: Bytes,
    /// The lease the key is attached to; 0 for none.
    pub lease: LeaseId,
}

/// The order of a Range's results.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SortOrder {
    /// Key order, ascending (the default).
    #[default]
    None,
    /// Lowest target value first.
    Ascend,
    /// Highest target value first.
    Descend,
}

/// The field a Range sorts by.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SortTarget {
    /// The key (the default).
    #[default]
    Key,
    /// [`KeyValue::version`].
    Version,
    /// [`KeyValue::create_revision`].
    Create,
    /// [`KeyValue::mod_revision`].
    Mod,
    /// The value, bytewise.
    Value,
}

/// etcd's `RangeRequest`. An empty `range_end` means `key` alone; `"\0"` means every key at or
/// after `key`; otherwise the half-open range `[key, range_end)`. [`RangeRequest::key`],
/// [`RangeRequest::prefix`] and [`RangeRequest::from_key`] build the common shapes; every field
/// left at its default (0, empty, false) adds no condition.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RangeRequest {
    /// The first key of the range, or the one key read; must not be empty.
    pub key: Bytes,
    /// The end of the range, exclusive: empty for `key` alone, `"\0"` for every key from `key`
    /// on ([`crate::range::prefix_end`] gives a prefix's end).
    pub range_end: Bytes,
    /// Most keys returned; 0 means no limit.
    pub limit: i64,
    /// The revision to read at; 0 or less means the current revision. A compacted revision
    /// fails with [`crate::KvError::Compacted`].
    pub revision: Revision,
    /// The order of the results (default: by key).
    pub sort_order: SortOrder,
    /// What `sort_order` sorts by (default: the key).
    pub sort_target: SortTarget,
    /// Read this member's state without confirming it is current: faster, possibly stale on
    /// a member of a cluster. Reads are linearizable by default.
    pub serializable: bool,
    /// Return keys without their values.
    pub keys_only: bool,
    /// Return only the count.
    pub count_only: bool,
    /// Leave out keys modified before this revision (0: no bound).
    pub min_mod_revision: Revision,
    /// Leave out keys modified after this revision (0: no bound).
    pub max_mod_revision: Revision,
    /// Leave out keys created before this revision (0: no bound).
    pub min_create_revision: Revision,
    /// Leave out keys created after this revision (0: no bound).
    pub max_create_revision: Revision,
}

impl RangeRequest {
    /// Reads one key.
    pub fn key(key: impl Into<Bytes>) -> RangeRequest {
        RangeRequest { key: key.into(), ..RangeRequest::default() }
    }

    /// Reads every key that starts with `prefix` (every key, for an empty prefix).
    pub fn prefix(prefix: impl Into<Bytes>) -> RangeRequest {
        let (key, range_end) = prefix_range(prefix.into());
        RangeRequest { key, range_end, ..RangeRequest::default() }
    }

    /// Reads every key at or after `key`.
    pub fn from_key(key: impl Into<Bytes>) -> RangeRequest {
        RangeRequest { key: key.into(), range_end: ALL_FROM, ..RangeRequest::default() }
    }
}

/// As a `range_end`: every key from the start key on.
const ALL_FROM: Bytes = Bytes::from_static(b"\0");

/// The `(key, range_end)` of a prefix, as etcd's client builds it: an empty prefix is every
/// key, from `"\0"` on (an empty key is refused).
pub(crate) fn prefix_range(prefix: Bytes) -> (Bytes, Bytes) {
    if prefix.is_empty() {
        return (ALL_FROM, ALL_FROM);
    }
    let end = crate::range::prefix_end(&prefix);
    (prefix, end)
}

/// What a Range read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RangeResponse {
    /// The store's current revision when the read ran, even for a read at an older revision
    /// (etcd's header revision; Kubernetes pins pagination to it).
    pub revision: Revision,
    /// The keys read, in the requested order (empty with `count_only`).
    pub kvs: Vec<KeyValue>,
    /// More keys matched than `limit` allowed.
    pub more: bool,
    /// Keys in the range at that revision, ignoring limit and filters.
    pub count: i64,
}

/// etcd's `PutRequest`: sets a key's value ([`PutRequest::new`] for the common case).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PutRequest {
    /// The key; must not be empty.
    pub key: Bytes,
    /// The new value.
    pub value: Bytes,
    /// The lease to attach the key to; 0 (the default) for none.
    pub lease: LeaseId,
    /// Answer the key's previous state too.
    pub prev_kv: bool,
    /// Keep the current value; the key must exist.
    pub ignore_value: bool,
    /// Keep the current lease; the key must exist.
    pub ignore_lease: bool,
}

impl PutRequest {
    /// Sets `key` to `value`, without a lease.
    pub fn new(key: impl Into<Bytes>, value: impl Into<Bytes>) -> PutRequest {
        PutRequest { key: key.into(), value: value.into(), ..PutRequest::default() }
    }
}

/// What a Put did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PutResponse {
    /// The revision the put created.
    pub revision: Revision,
    /// The key's state before, if it existed and the request asked for it.
    pub prev_kv: Option<KeyValue>,
}

/// etcd's `DeleteRangeRequest`; the range as in [`RangeRequest`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeleteRangeRequest {
    /// The first key of the range, or the one key deleted; must not be empty.
    pub key: Bytes,
    /// The end of the range, exclusive: empty for `key` alone, `"\0"` for every key from `key`
    /// on.
    pub range_end: Bytes,
    /// Answer the deleted keys' states.
    pub prev_kv: bool,
}

impl DeleteRangeRequest {
    /// Deletes one key.
    pub fn key(key: impl Into<Bytes>) -> DeleteRangeRequest {
        DeleteRangeRequest { key: key.into(), ..DeleteRangeRequest::default() }
    }

    /// Deletes every key that starts with `prefix` (every key, for an empty prefix).
    pub fn prefix(prefix: impl Into<Bytes>) -> DeleteRangeRequest {
        let (key, range_end) = prefix_range(prefix.into());
        DeleteRangeRequest { key, range_end, prev_kv: false }
    }
}

/// What a DeleteRange did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeleteRangeResponse {
    /// The store's revision after the delete (unchanged when nothing was deleted).
    pub revision: Revision,
    /// How many keys were deleted.
    pub deleted: i64,
    /// Their states before, when the request asked for them.
    pub prev_kvs: Vec<KeyValue>,
}

/// What a comparison looks at, with the operand.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CompareTarget {
    /// The key's version (0 when the key does not exist).
    Version(i64),
    /// The key's create revision (0 when the key does not exist).
    Create(Revision),
    /// The key's mod revision (0 when the key does not exist).
    Mod(Revision),
    /// The key's value.
    Value(Bytes),
    /// The key's lease (0 for none).
    Lease(LeaseId),
}

/// How a comparison's target relates to its operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompareResult {
    /// target == operand
    Equal,
    /// target > operand
    Greater,
    /// target < operand
    Less,
    /// target != operand
    NotEqual,
}

/// One condition of a transaction; with a `range_end`, every key in the range must satisfy it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Compare {
    /// The key compared (the first of the range, with a `range_end`).
    pub key: Bytes,
    /// The end of the range, exclusive, as in [`RangeRequest`]; empty for `key` alone.
    pub range_end: Bytes,
    /// What is compared, and with what.
    pub target: CompareTarget,
    /// The relation that must hold.
    pub result: CompareResult,
}

/// One operation of a transaction branch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestOp {
    /// A read (at the transaction's revision).
    Range(RangeRequest),
    /// A put.
    Put(PutRequest),
    /// A delete.
    DeleteRange(DeleteRangeRequest),
    /// A nested transaction (etcd 3.3 and later).
    Txn(TxnRequest),
}

/// The answer to one [`RequestOp`], in the same place.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResponseOp {
    /// A read's answer.
    Range(RangeResponse),
    /// A put's answer.
    Put(PutResponse),
    /// A delete's answer.
    DeleteRange(DeleteRangeResponse),
    /// A nested transaction's answer.
    Txn(TxnResponse),
}

/// etcd's `TxnRequest`: if every comparison holds, the `success` branch runs, otherwise the
/// `failure` branch; either way in one revision.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TxnRequest {
    /// The conditions; all must hold (none: they hold).
    pub compare: Vec<Compare>,
    /// What runs when they hold.
    pub success: Vec<RequestOp>,
    /// What runs when one does not.
    pub failure: Vec<RequestOp>,
}

/// What a transaction did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TxnResponse {
    /// The store's revision after the transaction.
    pub revision: Revision,
    /// Whether the comparisons held (the `success` branch ran).
    pub succeeded: bool,
    /// The branch's answers, one per operation.
    pub responses: Vec<ResponseOp>,
}

/// etcd's `CompactionRequest`: discards the history before `revision`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CompactRequest {
    /// Reads and watches below this revision fail as compacted from now on.
    pub revision: Revision,
    /// Answer only once the superseded history is physically removed.
    pub physical: bool,
}

/// What a compaction answered.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CompactResponse {
    /// The store's revision (a compaction does not move it).
    pub revision: Revision,
}

/// What a member tells the others about itself (etcd's member attributes): what `MemberList`
/// shows for it. Published through the log, as etcd's `ClusterMemberAttrSet`; kept beside the
/// key space, not in it: no revision, invisible to Range and HashKV.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemberAttributes {
    /// The member's name (`--name`).
    pub name: String,
    /// Where it serves clients (`--advertise-client-urls`).
    pub client_urls: Vec<String>,
    /// Where its peers reach it, as the membership change that added it (or the last
    /// `MemberUpdate`) set them; empty for a founding member of a directory made before peer
    /// URLs were replicated. Not part of what a member publishes.
    pub peer_urls: Vec<String>,
    /// The member was removed from the cluster, for good: its id may never serve again
    /// (etcd's `removed_member` bucket). Nothing else is kept for it.
    pub removed: bool,
}

/// A lease as the replicated state holds it (etcd's `leasepb.Lease`). When it expires is the
/// leader's business (its clock); what every member agrees on is that it exists, its TTL, the
/// remaining TTL last checkpointed, and (in the key index) which keys it holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Lease {
    /// The lease's id.
    pub id: LeaseId,
    /// Seconds granted; a keepalive renews the lease for this long.
    pub ttl: i64,
    /// Seconds left at the last checkpoint; 0 when none was taken since the grant or the last
    /// keepalive. A new leader counts down from here instead of from the full TTL.
    pub remaining_ttl: i64,
    /// The Raft index of the entry that granted it, which tells this grant apart from a later
    /// one under the same id: the leader's revoke of an expired lease names it, so a revoke
    /// that commits after the lease was revoked and granted again leaves the new grant alone.
    /// 0 for a lease granted before cairn recorded it, or restored from a backup (whose log
    /// is gone).
    pub grant_index: u64,
}

/// One lease's remaining TTL by the leader's clock, for the grant it was taken for
/// ([`Command::LeaseGrantCheckpoint`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GrantCheckpoint {
    /// The lease's id.
    pub id: LeaseId,
    /// The [`Lease::grant_index`] of the grant the leader counted down: a later grant under
    /// the same id is left alone.
    pub grant_index: u64,
    /// Seconds left; 0 clears the checkpoint (a keepalive renewed the lease).
    pub remaining: i64,
}

/// etcd's largest lease TTL, in seconds (`MaxLeaseTTL`).
pub const MAX_LEASE_TTL: i64 = 9_000_000_000;

/// etcd's alarm types (`etcdserverpb.AlarmType`), with etcd's numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AlarmType {
    /// No alarm: in a request, every type.
    None = 0,
    /// The database reached `--quota-backend-bytes`: writes that add data are refused.
    NoSpace = 1,
    /// Members disagree on the hash of the same revision.
    Corrupt = 2,
}

impl AlarmType {
    /// The type with etcd's number `n`, if there is one.
    pub fn from_i32(n: i32) -> Option<AlarmType> {
        match n {
            0 => Some(AlarmType::None),
            1 => Some(AlarmType::NoSpace),
            2 => Some(AlarmType::Corrupt),
            _ => None,
        }
    }

    /// etcd's name, as `etcdctl alarm list` and Status show it.
    pub fn name(self) -> &'static str {
        match self {
            AlarmType::None => "NONE",
            AlarmType::NoSpace => "NOSPACE",
            AlarmType::Corrupt => "CORRUPT",
        }
    }
}

/// An alarm raised on a member (etcd's `AlarmMember`). Alarms are replicated state kept beside
/// the key space: no revision, invisible to Range, Watch and HashKV.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AlarmMember {
    /// The member the alarm is raised for.
    pub member: u64,
    /// What it is.
    pub alarm: AlarmType,
}

/// A mutating request, as replicated through Raft.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// A put.
    Put(PutRequest),
    /// A delete.
    DeleteRange(DeleteRangeRequest),
    /// A transaction.
    Txn(TxnRequest),
    /// A compaction.
    Compact(CompactRequest),
    /// Membership as the Cluster API changed it, applied with the Raft membership change it rides
    /// on: these members' peer URLs set (added or updated), these members removed for good.
    Membership {
        /// Member ids and their peer URLs.
        peers: Vec<(u64, Vec<String>)>,
        /// Member ids removed.
        removed: Vec<u64>,
    },
    /// A member publishes its name and client URLs; they replace any it published before (its
    /// peer URLs stay as the membership set them). A removed member's publish changes nothing.
    PublishMember {
        /// The member's id.
        member: u64,
        /// What it publishes.
        attributes: MemberAttributes,
    },
    /// Creates a lease. The proposer chose the id (when the client left it 0) and raised the
    /// TTL to the minimum, so every member applies the same values.
    LeaseGrant {
        /// The lease's id (never 0).
        id: LeaseId,
        /// Seconds granted.
        ttl: i64,
    },
    /// Deletes a lease and every key attached to it, in one revision.
    LeaseRevoke {
        /// The lease revoked.
        id: LeaseId,
    },
    /// The leader's revoke of a lease it found expired: a [`Command::LeaseRevoke`] of the grant
    /// made at Raft index `grant_index` only. Between the proposal and its commit the lease
    /// may be revoked and granted again under the same id (a client's revoke and grant, or an
    /// earlier proposal of this revoke applied first); the new grant is then left alone and
    /// this fails as `LeaseNotFound`. A client's revoke names no grant, as in etcd.
    LeaseExpire {
        /// The lease revoked.
        id: LeaseId,
        /// The [`Lease::grant_index`] the leader found expired.
        grant_index: u64,
    },
    /// The leader's record of leases' remaining TTLs, so a new leader or a restart neither
    /// forgets how far they ran nor grants them a full TTL again. Names leases by id alone,
    /// so it lands on whatever grant holds the id when it applies: only an older cairn
    /// proposed it, and its entries still apply so; this one proposes
    /// [`Command::LeaseGrantCheckpoint`].
    LeaseCheckpoint {
        /// Each lease's remaining TTL, in seconds.
        checkpoints: Vec<(LeaseId, i64)>,
    },
    /// [`Command::LeaseCheckpoint`] of the grants the leader took each one for. Between the
    /// proposal and its commit a lease may be revoked and granted again under the same id (a
    /// client's revoke and grant the leader had not applied yet); the new grant's clock did
    /// not start with the old one's, so a checkpoint naming the old grant leaves it alone.
    /// The others in the batch still apply.
    LeaseGrantCheckpoint {
        /// Each grant's remaining TTL.
        checkpoints: Vec<GrantCheckpoint>,
    },
    /// Raises an alarm (etcd's `AlarmRequest` ACTIVATE); raising a raised one changes nothing.
    AlarmActivate(AlarmMember),
    /// Clears an alarm (etcd's DEACTIVATE); clearing one not raised changes nothing.
    AlarmDeactivate(AlarmMember),
    /// A change to the auth store (users, roles, enabling).
    Auth(crate::auth::AuthCommand),
    /// A client's command with who asked: applied only if that caller may, with the auth store
    /// as of this entry (etcd's request header with its user and auth revision).
    Authorized {
        /// Who asked.
        caller: crate::auth::Caller,
        /// What they asked.
        command: Box<Command>,
    },
}

impl Command {
    /// The command itself, without the caller it may carry.
    pub fn without_caller(&self) -> &Command {
        match self {
            Command::Authorized { command, .. } => command,
            c => c,
        }
    }
}

/// The result of applying a [`Command`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CommandResponse {
    /// A put's answer.
    Put(PutResponse),
    /// A delete's answer.
    DeleteRange(DeleteRangeResponse),
    /// A transaction's answer.
    Txn(TxnResponse),
    /// A compaction's answer.
    Compact(CompactResponse),
    /// The attributes are recorded. Nothing else changed: the revision did not move.
    PublishMember,
    /// The membership is recorded; the revision did not move.
    Membership,
    /// The lease exists; the revision did not move.
    LeaseGrant {
        /// The store's revision.
        revision: Revision,
        /// The lease as granted.
        lease: Lease,
    },
    /// The lease and its keys are gone; the revision moved if it held keys.
    LeaseRevoke {
        /// The store's revision after the revoke.
        revision: Revision,
    },
    /// The remaining TTLs are recorded (leases gone meanwhile, or granted anew since a
    /// [`Command::LeaseGrantCheckpoint`] was taken, are skipped).
    LeaseCheckpoint,
    /// The alarm the request changed, as etcd answers: present if it was raised (activate)
    /// or had been raised (deactivate), absent if the request changed nothing.
    Alarm(Option<AlarmMember>),
    /// The auth store changed (or was already as asked); the key revision did not move.
    Auth {
        /// The store's revision.
        revision: Revision,
        /// The auth revision after the change.
        auth_revision: u64,
    },
}
