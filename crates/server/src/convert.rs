//! Conversions between the etcd protobuf messages and cairn's plain types. The only place that
//! maps one to the other.

use bytes::Bytes;
use cairn_kv as kv;
use cairn_proto::etcdserverpb as pb;
use cairn_proto::mvccpb;

fn bytes(v: Vec<u8>) -> Bytes {
    Bytes::from(v)
}

/// A range request. Sort values the API does not define are refused as etcd 3.6 does (3.5 crashes
/// on an unknown sort target); a missing key is reported first, as etcd's checks run.
pub fn range_req(r: pb::RangeRequest) -> Result<kv::RangeRequest, kv::KvError> {
    use pb::range_request::{SortOrder as O, SortTarget as T};
    if r.key.is_empty() {
        return Err(kv::KvError::EmptyKey);
    }
    let sort_order = match O::try_from(r.sort_order).map_err(|_| kv::KvError::InvalidSortOption)? {
        O::None => kv::SortOrder::None,
        O::Ascend => kv::SortOrder::Ascend,
        O::Descend => kv::SortOrder::Descend,
    };
    let sort_target =
        match T::try_from(r.sort_target).map_err(|_| kv::KvError::InvalidSortOption)? {
            T::Key => kv::SortTarget::Key,
            T::Version => kv::SortTarget::Version,
            T::Create => kv::SortTarget::Create,
            T::Mod => kv::SortTarget::Mod,
            T::Value => kv::SortTarget::Value,
        };
    Ok(kv::RangeRequest {
        key: bytes(r.key),
        range_end: bytes(r.range_end),
        limit: r.limit,
        revision: kv::Revision(r.revision),
        sort_order,
        sort_target,
        serializable: r.serializable,
        keys_only: r.keys_only,
        count_only: r.count_only,
        min_mod_revision: kv::Revision(r.min_mod_revision),
        max_mod_revision: kv::Revision(r.max_mod_revision),
        min_create_revision: kv::Revision(r.min_create_revision),
        max_create_revision: kv::Revision(r.max_create_revision),
    })
}

pub fn put_req(r: pb::PutRequest) -> kv::PutRequest {
    kv::PutRequest {
        key: bytes(r.key),
        value: bytes(r.value),
        lease: kv::LeaseId(r.lease),
        prev_kv: r.prev_kv,
        ignore_value: r.ignore_value,
        ignore_lease: r.ignore_lease,
    }
}

pub fn delete_req(r: pb::DeleteRangeRequest) -> kv::DeleteRangeRequest {
    kv::DeleteRangeRequest { key: bytes(r.key), range_end: bytes(r.range_end), prev_kv: r.prev_kv }
}

/// A transaction compare, read as etcd's `compareKV` reads it: the operand comes from the union
/// member that matches the target (any other member counts as zero or an empty value), an
/// undefined target compares as equal, and an undefined result holds for every key that exists
/// and, unless the target is the value, for a missing key too. Those last cases have no variant in
/// cairn's own types; each is written as the version compare that holds exactly when etcd's does.
fn compare(c: pb::Compare) -> kv::Compare {
    use pb::compare::{CompareResult as R, CompareTarget as T, TargetUnion as U};
    // A version is never below 0, and is above 0 exactly when the key exists.
    let version = |v: i64, result| (kv::CompareTarget::Version(v), result);
    let always = |holds: bool| {
        version(-1, if holds { kv::CompareResult::Greater } else { kv::CompareResult::Less })
    };
    let exists = || version(0, kv::CompareResult::Greater);
    let result = match R::try_from(c.result) {
        Ok(R::Equal) => Some(kv::CompareResult::Equal),
        Ok(R::Greater) => Some(kv::CompareResult::Greater),
        Ok(R::Less) => Some(kv::CompareResult::Less),
        Ok(R::NotEqual) => Some(kv::CompareResult::NotEqual),
        Err(_) => None,
    };
    let u = c.target_union;
    let target = match T::try_from(c.target) {
        Ok(T::Version) => Some(kv::CompareTarget::Version(match u {
            Some(U::Version(v)) => v,
            _ => 0,
        })),
        Ok(T::Create) => Some(kv::CompareTarget::Create(kv::Revision(match u {
            Some(U::CreateRevision(v)) => v,
            _ => 0,
        }))),
        Ok(T::Mod) => Some(kv::CompareTarget::Mod(kv::Revision(match u {
            Some(U::ModRevision(v)) => v,
            _ => 0,
        }))),
        Ok(T::Value) => Some(kv::CompareTarget::Value(match u {
            Some(U::Value(v)) => bytes(v),
            _ => Bytes::new(),
        })),
        Ok(T::Lease) => Some(kv::CompareTarget::Lease(kv::LeaseId(match u {
            Some(U::Lease(v)) => v,
            _ => 0,
        }))),
        Err(_) => None,
    };
    let (target, result) = match (target, result) {
        (Some(t), Some(r)) => (t, r),
        (Some(kv::CompareTarget::Value(_)), None) => exists(),
        (Some(_), None) => always(true),
        // An undefined target compares as equal.
        (None, r) => always(matches!(r, None | Some(kv::CompareResult::Equal))),
    };
    kv::Compare { key: bytes(c.key), range_end: bytes(c.range_end), target, result }
}

