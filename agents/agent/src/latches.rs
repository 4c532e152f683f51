//! The agent's latches on disk: every tripped fuse and engaged limit, kept in
//! `--state-dir` (`latches.json`), so that an agent restarted, with the
//! control plane up or down, refuses what it refused before it stopped.
//!
//! [`LatchStore::open`] reads the file and re-arms each latch in the engine; the
//! sidecar calls it after the config is in force and before it accepts a
//! connection. [`LatchStore::run`] then rewrites the file atomically (the
//! last good config's temp file, fsync, rename) on every engine event (trip,
//! engage, release, recovery), and once a second when the latches differ from
//! what the file holds (a config swap that removed a rule, a latch the control
//! plane re-armed, an earlier write that failed). A failed write (disk full,
//! read-only) changes nothing in memory: the engine keeps enforcing, the error
//! is logged and counted in `/metrics`, and the write is retried every second.
//!
//! Latches read before any config is in force (the last good config could not
//! be read) wait, and are re-armed once a config names their rules; they stay in
//! the file meanwhile.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, SystemTime};

use gov_engine::latch::unix_ms;
use gov_engine::{Engine, Latch, Restored};
use gov_proto::v1 as proto;
use tokio::sync::broadcast::error::RecvError;
use tokio_util::sync::CancellationToken;

/// File name of the latches in the state directory.
pub const LATCHES_FILE: &str = "latches.json";

/// How often the latches are compared with the file (and a failed write retried).
const CHECK_EVERY: Duration = Duration::from_secs(1);

/// The latch file cannot be read or written.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum LatchFileError {
    #[error("cannot {op} the latch file `{path}`")]
    #[diagnostic(
        code(gov::agent::latch_io),
        help(
            "check that --state-dir is writable and has space; meanwhile the agent enforces its latches in memory only (they would not survive a restart) and retries every second"
        )
    )]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the latch file `{path}` is unusable: {reason}")]
    #[diagnostic(
        code(gov::agent::latch_corrupt),
        help(
            "it was moved aside to `latches.json.corrupt`; the control plane re-arms the latches it holds for this instance when the agent connects"
        )
    )]
    Corrupt { path: PathBuf, reason: String },
}

/// Reads the latches of `service` kept in `dir` (none when there is no file,
/// or it belongs to another service).
pub fn read_latches(dir: &Path, service: &str) -> Result<Vec<Latch>, LatchFileError> {
    let path = dir.join(LATCHES_FILE);
    let bytes = match fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(LatchFileError::Io {
                op: "read",
                path,
                source,
            });
        }
    };
    let corrupt = |reason: String| LatchFileError::Corrupt {
        path: path.clone(),
        reason,
    };
    let doc: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| corrupt(e.to_string()))?;
    let found = doc.get("service").and_then(serde_json::Value::as_str);
    if found != Some(service) {
        tracing::warn!(path = %path.display(), found = ?found, service, "the latch file is for another service; ignoring it");
        return Ok(Vec::new());
    }
    let wire: Vec<proto::Latch> = serde_json::from_value(
        doc.get("latches")
            .cloned()
            .unwrap_or(serde_json::Value::Array(Vec::new())),
    )
    .map_err(|e| corrupt(e.to_string()))?;
    wire.iter()
        .map(|l| Latch::try_from(l).map_err(|e| corrupt(e.to_string())))
        .collect()
}

/// Writes the latches of `service` to `dir` atomically.
pub fn write_latches(dir: &Path, service: &str, latches: &[Latch]) -> Result<(), LatchFileError> {
    let unusable = |e: serde_json::Error| LatchFileError::Corrupt {
        path: dir.join(LATCHES_FILE),
        reason: e.to_string(),
    };
    let wire: Vec<proto::Latch> = latches.iter().map(Latch::to_proto).collect();
    let mut doc = serde_json::Map::new();
    doc.insert("service".into(), service.into());
    doc.insert(
        "latches".into(),
        serde_json::to_value(&wire).map_err(unusable)?,
    );
    let bytes = serde_json::to_vec_pretty(&doc).map_err(unusable)?;
    crate::state_dir::write_atomically(dir, LATCHES_FILE, &bytes).map_err(|e| LatchFileError::Io {
        op: e.op,
        path: e.path,
        source: e.source,
    })
}

