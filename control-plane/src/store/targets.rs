//! The compiled bundle of the policy in force as parts: each service's
//! compiled config (`pb::TargetConfig`) in a part of its own,
//! `target-HEX.json`, named by the sha256 of its contents (128 bits), and
//! the policy part naming them in the bundle's order. An apply that
//! changes one service writes that service's config and a policy part that
//! names the others, not every service's config again. Like a source text, a
//! config is written once, before the policy that names it (harmless if
//! the write stops there: nothing names it yet, and the next write removes
//! it), and removed once the policy in force no longer names it.

use gov_proto::v1 as pb;

use crate::error::Error;

pub(super) const TARGET: &str = "target-";
const JSON: &str = ".json";

/// One service's compiled config encoded as its part, and the part's name.
pub(super) fn encode(target: &pb::TargetConfig) -> Result<(String, Vec<u8>), Error> {
    use sha2::Digest as _;
    let bytes = serde_json::to_vec(target).map_err(Error::Encode)?;
    let digest = sha2::Sha256::digest(&bytes);
    let mut name = String::with_capacity(TARGET.len() + 32 + JSON.len());
    name.push_str(TARGET);
    for b in &digest[..16] {
        name.push_str(&format!("{b:02x}"));
    }
    name.push_str(JSON);
    Ok((name, bytes))
}

/// The id the policy part names a config by: its part's name without
/// `target-` and `.json`.
pub(super) fn id(name: &str) -> &str {
    name.strip_prefix(TARGET)
        .and_then(|n| n.strip_suffix(JSON))
        .unwrap_or(name)
}

/// The part's name of an id the policy part names.
pub(super) fn name(id: &str) -> String {
    format!("{TARGET}{id}{JSON}")
}
