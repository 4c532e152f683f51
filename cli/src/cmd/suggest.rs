//! `govc suggest --log FILE... [--service S] [--out FILE]`: a policy proposed
//! from traffic an agent recorded (`gov-agent --decision-log`), each number
//! with its evidence in a comment, then checked: compiled, and replayed
//! over the same log (`govc replay`) to show what it would have rejected.
//!
//! What it proposes, per service, from the inbound calls:
//! - a fail-fast bulkhead on each route (first path segment) much slower
//!   than the others: problem 1's lesson, a slow endpoint must not take the
//!   workers the fast ones need. Its size is the 99th percentile of the
//!   calls in flight at an instance when one arrived, its wait a tenth of
//!   the route's median latency;
//! - with two consumers or more, a limit per consumer at 1.25 times the
//!   busiest consumer's busiest window;
//! - a fuse on the error ratio, above the worst window seen.
//!
//! It proposes nothing it has no evidence for (a route with fewer than 20
//! calls, one consumer, a log shorter than its windows), and says so.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use gov_proto::decision_log::{Direction, Outcome, Record, VERSION};

use crate::report::ReportArgs;

/// Propose a policy from recorded traffic, and replay it over that traffic.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Decision log files written by `gov-agent --decision-log`.
    #[arg(long, required = true, num_args = 1.., value_name = "FILE")]
    pub log: Vec<PathBuf>,

    /// Propose only for this service.
    #[arg(long, short = 's', value_name = "NAME")]
    pub service: Option<String>,

    /// Write the proposal to this file (default: print it) before the
    /// replay of it.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,

    #[command(flatten)]
    pub report: ReportArgs,
}

/// Fewer calls than this on a route or in a window: no evidence.
const MIN_CALLS: usize = 20;

/// One inbound call, as suggest reads it.
struct Call {
    t_us: u64,
    latency_us: u64,
    instance: String,
    route: String,
    consumer: Option<String>,
    admitted: bool,
    error: bool,
}

pub fn run(args: Args) -> ExitCode {
    let mut by_service: BTreeMap<String, Vec<Call>> = BTreeMap::new();
    for path in &args.log {
        if let Err(e) = read(path, args.service.as_deref(), &mut by_service) {
            gov_common::errln!("error: {e}");
            return ExitCode::FAILURE;
        }
    }
    if by_service.is_empty() {
        gov_common::errln!(
            "error: no inbound call{} in the log: nothing to propose from\n  help: record with `gov-agent --decision-log FILE` under real traffic first",
            args.service
                .as_deref()
                .map(|s| format!(" of `{s}`"))
                .unwrap_or_default()
        );
        return ExitCode::FAILURE;
    }
    let mut policy = String::new();
    for (service, calls) in &by_service {
        policy.push_str(&propose(service, calls));
    }
    let (path, _keep) = match &args.out {
        Some(out) => (out.clone(), None),
        None => {
            let dir = match tempfile::tempdir() {
                Ok(d) => d,
                Err(e) => {
                    gov_common::errln!("error: cannot make a temporary directory: {e}");
                    return ExitCode::FAILURE;
                }
            };
            (dir.path().join("suggested.gov"), Some(dir))
        }
    };
    if let Err(e) = std::fs::write(&path, &policy) {
        gov_common::errln!("error: cannot write `{}`: {e}", path.display());
        return ExitCode::FAILURE;
    }
    if args.out.is_some() {
        gov_common::outln!("Wrote the proposal to {}.", path.display());
    } else {
        gov_common::out!("{policy}");
    }
    // The check: the real compiler, then the agents' engine over the log.
    gov_common::outln!("\nReplayed over the same log (govc replay):\n");
    crate::cmd::replay::run(crate::cmd::replay::Args {
        files: vec![path],
        log: args.log.clone(),
        service: args.service.clone(),
        against: Vec::new(),
        output: crate::report::Output::Text,
        report: args.report.clone(),
    })
}

