//! The decision log (`--decision-log PATH`): one JSON line per sampled call
//! ([`gov_proto::decision_log::Record`], documented in
//! `docs/decision-log.md`), for `govc replay`.
//!
//! The request path only samples, copies what the record needs and hands it
//! to a bounded channel with `try_send`: when the channel is full the record
//! is dropped and counted (`gov_agent_decision_log_dropped_total`), so a slow
//! or broken disk never blocks or fails a call. One thread of its own encodes
//! and writes the records, rotates the file by size (`PATH` -> `PATH.1` ->
//! ... `PATH.KEEP`) and counts what it could not write.
//!
//! Times come from one anchor taken at start: a record's `t_us` is the Unix
//! time of the anchor plus the monotonic time since, so records and the
//! rules' window epochs lie on one clock and a replay lines them up exactly.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use gov_engine::{
    Admission, Direction, Ended, Engine, Outcome, Rejection, RequestInfo, WouldReject,
};
use gov_proto::decision_log as log;
use http::HeaderName;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// How the decision log is written.
#[derive(Clone, Debug)]
pub struct LogOptions {
    /// The file; rotated files get `.1`, `.2`, ... appended.
    pub path: PathBuf,
    /// The share of calls logged, in `(0, 1]`.
    pub sample: f64,
    /// The size at which the file is rotated.
    pub max_bytes: u64,
    /// Rotated files kept (`PATH.1` is the newest).
    pub keep: usize,
    /// Records that may wait for the writer; more are dropped.
    pub queue: usize,
    /// This agent's instance (the records' `instance`).
    pub instance: String,
}

/// Default `--decision-log-max-bytes`.
pub const DEFAULT_MAX_BYTES: u64 = 64 * 1024 * 1024;
/// Default `--decision-log-keep`.
pub const DEFAULT_KEEP: usize = 4;
/// Records the channel holds before dropping.
pub const DEFAULT_QUEUE: usize = 8192;

impl LogOptions {
    /// Whether these options can work: a rate in `(0, 1]`, a size of at
    /// least 1 KiB, an existing directory. Checked again at start.
    pub fn check(&self) -> Result<(), LogError> {
        if !(self.sample > 0.0 && self.sample <= 1.0) {
            return Err(LogError::Sample { rate: self.sample });
        }
        if self.max_bytes < 1024 {
            return Err(LogError::MaxBytes {
                bytes: self.max_bytes,
            });
        }
        let dir = match self.path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
            _ => PathBuf::from("."),
        };
        if !dir.is_dir() {
            return Err(LogError::NoDirectory { dir });
        }
        Ok(())
    }

    /// Every call logged to `path`, default rotation and queue.
    pub fn new(path: impl Into<PathBuf>, instance: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            sample: 1.0,
            max_bytes: DEFAULT_MAX_BYTES,
            keep: DEFAULT_KEEP,
            queue: DEFAULT_QUEUE,
            instance: instance.into(),
        }
    }
}

/// The decision log cannot start.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum LogError {
    #[error("the decision log's directory `{dir}` does not exist")]
    #[diagnostic(
        code(gov::agent::decision_log_dir),
        help("create it, or give --decision-log a path in an existing directory")
    )]
    NoDirectory { dir: PathBuf },
    #[error("--decision-log-sample must be above 0 and at most 1, not `{rate}`")]
    #[diagnostic(
        code(gov::agent::decision_log_sample),
        help("1 logs every call, 0.01 one call in a hundred")
    )]
    Sample { rate: f64 },
    #[error("--decision-log-max-bytes must be at least 1024, not `{bytes}`")]
    #[diagnostic(code(gov::agent::decision_log_max_bytes))]
    MaxBytes { bytes: u64 },
    #[error("cannot start the decision log's writer thread")]
    #[diagnostic(code(gov::agent::decision_log_thread))]
    Thread(#[source] std::io::Error),
}

/// The decision log of a running agent. Cheap to clone.
#[derive(Clone, Debug)]
pub struct DecisionLog {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    tx: mpsc::Sender<log::Record>,
    /// A call is logged when a random `u64` is below this (`u64::MAX`: all).
    threshold: u64,
    counters: Arc<Counters>,
    anchor: Anchor,
    service: Arc<str>,
    instance: Arc<str>,
    engine: Engine,
    /// The headers the current config's matches read, by config version.
    headers: Mutex<(Arc<str>, Arc<[HeaderName]>)>,
}

/// What the writer counts, for `/metrics`.
#[derive(Debug, Default)]
pub struct Counters {
    written: AtomicU64,
    dropped: AtomicU64,
    errors: AtomicU64,
    rotations: AtomicU64,
}

