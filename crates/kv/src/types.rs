//! The etcd data model in plain Rust: revisions, key-values, requests and responses.

use std::fmt;

use bytes::Bytes;

/// A store revision (etcd's "main revision"). The empty store is at revision 1; every effective
/// mutating request adds one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Revision(pub i64);

impl Revision {
    pub const INITIAL: Revision = Revision(1);
    /// The compaction point of a store never compacted. etcd starts it below zero too, so a first
    /// compaction at revision 0 succeeds (and a second fails as compacted).
    pub const NEVER_COMPACTED: Revision = Revision(-1);

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
    pub main: Revision,
    pub sub: u32,
}

/// A lease id; 0 means no lease.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LeaseId(pub i64);

/// A key's state at some revision, as etcd's `mvccpb.KeyValue`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyValue {
    pub key: Bytes,
    /// Revision of the last creation. Equal to `mod_revision` on creation.
    pub create_revision: Revision,
    pub mod_revision: Revision,
    /// 1 on creation, +1 per modification; a deletion resets it.
    pub version: i64,
    pub value: Bytes,
    pub lease: LeaseId,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SortOrder {
    #[default]
    None,
    Ascend,
    Descend,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SortTarget {
    #[default]
    Key,
    Version,
    Create,
    Mod,
    Value,
}

/// etcd's `RangeRequest`. An empty `range_end` means `key` alone; `"\0"` means every key at or
/// after `key`; otherwise the half-open range `[key, range_end)`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RangeRequest {
    pub key: Bytes,
    pub range_end: Bytes,
    /// 0 means no limit.
    pub limit: i64,
    /// 0 or less means the current revision.
    pub revision: Revision,
    pub sort_order: SortOrder,
    pub sort_target: SortTarget,
    pub serializable: bool,
    pub keys_only: bool,
    pub count_only: bool,
    pub min_mod_revision: Revision,
    pub max_mod_revision: Revision,
    pub min_create_revision: Revision,
    pub max_create_revision: Revision,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RangeResponse {
    /// The store's current revision when the read ran, even for a read at an older revision
    /// (etcd's header revision; Kubernetes pins pagination to it).
    pub revision: Revision,
    pub kvs: Vec<KeyValue>,
    /// More keys matched than `limit` allowed.
    pub more: bool,
    /// Keys in the range at that revision, ignoring limit and filters.
    pub count: i64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PutRequest {
    pub key: Bytes,
    pub value: Bytes,
    pub lease: LeaseId,
    pub prev_kv: bool,
    /// Keep the current value; the key must exist.
    pub ignore_value: bool,
    /// Keep the current lease; the key must exist.
    pub ignore_lease: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PutResponse {
    pub revision: Revision,
    pub prev_kv: Option<KeyValue>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeleteRangeRequest {
    pub key: Bytes,
    pub range_end: Bytes,
    pub prev_kv: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeleteRangeResponse {
    pub revision: Revision,
    pub deleted: i64,
    pub prev_kvs: Vec<KeyValue>,
}

/// What a comparison looks at, with the operand.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CompareTarget {
    Version(i64),
    Create(Revision),
    Mod(Revision),
    Value(Bytes),
    Lease(LeaseId),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompareResult {
    Equal,
    Greater,
    Less,
    NotEqual,
}

/// One condition of a transaction; with a `range_end`, every key in the range must satisfy it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Compare {
    pub key: Bytes,
    pub range_end: Bytes,
    pub target: CompareTarget,
    pub result: CompareResult,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestOp {
    Range(RangeRequest),
    Put(PutRequest),
    DeleteRange(DeleteRangeRequest),
    Txn(TxnRequest),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResponseOp {
    Range(RangeResponse),
    Put(PutResponse),
    DeleteRange(DeleteRangeResponse),
    Txn(TxnResponse),
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TxnRequest {
    pub compare: Vec<Compare>,
    pub success: Vec<RequestOp>,
    pub failure: Vec<RequestOp>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TxnResponse {
    pub revision: Revision,
    pub succeeded: bool,
    pub responses: Vec<ResponseOp>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CompactRequest {
    pub revision: Revision,
    /// Answer only once the superseded history is physically removed.
    pub physical: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CompactResponse {
    pub revision: Revision,
}

/// What a member tells the others about itself (etcd's member attributes): what `MemberList`
/// shows for it. Published through the log, as etcd's `ClusterMemberAttrSet`; kept beside the
/// key space, not in it: no revision, invisible to Range and HashKV.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemberAttributes {
    pub name: String,
    pub client_urls: Vec<String>,
}

/// A lease as the replicated state holds it (etcd's `leasepb.Lease`). When it expires is the
/// leader's business (its clock); what every member agrees on is that it exists, its TTL, the
/// remaining TTL last checkpointed, and (in the key index) which keys it holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Lease {
    pub id: LeaseId,
    /// Seconds granted; a keepalive renews the lease for this long.
    pub ttl: i64,
    /// Seconds left at the last checkpoint; 0 when none was taken since the grant or the last
    /// keepalive. A new leader counts down from here instead of from the full TTL.
    pub remaining_ttl: i64,
}

/// etcd's largest lease TTL, in seconds (`MaxLeaseTTL`).
pub const MAX_LEASE_TTL: i64 = 9_000_000_000;

/// A mutating request, as replicated through Raft.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    Put(PutRequest),
    DeleteRange(DeleteRangeRequest),
    Txn(TxnRequest),
    Compact(CompactRequest),
    /// A member publishes its attributes; they replace any it published before.
    PublishMember {
        member: u64,
        attributes: MemberAttributes,
    },
    /// Creates a lease. The proposer chose the id (when the client left it 0) and raised the
    /// TTL to the minimum, so every member applies the same values.
    LeaseGrant {
        id: LeaseId,
        ttl: i64,
    },
    /// Deletes a lease and every key attached to it, in one revision.
    LeaseRevoke {
        id: LeaseId,
    },
    /// The leader's record of leases' remaining TTLs, so a new leader or a restart neither
    /// forgets how far they ran nor grants them a full TTL again.
    LeaseCheckpoint {
        checkpoints: Vec<(LeaseId, i64)>,
    },
}

/// The result of applying a [`Command`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CommandResponse {
    Put(PutResponse),
    DeleteRange(DeleteRangeResponse),
    Txn(TxnResponse),
    Compact(CompactResponse),
    /// The attributes are recorded. Nothing else changed: the revision did not move.
    PublishMember,
    /// The lease exists; the revision did not move.
    LeaseGrant {
        revision: Revision,
        lease: Lease,
    },
    /// The lease and its keys are gone; the revision moved if it held keys.
    LeaseRevoke {
        revision: Revision,
    },
    /// The remaining TTLs are recorded (leases gone meanwhile are skipped).
    LeaseCheckpoint,
}
