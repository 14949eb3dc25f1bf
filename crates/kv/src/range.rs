//! Key ranges as etcd defines them, and the filtering, sorting and limiting of Range results.

use std::cmp::Ordering;

use bytes::Bytes;

use crate::types::{KeyValue, RangeRequest, SortOrder, SortTarget};

/// The keys a request covers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyRange {
    /// Exactly one key (an empty `range_end`).
    Single(Bytes),
    /// Every key at or after this one (`range_end` is `"\0"`).
    From(Bytes),
    /// `[start, end)`; empty when `end <= start`.
    Between(Bytes, Bytes),
}

impl KeyRange {
    /// The range a request's `key` and `range_end` name.
    pub fn new(key: &Bytes, range_end: &Bytes) -> KeyRange {
        if range_end.is_empty() {
            KeyRange::Single(key.clone())
        } else if range_end.as_ref() == [0] {
            KeyRange::From(key.clone())
        } else {
            KeyRange::Between(key.clone(), range_end.clone())
        }
    }

    /// Whether `k` is in the range.
    pub fn contains(&self, k: &[u8]) -> bool {
        match self {
            KeyRange::Single(key) => k == key.as_ref(),
            KeyRange::From(start) => k >= start.as_ref(),
            KeyRange::Between(start, end) => k >= start.as_ref() && k < end.as_ref(),
        }
    }

    /// The first key of the range.
    pub fn start(&self) -> &Bytes {
        match self {
            KeyRange::Single(k) | KeyRange::From(k) | KeyRange::Between(k, _) => k,
        }
    }

    /// The exclusive upper bound, if any.
    pub fn end(&self) -> Option<&Bytes> {
        match self {
            KeyRange::Between(_, end) => Some(end),
            _ => None,
        }
    }
}

/// The smallest key after every key that starts with `prefix`: `range_end` for a prefix query.
/// A prefix of only 0xff bytes has no such key, so it maps to `"\0"` (all keys from `prefix`).
pub fn prefix_end(prefix: &[u8]) -> Bytes {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end.into();
        }
    }
    Bytes::from_static(&[0])
}

/// Whether a request needs every matching key before it can sort, filter and limit; otherwise
/// the store can stop after `limit + 1` keys.
pub fn needs_full_scan(req: &RangeRequest) -> bool {
    req.sort_order != SortOrder::None
        || req.sort_target != SortTarget::Key
        || req.min_mod_revision.0 != 0
        || req.max_mod_revision.0 != 0
        || req.min_create_revision.0 != 0
        || req.max_create_revision.0 != 0
}

/// Whether a key-value passes the request's revision filters (0 means no bound).
pub fn passes_filters(req: &RangeRequest, kv: &KeyValue) -> bool {
    let min_ok = |bound: i64, v: i64| bound == 0 || v >= bound;
    let max_ok = |bound: i64, v: i64| bound == 0 || v <= bound;
    min_ok(req.min_mod_revision.0, kv.mod_revision.0)
        && max_ok(req.max_mod_revision.0, kv.mod_revision.0)
        && min_ok(req.min_create_revision.0, kv.create_revision.0)
        && max_ok(req.max_create_revision.0, kv.create_revision.0)
}

/// Sorts key-ordered results as etcd does: a non-key target with no order sorts ascending.
pub fn sort(req: &RangeRequest, kvs: &mut [KeyValue]) {
    let order = match (req.sort_order, req.sort_target) {
        (SortOrder::None, SortTarget::Key) => return,
        (SortOrder::None, _) => SortOrder::Ascend,
        (o, _) => o,
    };
    let cmp = |a: &KeyValue, b: &KeyValue| -> Ordering {
        match req.sort_target {
            SortTarget::Key => a.key.cmp(&b.key),
            SortTarget::Version => a.version.cmp(&b.version),
            SortTarget::Create => a.create_revision.cmp(&b.create_revision),
            SortTarget::Mod => a.mod_revision.cmp(&b.mod_revision),
            SortTarget::Value => a.value.cmp(&b.value),
        }
    };
    match order {
        SortOrder::Descend => kvs.sort_by(|a, b| cmp(b, a)),
        _ => kvs.sort_by(cmp),
    }
}

/// Filters, sorts and cuts key-ordered results to the limit; returns whether more matched.
pub fn finish(req: &RangeRequest, kvs: &mut Vec<KeyValue>) -> bool {
    kvs.retain(|kv| passes_filters(req, kv));
    sort(req, kvs);
    let more = req.limit > 0 && kvs.len() as i64 > req.limit;
    if more {
        kvs.truncate(req.limit as usize);
    }
    if req.keys_only {
        for kv in kvs.iter_mut() {
            kv.value = Bytes::new();
        }
    }
    more
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_increments_the_last_byte_that_can_be() {
        assert_eq!(prefix_end(b"abc"), Bytes::from_static(b"abd"));
        assert_eq!(prefix_end(b"a\xff"), Bytes::from_static(b"b"));
        assert_eq!(prefix_end(b"\xff\xff"), Bytes::from_static(&[0]));
    }

    #[test]
    fn ranges_follow_etcd_rules() {
        let k = |s: &'static str| Bytes::from_static(s.as_bytes());
        assert!(KeyRange::new(&k("a"), &k("")).contains(b"a"));
        assert!(!KeyRange::new(&k("a"), &k("")).contains(b"ab"));
        let all = KeyRange::new(&k("\0"), &Bytes::from_static(&[0]));
        assert!(all.contains(b"") || all.contains(b"\0") && all.contains(b"zzz"));
        let between = KeyRange::new(&k("b"), &k("d"));
        assert!(between.contains(b"b") && between.contains(b"c\xff") && !between.contains(b"d"));
        assert!(!KeyRange::new(&k("d"), &k("b")).contains(b"c"), "an inverted range is empty");
    }
}
