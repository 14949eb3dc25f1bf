//! Conversions between the etcd protobuf messages and cairn's plain types. The only place that
//! maps one to the other.

use bytes::Bytes;
use cairn_kv as kv;
use cairn_proto::etcdserverpb as pb;
use cairn_proto::mvccpb;

fn bytes(v: Vec<u8>) -> Bytes {
    Bytes::from(v)
}

pub fn range_req(r: pb::RangeRequest) -> kv::RangeRequest {
    let sort_order = match pb::range_request::SortOrder::try_from(r.sort_order) {
        Ok(pb::range_request::SortOrder::Ascend) => kv::SortOrder::Ascend,
        Ok(pb::range_request::SortOrder::Descend) => kv::SortOrder::Descend,
        _ => kv::SortOrder::None,
    };
    let sort_target = match pb::range_request::SortTarget::try_from(r.sort_target) {
        Ok(pb::range_request::SortTarget::Version) => kv::SortTarget::Version,
        Ok(pb::range_request::SortTarget::Create) => kv::SortTarget::Create,
        Ok(pb::range_request::SortTarget::Mod) => kv::SortTarget::Mod,
        Ok(pb::range_request::SortTarget::Value) => kv::SortTarget::Value,
        _ => kv::SortTarget::Key,
    };
    kv::RangeRequest {
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
    }
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

fn compare(c: pb::Compare) -> kv::Compare {
    use pb::compare::{CompareResult as R, CompareTarget as T, TargetUnion as U};
    let result = match R::try_from(c.result) {
        Ok(R::Greater) => kv::CompareResult::Greater,
        Ok(R::Less) => kv::CompareResult::Less,
        Ok(R::NotEqual) => kv::CompareResult::NotEqual,
        _ => kv::CompareResult::Equal,
    };
    let num = |u: &Option<U>| match u {
        Some(U::Version(v))
        | Some(U::CreateRevision(v))
        | Some(U::ModRevision(v))
        | Some(U::Lease(v)) => *v,
        _ => 0,
    };
    let target = match T::try_from(c.target) {
        Ok(T::Create) => kv::CompareTarget::Create(kv::Revision(num(&c.target_union))),
        Ok(T::Mod) => kv::CompareTarget::Mod(kv::Revision(num(&c.target_union))),
        Ok(T::Value) => kv::CompareTarget::Value(match c.target_union {
            Some(U::Value(v)) => bytes(v),
            _ => Bytes::new(),
        }),
        Ok(T::Lease) => kv::CompareTarget::Lease(kv::LeaseId(num(&c.target_union))),
        _ => kv::CompareTarget::Version(num(&c.target_union)),
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
                Q::RequestRange(r) => kv::RequestOp::Range(range_req(r)),
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