/// The inbound calls of `path`, by service.
fn read(
    path: &Path,
    service: Option<&str>,
    out: &mut BTreeMap<String, Vec<Call>>,
) -> Result<(), String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read `{}`: {e}", path.display()))?;
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let r: Record = serde_json::from_str(line).map_err(|e| {
            format!(
                "`{}` line {}: not a decision log record: {e}",
                path.display(),
                n + 1
            )
        })?;
        if r.v != VERSION {
            return Err(format!(
                "`{}` line {}: format version {}, this govc reads {VERSION}",
                path.display(),
                n + 1,
                r.v
            ));
        }
        if r.direction != Direction::Inbound || service.is_some_and(|s| s != r.service) {
            continue;
        }
        let error = match r.outcome {
            Outcome::ConnectFailure | Outcome::Timeout | Outcome::Reset => true,
            Outcome::Response => r.status.is_some_and(|s| s >= 500),
            Outcome::Rejected | Outcome::Abandoned => false,
        };
        out.entry(r.service.clone()).or_default().push(Call {
            t_us: r.t_us,
            latency_us: r.latency_us,
            instance: r.instance,
            route: route_of(&r.path),
            consumer: r.consumer,
            admitted: r.outcome != Outcome::Rejected,
            error,
        });
    }
    Ok(())
}

/// A route: the path's first segment (`/slow/3` -> `/slow`).
fn route_of(path: &str) -> String {
    let first = path.trim_start_matches('/').split('/').next().unwrap_or("");
    format!("/{first}")
}

/// A rule name for a route: letters, digits and `_`.
fn name_of(route: &str) -> String {
    let mut name: String = route
        .trim_start_matches('/')
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect();
    if name.is_empty() {
        name = "root".into();
    }
    if name.starts_with(|c: char| c.is_ascii_digit()) {
        name.insert_str(0, "r_");
    }
    name
}

/// The `q`-quantile of `v` (sorted in place).
fn quantile(v: &mut [u64], q: f64) -> u64 {
    if v.is_empty() {
        return 0;
    }
    v.sort_unstable();
    let i = ((v.len() - 1) as f64 * q).round() as usize;
    v[i.min(v.len() - 1)]
}

/// A duration in the language's spelling, whole milliseconds (at least 1).
fn ms(us: u64) -> String {
    format!("{}ms", (us / 1000).max(1))
}

/// The most of `times` (sorted) in any window of `window_us`.
fn busiest(times: &[u64], window_us: u64) -> u64 {
    let (mut start, mut most) = (0usize, 0usize);
    for (end, &t) in times.iter().enumerate() {
        while times[start] + window_us <= t {
            start += 1;
        }
        most = most.max(end - start + 1);
    }
    most as u64
}

/// The calls in flight at the same instance when each call arrived.
fn in_flight_at_arrival(calls: &[&Call]) -> Vec<u64> {
    let mut by_instance: BTreeMap<&str, Vec<&Call>> = BTreeMap::new();
    for c in calls {
        by_instance.entry(&c.instance).or_default().push(c);
    }
    let mut seen = Vec::new();
    for mut list in by_instance.into_values() {
        list.sort_by_key(|c| c.t_us);
        let mut ends: std::collections::BinaryHeap<std::cmp::Reverse<u64>> = Default::default();
        for c in list {
            while ends.peek().is_some_and(|e| e.0 <= c.t_us) {
                ends.pop();
            }
            seen.push(ends.len() as u64 + 1);
            ends.push(std::cmp::Reverse(c.t_us.saturating_add(c.latency_us)));
        }
    }
    seen
}

