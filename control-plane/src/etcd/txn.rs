//! What etcd's answers and errors say, and how writes are cut into
//! transactions etcd takes.

use super::client::pb::etcdserverpb::{Compare, RangeRequest, RequestOp, TxnRequest, TxnResponse};
use super::config::EtcdConfig;
use crate::error::Error;
use crate::store::parts::{self, Op, Stored};
use crate::store::{Persisted, Revision, legacy};

/// The value of `PREFIX/revision`: the layout of the parts.
const LAYOUT: &str = "parts 1";
/// Most operations in one transaction (etcd's `--max-txn-ops` is 128 by
/// default).
pub(super) const MAX_OPS: usize = 100;
/// Most bytes of values in one transaction of new source texts (etcd's
/// `--max-request-bytes` is 1.5 MiB by default).
const MAX_BATCH_BYTES: usize = 1 << 20;

/// The read of the shared state, in one transaction (its parts as of one
/// revision): the revision key, the value an earlier govd kept the whole
/// state in, and every part, paged (`Client::txn_whole` reads the rest).
pub(super) fn state_read(config: &EtcdConfig) -> TxnRequest {
    let prefix = config.part("");
    TxnRequest::default().and_then(vec![
        RequestOp::get(config.key("revision")),
        RequestOp::get(config.key("state")),
        RequestOp::range(RangeRequest::prefix(prefix).paged()),
    ])
}

/// What holds while the stored state is still the one of revision
/// `expected`: the revision key's last write (the legacy value's, with no
/// revision key yet, when the state is still kept the earlier way).
pub(super) fn unchanged_since(
    config: &EtcdConfig,
    expected: Revision,
    legacy: bool,
) -> Vec<Compare> {
    let rev_key = config.key("revision");
    if legacy {
        vec![
            Compare::mod_revision_is(config.key("state"), expected),
            Compare::create_revision_is(rev_key, 0),
        ]
    } else {
        vec![Compare::mod_revision_is(rev_key, expected)]
    }
}

/// The commit of a write: the operations of `main` and the layout put at
/// the revision key (the legacy value removed), when `when` holds; else
/// reads of what the keys' revisions are instead. `bytes` counts the
/// keys and values written.
pub(super) fn commit(
    config: &EtcdConfig,
    main: &[&Op],
    when: Vec<Compare>,
    legacy: bool,
    bytes: &mut usize,
) -> TxnRequest {
    let (rev_key, legacy_key) = (config.key("revision"), config.key("state"));
    let mut ops: Vec<RequestOp> = main.iter().map(|op| txn_op(config, op, bytes)).collect();
    ops.push(RequestOp::put(rev_key.as_str(), LAYOUT, 0));
    *bytes += rev_key.len() + LAYOUT.len();
    if legacy {
        ops.push(RequestOp::delete(legacy_key.as_str()));
        *bytes += legacy_key.len();
    }
    TxnRequest::default().when(when).and_then(ops).or_else(vec![
        RequestOp::get(rev_key.as_str()),
        RequestOp::get(legacy_key.as_str()),
    ])
}

/// `ops` in batches of at most [`MAX_OPS`] operations and
/// [`MAX_BATCH_BYTES`] bytes of values (a larger value alone).
pub(super) fn batches<'a>(ops: &'a [&'a Op]) -> Vec<&'a [&'a Op]> {
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, op) in ops.iter().enumerate() {
        let size = match op {
            Op::Put(_, value) => value.len(),
            Op::Delete(_) => 0,
        };
        if i > start && (i - start == MAX_OPS || bytes + size > MAX_BATCH_BYTES) {
            out.push(&ops[start..i]);
            (start, bytes) = (i, 0);
        }
        bytes += size;
    }
    if start < ops.len() {
        out.push(&ops[start..]);
    }
    out
}

/// The mod revision of the key each of the first two reads of `response`
/// found (`None`: no such key).
pub(super) fn mod_revisions(response: &TxnResponse) -> [Option<Revision>; 2] {
    let mut found = response
        .ranges()
        .map(|g| g.kvs.first().map(|kv| kv.mod_revision));
    [found.next().flatten(), found.next().flatten()]
}

/// The revision of the state a refused write found: `PREFIX/revision`'s,
/// or while converting the `legacy` value, that value's until the parts
/// exist (0: neither).
pub(super) fn found(response: &TxnResponse, legacy: bool) -> Revision {
    let [revision, legacy_rev] = mod_revisions(response);
    if legacy {
        revision.or(legacy_rev)
    } else {
        revision
    }
    .unwrap_or(0)
}

