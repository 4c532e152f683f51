//! Decision log files read into a compact form: a million calls take about
//! a hundred bytes each, their strings interned once.

use std::collections::{BTreeMap, HashMap};
use std::io::BufRead;
use std::path::{Path, PathBuf};

use gov_engine::Direction;
use gov_proto::decision_log as log;

/// "None" in an interned field.
pub const NONE: u32 = u32::MAX;

/// Interned strings.
#[derive(Debug, Default)]
pub struct Strings {
    ids: HashMap<Box<str>, u32>,
    list: Vec<Box<str>>,
}

impl Strings {
    pub fn intern(&mut self, s: &str) -> u32 {
        if let Some(&id) = self.ids.get(s) {
            return id;
        }
        let id = u32::try_from(self.list.len()).unwrap_or(NONE);
        self.list.push(s.into());
        self.ids.insert(s.into(), id);
        id
    }

    pub fn get(&self, id: u32) -> &str {
        self.list.get(id as usize).map_or("", |s| s)
    }
}

/// What the live agent decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Live {
    Admitted,
    /// By this rule (interned), for this reason (interned).
    Rejected {
        rule: u32,
        reason: u32,
    },
}

/// One recorded call.
#[derive(Debug)]
pub struct Call {
    pub t_us: u64,
    pub latency_us: u64,
    /// From arrival to when the live agent counted its outcome, when the
    /// record says.
    pub outcome_us: Option<u64>,
    /// What the call waited live (for a permit or a shaping delay).
    pub live_wait_us: u64,
    pub request_bytes: u64,
    pub response_bytes: u64,
    /// Index into [`Calls::agents`].
    pub agent: u32,
    pub consumer: u32,
    pub method: u32,
    pub path: u32,
    pub target: u32,
    pub upstream: u32,
    /// Range into [`Calls::header_pairs`].
    headers: (u32, u32),
    pub status: Option<u16>,
    /// A gRPC call's `grpc-status`, when it was one.
    pub grpc_status: Option<u32>,
    pub direction: Direction,
    pub outcome: log::Outcome,
    pub live: Live,
}

/// One agent's calls: `(service, instance)`, and the epochs its records gave.
#[derive(Debug)]
pub struct Agent {
    pub service: String,
    pub instance: String,
    /// Rule -> Unix µs, from the earliest record that carries it.
    pub epochs: BTreeMap<String, u64>,
    epochs_at: BTreeMap<String, u64>,
}

/// Every call read, with the tables its fields point into.
#[derive(Debug, Default)]
pub struct Calls {
    pub list: Vec<Call>,
    pub strings: Strings,
    pub methods: Vec<http::Method>,
    pub agents: Vec<Agent>,
    header_pairs: Vec<(u32, u32)>,
}

/// A decision log line that cannot be replayed.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum LogError {
    #[error("cannot read the decision log `{path}`")]
    #[diagnostic(
        code("gov::replay::read"),
        help("give --log the files `gov-agent --decision-log` wrote")
    )]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{file}:{line}: not a decision log record: {message}")]
    #[diagnostic(
        code("gov::replay::bad-record"),
        help(
            "each line must be one JSON object as docs/decision-log.md describes; remove or fix the line"
        )
    )]
    BadRecord {
        file: String,
        line: usize,
        message: String,
    },
    #[error("{file}:{line}: a record of format version {version}, this govc reads version {known}")]
    #[diagnostic(
        code("gov::replay::version"),
        help("replay the log with a govc of the agent's release")
    )]
    Version {
        file: String,
        line: usize,
        version: u32,
        known: u32,
    },
}

/// serde's message without its "at line 1 column N" (the line is the
/// file's): `column N: message`.
fn json_message(e: &serde_json::Error) -> String {
    let text = e.to_string();
    let text = text.rsplit_once(" at line ").map_or(&*text, |(m, _)| m);
    format!("column {}: {text}", e.column())
}

impl Calls {
    /// The logged headers of `call`, as interned `(name, value)`.
    pub fn headers_of(&self, call: &Call) -> &[(u32, u32)] {
        let (from, to) = call.headers;
        self.header_pairs
            .get(from as usize..to as usize)
            .unwrap_or(&[])
    }