/// Keeps the engine's latches in the state directory.
#[derive(Debug)]
pub struct LatchStore {
    dir: PathBuf,
    service: String,
    engine: Engine,
    /// Read from the file before any config was in force: armed later.
    pending: Mutex<Vec<Latch>>,
    write_errors: AtomicU64,
    /// The file holds every latch in force.
    persisted: AtomicBool,
}

// === impl LatchStore ===

impl LatchStore {
    /// Re-arms the latches kept in `dir` and returns the store that keeps
    /// them from now on ([`LatchStore::run`]). Never fails: an unreadable file
    /// is logged (and a corrupt one moved aside), and the agent starts
    /// without it.
    pub fn open(engine: &Engine, dir: &Path, service: &str) -> Arc<Self> {
        let store = Arc::new(Self {
            dir: dir.to_owned(),
            service: service.to_owned(),
            engine: engine.clone(),
            pending: Mutex::new(Vec::new()),
            write_errors: AtomicU64::new(0),
            persisted: AtomicBool::new(false),
        });
        match read_latches(dir, service) {
            Ok(latches) if engine.config().version.is_empty() && !latches.is_empty() => {
                tracing::warn!(
                    n = latches.len(),
                    "latches kept across the restart wait for a config that names their rules"
                );
                *store.pending() = latches;
            }
            Ok(latches) => {
                for latch in &latches {
                    store.arm(latch);
                }
            }
            Err(error) => {
                tracing::error!(error = %error, "cannot restore the latches kept across the restart");
                if let LatchFileError::Corrupt { path, .. } = &error {
                    let aside = path.with_extension("json.corrupt");
                    if let Err(e) = fs::rename(path, &aside) {
                        tracing::error!(error = %e, "cannot move the corrupt latch file aside");
                    }
                }
            }
        }
        store
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, Vec<Latch>> {
        // A plain list: a panic elsewhere cannot leave it inconsistent.
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Re-arms one latch kept across a restart, saying what became of it.
    fn arm(&self, latch: &Latch) {
        let (rule, key) = (&latch.rule, &latch.key);
        match self.engine.restore_latch(latch, unix_ms(SystemTime::now())) {
            Ok(Restored::Armed) => {
                tracing::info!(%rule, %key, since_unix_ms = latch.since_unix_ms, reason = %latch.reason, "re-armed a latch kept across the restart")
            }
            Ok(Restored::Held) => {}
            Ok(Restored::Expired) => {
                tracing::info!(%rule, %key, "a latch kept across the restart reached its `release after` deadline while the agent was down")
            }
            Ok(Restored::KeyMissing) => {
                tracing::warn!(%rule, "a latch kept across the restart has no key but its limit is keyed; it ends")
            }
            Err(error) => {
                tracing::warn!(%rule, %key, %error, "a latch kept across the restart names no such rule in the config in force; it ends")
            }
        }
    }

    /// Failed writes of the latch file since start.
    pub fn write_errors(&self) -> u64 {
        self.write_errors.load(Relaxed)
    }

    /// Whether the file holds every latch in force (false until the first
    /// write, and while writes fail).
    pub fn persisted(&self) -> bool {
        self.persisted.load(Relaxed)
    }

    /// Keeps the file in step with the engine until `stop` (then writes once more).
    pub async fn run(self: Arc<Self>, stop: CancellationToken) {
        let mut events = self.engine.subscribe();
        let mut check = tokio::time::interval(CHECK_EVERY);
        check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // What the file holds; `None`: not written yet by this process.
        let mut written: Option<Vec<Latch>> = None;
        loop {
            tokio::select! {
                () = stop.cancelled() => {
                    self.sync(&mut written).await;
                    return;
                }
                event = events.recv() => {
                    if let Err(RecvError::Closed) = event {
                        return;
                    }
                    // One write for a burst of events.
                    while events.try_recv().is_ok() {}
                }
                _ = check.tick() => {}
            }
            self.sync(&mut written).await;
        }
    }

    /// Writes the latches in force (and those still pending) when they
    /// differ from what the file holds.
    async fn sync(&self, written: &mut Option<Vec<Latch>>) {
        let latches = {
            let mut pending = self.pending();
            if !pending.is_empty() && !self.engine.config().version.is_empty() {
                for latch in pending.drain(..) {
                    self.arm(&latch);
                }
            }
            let mut latches = self.engine.latches(unix_ms(SystemTime::now()));
            latches.extend(pending.iter().cloned());
            latches
        };
        let same = written.as_ref().is_some_and(|w| {
            w.len() == latches.len() && w.iter().zip(&latches).all(|(a, b)| a.same_as(b))
        });
        if same {
            return;
        }
        let (dir, service, copy) = (self.dir.clone(), self.service.clone(), latches.clone());
        let result = tokio::task::spawn_blocking(move || write_latches(&dir, &service, &copy))
            .await
            .unwrap_or_else(|e| {
                Err(LatchFileError::Io {
                    op: "write",
                    path: self.dir.join(LATCHES_FILE),
                    source: std::io::Error::other(e.to_string()),
                })
            });
        match result {
            Ok(()) => {
                if !self.persisted.swap(true, Relaxed) && self.write_errors() > 0 {
                    tracing::info!("the latch file is written again");
                }
                *written = Some(latches);
            }
            Err(error) => {
                let n = self.write_errors.fetch_add(1, Relaxed);
                self.persisted.store(false, Relaxed);
                // Once a minute while it lasts.
                if n.is_multiple_of(60) {
                    tracing::error!(error = %error, latches = latches.len(), "cannot persist the latches; they are enforced in memory but would not survive a restart");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gov_engine::LatchKind;

    fn latch(rule: &str, key: &str) -> Latch {
        Latch {
            kind: LatchKind::Limit,
            rule: rule.into(),
            key: key.into(),
            since_unix_ms: 1_700_000_000_000,
            deadline_unix_ms: Some(1_700_007_200_000),
            reason: "calls per window exceeded; engaged releases after 7200s".into(),
        }
    }

    #[test]
    fn the_latch_file_round_trips_and_belongs_to_its_service() {
        let dir = tempfile::tempdir().unwrap();
        assert!(read_latches(dir.path(), "order").unwrap().is_empty());
        let latches = vec![latch("order/crm", "crm"), latch("order/all", "")];
        write_latches(dir.path(), "order", &latches).unwrap();
        write_latches(dir.path(), "order", &latches).unwrap();
        assert_eq!(read_latches(dir.path(), "order").unwrap(), latches);
        assert!(read_latches(dir.path(), "payment").unwrap().is_empty());
        fs::write(
            dir.path().join(LATCHES_FILE),
            b"{\"service\":\"order\",\"latches\":[{}]}",
        )
        .unwrap();
        assert!(matches!(
            read_latches(dir.path(), "order"),
            Err(LatchFileError::Corrupt { .. })
        ));
    }

    #[test]
    fn a_corrupt_file_is_moved_aside_and_the_agent_starts() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(LATCHES_FILE), b"{oops").unwrap();
        let store = LatchStore::open(&Engine::empty("order"), dir.path(), "order");
        assert!(!store.persisted());
        assert!(!dir.path().join(LATCHES_FILE).exists());
        assert!(dir.path().join("latches.json.corrupt").exists());
    }
}
