//! The endpoint sets govd pushes: each replaces its service's set in the
//! balancer's [`Directory`], and with a state directory all of them are kept
//! on disk, so that an agent restarted while govd is down still knows where
//! its calls go.

use std::path::PathBuf;
use std::sync::Arc;

use gov_engine::Engine;
use http::uri::Authority;

use super::upstream::{Directory, EndpointSpec};

/// Where the agent keeps the last endpoint sets govd pushed (in `--state-dir`).
const ENDPOINTS_FILE: &str = "endpoints.json";

/// The control-plane callback that keeps `directory` on govd's registry: each
/// `Endpoints` push replaces that service's set (an address that does not parse
/// is skipped and logged). With a state directory, every set is also written
/// there atomically, so that an agent restarted while govd is down still knows
/// where its calls go ([`restore_endpoints`]).
pub fn endpoints_to(
    directory: Arc<Directory>,
    engine: Engine,
    state_dir: Option<PathBuf>,
) -> crate::control::OnEndpoints {
    let sets = std::sync::Mutex::new(std::collections::BTreeMap::new());
    Arc::new(move |endpoints: &gov_proto::v1::Endpoints| {
        // Per-instance bulkhead scopes follow the live set.
        engine.forget_instances(&apply_endpoints(&directory, endpoints));
        let Some(dir) = &state_dir else { return };
        let mut sets = sets.lock().unwrap_or_else(|e| e.into_inner());
        sets.insert(endpoints.service.clone(), endpoints.clone());
        let all: Vec<&gov_proto::v1::Endpoints> = sets.values().collect();
        let written = serde_json::to_vec_pretty(&all)
            .map_err(|e| e.to_string())
            .and_then(|bytes| {
                crate::state_dir::write_atomically(dir, ENDPOINTS_FILE, &bytes)
                    .map_err(|e| format!("cannot {} `{}`: {}", e.op, e.path.display(), e.source))
            });
        if let Err(error) = written {
            tracing::warn!(%error, "cannot keep the endpoint sets in the state directory; calls are routed as pushed");
        }
    })
}

/// Replaces a service's set in `directory` with what govd pushed; the ids of
/// the endpoints that left it.
fn apply_endpoints(directory: &Directory, endpoints: &gov_proto::v1::Endpoints) -> Vec<Arc<str>> {
    let specs = endpoints.instances.iter().filter_map(|i| {
        match i.address.parse::<Authority>() {
            Ok(authority) => Some(EndpointSpec {
                authority,
                weight_milli_percent: i.weight_milli_percent,
            }),
            Err(error) => {
                tracing::warn!(service = %endpoints.service, instance = %i.instance, address = %i.address, %error, "skipping an endpoint with a bad address");
                None
            }
        }
    });
    let ids = directory.replace(&endpoints.service, specs);
    let address = |i: &gov_proto::v1::Instance| i.address.parse::<Authority>().ok();
    let all = endpoints.instances.iter().filter_map(address).collect();
    let marked = endpoints
        .instances
        .iter()
        .filter(|i| i.mtls)
        .filter_map(address)
        .collect();
    directory
        .mtls_targets()
        .set(&endpoints.service, all, marked);
    ids
}

/// Loads the endpoint sets kept in `dir` into `directory` (at start, before
/// govd is reached; govd's pushes replace them). Returns how many services;
/// a missing file is none, a corrupt one is logged and skipped.
pub fn restore_endpoints(directory: &Directory, dir: &std::path::Path) -> usize {
    let path = dir.join(ENDPOINTS_FILE);
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return 0,
        Err(error) => {
            tracing::warn!(path = %path.display(), %error, "cannot read the kept endpoint sets");
            return 0;
        }
    };
    match serde_json::from_slice::<Vec<gov_proto::v1::Endpoints>>(&bytes) {
        Ok(sets) => {
            for set in &sets {
                apply_endpoints(directory, set);
            }
            tracing::info!(
                services = sets.len(),
                "restored the endpoint sets govd last pushed"
            );
            sets.len()
        }
        Err(error) => {
            tracing::warn!(path = %path.display(), %error, "the kept endpoint sets are unreadable; ignoring them");
            0
        }
    }
}
