//! The compiled bundle of the policy in force as parts, so that an apply
//! that changes one service writes bytes independent of the number of
//! services:
//!
//! - `config-KEY-SEQ-WRITE.json`: one service's compiled config
//!   (`pb::TargetConfig`). `KEY` is a hash of the service's name, `SEQ` the
//!   number of the policy write that put it, `WRITE` a hash of that
//!   policy's version, author and time. An apply writes the configs of the
//!   services it changes only, under its own `SEQ` and `WRITE`;
//! - `services-HEX.json`: the services' names in the bundle's order, by the
//!   sha256 of its contents: written when the set (or order) of services
//!   changes, not when a config does;
//! - the policy part names the list, its `SEQ` and its `WRITE`.
//!
//! A service's config is its part with the greatest `SEQ` that the policy
//! in force commits: a lower `SEQ`, or its own `SEQ` with its own `WRITE`.
//! A part of a higher `SEQ` (an apply cut short before its policy part) or
//! of the same `SEQ` but another `WRITE` (the apply of another replica that
//! lost the race) is not read, and is removed before the next policy write
//! commits (so that a later `SEQ` never makes it readable); a part a newer
//! one replaced, after it. Earlier layouts are read as they are and
//! rewritten in this one by the next write: the policy part holding the
//! whole bundle, then `target-HEX.json` parts by content address that the
//! policy part listed (35 bytes a service in every apply).

use std::collections::BTreeMap;

use gov_proto::v1 as pb;
use serde::{Deserialize, Serialize};

use crate::error::Error;

/// A config part of the layout before (content-addressed, listed).
pub(super) const TARGET: &str = "target-";
pub(super) const CONFIG: &str = "config-";
pub(super) const SERVICES: &str = "services-";
const JSON: &str = ".json";

/// What the policy part says of its configs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Configs {
    /// The id of the `services-HEX.json` part (its `HEX`).
    pub services: String,
    pub seq: u64,
    pub write: String,
}

/// The policy part's `targets` as any layout wrote it: an object since the
/// configs are parts of their own (a govd of the layout before, reading a
/// list there, refuses the part rather than reads an empty bundle), a list
/// of content addresses before.
#[derive(Deserialize)]
#[serde(untagged)]
pub(super) enum TargetsIn {
    Parts(Configs),
    Ids(Vec<String>),
}

impl Default for TargetsIn {
    fn default() -> Self {
        TargetsIn::Ids(Vec::new())
    }
}

/// The configs the store holds for the policy in force.
#[derive(Clone, Debug)]
pub(super) struct Committed {
    pub configs: Configs,
    /// The services list part's name.
    pub list: String,
    /// Each service's key: its config part's name and a digest of its
    /// contents.
    pub parts: BTreeMap<String, (String, [u8; 16])>,
}