/// A write's operations: the removals the plan makes first, the new source
/// texts, services' configs and lists (and history entries, when the
/// commit would hold too many) before the commit, the commit's, and the
/// removals that do not fit in it, after. What goes before the commit is
/// written in transactions conditioned on the revision the commit is
/// (`EtcdStore::write`): none lands once another replica committed, so a
/// replica that reads the state after a commit sees every part written
/// before it.
pub(super) struct Split<'a> {
    pub pre: Vec<&'a Op>,
    pub main: Vec<&'a Op>,
    pub after: Vec<&'a Op>,
}

/// Splits `ops` (the first `first` of them removals to make before the
/// rest) for a commit that has `fixed` operations of its own; the number
/// of puts when they do not fit in one transaction.
pub(super) fn split(ops: &[Op], first: usize, fixed: usize) -> Result<Split<'_>, usize> {
    let (mut pre, mut main, mut removals) = (Vec::new(), Vec::new(), Vec::new());
    pre.extend(&ops[..first.min(ops.len())]);
    for op in &ops[first.min(ops.len())..] {
        match op {
            // Content-addressed, or named by the write that puts them:
            // nothing the store's policy commits reads them before the commit.
            Op::Put(name, _)
                if ["text-", "config-", "services-"]
                    .iter()
                    .any(|p| name.starts_with(p)) =>
            {
                pre.push(op)
            }
            Op::Put(..) => main.push(op),
            Op::Delete(_) => removals.push(op),
        }
    }
    if main.len() + fixed > MAX_OPS {
        // History entries before the commit are not read until the policy
        // that names them is (`parts.rs`).
        let (history, rest): (Vec<&Op>, Vec<&Op>) = main
            .into_iter()
            .partition(|op| op.name().starts_with("history-"));
        pre.extend(history);
        main = rest;
    }
    if main.len() + fixed > MAX_OPS {
        return Err(main.len());
    }
    let room = MAX_OPS - main.len() - fixed;
    let after = removals.split_off(room.min(removals.len()));
    main.extend(removals);
    Ok(Split { pre, main, after })
}

/// A transaction of removals past the commit at `revision` (`rev_key`'s
/// mod revision then): made only while no other write came after it. A
/// replica that read the state before these removals ran may name again,
/// in its own commit, a part they remove (a source text, a service's
/// config it holds and so does not put again); that part is then left, and
/// removed by a later write that finds nothing names it.
pub(super) fn removals(rev_key: &str, revision: Revision, ops: Vec<RequestOp>) -> TxnRequest {
    TxnRequest::default()
        .when(vec![Compare::mod_revision_is(rev_key, revision)])
        .and_then(ops)
}

/// The transaction operation of `op`, its bytes counted.
pub(super) fn txn_op(config: &EtcdConfig, op: &Op, bytes: &mut usize) -> RequestOp {
    match op {
        Op::Put(name, value) => {
            let key = config.part(name);
            *bytes += key.len() + value.len();
            RequestOp::put(key, value.clone(), 0)
        }
        Op::Delete(name) => {
            let key = config.part(name);
            *bytes += key.len();
            RequestOp::delete(key)
        }
    }
}

/// The state a read of `PREFIX/revision`, `PREFIX/state` and the parts
/// under `PREFIX/state/` (one transaction, in this order) found, what the
/// store holds of it, and its revision: the parts, or the legacy value
/// while `PREFIX/revision` does not exist.
pub(super) fn state_of(
    got: &TxnResponse,
    config: &EtcdConfig,
) -> Result<(Persisted, Stored, Revision), Error> {
    let [revision, legacy_rev] = mod_revisions(got);
    let mut gets = got.ranges();
    let (_, legacy_value, listed) = (gets.next(), gets.next(), gets.next());
    let prefix = config.part("");
    let parts: Vec<(String, Vec<u8>)> = listed
        .iter()
        .flat_map(|g| &g.kvs)
        .filter_map(|kv| {
            let name = std::str::from_utf8(&kv.key).ok()?;
            let name = name.strip_prefix(prefix.as_str())?;
            parts::is_part(name).then(|| (name.to_owned(), kv.value.clone()))
        })
        .collect();
    Ok(match (revision, legacy_rev) {
        (None, Some(rev)) => {
            let value = legacy_value
                .as_ref()
                .and_then(|g| g.kvs.first())
                .map(|kv| kv.value.clone())
                .unwrap_or_default();
            let state = legacy::decode(&value, &format!("etcd:{}", config.key("state")))?;
            let names = parts.into_iter().map(|(name, _)| name);
            (state, Stored::unknown(names, true), rev)
        }
        (revision, _) => {
            let place = |name: &str| format!("etcd:{}", config.part(name));
            let (state, stored) = parts::assemble(parts, &place)?;
            (state, stored, revision.unwrap_or(0))
        }
    })
}
