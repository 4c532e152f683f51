//! The agents a replica has seen, in etcd, a key per agent, so that an ACK
//! writes its own agent's new version, not the whole registry:
//!
//! - `PREFIX/agents/REPLICA/SERVICE/INSTANCE`: the agent's record
//!   (`KnownAgent`, JSON), written when the agent is first seen and when its
//!   address, labels or identity change (`/` and `%` in a name are written
//!   `%2F` and `%25`);
//! - `PREFIX/agents/REPLICA/SERVICE/INSTANCE/v`: its last good version,
//!   which wins over the record's: an ACK writes it alone;
//! - `PREFIX/agents/REPLICA`: every record in one value, as earlier releases
//!   wrote it on every change: read under the keys above, and replaced by
//!   them at the first load ([`convert`]).
//!
//! Both keys of an agent go when it is forgotten (`--agent-retention`).

use std::collections::BTreeMap;

use super::client::pb::etcdserverpb::{
    RangeRequest, RangeResponse, RequestOp, TxnRequest, TxnResponse,
};
use super::config::EtcdConfig;
use crate::error::Error;
use crate::store::{AgentChanges, KnownAgent};

/// The suffix of an agent's version key.
const VERSION: &str = "/v";

/// `name` with `%` and `/` escaped, so that it is one segment of a key.
fn escape(name: &str) -> String {
    name.replace('%', "%25").replace('/', "%2F")
}

/// The id of an agent under its replica's prefix: `SERVICE/INSTANCE`,
/// escaped.
fn id(service: &str, instance: &str) -> String {
    format!("{}/{}", escape(service), escape(instance))
}

/// The key of the whole registry of earlier releases.
pub(super) fn legacy_key(config: &EtcdConfig) -> String {
    config.key(&format!("agents/{}", config.replica))
}

/// The prefix of this replica's agent keys.
pub(super) fn prefix(config: &EtcdConfig) -> String {
    config.key(&format!("agents/{}/", config.replica))
}

/// What a replica holds of its agents in etcd: each agent's record as
/// last read or written, by [`id`].
pub(super) type Written = BTreeMap<String, KnownAgent>;

/// The agents of `legacy` (the value of [`legacy_key`], if any) and of the
/// keys under [`prefix`] in `keys` (they win), and what etcd holds of them.
/// An unreadable record costs its DISCONNECTED row, nothing else.
pub(super) fn read(
    config: &EtcdConfig,
    legacy: Option<&[u8]>,
    keys: &RangeResponse,
) -> (Vec<KnownAgent>, Written) {
    let mut agents: BTreeMap<String, KnownAgent> = legacy
        .and_then(|v| serde_json::from_slice::<Vec<KnownAgent>>(v).ok())
        .unwrap_or_default()
        .into_iter()
        .map(|a| (id(&a.service, &a.instance), a))
        .collect();
    let prefix = prefix(config);
    let mut versions = Vec::new();
    let mut written = Written::new();
    for kv in &keys.kvs {
        let Some(rest) = kv.key.strip_prefix(prefix.as_bytes()) else {
            continue;
        };
        let Ok(rest) = std::str::from_utf8(rest) else {
            continue;
        };
        if let Some(agent) = rest.strip_suffix(VERSION) {
            let version = String::from_utf8_lossy(&kv.value).into_owned();
            versions.push((agent.to_owned(), version));
        } else if let Ok(agent) = serde_json::from_slice::<KnownAgent>(&kv.value) {
            written.insert(rest.to_owned(), agent.clone());
            agents.insert(rest.to_owned(), agent);
        }
    }
    for (agent, version) in versions {
        if let Some(a) = agents.get_mut(&agent) {
            a.last_good_version.clone_from(&version);
        }
        if let Some(a) = written.get_mut(&agent) {
            a.last_good_version = version;
        }
    }
    (agents.into_values().collect(), written)
}

