//! `govc audit [--since 2h|2026-12-01T08:00:00Z] [--limit N] [--before SEQ]
//! [-o json]`: govd's audit log, oldest first: who applied or released
//! what, and the latches agents tripped. govd answers one bounded page (the
//! newest records that match); `--before` pages back. It needs a token with
//! the viewer role (or more).

use std::process::ExitCode;

use gov_proto::v1 as pb;

use crate::remote::{self, RemoteArgs};
use crate::report::Output;

/// Show govd's audit log: applies, releases, trips, with who did them.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Only records from this long ago (`30m`, `2h`, `7d`) or since this UTC
    /// time (`2026-12-01T08:00:00Z`, `2026-12-01`).
    #[arg(long, value_name = "DURATION|TIME", value_parser = parse_since)]
    pub since: Option<Since>,

    /// At most this many records (the newest); govd sends at most 10,000,
    /// and about 1 MiB, in one page.
    #[arg(long, value_name = "N", default_value_t = 1000)]
    pub limit: u32,

    /// Only records before this position in the log (the `SEQ` column):
    /// the next older page, as the note after a partial page says.
    #[arg(long, value_name = "SEQ")]
    pub before: Option<u64>,

    #[command(flatten)]
    pub remote: RemoteArgs,

    /// `text` for people, `json` for tools (one array of records).
    #[arg(long, short = 'o', value_enum, default_value_t = Output::Text)]
    pub output: Output,
}

/// Where `--since` starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Since {
    /// This long before now, in ms.
    Ago(u64),
    /// This time, in ms since the Unix epoch.
    At(u64),
}

pub fn run(args: Args) -> ExitCode {
    let now = now_unix_ms();
    let since_unix_ms = match args.since {
        None => 0,
        Some(Since::Ago(ms)) => now.saturating_sub(ms),
        Some(Since::At(ms)) => ms,
    };
    let request = pb::AuditRequest {
        since_unix_ms,
        limit: args.limit,
        before_seq: args.before.unwrap_or(0),
    };
    let result = remote::block_on(async {
        let mut client = args.remote.connect().await?;
        let request = args.remote.request(request)?;
        client
            .audit(request)
            .await
            .map(tonic::Response::into_inner)
            .map_err(|s| args.remote.status(s))
    });
    let result = match result {
        Ok(Ok(r)) => r,
        Ok(Err(e)) | Err(e) => return remote::fail(e),
    };
    match args.output {
        Output::Json => {
            let records: Vec<serde_json::Value> = result.records.iter().map(json).collect();
            match serde_json::to_string_pretty(&records) {
                Ok(text) => gov_common::outln!("{text}"),
                Err(e) => {
                    gov_common::errln!("error: cannot encode the records: {e}");
                    return ExitCode::FAILURE;
                }
            }
        }
        Output::Text => gov_common::out!("{}", render(&result)),
    }
    if result.left_out > 0 {
        gov_common::errln!(
            "note: {} older record(s) left out; the next page: govc audit --before {}",
            result.left_out,
            result.next_before_seq
        );
    }
    ExitCode::SUCCESS
}

/// One record as JSON: the wire fields, with the time also as RFC 3339.
fn json(r: &pb::AuditRecord) -> serde_json::Value {
    serde_json::json!({
        "at": rfc3339(r.at_unix_ms),
        "at_unix_ms": r.at_unix_ms,
        "seq": r.seq,
        "who": r.who,
        "action": r.action,
        "intent": r.intent,
        "version": r.version,
        "kind": r.kind,
        "rule": r.rule,
        "key": r.key,
        "targets": r.targets,
        "detail": r.detail,
    })
}

/// The records as a table, or a line saying there are none.
fn render(result: &pb::AuditResult) -> String {
    if result.records.is_empty() {
        return "no audit records\n".to_owned();
    }
    let mut rows = vec![vec![
        "SEQ".to_owned(),
        "TIME (UTC)".to_owned(),
        "WHO".to_owned(),
        "ACTION".to_owned(),
        "WHAT".to_owned(),
        "DETAIL".to_owned(),
    ]];
    for r in &result.records {
        let what = if !r.rule.is_empty() && !r.key.is_empty() {
            // One key of a limit keyed by consumer or called service.
            format!("{} {} [{}]", r.kind, r.rule, r.key)
        } else if !r.rule.is_empty() {
            format!("{} {}", r.kind, r.rule)
        } else if !r.version.is_empty() {
            crate::cmd::apply::short(&r.version)
        } else {
            String::new()
        };
        let mut detail = r.detail.clone();
        if !r.targets.is_empty() {
            if !detail.is_empty() {
                detail.push_str("; ");
            }
            detail.push_str(&r.targets.join(","));
        }
        rows.push(vec![
            r.seq.to_string(),
            rfc3339(r.at_unix_ms),
            r.who.clone(),
            r.action.clone(),
            what,
            detail,
        ]);
    }
    remote::table(&rows)
}

fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A duration as every flag takes it (`30m`, `1.5h`, `90s`: gov-proto's one
/// duration parser), whole days (`7d`, for looking back only), or a UTC time
/// (`2026-12-01T08:00:00Z`, `2026-12-01`).
fn parse_since(s: &str) -> Result<Since, String> {
    let s = s.trim();
    if s.contains('-') {
        return parse_time(s).map(Since::At);
    }
    let bad = || {
        format!(
            "`{s}` is neither a duration (`30m`, `2h`, `7d`) nor a UTC time (`2026-12-01T08:00:00Z`)"
        )
    };
    if let Some(days) = s.strip_suffix('d') {
        let days: u64 = days.parse().map_err(|_| bad())?;
        return days
            .checked_mul(86_400_000)
            .map(Since::Ago)
            .ok_or_else(|| format!("`{s}` is too long ago"));
    }
    let ago = gov_common::flag::parse_duration(s).map_err(|e| format!("{}: {e}", bad()))?;
    u64::try_from(ago.as_millis())
        .map(Since::Ago)
        .map_err(|_| format!("`{s}` is too long ago"))
}

/// `YYYY-MM-DD` or `YYYY-MM-DDTHH:MM:SSZ` (UTC) as ms since the epoch.
fn parse_time(s: &str) -> Result<u64, String> {
    let bad = || format!("`{s}` is not a UTC time such as `2026-12-01T08:00:00Z` or `2026-12-01`");
    let (date, time) = match s.split_once('T') {
        Some((d, t)) => (d, Some(t.strip_suffix('Z').ok_or_else(bad)?)),
        None => (s, None),
    };
    let num = |p: &str, len: usize| -> Result<u64, String> {
        if p.len() == len && p.bytes().all(|b| b.is_ascii_digit()) {
            p.parse().map_err(|_| bad())
        } else {
            Err(bad())
        }
    };
    let d: Vec<&str> = date.split('-').collect();
    let [y, m, day] = d.as_slice() else {
        return Err(bad());
    };
    let (y, m, day) = (num(y, 4)?, num(m, 2)?, num(day, 2)?);
    if y < 1970 || !(1..=12).contains(&m) || day < 1 || day > days_in_month(y, m) {
        return Err(bad());
    }
    let secs_of_day = match time {
        None => 0,
        Some(t) => {
            let t: Vec<&str> = t.split(':').collect();
            let [h, mi, se] = t.as_slice() else {
                return Err(bad());
            };
            let (h, mi, se) = (num(h, 2)?, num(mi, 2)?, num(se, 2)?);
            if h > 23 || mi > 59 || se > 59 {
                return Err(bad());
            }
            h * 3600 + mi * 60 + se
        }
    };
    Ok((days_from_civil(y, m, day) * 86_400 + secs_of_day) * 1000)
}

fn days_in_month(y: u64, m: u64) -> u64 {
    match m {
        2 if (y.is_multiple_of(4) && !y.is_multiple_of(100)) || y.is_multiple_of(400) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a date on or after it (H. Hinnant's algorithm).
fn days_from_civil(y: u64, m: u64, d: u64) -> u64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y / 400;
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// `2026-12-01T08:00:00Z` for ms since the epoch.
pub(crate) use gov_common::report::rfc3339;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_takes_durations_and_utc_times() {
        assert_eq!(parse_since("30m"), Ok(Since::Ago(1_800_000)));
        assert_eq!(parse_since("2h"), Ok(Since::Ago(7_200_000)));
        assert_eq!(parse_since("7d"), Ok(Since::Ago(604_800_000)));
        // The flags' own spellings: fractions and `min`, as every duration flag.
        assert_eq!(parse_since("1.5h"), Ok(Since::Ago(5_400_000)));
        assert_eq!(parse_since("2min"), Ok(Since::Ago(120_000)));
        assert_eq!(parse_since("1970-01-02"), Ok(Since::At(86_400_000)));
        assert_eq!(
            parse_since("2026-12-01T08:00:00Z"),
            Ok(Since::At(1_796_112_000_000))
        );
        for bad in [
            "",
            "2",
            "2w",
            "h",
            "-1h",
            "2026-13-01",
            "2026-02-30",
            "2026-12-01T08:00:00",
            "2026-12-01T24:00:00Z",
            "26-12-01",
            "99999999999999999999d",
            "1.5d",
            "0.0001ms",
        ] {
            assert!(parse_since(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn times_print_as_rfc3339_utc() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_796_112_000_999), "2026-12-01T08:00:00Z");
        assert_eq!(rfc3339(951_782_400_000), "2000-02-29T00:00:00Z");
        for ms in [
            0,
            86_399_000,
            951_782_400_000,
            1_796_112_061_000,
            4_102_444_800_000,
        ] {
            let text = rfc3339(ms);
            assert_eq!(parse_time(&text), Ok(ms), "{text}");
        }
    }
}