fn digest(bytes: &[u8]) -> [u8; 16] {
    use sha2::Digest as _;
    let d = sha2::Sha256::digest(bytes);
    let mut out = [0u8; 16];
    out.copy_from_slice(&d[..16]);
    out
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The key of the `nth` service of the bundle named `service` (0 for the
/// first: a bundle names each service once).
fn key(service: &str, nth: usize) -> String {
    let mut bytes = service.as_bytes().to_vec();
    if nth > 0 {
        bytes.push(0);
        bytes.extend_from_slice(nth.to_string().as_bytes());
    }
    hex(&digest(&bytes))
}

/// Each service's key, in `names`' order.
fn keys<'a>(names: impl Iterator<Item = &'a str>) -> Vec<String> {
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    names
        .map(|name| {
            let nth = seen.entry(name).or_default();
            let k = key(name, *nth);
            *nth += 1;
            k
        })
        .collect()
}

/// The `WRITE` of the policy `version` applied by `who` at `at_unix_ms`.
pub(super) fn write_id(version: &str, who: &str, at_unix_ms: u64) -> String {
    let mut bytes = Vec::new();
    for part in [version, who, &at_unix_ms.to_string()] {
        bytes.extend_from_slice(part.as_bytes());
        bytes.push(0);
    }
    hex(&digest(&bytes)[..8])
}

fn config_name(key: &str, seq: u64, write: &str) -> String {
    format!("{CONFIG}{key}-{seq:012}-{write}{JSON}")
}

/// `(KEY, SEQ, WRITE)` of a config part's name.
pub(super) fn parse(name: &str) -> Option<(&str, u64, &str)> {
    let rest = name.strip_prefix(CONFIG)?.strip_suffix(JSON)?;
    let mut it = rest.splitn(3, '-');
    let (key, seq, write) = (it.next()?, it.next()?, it.next()?);
    Some((key, seq.parse().ok()?, write))
}

/// Whether the config part `name` is one the policy writes up to
/// `configs` committed (see the module doc).
pub(super) fn committed(name: &str, configs: &Configs) -> bool {
    parse(name).is_some_and(|(_, seq, write)| {
        seq < configs.seq || (seq == configs.seq && write == configs.write)
    })
}

pub(super) fn list_name(id: &str) -> String {
    format!("{SERVICES}{id}{JSON}")
}

/// The bundle a policy part of the layout before names by the ids of its
/// `target-` parts (`missing` and `corrupt` as for [`assemble`]).
pub(super) fn listed(
    version: String,
    ids: &[String],
    parts: &BTreeMap<String, Vec<u8>>,
    missing: &dyn Fn(String) -> Error,
    corrupt: &dyn Fn(&str, serde_json::Error) -> Error,
) -> Result<pb::Bundle, Error> {
    let targets = ids
        .iter()
        .map(|id| {
            let name = format!("{TARGET}{id}{JSON}");
            match parts.get(&name) {
                Some(bytes) => serde_json::from_slice(bytes).map_err(|e| corrupt(&name, e)),
                None => Err(missing(name)),
            }
        })
        .collect::<Result<_, _>>()?;
    Ok(pb::Bundle { version, targets })
}

/// The config parts of `bundle` to write over `base` (the configs the
/// store holds, `None`: unknown, write every one) at `seq` and `write`:
/// each part to put (configs, then the list when it changed) given to
/// `put`; what the store holds then.
pub(super) fn plan(
    bundle: &pb::Bundle,
    base: Option<&Committed>,
    seq: u64,
    write: String,
    put: &mut dyn FnMut(String, Vec<u8>),
) -> Result<Committed, Error> {
    let names: Vec<&str> = bundle.targets.iter().map(|t| t.service.as_str()).collect();
    let list = serde_json::to_vec(&names).map_err(Error::Encode)?;
    let services = hex(&digest(&list));
    let mut parts = BTreeMap::new();
    for (target, key) in bundle.targets.iter().zip(keys(names.iter().copied())) {
        let bytes = serde_json::to_vec(target).map_err(Error::Encode)?;
        let sum = digest(&bytes);
        let kept = base
            .and_then(|b| b.parts.get(&key))
            .filter(|(_, d)| *d == sum);
        let name = match kept {
            Some((name, _)) => name.clone(),
            None => {
                let name = config_name(&key, seq, &write);
                put(name.clone(), bytes);
                name
            }
        };
        parts.insert(key, (name, sum));
    }
    let list_part = list_name(&services);
    if base.is_none_or(|b| b.list != list_part) {
        put(list_part.clone(), list);
    }
    Ok(Committed {
        configs: Configs {
            services,
            seq,
            write,
        },
        list: list_part,
        parts,
    })
}

/// The bundle `configs` names among `parts` (config and list parts by
/// name), and what the store holds of it; `missing` is the error for a
/// part it names that is missing, `corrupt` for one unreadable.
pub(super) fn assemble(
    version: String,
    configs: Configs,
    parts: &BTreeMap<String, Vec<u8>>,
    missing: &dyn Fn(String) -> Error,
    corrupt: &dyn Fn(&str, serde_json::Error) -> Error,
) -> Result<(pb::Bundle, Committed), Error> {
    let list = list_name(&configs.services);
    let bytes = parts.get(&list).ok_or_else(|| missing(list.clone()))?;
    let names: Vec<String> = serde_json::from_slice(bytes).map_err(|e| corrupt(&list, e))?;
    // Each key's committed part with the greatest SEQ.
    let mut newest: BTreeMap<&str, (u64, &str)> = BTreeMap::new();
    for name in parts.keys().filter(|n| committed(n, &configs)) {
        if let Some((key, seq, _)) = parse(name) {
            let best = newest.entry(key).or_insert((seq, name));
            if seq >= best.0 {
                *best = (seq, name);
            }
        }
    }
    let mut out = Committed {
        configs,
        list,
        parts: BTreeMap::new(),
    };
    let mut targets = Vec::with_capacity(names.len());
    for key in keys(names.iter().map(String::as_str)) {
        let Some((_, name)) = newest.get(key.as_str()) else {
            return Err(missing(format!("{CONFIG}{key}-*")));
        };
        let bytes = &parts[*name];
        targets.push(serde_json::from_slice(bytes).map_err(|e| corrupt(name, e))?);
        out.parts.insert(key, ((*name).to_owned(), digest(bytes)));
    }
    let bundle = pb::Bundle { version, targets };
    Ok((bundle, out))
}

/// Whether the part `name`, gone from the store's next state, is
/// removed before the write's puts rather than after its commit: a config
/// part that `base` (the configs the store holds) does not commit, which a
/// later `SEQ` could make readable.
pub(super) fn remove_first(name: &str, base: Option<&Committed>) -> bool {
    base.is_some_and(|b| name.starts_with(CONFIG) && !committed(name, &b.configs))
}

/// The names of the parts `c` holds: its configs and its list.
pub(super) fn part_names(c: &Committed) -> impl Iterator<Item = &String> {
    c.parts.values().map(|(n, _)| n).chain([&c.list])
}
