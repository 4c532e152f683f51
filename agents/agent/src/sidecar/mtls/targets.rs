//! Which endpoints of other agents are called over mutual TLS.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use http::uri::Authority;

/// Which endpoints take mutual TLS, by address, and the service each is
/// an endpoint of: the instances govd marks in the endpoint sets it pushes
/// (their hello said so), and every known endpoint for `--outbound-mtls
/// always`.
#[derive(Debug, Default)]
pub struct Targets {
    marked: AddressBook,
    all: AddressBook,
}

/// Addresses by service, and the service of each address.
#[derive(Debug, Default)]
struct AddressBook {
    by_service: Mutex<HashMap<String, Vec<Authority>>>,
    by_authority: ArcSwap<HashMap<Authority, Arc<str>>>,
}

impl AddressBook {
    fn set(&self, service: &str, authorities: Vec<Authority>) {
        let mut by_service = self.by_service.lock().unwrap_or_else(|e| e.into_inner());
        if authorities.is_empty() {
            by_service.remove(service);
        } else {
            by_service.insert(service.to_owned(), authorities);
        }
        let mut by_authority = HashMap::new();
        for (service, authorities) in by_service.iter() {
            let name: Arc<str> = service.as_str().into();
            for a in authorities {
                by_authority.insert(a.clone(), name.clone());
            }
        }
        self.by_authority.store(Arc::new(by_authority));
    }

    fn service(&self, authority: &Authority) -> Option<Arc<str>> {
        self.by_authority.load().get(authority).cloned()
    }
}

impl Targets {
    /// `service`'s endpoints are now `all`, of which `marked` take mutual TLS.
    pub(crate) fn set(&self, service: &str, all: Vec<Authority>, marked: Vec<Authority>) {
        self.all.set(service, all);
        self.marked.set(service, marked);
    }

    /// The service whose endpoint at `authority` is called over mutual TLS
    /// by `mode`.
    pub(crate) fn service(&self, authority: &Authority, mode: OutboundMtls) -> Option<Arc<str>> {
        match mode {
            OutboundMtls::Off => None,
            OutboundMtls::Auto => self.marked.service(authority),
            OutboundMtls::Always => self.all.service(authority),
        }
    }
}

/// `--outbound-mtls`: which endpoints of other agents a caller with a
/// certificate calls over mutual TLS.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OutboundMtls {
    /// The instances govd marks (their inbound listener takes it).
    #[default]
    Auto,
    /// Every endpoint, `--instances` included (a fleet without govd).
    Always,
    /// None.
    Off,
}

impl std::str::FromStr for OutboundMtls {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Self::Auto),
            "always" => Ok(Self::Always),
            "off" => Ok(Self::Off),
            _ => Err(format!(
                "`{s}` is not an outbound mTLS mode: use `auto`, `always` or `off`"
            )),
        }
    }
}
