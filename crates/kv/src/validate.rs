//! Checks etcd makes before a request is proposed: they depend only on the request.

use std::collections::BTreeSet;

use bytes::Bytes;

use crate::range::KeyRange;
use crate::types::{PutRequest, RequestOp, TxnRequest};
use crate::KvError;

/// etcd's default `--max-txn-ops`.
pub const DEFAULT_MAX_TXN_OPS: usize = 128;

/// The deepest nesting of transactions accepted (a transaction with no nested one has depth 1).
/// etcd bounds nesting only through `--max-txn-ops`; cairn decodes requests with prost, which
/// refuses messages nested more than 100 deep, about 50 transactions (each adds a `TxnRequest`
/// and a `RequestOp`). This limit sits well under that, so every request is refused by this
/// check, by name, and with room for the ops inside the innermost transaction.
pub const MAX_TXN_DEPTH: usize = 32;

/// Rejects what etcd rejects before proposing a put (`checkPutRequest`): no key, a value
/// together with `ignore_value`, or a lease together with `ignore_lease`.
pub fn check_put(put: &PutRequest) -> Result<(), KvError> {
    if put.key.is_empty() {
        return Err(KvError::EmptyKey);
    }
    if put.ignore_value && !put.value.is_empty() {
        return Err(KvError::ValueProvided);
    }
    if put.ignore_lease && put.lease.0 != 0 {
        return Err(KvError::LeaseProvided);
    }
    Ok(())
}

/// Rejects what etcd rejects before proposing a transaction (`checkTxnRequest`): more than
/// `max_ops` compares, success or failure ops (a nested transaction gets what its parent leaves
/// of that budget), a compare or op without a key, an invalid put, or a branch that writes a key
/// twice (`checkIntervals`).
pub fn check_txn(txn: &TxnRequest, max_ops: usize) -> Result<(), KvError> {
    check_sizes_and_keys(txn, max_ops, 1)?;
    check_intervals(&txn.success)?;
    check_intervals(&txn.failure)?;
    Ok(())
}

fn check_sizes_and_keys(txn: &TxnRequest, max_ops: usize, depth: usize) -> Result<(), KvError> {
    if depth > MAX_TXN_DEPTH {
        return Err(KvError::TxnTooDeep);
    }
    let ops = txn.compare.len().max(txn.success.len()).max(txn.failure.len());
    if ops > max_ops {
        return Err(KvError::TooManyOps);
    }
    if txn.compare.iter().any(|c| c.key.is_empty()) {
        return Err(KvError::EmptyKey);
    }
    for op in txn.success.iter().chain(&txn.failure) {
        match op {
            RequestOp::Range(r) if r.key.is_empty() => return Err(KvError::EmptyKey),
            RequestOp::Put(p) => check_put(p)?,
            RequestOp::DeleteRange(d) if d.key.is_empty() => return Err(KvError::EmptyKey),
            RequestOp::Txn(nested) => check_sizes_and_keys(nested, max_ops - ops, depth + 1)?,
            _ => {}
        }
    }
    Ok(())
}

type Writes = (BTreeSet<Bytes>, Vec<KeyRange>);

/// The keys a list of ops puts and the ranges it deletes; fails if a key is put twice or put
/// inside a deleted range. A nested transaction's two branches exclude each other, so a key put in
/// both is fine.
fn check_intervals(ops: &[RequestOp]) -> Result<Writes, KvError> {
    let mut dels: Vec<KeyRange> = ops
        .iter()
        .filter_map(|op| match op {
            RequestOp::DeleteRange(d) => Some(KeyRange::new(&d.key, &d.range_end)),
            _ => None,
        })
        .collect();
    let deleted = |dels: &[KeyRange], k: &Bytes| dels.iter().any(|d| d.contains(k));
    let mut puts = BTreeSet::new();
    for op in ops {
        let RequestOp::Txn(nested) = op else { continue };
        let (puts_then, dels_then) = check_intervals(&nested.success)?;
        let (puts_else, dels_else) = check_intervals(&nested.failure)?;
        for k in &puts_then {
            if puts.contains(k) || deleted(&dels, k) {
                return Err(KvError::DuplicateKey);
            }
        }
        puts.extend(puts_then.iter().cloned());
        for k in puts_else {
            if (puts.contains(&k) && !puts_then.contains(&k)) || deleted(&dels, &k) {
                return Err(KvError::DuplicateKey);
            }
            puts.insert(k);
        }
        dels.extend(dels_then);
        dels.extend(dels_else);
    }
    for op in ops {
        let RequestOp::Put(p) = op else { continue };
        if puts.contains(&p.key) || deleted(&dels, &p.key) {
            return Err(KvError::DuplicateKey);
        }
        puts.insert(p.key.clone());
    }
    Ok((puts, dels))
}
