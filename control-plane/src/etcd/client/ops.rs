//! Builders for the requests govd sends and readers of the answers it gets,
//! on the generated messages themselves: only what govd uses (reads of a key
//! or a prefix, puts, deletes, compares of a key's create or mod revision
//! for equality, transactions of those).

use super::pb::etcdserverpb::{
    Compare, DeleteRangeRequest, PutRequest, RangeRequest, RangeResponse, RequestOp,
    ResponseHeader, TxnRequest, TxnResponse, compare, request_op, response_op,
};

/// The keys of a page of a [`RangeRequest::paged`] read: 1,000 agent keys
/// are about 0.2 MB, a service's config part at most etcd's request limit
/// (1.5 MiB by default), so a page stays under the client's 64 MiB.
pub const PAGE: i64 = 1_000;

impl RangeRequest {
    /// A read of `key`.
    pub fn key(key: impl Into<Vec<u8>>) -> Self {
        Self {
            key: key.into(),
            ..Self::default()
        }
    }

    /// A read of every key that starts with `prefix`.
    pub fn prefix(prefix: impl Into<Vec<u8>>) -> Self {
        let mut key = prefix.into();
        let range_end = prefix_end(&key);
        if key.is_empty() {
            // etcd reads `\0` to `\0` as every key.
            key = vec![0];
        }
        Self {
            key,
            range_end,
            ..Self::default()
        }
    }

    /// At most [`PAGE`] keys in its answer (`more` says when there are
    /// others): a read of a prefix that grows with the fleet (an agent's
    /// keys, a service's config) stays under a gRPC message's size; the
    /// caller reads the rest after the last key ([`RangeRequest::after`]).
    pub fn paged(mut self) -> Self {
        self.limit = PAGE;
        self
    }

    /// The same read from just after `key` (the last of a page), at
    /// `revision` (the first page's, so that every page is of one state).
    pub fn after(&self, key: &[u8], revision: i64) -> Self {
        let mut from = key.to_vec();
        from.push(0);
        Self {
            key: from,
            revision,
            ..self.clone()
        }
    }

    /// Keys and revisions without their values.
    pub fn keys_only(mut self) -> Self {
        self.keys_only = true;
        self
    }
}

/// The end (exclusive) of the range of keys that start with `prefix`: the
/// prefix with its last byte below 0xff incremented (`\0`, every key, when
/// there is none).
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

impl Compare {
    /// True while `key`'s mod revision (its last write) is `revision`.
    pub fn mod_revision_is(key: impl Into<Vec<u8>>, revision: i64) -> Self {
        Self::equal(
            key,
            compare::CompareTarget::Mod,
            compare::TargetUnion::ModRevision(revision),
        )
    }

    /// True while `key`'s create revision is `revision` (0: no such key).
    pub fn create_revision_is(key: impl Into<Vec<u8>>, revision: i64) -> Self {
        Self::equal(
            key,
            compare::CompareTarget::Create,
            compare::TargetUnion::CreateRevision(revision),
        )
    }

    fn equal(
        key: impl Into<Vec<u8>>,
        target: compare::CompareTarget,
        value: compare::TargetUnion,
    ) -> Self {
        Self {
            result: compare::CompareResult::Equal.into(),
            target: target.into(),
            key: key.into(),
            target_union: Some(value),
            range_end: Vec::new(),
        }
    }
}

impl RequestOp {
    /// A read in a transaction.
    pub fn range(range: RangeRequest) -> Self {
        Self {
            request: Some(request_op::Request::RequestRange(range)),
        }
    }

    /// A read of `key` in a transaction.
    pub fn get(key: impl Into<Vec<u8>>) -> Self {
        Self::range(RangeRequest::key(key))
    }

    /// A put of `value` at `key`; `lease`: the lease it goes with (0: none).
    pub fn put(key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>, lease: i64) -> Self {
        Self {
            request: Some(request_op::Request::RequestPut(PutRequest {
                key: key.into(),
                value: value.into(),
                lease,
                ..PutRequest::default()
            })),
        }
    }

    /// The removal of `key`.
    pub fn delete(key: impl Into<Vec<u8>>) -> Self {
        Self {
            request: Some(request_op::Request::RequestDeleteRange(
                DeleteRangeRequest {
                    key: key.into(),
                    ..DeleteRangeRequest::default()
                },
            )),
        }
    }
}

impl TxnRequest {
    /// The compares that must all hold for `and_then` to run (`or_else`
    /// otherwise).
    pub fn when(mut self, compares: Vec<Compare>) -> Self {
        self.compare = compares;
        self
    }

    /// The operations made when every compare holds.
    pub fn and_then(mut self, ops: Vec<RequestOp>) -> Self {
        self.success = ops;
        self
    }

    /// The operations made when a compare fails.
    pub fn or_else(mut self, ops: Vec<RequestOp>) -> Self {
        self.failure = ops;
        self
    }
}

impl TxnResponse {
    /// The answers to the reads among the operations that ran, in order.
    pub fn ranges(&self) -> impl Iterator<Item = &RangeResponse> {
        self.responses.iter().filter_map(|r| match &r.response {
            Some(response_op::Response::ResponseRange(range)) => Some(range),
            _ => None,
        })
    }

    /// The store's revision after the transaction.
    pub fn revision(&self) -> i64 {
        revision(self.header.as_ref())
    }
}

impl RangeResponse {
    /// The store's revision when the read was served.
    pub fn revision(&self) -> i64 {
        revision(self.header.as_ref())
    }
}

fn revision(header: Option<&ResponseHeader>) -> i64 {
    header.map_or(0, |h| h.revision)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_ends_past_its_last_byte_below_0xff() {
        assert_eq!(prefix_end(b"gov/audit/"), b"gov/audit0");
        assert_eq!(prefix_end(b"a\xff\xff"), b"b");
        assert_eq!(prefix_end(b"\xff"), [0]);
        let all = RangeRequest::prefix("");
        assert_eq!((all.key, all.range_end), (vec![0], vec![0]));
        let r = RangeRequest::prefix("p/").keys_only();
        assert_eq!(
            (r.key.as_slice(), r.range_end.as_slice()),
            (&b"p/"[..], &b"p0"[..])
        );
        assert!(r.keys_only);
    }

    #[test]
    fn compares_are_for_equality_of_the_named_revision() {
        let c = Compare::mod_revision_is("k", 7);
        assert_eq!(c.result(), compare::CompareResult::Equal);
        assert_eq!(c.target(), compare::CompareTarget::Mod);
        assert_eq!(c.target_union, Some(compare::TargetUnion::ModRevision(7)));
        let c = Compare::create_revision_is("k", 0);
        assert_eq!(c.target(), compare::CompareTarget::Create);
        assert_eq!(
            c.target_union,
            Some(compare::TargetUnion::CreateRevision(0))
        );
    }
}
