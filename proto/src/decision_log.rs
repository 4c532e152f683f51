//! The decision log's record: one JSON line per call, written by `gov-agent
//! --decision-log` and read by `govc replay`. The format is versioned
//! ([`VERSION`], the `v` field of every line) and documented in
//! `docs/decision-log.md`; a reader refuses a line of another version.
//!
//! Times are microseconds (the arrival as Unix time, durations as counts), so
//! a replay can put every call back where it happened. A record holds what
//! the engine needs to decide the call again (direction, method, path,
//! consumer, the headers the policy's matches read, the called service and
//! instance, bytes, how it ended) and what the live engine decided, rule by
//! rule.
//!
//! Readers ignore fields they do not know: adding a field keeps the
//! version; changing or removing one bumps it.

use serde::{Deserialize, Serialize};

/// The format version written in every record's `v`.
pub const VERSION: u32 = 1;

/// One call seen by an agent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// The format version ([`VERSION`]).
    pub v: u32,
    /// When the call arrived (the decision began), Unix time in microseconds.
    pub t_us: u64,
    /// The service of the agent that saw the call.
    pub service: String,
    /// The agent's instance.
    pub instance: String,
    /// `inbound` (a client of the service) or `outbound` (the service calling another).
    pub direction: Direction,
    /// The caller identity (the config's consumer header), when sent.
    #[serde(default)]
    pub consumer: Option<String>,
    /// Inbound: where `consumer` came from, the service's `consumer from`:
    /// `header` (as the client sent it, unverified), `trusted-header` (as a
    /// verified calling service set it), `peer` (the calling service's
    /// certificate), `jwt` (a verified token's claim). Added within format
    /// version 1: older readers ignore it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consumer_source: Option<String>,
    pub method: String,
    /// The normalized path the rules matched, without the query.
    pub path: String,
    /// Outbound: the called service.
    #[serde(default)]
    pub target: Option<String>,
    /// Outbound: the upstream instance (`host:port`) the call went to.
    #[serde(default)]
    pub upstream: Option<String>,
    /// The request headers the config's matches read (name lowercase,
    /// value as sent when it is visible ASCII), so that a replay matches
    /// them again. Other headers are not logged.
    #[serde(default)]
    pub headers: Vec<(String, String)>,
    /// Request body bytes (`None`: not known, e.g. a body streamed without
    /// a length on the hyper path).
    #[serde(default)]
    pub request_bytes: Option<u64>,
    /// Response body bytes, as for `request_bytes`.
    #[serde(default)]
    pub response_bytes: Option<u64>,
    /// The status the client got (a rejection's, the agent's own 502 or 504,
    /// or the upstream's); `None` when the client left before an answer.
    #[serde(default)]
    pub status: Option<u16>,
    /// For a gRPC call the upstream answered: the `grpc-status` it ended
    /// with (from its trailers or a trailers-only response; `status` is then
    /// 200). Absent for plain HTTP. Added within format version 1: older
    /// readers ignore it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grpc_status: Option<u32>,
    /// How the call ended, as fuses classify it.
    pub outcome: Outcome,
    /// From arrival to the end of the call (the response body done, or the
    /// rejection), in microseconds. An admitted call held its permits this long.
    pub latency_us: u64,
    /// From arrival to the moment the outcome was recorded (the response
    /// head, or gRPC trailers), in microseconds: when fuses and latency
    /// histograms counted the call. Absent when the call had no outcome.
    /// Added within format version 1: older readers ignore it, and a replay
    /// of a record without it counts the outcome at the end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome_us: Option<u64>,
    /// The version of the config that decided the call (empty: no rule matched).
    #[serde(default)]
    pub config: String,
    /// What each rule that decided the call decided, in decision order. A
    /// rejected call lists the rules that admitted it before the rejecting one
    /// when the engine reports them, and the rejecting rule last.
    #[serde(default)]
    pub rules: Vec<RuleDecision>,
    /// Shadow rules (`mode shadow`) that would have rejected the call.
    #[serde(default)]
    pub shadow: Vec<ShadowDecision>,
    /// Where the windows of the config's limits and fuses start: written
    /// with the first record of a file and the first under a new config.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub epochs: Vec<Epoch>,
}