    /// Reads every line of `path`; `service` keeps only that service's calls.
    pub fn read(&mut self, path: &Path, service: Option<&str>) -> Result<(), LogError> {
        let file = std::fs::File::open(path).map_err(|source| LogError::Read {
            path: path.to_owned(),
            source,
        })?;
        let name = path.display().to_string();
        let mut reader = std::io::BufReader::with_capacity(1 << 20, file);
        let mut text = String::new();
        let mut line = 0;
        loop {
            text.clear();
            line += 1;
            let n = reader
                .read_line(&mut text)
                .map_err(|source| LogError::Read {
                    path: path.to_owned(),
                    source,
                })?;
            if n == 0 {
                return Ok(());
            }
            if text.trim().is_empty() {
                continue;
            }
            let record: log::Record =
                serde_json::from_str(&text).map_err(|e| LogError::BadRecord {
                    file: name.clone(),
                    line,
                    message: json_message(&e),
                })?;
            if record.v != log::VERSION {
                return Err(LogError::Version {
                    file: name.clone(),
                    line,
                    version: record.v,
                    known: log::VERSION,
                });
            }
            if service.is_some_and(|s| s != record.service) {
                continue;
            }
            self.push(record, &name, line)?;
        }
    }

    fn push(&mut self, r: log::Record, file: &str, line: usize) -> Result<(), LogError> {
        let bad = |message: String| LogError::BadRecord {
            file: file.to_owned(),
            line,
            message,
        };
        let method = http::Method::from_bytes(r.method.as_bytes())
            .map_err(|_| bad(format!("`{}` is not an HTTP method", r.method)))?;
        if !r.path.starts_with('/') && r.path != "*" {
            return Err(bad(format!(
                "the path `{}` does not start with `/`",
                r.path
            )));
        }
        let method = match self.methods.iter().position(|m| *m == method) {
            Some(i) => i,
            None => {
                self.methods.push(method);
                self.methods.len() - 1
            }
        };
        let agent = match self
            .agents
            .iter()
            .position(|a| a.service == r.service && a.instance == r.instance)
        {
            Some(i) => i,
            None => {
                self.agents.push(Agent {
                    service: r.service.clone(),
                    instance: r.instance.clone(),
                    epochs: BTreeMap::new(),
                    epochs_at: BTreeMap::new(),
                });
                self.agents.len() - 1
            }
        };
        let a = &mut self.agents[agent];
        for e in &r.epochs {
            // The epoch given by the earliest record.
            let earlier = a.epochs_at.get(&e.rule).is_none_or(|&at| r.t_us < at);
            if earlier {
                a.epochs.insert(e.rule.clone(), e.t_us);
                a.epochs_at.insert(e.rule.clone(), r.t_us);
            }
        }
        let live = match r
            .rules
            .iter()
            .find(|d| d.decision == log::Verdict::Rejected)
        {
            Some(d) => Live::Rejected {
                rule: self.strings.intern(&d.rule),
                reason: self.strings.intern(d.reason.as_deref().unwrap_or("")),
            },
            None if r.outcome == log::Outcome::Rejected => {
                return Err(bad("a rejected call names no rejecting rule".into()));
            }
            None => Live::Admitted,
        };
        let from = u32::try_from(self.header_pairs.len()).unwrap_or(NONE);
        for (name, value) in &r.headers {
            if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
                return Err(bad(format!("`{name}` is not a header name")));
            }
            let pair = (self.strings.intern(name), self.strings.intern(value));
            self.header_pairs.push(pair);
        }
        let to = u32::try_from(self.header_pairs.len()).unwrap_or(NONE);
        let mut opt = |s: &Option<String>| s.as_deref().map_or(NONE, |s| self.strings.intern(s));
        let consumer = opt(&r.consumer);
        let target = opt(&r.target);
        let upstream = opt(&r.upstream);
        let call = Call {
            t_us: r.t_us,
            latency_us: r.latency_us,
            outcome_us: r.outcome_us,
            live_wait_us: r
                .rules
                .iter()
                .filter_map(|d| d.wait_us)
                .fold(0, u64::saturating_add),
            request_bytes: r.request_bytes.unwrap_or(0),
            response_bytes: r.response_bytes.unwrap_or(0),
            agent: u32::try_from(agent).unwrap_or(NONE),
            consumer,
            method: u32::try_from(method).unwrap_or(0),
            path: self.strings.intern(&r.path),
            target,
            upstream,
            headers: (from, to),
            status: r.status,
            grpc_status: r.grpc_status,
            direction: match r.direction {
                log::Direction::Inbound => Direction::Inbound,
                log::Direction::Outbound => Direction::Outbound,
            },
            outcome: r.outcome,
            live,
        };
        self.list.push(call);
        Ok(())
    }
}