/// The proposal for one service.
fn propose(service: &str, calls: &[Call]) -> String {
    let mut out = String::new();
    let first = calls.iter().map(|c| c.t_us).min().unwrap_or(0);
    let last = calls.iter().map(|c| c.t_us).max().unwrap_or(0);
    let span_us = last.saturating_sub(first).max(1);
    let instances: BTreeSet<&str> = calls.iter().map(|c| c.instance.as_str()).collect();
    let _ = writeln!(
        out,
        "# Proposed by `govc suggest` from {} inbound calls of `{service}` at {} instance(s) over {:.1}s.\n# Review each number against its evidence before applying.",
        calls.len(),
        instances.len(),
        span_us as f64 / 1e6
    );
    let _ = writeln!(out, "service {service} {{");
    let consumers: BTreeSet<&str> = calls.iter().filter_map(|c| c.consumer.as_deref()).collect();
    if !consumers.is_empty() {
        let _ = writeln!(
            out,
            "  # The header your agents read the consumer from (the log does not name it).\n  consumer from header \"x-gov-consumer\""
        );
    }
    let _ = writeln!(out, "  match all = path prefix \"/\"");

    // Routes, and which are slow next to the others.
    let mut routes: BTreeMap<&str, Vec<&Call>> = BTreeMap::new();
    for c in calls.iter().filter(|c| c.admitted) {
        routes.entry(&c.route).or_default().push(c);
    }
    let p50: BTreeMap<&str, u64> = routes
        .iter()
        .map(|(r, cs)| {
            let mut l: Vec<u64> = cs.iter().map(|c| c.latency_us).collect();
            (*r, quantile(&mut l, 0.5))
        })
        .collect();
    let mut rules = String::new();
    let mut notes = Vec::new();
    for (route, cs) in &routes {
        let mine = p50[route];
        let mut others: Vec<u64> = p50
            .iter()
            .filter(|(r, _)| r != &route)
            .map(|(_, v)| *v)
            .collect();
        let others_p50 = quantile(&mut others, 0.5);
        if cs.len() < MIN_CALLS {
            notes.push(format!(
                "{route}: {} calls, too few to size a bulkhead",
                cs.len()
            ));
            continue;
        }
        if others.is_empty() || mine < 20_000 || mine < others_p50.saturating_mul(4) {
            continue;
        }
        let name = name_of(route);
        let mut latencies: Vec<u64> = cs.iter().map(|c| c.latency_us).collect();
        let p99 = quantile(&mut latencies, 0.99);
        let mut seen = in_flight_at_arrival(cs);
        let size = quantile(&mut seen, 0.99).max(1);
        let peak = seen.iter().copied().max().unwrap_or(1);
        let _ = writeln!(
            out,
            "  match {name} = path prefix \"{route}\" latency {}",
            ms(mine)
        );
        let _ = writeln!(
            rules,
            "\n  # {route}: {} calls, p50 {}, p99 {} (the other routes' p50: {}). In flight at an\n  # instance when a call arrived: p99 {size}, peak {peak}. Fail fast: a call that\n  # finds no permit waits a tenth of the p50, then gets 408, so the slow route\n  # cannot take the workers the fast ones need.\n  bulkhead {name}_calls on {name} {{\n    max_concurrent {size}\n    max_wait {}\n  }}",
            cs.len(),
            ms(mine),
            ms(p99),
            ms(others_p50),
            ms(mine / 10)
        );
    }

    // Windows: a minute when the log covers ten, else a second.
    let (window_us, window) = if span_us >= 600_000_000 {
        (60_000_000, "1m")
    } else {
        (1_000_000, "1s")
    };
    if consumers.len() >= 2 {
        // Each consumer's most calls in any window of that length (an
        // upper bound on every aligned window the engine counts).
        let mut peaks: BTreeMap<&str, u64> = BTreeMap::new();
        for consumer in &consumers {
            let mut times: Vec<u64> = calls
                .iter()
                .filter(|c| c.consumer.as_deref() == Some(*consumer))
                .map(|c| c.t_us)
                .collect();
            times.sort_unstable();
            peaks.insert(consumer, busiest(&times, window_us));
        }
        let busiest = peaks.values().copied().max().unwrap_or(1);
        let amount = (busiest * 5).div_ceil(4).max(1);
        let evidence: Vec<String> = peaks.iter().map(|(c, n)| format!("{c} {n}")).collect();
        let _ = writeln!(
            rules,
            "\n  # Most calls in any {window}, per consumer: {}. At 1.25 times the\n  # busiest, as the rate and as the burst (the token bucket admits at most\n  # the burst at once), no consumer seen is throttled; a new one that floods is.\n  limit per_consumer on all {{\n    calls {amount} per {window} burst {amount}\n    per consumer\n  }}",
            evidence.join(", ")
        );
    } else {
        notes.push(format!(
            "{} consumer(s) seen: no per-consumer limit",
            consumers.len()
        ));
    }

    propose_fuse(calls, (window_us, window), &mut rules, &mut notes);
    out.push_str(&rules);
    for note in notes {
        let _ = writeln!(out, "  # Not proposed: {note}.");
    }
    out.push_str("}\n");
    out
}