/// An op with no request set is refused as etcd's `checkRequestOp` does (key not found), rather
/// than dropped, which would change the transaction's shape.
fn ops(list: Vec<pb::RequestOp>) -> Result<Vec<kv::RequestOp>, kv::KvError> {
    use pb::request_op::Request as Q;
    list.into_iter()
        .map(|op| {
            Ok(match op.request.ok_or(kv::KvError::KeyNotFound)? {
                Q::RequestRange(r) => kv::RequestOp::Range(range_req(r)?),
                Q::RequestPut(p) => kv::RequestOp::Put(put_req(p)),
                Q::RequestDeleteRange(d) => kv::RequestOp::DeleteRange(delete_req(d)),
                Q::RequestTxn(t) => kv::RequestOp::Txn(txn_req(t)?),
            })
        })
        .collect()
}

pub fn txn_req(t: pb::TxnRequest) -> Result<kv::TxnRequest, kv::KvError> {
    Ok(kv::TxnRequest {
        compare: t.compare.into_iter().map(compare).collect(),
        success: ops(t.success)?,
        failure: ops(t.failure)?,
    })
}

pub fn kv_pb(kv: kv::KeyValue) -> mvccpb::KeyValue {
    mvccpb::KeyValue {
        key: kv.key.to_vec(),
        create_revision: kv.create_revision.0,
        mod_revision: kv.mod_revision.0,
        version: kv.version,
        value: kv.value.to_vec(),
        lease: kv.lease.0,
    }
}

/// Builds response headers: the cluster's identity plus a revision.
#[derive(Clone, Copy, Debug)]
pub struct Header {
    pub cluster_id: u64,
    pub member_id: u64,
    pub raft_term: u64,
}

impl Header {
    pub fn at(&self, revision: kv::Revision) -> Option<pb::ResponseHeader> {
        Some(pb::ResponseHeader {
            cluster_id: self.cluster_id,
            member_id: self.member_id,
            revision: revision.0,
            raft_term: self.raft_term,
        })
    }

    pub fn range(&self, r: kv::RangeResponse) -> pb::RangeResponse {
        pb::RangeResponse {
            header: self.at(r.revision),
            kvs: r.kvs.into_iter().map(kv_pb).collect(),
            more: r.more,
            count: r.count,
        }
    }

    pub fn put(&self, r: kv::PutResponse) -> pb::PutResponse {
        pb::PutResponse { header: self.at(r.revision), prev_kv: r.prev_kv.map(kv_pb) }
    }

    pub fn delete(&self, r: kv::DeleteRangeResponse) -> pb::DeleteRangeResponse {
        pb::DeleteRangeResponse {
            header: self.at(r.revision),
            deleted: r.deleted,
            prev_kvs: r.prev_kvs.into_iter().map(kv_pb).collect(),
        }
    }

    pub fn txn(&self, r: kv::TxnResponse) -> pb::TxnResponse {
        use pb::response_op::Response as P;
        let responses = r
            .responses
            .into_iter()
            .map(|op| pb::ResponseOp {
                response: Some(match op {
                    kv::ResponseOp::Range(x) => P::ResponseRange(self.range(x)),
                    kv::ResponseOp::Put(x) => P::ResponsePut(self.put(x)),
                    kv::ResponseOp::DeleteRange(x) => P::ResponseDeleteRange(self.delete(x)),
                    kv::ResponseOp::Txn(x) => P::ResponseTxn(self.txn(x)),
                }),
            })
            .collect();
        pb::TxnResponse { header: self.at(r.revision), succeeded: r.succeeded, responses }
    }
}