/// One instant on both clocks.
#[derive(Clone, Copy, Debug)]
struct Anchor {
    at: Instant,
    unix_us: u64,
}

/// A sampled call: when it arrived.
#[derive(Clone, Copy, Debug)]
pub struct Sampled(Instant);

// === impl DecisionLog ===

impl DecisionLog {
    /// Starts the writer thread for `engine`'s calls. The file is opened by
    /// the writer: a failure to open or write it is logged and counted, and
    /// retried with the next record.
    pub fn start(options: &LogOptions, service: &str, engine: Engine) -> Result<Self, LogError> {
        options.check()?;
        let (tx, rx) = mpsc::channel(options.queue.max(1));
        let counters = Arc::new(Counters::default());
        let anchor = Anchor {
            at: Instant::now(),
            unix_us: unix_us(SystemTime::now()),
        };
        let config = engine.config();
        let inner = Arc::new(Inner {
            tx,
            threshold: threshold(options.sample),
            counters: counters.clone(),
            anchor,
            service: service.into(),
            instance: options.instance.as_str().into(),
            engine: engine.clone(),
            headers: Mutex::new((config.version.clone(), config.match_headers().into())),
        });
        let writer = Writer {
            path: options.path.clone(),
            max_bytes: options.max_bytes,
            keep: options.keep,
            file: None,
            size: 0,
            last_config: None,
            counters,
            engine,
            anchor,
            failing: false,
            pending: 0,
        };
        std::thread::Builder::new()
            .name("gov-decision-log".into())
            .spawn(move || writer.run(rx))
            .map_err(LogError::Thread)?;
        Ok(Self { inner })
    }

    /// What the writer counted.
    pub fn counters(&self) -> &Counters {
        &self.inner.counters
    }

    /// The record of a call, without its end.
    fn record(
        &self,
        at: Sampled,
        info: &RequestInfo<'_>,
        request_bytes: Option<u64>,
    ) -> log::Record {
        let inner = &*self.inner;
        let config = inner.engine.config();
        let names = {
            let mut cached = inner.headers.lock().unwrap_or_else(|e| e.into_inner());
            if !Arc::ptr_eq(&cached.0, &config.version) {
                *cached = (config.version.clone(), config.match_headers().into());
            }
            cached.1.clone()
        };
        let headers = names
            .iter()
            .filter_map(|name| Some((name.to_string(), info.headers.get_str(name)?.to_owned())))
            .collect();
        let target = info.target;
        log::Record {
            v: log::VERSION,
            t_us: inner.anchor.unix_us(at.0),
            service: inner.service.to_string(),
            instance: inner.instance.to_string(),
            direction: match info.direction {
                Direction::Inbound => log::Direction::Inbound,
                Direction::Outbound => log::Direction::Outbound,
            },
            consumer: info
                .headers
                .get_str(&config.consumer_header)
                .map(str::to_owned),
            consumer_source: (info.direction == Direction::Inbound)
                .then(|| config.consumer_source.name().to_owned()),
            method: info.method.as_str().to_owned(),
            path: info.path.to_owned(),
            target: target.map(|t| t.service.to_owned()),
            upstream: target.and_then(|t| t.instance).map(str::to_owned),
            headers,
            request_bytes,
            response_bytes: None,
            status: None,
            grpc_status: None,
            outcome: log::Outcome::Abandoned,
            latency_us: 0,
            outcome_us: None,
            config: String::new(),
            rules: Vec::new(),
            shadow: Vec::new(),
            epochs: Vec::new(),
        }
    }

    /// Hands `record` to the writer, or drops and counts it.
    fn send(&self, record: log::Record) {
        if self.inner.tx.try_send(record).is_err() {
            self.inner.counters.dropped.fetch_add(1, Relaxed);
        }
    }
}

/// Both proxy paths tell the log through the engine: hyper's as the observer
/// of its [`gov_engine::Govern`], the HTTP/1 path by
/// [`gov_engine::Engine::admit_observed`].
impl gov_engine::Observe for DecisionLog {
    type Sample = Sampled;

    /// Whether to log this call: `Some(arrival)` for a sampled one.
    #[inline]
    fn sample(&self) -> Option<Sampled> {
        let pick = self.inner.threshold == u64::MAX || rand::random::<u64>() < self.inner.threshold;
        pick.then(|| Sampled(Instant::now()))
    }

