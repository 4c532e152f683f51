//! The config file: reading the `TargetConfig` that `govc compile` prints (YAML or
//! JSON) and reloading it when the file changes.
//!
//! Two watches, both about the file itself. One on its directory, of which only
//! events naming the file count: editors and config management save by writing a
//! temporary file and renaming it over the old one, which a watch on the file alone
//! does not survive. One on the file, following a symlink, re-armed after every
//! event: a Kubernetes config map swaps a `..data` symlink elsewhere in the
//! directory, and only the file's old target sees it. Events are debounced (an
//! editor save is several events), and bytes already seen, accepted or refused, are
//! not read again: other files in the directory (the agent's own log) and a refused
//! config left in place cause no work and no log line. A new config that fails to
//! read, parse or convert is refused with a logged reason; the old one stays in
//! force.

use std::path::{Path, PathBuf};
use std::sync::RwLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use gov_proto::v1::TargetConfig;
use notify::Watcher as _;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Quiet time after the last file event before the file is read.
const DEBOUNCE: Duration = Duration::from_millis(100);

/// A config file that cannot be used.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum ConfigError {
    /// The file cannot be read.
    #[error("cannot read the config file `{path}`")]
    #[diagnostic(
        code(gov::agent::config_read),
        help("check that the file exists and is readable")
    )]
    Read {
        /// The config file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is not a `TargetConfig` in YAML or JSON.
    #[error("the config file `{path}` is not a valid target config: {message}")]
    #[diagnostic(
        code(gov::agent::config_parse),
        help(
            "the file must be one service's config, what `govc compile FILE... --service NAME` prints, in YAML or JSON (without --service it prints every service under `targets`)"
        )
    )]
    Parse {
        /// The config file.
        path: PathBuf,
        /// The parser's message, with the position.
        message: String,
    },
    /// The config parses but the engine refuses it.
    #[error("the config file `{path}` was refused: {message}")]
    #[diagnostic(
        code(gov::agent::config_invalid),
        help("recompile the policy with `govc compile`; the agent keeps its previous config")
    )]
    Invalid {
        /// The config file.
        path: PathBuf,
        /// The engine's reason.
        message: String,
    },
}

/// What the agent knows about its config, for `/metrics`, `GET /config` and logs.
#[derive(Debug, Default)]
pub struct ConfigStatus {
    version: RwLock<Option<String>>,
    in_force: RwLock<Option<InForce>>,
    applied: AtomicU64,
    refused: AtomicU64,
    control_plane_connected: AtomicBool,
    unsaved: AtomicBool,
}

/// The config in force and where it came from (`GET /config`).
#[derive(Clone, Debug, serde::Serialize)]
pub struct InForce {
    /// The service.
    pub service: String,
    /// Its version (the content hash the compiler gave it).
    pub version: String,
    /// Where it came from: `file PATH`, `control-plane URL`, or `state-dir PATH`
    /// (the last good config from the control plane, read at start).
    pub source: String,
    /// The config itself, as `govc compile -o json` prints it.
    pub config: TargetConfig,
}

impl ConfigStatus {
    /// The version of the config in force, if any.
    pub fn version(&self) -> Option<String> {
        self.version.read().map(|v| v.clone()).unwrap_or_default()
    }

    /// The config in force with its source, if any.
    pub fn in_force(&self) -> Option<InForce> {
        self.in_force.read().map(|v| v.clone()).unwrap_or_default()
    }

    /// How many configs were applied and refused since start.
    pub fn counts(&self) -> (u64, u64) {
        (
            self.applied.load(Ordering::Relaxed),
            self.refused.load(Ordering::Relaxed),
        )
    }

    /// Whether the agent has a stream to the control plane now.
    pub fn control_plane_connected(&self) -> bool {
        self.control_plane_connected.load(Ordering::Relaxed)
    }

    pub(crate) fn set_control_plane_connected(&self, connected: bool) {
        self.control_plane_connected
            .store(connected, Ordering::Relaxed);
    }

    /// Whether the config in force was pushed by the control plane and could
    /// not be saved in the state directory.
    pub fn unsaved(&self) -> bool {
        self.unsaved.load(Ordering::Relaxed)
    }

    pub(crate) fn set_unsaved(&self, unsaved: bool) {
        self.unsaved.store(unsaved, Ordering::Relaxed);
    }