/// This replica's agents and what etcd holds of them, read with `txn` (a
/// transaction and what it is for, which reads the rest of a paged read:
/// `EtcdStore::txn_whole`); the registry of an earlier release in
/// one value is converted to a key per agent at once ([`convert`]), or at
/// the next load when that fails.
pub(super) async fn load<F, T>(
    config: &EtcdConfig,
    per_txn: usize,
    txn: F,
) -> Result<(Vec<KnownAgent>, Written), Error>
where
    F: Fn(TxnRequest, &'static str) -> T,
    T: Future<Output = Result<TxnResponse, Error>>,
{
    let legacy_key = legacy_key(config);
    let both = TxnRequest::default().and_then(vec![
        RequestOp::get(legacy_key.as_str()),
        RequestOp::range(RangeRequest::prefix(prefix(config)).paged()),
    ]);
    let got = txn(both, "read the agents").await?;
    let mut gets = got.ranges();
    let legacy = gets.next().and_then(|g| g.kvs.first());
    let keys = gets.next().cloned().unwrap_or_default();
    let (list, mut written) = read(config, legacy.map(|kv| &kv.value[..]), &keys);
    if legacy.is_some() {
        for batch in convert(config, &list, per_txn) {
            if let Err(error) =
                txn(TxnRequest::default().and_then(batch), "convert the agents").await
            {
                tracing::warn!(error = %crate::error::one_line(&error), "cannot convert the agents' registry to a key per agent; trying again at the next load");
                return Ok((list, written));
            }
        }
        let all = AgentChanges {
            changed: list.clone(),
            ..AgentChanges::default()
        };
        record(&all, &mut written);
    }
    Ok((list, written))
}

/// The puts that write `agents` whole (a record and a version each) and
/// the removal of `legacy_key` last: the conversion of the registry of
/// earlier releases, in transactions of at most `per_txn` operations.
pub(super) fn convert(
    config: &EtcdConfig,
    agents: &[KnownAgent],
    per_txn: usize,
) -> Vec<Vec<RequestOp>> {
    let changes = AgentChanges {
        changed: agents.to_vec(),
        gone: Vec::new(),
        live: agents.len(),
    };
    let mut batches = ops(config, &changes, &Written::new(), per_txn);
    let delete = RequestOp::delete(legacy_key(config));
    match batches.last_mut() {
        Some(last) if last.len() < per_txn => last.push(delete),
        _ => batches.push(vec![delete]),
    }
    batches
}

/// The writes of `changes` over `written`, in transactions of at most
/// `per_txn` operations: an agent whose record differs from the one
/// written only in its version, its version key; another, its record and
/// its version key; an agent forgotten, the removal of both. An agent's
/// keys are in one transaction.
pub(super) fn ops(
    config: &EtcdConfig,
    changes: &AgentChanges,
    written: &Written,
    per_txn: usize,
) -> Vec<Vec<RequestOp>> {
    let prefix = prefix(config);
    let mut batches: Vec<Vec<RequestOp>> = Vec::new();
    let mut push = |pair: Vec<RequestOp>| match batches.last_mut() {
        Some(last) if last.len() + pair.len() <= per_txn => last.extend(pair),
        _ => batches.push(pair),
    };
    for a in &changes.changed {
        let id = id(&a.service, &a.instance);
        let key = format!("{prefix}{id}");
        let version = RequestOp::put(format!("{key}{VERSION}"), a.last_good_version.clone(), 0);
        let same_but_version = written.get(&id).is_some_and(|w| {
            (&w.address, &w.labels, &w.identity) == (&a.address, &a.labels, &a.identity)
        });
        if same_but_version {
            push(vec![version]);
        } else {
            let record = serde_json::to_vec(a).unwrap_or_default();
            push(vec![RequestOp::put(key, record, 0), version]);
        }
    }
    for (service, instance) in &changes.gone {
        let key = format!("{prefix}{}", id(service, instance));
        push(vec![
            RequestOp::delete(format!("{key}{VERSION}")),
            RequestOp::delete(key),
        ]);
    }
    batches
}

/// `written` once `changes` are written.
pub(super) fn record(changes: &AgentChanges, written: &mut Written) {
    for a in &changes.changed {
        written.insert(id(&a.service, &a.instance), a.clone());
    }
    for (service, instance) in &changes.gone {
        written.remove(&id(service, instance));
    }
}

#[cfg(test)]
mod tests {
    use super::super::client::pb::etcdserverpb::request_op;
    use super::super::client::pb::mvccpb::KeyValue;
    use super::*;

    fn config() -> EtcdConfig {
        let ttl = std::time::Duration::from_secs(10);
        EtcdConfig::parse("etcd://h:1/gov", "r1", ttl).unwrap()
    }

    fn agent(instance: &str, version: &str) -> KnownAgent {
        KnownAgent {
            service: "order".into(),
            instance: instance.into(),
            address: "10.0.0.1:80".into(),
            last_good_version: version.into(),
            labels: [("zone".to_string(), "a".to_string())].into(),
            identity: "token `order`".into(),
        }
    }

    /// What etcd would hold after `batches`, over `kv`.
    fn run(kv: &mut BTreeMap<Vec<u8>, Vec<u8>>, batches: &[Vec<RequestOp>]) -> usize {
        let mut bytes = 0;
        for op in batches.iter().flatten() {
            match &op.request {
                Some(request_op::Request::RequestPut(p)) => {
                    bytes += p.key.len() + p.value.len();
                    kv.insert(p.key.clone(), p.value.clone());
                }
                Some(request_op::Request::RequestDeleteRange(d)) => {
                    kv.remove(&d.key);
                }
                _ => panic!("{op:?}"),
            }
        }
        bytes
    }

    fn response(kv: &BTreeMap<Vec<u8>, Vec<u8>>) -> RangeResponse {
        RangeResponse {
            kvs: kv
                .iter()
                .map(|(k, v)| KeyValue {
                    key: k.clone(),
                    value: v.clone(),
                    ..KeyValue::default()
                })
                .collect(),
            ..RangeResponse::default()
        }
    }

    /// An ACK writes its agent's version key alone, the same bytes whatever
    /// the number of agents; a new agent writes its record too; a forgotten
    /// one loses both keys; a read gives every agent back as last written.
    #[test]
    fn an_ack_writes_its_agents_version_alone() {
        let config = config();
        let mut kv = BTreeMap::new();
        let mut written = Written::new();
        let all: Vec<KnownAgent> = (0..300).map(|i| agent(&format!("i/{i}"), "v1")).collect();
        let first = AgentChanges {
            changed: all.clone(),
            gone: Vec::new(),
            live: 300,
        };
        let batches = ops(&config, &first, &written, 100);
        assert_eq!(batches.len(), 6, "two keys an agent, 100 operations a txn");
        run(&mut kv, &batches);
        record(&first, &mut written);
        let ack = AgentChanges {
            changed: vec![agent("i/7", "v2")],
            gone: vec![("order".into(), "i/9".into())],
            live: 299,
        };
        let batches = ops(&config, &ack, &written, 100);
        assert_eq!(batches.concat().len(), 3, "{batches:?}");
        let bytes = run(&mut kv, &batches);
        assert_eq!(bytes, "gov/agents/r1/order/i%2F7/v".len() + 2);
        record(&ack, &mut written);
        let (back, read_written) = read(&config, None, &response(&kv));
        assert_eq!(back.len(), 299);
        let i7 = back.iter().find(|a| a.instance == "i/7").unwrap();
        assert_eq!(i7, &agent("i/7", "v2"));
        assert!(back.iter().all(|a| a.instance != "i/9"));
        assert_eq!(read_written, written);
        // A new address: the record again.
        let mut moved = agent("i/7", "v2");
        moved.address = "10.0.0.2:80".into();
        let change = AgentChanges {
            changed: vec![moved.clone()],
            gone: Vec::new(),
            live: 299,
        };
        assert_eq!(ops(&config, &change, &written, 100).concat().len(), 2);
    }

    /// The registry of earlier releases (one value) is read, and converted
    /// to a key per agent with its removal last; the keys win over it.
    #[test]
    fn the_registry_of_an_earlier_release_is_read_and_converted() {
        let config = config();
        let legacy = vec![agent("a", "v1"), agent("b", "v1")];
        let value = serde_json::to_vec(&legacy).unwrap();
        let mut kv = BTreeMap::new();
        kv.insert(legacy_key(&config).into_bytes(), value.clone());
        let (agents, _) = read(&config, Some(&value), &response(&BTreeMap::new()));
        assert_eq!(agents, legacy);
        let batches = convert(&config, &agents, 3);
        assert_eq!(batches.len(), 2, "{batches:?}");
        run(&mut kv, &batches);
        assert!(!kv.contains_key(legacy_key(&config).as_bytes()));
        let (agents, _) = read(&config, None, &response(&kv));
        assert_eq!(agents, legacy);
        // Cut short before the removal: both are read, the keys win.
        let mut kv = BTreeMap::new();
        kv.insert(legacy_key(&config).into_bytes(), value.clone());
        run(
            &mut kv,
            &ops(
                &config,
                &AgentChanges {
                    changed: vec![agent("a", "v2")],
                    gone: Vec::new(),
                    live: 2,
                },
                &Written::new(),
                100,
            ),
        );
        let keys: BTreeMap<_, _> = kv
            .iter()
            .filter(|(k, _)| k.starts_with(prefix(&config).as_bytes()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let (agents, _) = read(&config, Some(&value), &response(&keys));
        assert_eq!(agents, vec![agent("a", "v2"), agent("b", "v1")]);
    }
}