    /// Logs a rejected call (the client got the rejection now).
    fn rejected(
        &self,
        at: Sampled,
        info: &RequestInfo<'_>,
        request_bytes: Option<u64>,
        rejection: &Rejection,
    ) {
        let mut record = self.record(at, info, request_bytes);
        record.status = Some(rejection.status.as_u16());
        record.outcome = log::Outcome::Rejected;
        record.latency_us = micros(at.0.elapsed());
        let wait = (!at.0.elapsed().is_zero()).then(|| micros(at.0.elapsed()));
        record.rules.push(log::RuleDecision {
            rule: rejection.rule.to_string(),
            decision: log::Verdict::Rejected,
            reason: Some(rejection.reason.as_str().to_owned()),
            wait_us: wait.filter(|_| rejection.reason.kind() == gov_engine::RuleKind::Bulkhead),
        });
        record.shadow = rejection.would_reject.iter().map(shadow).collect();
        self.send(record);
    }

    /// Logs an admitted call when it ends (`admission` is dropped).
    fn admitted(
        &self,
        at: Sampled,
        info: &RequestInfo<'_>,
        request_bytes: Option<u64>,
        admission: &mut Admission,
    ) {
        let mut record = self.record(at, info, request_bytes);
        if let Some(version) = admission.config_version() {
            record.config = version.to_owned();
        }
        record.rules = admission
            .rules()
            .map(|(rule, wait)| log::RuleDecision {
                rule: rule.to_string(),
                decision: match wait {
                    Some(_) => log::Verdict::Waited,
                    None => log::Verdict::Admitted,
                },
                reason: None,
                wait_us: wait.map(micros),
            })
            .collect();
        record.shadow = admission.would_reject().map(|w| shadow(&w)).collect();
        let this = self.clone();
        admission.on_end(move |ended: Ended| {
            let (status, outcome) = match ended.outcome {
                Some(Outcome::Status(code)) => (Some(code), log::Outcome::Response),
                Some(Outcome::Grpc(code)) => {
                    record.grpc_status = Some(code as u32);
                    (Some(200), log::Outcome::Response)
                }
                Some(Outcome::ConnectFailure) => (Some(502), log::Outcome::ConnectFailure),
                Some(Outcome::Reset) => (Some(502), log::Outcome::Reset),
                Some(Outcome::Timeout) => (Some(504), log::Outcome::Timeout),
                None => (None, log::Outcome::Abandoned),
            };
            record.status = status;
            record.outcome = outcome;
            record.response_bytes = Some(ended.bytes);
            record.latency_us = micros(ended.at.saturating_duration_since(at.0));
            record.outcome_us = ended
                .outcome_at
                .map(|t| micros(t.saturating_duration_since(at.0)));
            this.send(record);
        });
    }
}

/// A shadow rule's would-be rejection as the log writes it.
fn shadow(would: &WouldReject) -> log::ShadowDecision {
    log::ShadowDecision {
        rule: would.rule.to_string(),
        reason: would.reason.as_str().to_owned(),
    }
}

// === impl Counters ===

impl Counters {
    /// Records written to the file.
    pub fn written(&self) -> u64 {
        self.written.load(Relaxed)
    }

    /// Records dropped because the writer was behind.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Relaxed)
    }

    /// Records lost to a failed open, write or rotation.
    pub fn errors(&self) -> u64 {
        self.errors.load(Relaxed)
    }

    /// Files rotated.
    pub fn rotations(&self) -> u64 {
        self.rotations.load(Relaxed)
    }
}

// === impl Anchor ===

impl Anchor {
    fn unix_us(&self, at: Instant) -> u64 {
        let since = at.saturating_duration_since(self.at);
        let before = self.at.saturating_duration_since(at);
        (self.unix_us + micros(since)).saturating_sub(micros(before))
    }
}

/// The thread that writes the file.
struct Writer {
    path: PathBuf,
    max_bytes: u64,
    keep: usize,
    file: Option<BufWriter<File>>,
    /// Bytes in the current file.
    size: u64,
    /// The config version whose epochs the current file has.
    last_config: Option<String>,
    counters: Arc<Counters>,
    engine: Engine,
    anchor: Anchor,
    /// The last write failed (logged once until one succeeds).
    failing: bool,
    /// Records buffered since the last flush: written when it succeeds.
    pending: u64,
}

impl Writer {
    fn run(mut self, mut rx: mpsc::Receiver<log::Record>) {
        let mut line = Vec::with_capacity(1024);
        while let Some(record) = rx.blocking_recv() {
            self.write(record, &mut line);
            // Drain what is queued, then flush once.
            while let Ok(record) = rx.try_recv() {
                self.write(record, &mut line);
            }
            self.flush();
        }
    }

    /// Flushes the buffer: its records are written, or lost and counted.
    fn flush(&mut self) {
        let Some(file) = &mut self.file else { return };
        let pending = std::mem::take(&mut self.pending);
        match file.flush() {
            Ok(()) => {
                self.counters.written.fetch_add(pending, Relaxed);
                if self.failing {
                    self.failing = false;
                    tracing::info!(path = %self.path.display(), "the decision log is written again");
                }
            }
            Err(error) => {
                self.counters.errors.fetch_add(pending, Relaxed);
                self.failed("write", &error);
                // Reopened with the next record; what the buffer held is lost.
                if let Some(file) = self.file.take() {
                    drop(file.into_parts());
                }
            }
        }
    }