/// When a windowed rule (a limit, a fuse) started counting: its windows
/// are aligned to this time.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Epoch {
    /// `service/rule`.
    pub rule: String,
    /// Unix time in microseconds, on the clock of the records' `t_us`.
    pub t_us: u64,
}

/// Which listener saw the call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    Inbound,
    Outbound,
}

/// How a call ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The upstream answered with `status`.
    Response,
    /// A rule rejected the call (the last entry of `rules`).
    Rejected,
    /// The upstream could not be connected to.
    ConnectFailure,
    /// The call exceeded its route timeout.
    Timeout,
    /// The upstream closed the connection before or during the response.
    Reset,
    /// The client went away before the call had an outcome.
    Abandoned,
}

/// What one rule decided about a call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuleDecision {
    /// `service/rule`.
    pub rule: String,
    pub decision: Verdict,
    /// Rejected: why (`limit_calls`, `bulkhead_full`, ...: the names of `/metrics`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Waited: how long, in microseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_us: Option<u64>,
}

/// A rule's decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Admitted at once.
    Admitted,
    /// Admitted after waiting (`wait_us`) for a permit or a shaping delay.
    Waited,
    /// Rejected (`reason`).
    Rejected,
}

/// A shadow rule that would have rejected a call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShadowDecision {
    /// `service/rule`.
    pub rule: String,
    /// Why it would have rejected (a `/metrics` reason name).
    pub reason: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINE: &str = r#"{"v":1,"t_us":1764574113123456,"service":"order","instance":"order-1","direction":"inbound","consumer":"crm","method":"GET","path":"/mdm/supplier/7","target":null,"upstream":null,"headers":[["x-tenant","a\"b"]],"request_bytes":0,"response_bytes":512,"status":429,"outcome":"rejected","latency_us":12,"config":"abc","rules":[{"rule":"order/slow","decision":"waited","wait_us":9},{"rule":"order/crm","decision":"rejected","reason":"limit_calls"}],"shadow":[{"rule":"order/new","reason":"limit_calls"}]}"#;

    #[test]
    fn a_documented_line_reads_and_writes_back_the_same() {
        let record: Record = serde_json::from_str(LINE).unwrap();
        assert_eq!(record.v, VERSION);
        assert_eq!(record.headers, [("x-tenant".into(), "a\"b".into())]);
        assert_eq!(record.rules[0].decision, Verdict::Waited);
        assert_eq!(record.rules[1].reason.as_deref(), Some("limit_calls"));
        assert_eq!(record.shadow[0].rule, "order/new");
        assert_eq!(serde_json::to_string(&record).unwrap(), LINE);
    }

    #[test]
    fn a_field_added_later_is_ignored_and_a_missing_one_is_refused() {
        let line = LINE.replacen("\"v\":1,", "\"v\":1,\"added\":1,", 1);
        assert!(serde_json::from_str::<Record>(&line).is_ok());
        let line = LINE.replacen("\"method\":\"GET\",", "", 1);
        assert!(serde_json::from_str::<Record>(&line).is_err());
    }

    /// A gRPC call's `grpc-status` is written after `status` when there is
    /// one, and left out (not `null`) for plain HTTP.
    #[test]
    fn a_grpc_status_is_written_only_for_grpc_calls() {
        let line = LINE.replacen("\"status\":429,", "\"status\":200,\"grpc_status\":14,", 1);
        let record: Record = serde_json::from_str(&line).unwrap();
        assert_eq!((record.status, record.grpc_status), (Some(200), Some(14)));
        assert_eq!(serde_json::to_string(&record).unwrap(), line);
        let plain: Record = serde_json::from_str(LINE).unwrap();
        assert_eq!(plain.grpc_status, None);
        assert!(
            !serde_json::to_string(&plain)
                .unwrap()
                .contains("grpc_status")
        );
    }
}