/// A fuse above the worst error ratio of any window (of `window`'s length,
/// ending at a call) with enough calls, or a note why none is proposed.
fn propose_fuse(
    calls: &[Call],
    (window_us, window): (u64, &str),
    rules: &mut String,
    notes: &mut Vec<String>,
) {
    let mut admitted: Vec<(u64, bool)> = calls
        .iter()
        .filter(|c| c.admitted)
        .map(|c| (c.t_us, c.error))
        .collect();
    admitted.sort_unstable();
    let times: Vec<u64> = admitted.iter().map(|a| a.0).collect();
    let per_window = busiest(&times, window_us);
    let min_calls = (per_window / 4).max(MIN_CALLS as u64);
    let (mut start, mut errors, mut worst, mut judged) = (0usize, 0u64, None::<u64>, 0usize);
    for (end, &(t, error)) in admitted.iter().enumerate() {
        errors += u64::from(error);
        while admitted[start].0 + window_us <= t {
            errors -= u64::from(admitted[start].1);
            start += 1;
        }
        let n = (end - start + 1) as u64;
        if n >= min_calls {
            judged += 1;
            worst = Some(worst.unwrap_or(0).max(errors * 100 / n));
        }
    }
    match worst {
        None => notes.push(format!(
            "no {window} with {min_calls} calls or more: no fuse"
        )),
        Some(worst) => {
            let threshold = (worst * 3 / 2 + 5).clamp(20, 90);
            let _ = writeln!(
                rules,
                "\n  # Errors (5xx, timeouts, resets, failed connects): the worst {window} with\n  # {min_calls} calls or more (of {judged} such) had {worst}%. The fuse trips above\n  # 1.5 times that (+5, at least 20%), so the traffic seen would not trip it.\n  fuse errors on all {{\n    trip when error_ratio > {threshold}% over {window} min_calls {min_calls}\n    recover manual\n  }}"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_and_names() {
        assert_eq!(route_of("/slow/3"), "/slow");
        assert_eq!(route_of("/"), "/");
        assert_eq!(name_of("/"), "root");
        assert_eq!(name_of("/9lives"), "r_9lives");
        assert_eq!(name_of("/Api-V2"), "api_v2");
    }

    #[test]
    fn the_busiest_window_slides() {
        assert_eq!(busiest(&[], 10), 0);
        // 5, 8, 12 and 14 fall within 10 us; aligned windows see at most 3.
        assert_eq!(busiest(&[1, 5, 8, 12, 14, 40], 10), 4);
    }

    #[test]
    fn in_flight_counts_each_instance_apart() {
        let call = |t_us, instance: &str| Call {
            t_us,
            latency_us: 100,
            instance: instance.into(),
            route: "/".into(),
            consumer: None,
            admitted: true,
            error: false,
        };
        let calls = [call(0, "a"), call(10, "a"), call(20, "b"), call(200, "a")];
        let refs: Vec<&Call> = calls.iter().collect();
        let mut seen = in_flight_at_arrival(&refs);
        seen.sort_unstable();
        assert_eq!(seen, [1, 1, 1, 2]);
    }
}