    pub(crate) fn record_applied(&self, target: &TargetConfig, version: &str, source: String) {
        if let Ok(mut v) = self.version.write() {
            *v = Some(version.to_owned());
        }
        if let Ok(mut v) = self.in_force.write() {
            *v = Some(InForce {
                service: target.service.clone(),
                version: version.to_owned(),
                source,
                config: target.clone(),
            });
        }
        self.applied.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn record_refused(&self) {
        self.refused.fetch_add(1, Ordering::Relaxed);
    }
}

/// Parses a `TargetConfig` from the bytes of `path`: JSON for a `.json` file, YAML
/// otherwise.
pub fn parse_config(path: &Path, bytes: &[u8]) -> Result<TargetConfig, ConfigError> {
    let is_json = path
        .extension()
        .is_some_and(|ext| ext.eq_ignore_ascii_case("json"));
    let parsed = if is_json {
        serde_json::from_slice(bytes).map_err(|e| e.to_string())
    } else {
        serde_yaml::from_slice(bytes).map_err(|e| e.to_string())
    };
    parsed.map_err(|message| ConfigError::Parse {
        path: path.to_owned(),
        message,
    })
}

/// Reads and parses the config file at `path`.
pub async fn read_config(path: &Path) -> Result<(Vec<u8>, TargetConfig), ConfigError> {
    let bytes = tokio::fs::read(path)
        .await
        .map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
    let config = parse_config(path, &bytes)?;
    Ok((bytes, config))
}

/// Watches `path` and calls `apply` with every changed, parseable config until `stop`.
/// `last` is the content currently in force (so that an unchanged save is skipped).
/// `apply` returns the engine's reason when it refuses the config.
pub(crate) fn spawn_watch(
    path: PathBuf,
    mut last: Vec<u8>,
    stop: CancellationToken,
    status: std::sync::Arc<ConfigStatus>,
    apply: impl Fn(TargetConfig) -> Result<String, String> + Send + 'static,
) -> Result<(), ConfigError> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_owned(),
        _ => PathBuf::from("."),
    };
    let Some(name) = path.file_name().map(ToOwned::to_owned) else {
        return Err(ConfigError::Read {
            path,
            source: std::io::Error::other("the config path names no file"),
        });
    };
    let (tx, mut rx) = mpsc::channel::<()>(1);
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        // Reads are not changes: reacting to them would re-read the file for ever,
        // since reading it makes such an event.
        let Ok(event) = event else { return };
        let ours = event.paths.iter().any(|p| p.file_name() == Some(&*name));
        if ours && !matches!(event.kind, notify::EventKind::Access(_)) {
            let _ = tx.try_send(());
        }
    })
    .and_then(|mut w| {
        w.watch(&dir, notify::RecursiveMode::NonRecursive)
            .map(|()| w)
    })
    .map_err(|e| ConfigError::Read {
        path: dir.clone(),
        source: std::io::Error::other(e),
    })?;
    rearm(&mut watcher, &path);

    tokio::spawn(async move {
        loop {
            tokio::select! {
                () = stop.cancelled() => break,
                event = rx.recv() => if event.is_none() { break },
            }
            // Debounce: wait until the file has been quiet for a moment.
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(DEBOUNCE) => break,
                    _ = rx.recv() => {}
                }
            }
            // A symlink swap leaves the file watch on the old target.
            rearm(&mut watcher, &path);
            let bytes = match tokio::fs::read(&path).await {
                Ok(bytes) => bytes,
                Err(error) => {
                    // A save in progress (the file briefly missing) lands here too; the
                    // next event retries.
                    tracing::debug!(%error, path = %path.display(), "config file not readable now");
                    continue;
                }
            };
            // INVARIANT: `last` is the last content read, whatever became of it, so
            // the same bytes are judged (and logged) once.
            if bytes == last {
                continue;
            }
            last = bytes;
            let result = parse_config(&path, &last).and_then(|config| {
                apply(config).map_err(|message| ConfigError::Invalid {
                    path: path.clone(),
                    message,
                })
            });
            match result {
                Ok(version) => tracing::info!(%version, path = %path.display(), "config reloaded"),
                Err(error) => {
                    status.record_refused();
                    tracing::warn!(%error, "new config refused; keeping the previous one");
                }
            }
        }
        drop(watcher.unwatch(&dir));
    });
    Ok(())
}

/// (Re)places the watch on the file itself, following a symlink to its current
/// target. Best effort: the directory watch alone covers every save but a swap of
/// a symlink elsewhere in the directory.
fn rearm(watcher: &mut notify::RecommendedWatcher, path: &Path) {
    let _ = watcher.unwatch(path);
    if let Err(error) = watcher.watch(path, notify::RecursiveMode::NonRecursive) {
        tracing::debug!(%error, path = %path.display(), "cannot watch the config file itself");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_yaml_and_json_by_extension() {
        let yaml = "service: shop\nversion: v1\n";
        let config = parse_config(Path::new("shop.yaml"), yaml.as_bytes()).unwrap();
        assert_eq!(config.service, "shop");
        let json = r#"{"service": "shop", "version": "v2"}"#;
        let config = parse_config(Path::new("shop.json"), json.as_bytes()).unwrap();
        assert_eq!(config.version, "v2");
        let err = parse_config(Path::new("shop.yaml"), b"service: [").unwrap_err();
        assert!(err.to_string().contains("shop.yaml"), "{err}");
    }

    /// `govc compile` without `--service` prints every service under
    /// `targets`: the error says which flag gives the agent's file.
    #[test]
    fn a_whole_bundle_is_refused_with_the_flag_that_prints_one_service() {
        use miette::Diagnostic as _;
        let bundle = "targets:\n- service: shop\n  version: v1\n";
        let err = parse_config(Path::new("shop.yaml"), bundle.as_bytes()).unwrap_err();
        assert!(err.to_string().contains("unknown field `targets`"), "{err}");
        let help = err.help().map(|h| h.to_string()).unwrap_or_default();
        assert!(help.contains("--service NAME"), "{help}");
    }
}