    fn write(&mut self, mut record: log::Record, line: &mut Vec<u8>) {
        // The first record of a file, and the first under a new config, say
        // where the windows of the config's rules start.
        if self.last_config.as_deref() != Some(&record.config) {
            let config = self.engine.config();
            if *config.version == *record.config {
                record.epochs = self
                    .engine
                    .epochs()
                    .into_iter()
                    .map(|(rule, at)| log::Epoch {
                        rule: rule.to_string(),
                        t_us: self.anchor.unix_us(at),
                    })
                    .collect();
                self.last_config = Some(record.config.clone());
            }
        }
        line.clear();
        if serde_json::to_writer(&mut *line, &record).is_err() {
            self.counters.errors.fetch_add(1, Relaxed);
            return;
        }
        line.push(b'\n');
        if self.size > 0 && self.size + line.len() as u64 > self.max_bytes {
            self.rotate();
        }
        if self.file.is_none() {
            match OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.path)
            {
                Ok(file) => {
                    self.size = file.metadata().map(|m| m.len()).unwrap_or(0);
                    let mut file = BufWriter::with_capacity(64 * 1024, file);
                    // A failed write may have left half a line: end it, so
                    // that the next record starts a line of its own.
                    if self.size > 0
                        && last_byte(&self.path, self.size).is_some_and(|b| b != b'\n')
                        && file.write_all(b"\n").is_ok()
                    {
                        self.size += 1;
                    }
                    self.file = Some(file);
                }
                Err(error) => {
                    self.failed("open", &error);
                    self.counters.errors.fetch_add(1, Relaxed);
                    return;
                }
            }
        }
        let Some(file) = &mut self.file else { return };
        match file.write_all(line) {
            Ok(()) => {
                self.size += line.len() as u64;
                self.pending += 1;
            }
            Err(error) => {
                self.failed("write", &error);
                let lost = std::mem::take(&mut self.pending) + 1;
                self.counters.errors.fetch_add(lost, Relaxed);
                // Reopened with the next record.
                if let Some(file) = self.file.take() {
                    drop(file.into_parts());
                }
            }
        }
    }

    /// `PATH` -> `PATH.1`, `PATH.1` -> `PATH.2`, ...; the oldest beyond `keep` goes.
    fn rotate(&mut self) {
        self.flush();
        self.file = None;
        let rotated = |n: usize| rotated_path(&self.path, n);
        let result = (|| {
            if self.keep == 0 {
                return std::fs::remove_file(&self.path);
            }
            let oldest = rotated(self.keep);
            if oldest.exists() {
                std::fs::remove_file(&oldest)?;
            }
            for n in (1..self.keep).rev() {
                let from = rotated(n);
                if from.exists() {
                    std::fs::rename(&from, rotated(n + 1))?;
                }
            }
            std::fs::rename(&self.path, rotated(1))
        })();
        match result {
            Ok(()) => {
                self.counters.rotations.fetch_add(1, Relaxed);
                self.size = 0;
                self.last_config = None;
            }
            // Appending to the current file loses nothing; the next record tries again.
            Err(error) => self.failed("rotate", &error),
        }
    }

    fn failed(&mut self, what: &str, error: &std::io::Error) {
        if !self.failing {
            self.failing = true;
            tracing::warn!(path = %self.path.display(), %error, "cannot {what} the decision log; records are counted in gov_agent_decision_log_write_errors_total until it works again");
        }
    }
}

/// The last byte of the regular file `path` of `size` bytes.
fn last_byte(path: &Path, size: u64) -> Option<u8> {
    use std::os::unix::fs::FileExt;
    let file = File::open(path).ok()?;
    if !file.metadata().ok()?.is_file() {
        return None;
    }
    let mut last = [0_u8; 1];
    (file.read_at(&mut last, size - 1).ok()? == 1).then_some(last[0])
}

fn threshold(rate: f64) -> u64 {
    if rate >= 1.0 {
        u64::MAX
    } else {
        // Exact enough: the share of `u64` values below it is `rate`.
        (rate * u64::MAX as f64) as u64
    }
}

fn unix_us(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(micros)
        .unwrap_or(0)
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// Where rotated file `n` of `path` is (for tests and tools).
pub fn rotated_path(path: &Path, n: usize) -> PathBuf {
    let mut name = path.to_path_buf().into_os_string();
    name.push(format!(".{n}"));
    PathBuf::from(name)
}
