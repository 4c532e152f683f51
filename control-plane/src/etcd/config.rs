//! Where the state lives in etcd (`--store etcd://...`) and who this
//! replica is: the store URL read, the keys named.

use std::time::Duration;

use super::client::EtcdError;
use super::tls::EtcdTlsFiles;
use crate::error::Error;

/// Where the state lives in etcd and who this replica is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdConfig {
    /// `http://HOST:PORT` of each member (`https://` with `etcds://`).
    pub endpoints: Vec<String>,
    /// TLS (`etcds://`): the files to read at connect; `None`: plain.
    pub tls: Option<EtcdTlsFiles>,
    /// Key prefix, without a trailing `/`.
    pub prefix: String,
    /// This replica's name (its agents key, its audit keys, the leader key's value).
    pub replica: String,
    /// The leader lease's time to live: how long a dead leader's timers wait
    /// for a new leader at most.
    pub lease_ttl: Duration,
}

impl EtcdConfig {
    /// Reads `etcd://HOST:PORT[,HOST:PORT...][/PREFIX]` (`etcds://`: TLS,
    /// whose files [`EtcdConfig::with_tls`] sets).
    pub fn parse(url: &str, replica: &str, lease_ttl: Duration) -> Result<Self, Error> {
        let bad = |problem: &str| Error::StoreUrl {
            url: url.to_owned(),
            problem: problem.to_owned(),
        };
        let (rest, scheme) = match url.strip_prefix("etcds://") {
            Some(rest) => (rest, "https"),
            None => (
                url.strip_prefix("etcd://")
                    .ok_or_else(|| bad("it does not start with `etcd://` or `etcds://`"))?,
                "http",
            ),
        };
        let (hosts, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        let prefix = prefix.trim_matches('/');
        let mut endpoints = Vec::new();
        for host in hosts.split(',') {
            let Some((name, port)) = host.rsplit_once(':') else {
                return Err(bad(&format!("`{host}` has no port")));
            };
            if name.is_empty() || port.parse::<u16>().map_or(true, |p| p == 0) {
                return Err(bad(&format!("`{host}` is not HOST:PORT")));
            }
            endpoints.push(format!("{scheme}://{host}"));
        }
        // Not the URL's fault: the error names the flag.
        if replica.is_empty() || replica.contains('/') {
            return Err(Error::StoreOption {
                flag: "--replica",
                problem: format!(
                    "`{replica}` is not a replica name: it must be non-empty without `/`"
                ),
            });
        }
        if lease_ttl < Duration::from_secs(2) {
            return Err(Error::StoreOption {
                flag: "--leader-lease",
                problem: format!("{lease_ttl:?} is shorter than etcd's minimum lease, 2s"),
            });
        }
        Ok(Self {
            tls: (scheme == "https").then(EtcdTlsFiles::default),
            endpoints,
            prefix: if prefix.is_empty() {
                "gov".into()
            } else {
                prefix.to_owned()
            },
            replica: replica.to_owned(),
            lease_ttl,
        })
    }

    /// With the TLS files of `--etcd-ca`, `--etcd-cert`, `--etcd-key` (all
    /// unset for `etcd://`; a CA at least for `etcds://`).
    pub fn with_tls(mut self, files: EtcdTlsFiles) -> Result<Self, Error> {
        files.check(self.tls.is_some())?;
        if self.tls.is_some() {
            self.tls = Some(files);
        }
        Ok(self)
    }
}

impl EtcdConfig {
    /// `PREFIX/NAME`.
    pub(super) fn key(&self, name: &str) -> String {
        format!("{}/{name}", self.prefix)
    }

    /// Where the store is, for messages: `etcd://HOSTS/PREFIX` (`etcds://`
    /// over TLS).
    pub(super) fn describe(&self) -> String {
        let hosts: Vec<&str> = self
            .endpoints
            .iter()
            .map(|e| e.split_once("://").map_or(e.as_str(), |(_, host)| host))
            .collect();
        let scheme = if self.tls.is_some() { "etcds" } else { "etcd" };
        format!("{scheme}://{}/{}", hosts.join(","), self.prefix)
    }

    /// The key of a part of the state: `PREFIX/state/NAME`.
    pub(super) fn part(&self, name: &str) -> String {
        format!("{}/state/{name}", self.prefix)
    }
}

/// An etcd call of `op` that failed.
pub(super) fn etcd_error(config: &EtcdConfig, op: &'static str, source: EtcdError) -> Error {
    Error::Etcd {
        endpoints: config.endpoints.join(","),
        op,
        advice: source.advice(
            config.tls.is_some(),
            config.tls.as_ref().is_some_and(|t| t.cert.is_some()),
        ),
        source,
    }
}
