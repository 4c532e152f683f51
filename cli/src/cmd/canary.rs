//! Canary applies in `govc`: the flags of `govc apply --canary`, what it
//! prints once the canary started, `govc canary abort|promote`, and the
//! canary's lines in `govc status`.

use std::process::ExitCode;
use std::time::Duration;

use gov_common::flag::parse_duration;
use gov_proto::v1 as pb;

use crate::remote::{self, RemoteArgs};

/// `govc apply`'s canary flags.
#[derive(Debug, Clone, clap::Args)]
pub struct CanaryArgs {
    /// Apply to this share of each changed service's connected instances
    /// first (`10%`; at least one instance, so a service with one instance
    /// is all canary), compare their outcomes with the other instances' for
    /// `--for`, promote when it ends clean, roll back on the first
    /// threshold crossed. `govc canary abort` ends it by hand.
    #[arg(long, value_name = "PERCENT", value_parser = parse_share)]
    pub canary: Option<u32>,

    /// How long a canary runs before it is promoted (`30s`, `5m`; 1s to 24h).
    #[arg(long = "for", value_name = "DURATION", default_value = "5m", value_parser = parse_window, requires = "canary")]
    pub window: Duration,

    /// Roll the canary back when, for one rule, the canary instances reject
    /// a share of their calls this much above the other instances' (`5%`;
    /// `0%`: not checked).
    #[arg(long, value_name = "PERCENT", default_value = "5%", value_parser = parse_ratio, requires = "canary")]
    pub max_reject_ratio: f64,

    /// The same for errors: calls that timed out under a rule, gRPC calls
    /// that ended with a code other than OK.
    #[arg(long, value_name = "PERCENT", default_value = "5%", value_parser = parse_ratio, requires = "canary")]
    pub max_error_ratio: f64,

    /// A rule's ratios are judged once the canary instances made this many
    /// calls under it.
    #[arg(long, value_name = "N", default_value_t = 20, requires = "canary")]
    pub min_calls: u64,
}

impl CanaryArgs {
    /// The canary of an apply request, if asked for.
    pub fn spec(&self) -> Option<pb::CanarySpec> {
        Some(pb::CanarySpec {
            share_percent: self.canary?,
            window_ms: u64::try_from(self.window.as_millis()).unwrap_or(u64::MAX),
            max_reject_ratio: self.max_reject_ratio,
            max_error_ratio: self.max_error_ratio,
            min_calls: self.min_calls,
        })
    }
}

fn parse_window(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if !(Duration::from_secs(1)..=Duration::from_secs(24 * 3600)).contains(&d) {
        return Err(format!("`{s}`: a canary runs from 1s to 24h"));
    }
    Ok(d)
}

fn parse_share(s: &str) -> Result<u32, String> {
    let n = percent(s)?;
    if !(1.0..=100.0).contains(&n) || n.fract() != 0.0 {
        return Err(format!(
            "`{s}`: the share is a whole percentage from 1% to 100%"
        ));
    }
    Ok(n as u32)
}

fn parse_ratio(s: &str) -> Result<f64, String> {
    let n = percent(s)?;
    if !(0.0..=100.0).contains(&n) {
        return Err(format!("`{s}`: from 0% to 100%"));
    }
    Ok(n / 100.0)
}

fn percent(s: &str) -> Result<f64, String> {
    let Some(n) = s.trim().strip_suffix('%') else {
        return Err(format!("`{s}`: write a percentage, e.g. `10%`"));
    };
    n.trim()
        .parse::<f64>()
        .ok()
        .filter(|n| n.is_finite())
        .ok_or_else(|| format!("`{s}` is not a percentage, e.g. `10%`"))
}

/// What `govc apply --canary` prints once the canary started.
pub fn print_started(c: &pb::CanaryView) {
    let spec = c.spec.unwrap_or_default();
    gov_common::outln!(
        "\nCanary of version {} started on {} ({}% of {}); the other instances keep version {}.",
        super::apply::short(&c.version),
        c.instances.join(", "),
        spec.share_percent,
        c.services.join(", "),
        super::apply::short(&c.previous_version),
    );
    gov_common::outln!(
        "It is promoted in {} unless a rule's rejections on the canary exceed the other instances' by {} (errors: {}) first, then it is rolled back.",
        remote::human_ms(spec.window_ms),
        threshold(spec.max_reject_ratio),
        threshold(spec.max_error_ratio),
    );
    gov_common::outln!(
        "Watch it with `govc status`; end it now with `govc canary abort` (or `govc canary promote`)."
    );
}

fn threshold(ratio: f64) -> String {
    if ratio == 0.0 {
        "never (not checked)".into()
    } else {
        gov_proto_percent(ratio)
    }
}

fn gov_proto_percent(ratio: f64) -> String {
    let p = (ratio * 1000.0).round() / 10.0;
    if p.fract() == 0.0 {
        format!("{p:.0}%")
    } else {
        format!("{p:.1}%")
    }
}

/// The canary's lines in `govc status`.
pub fn status_lines(c: &pb::CanaryView, now_unix_ms: u64) -> String {
    let mut out = format!(
        "CANARY {} on {} (the others: {}), {} left, by {}\n",
        super::apply::short(&c.version),
        c.instances.join(", "),
        super::apply::short(&c.previous_version),
        remote::human_ms(c.ends_unix_ms.saturating_sub(now_unix_ms)),
        c.who,
    );
    if c.rules.is_empty() {
        out.push_str("  no calls counted yet\n");
        return out;
    }
    let mut rows = vec![vec![
        "  RULE".to_owned(),
        "CANARY CALLS".into(),
        "REJECTED".into(),
        "ERRORS".into(),
        "P99".into(),
        "WOULD REJECT".into(),
        "OTHERS CALLS".into(),
        "REJECTED".into(),
        "ERRORS".into(),
        "P99".into(),
    ]];
    let empty = pb::CanaryCounts::default();
    for r in &c.rules {
        let (a, b) = (
            r.canary.as_ref().unwrap_or(&empty),
            r.baseline.as_ref().unwrap_or(&empty),
        );
        rows.push(vec![
            format!("  {}", r.rule),
            a.calls.to_string(),
            share(a.rejected, a.calls),
            share(a.errors, a.calls),
            p99(a.p99_ms),
            a.would_reject.to_string(),
            b.calls.to_string(),
            share(b.rejected, b.calls),
            share(b.errors, b.calls),
            p99(b.p99_ms),
        ]);
    }
    out.push_str(&remote::table(&rows));
    out
}

fn share(n: u64, calls: u64) -> String {
    if calls == 0 {
        "-".into()
    } else {
        format!("{n} ({})", gov_proto_percent(n as f64 / calls as f64))
    }
}

fn p99(ms: u64) -> String {
    match ms {
        0 => "-".into(),
        u64::MAX => ">1s".into(),
        ms => format!("<={ms}ms"),
    }
}

/// End the running canary now.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[arg(value_enum)]
    pub action: Action,

    /// Why, for the audit log.
    #[arg(long)]
    pub reason: Option<String>,

    #[command(flatten)]
    pub remote: RemoteArgs,

    /// Who, for the audit log of a govd without tokens (`--insecure`).
    /// Default: `$USER`. With tokens, govd records the token's name.
    #[arg(long, env = "GOV_WHO")]
    pub who: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Action {
    /// Roll the canary instances back to the version in force.
    Abort,
    /// Apply the version on trial to every instance now.
    Promote,
}

pub fn run(args: Args) -> ExitCode {
    let request = pb::CanaryRequest {
        action: match args.action {
            Action::Abort => pb::CanaryAction::Abort,
            Action::Promote => pb::CanaryAction::Promote,
        } as i32,
        who: args.who.clone().unwrap_or_else(super::apply::who_am_i),
        reason: args.reason.clone().unwrap_or_default(),
    };
    let result = remote::block_on(async {
        let mut client = args.remote.connect().await?;
        let request = args.remote.request(request)?;
        client
            .canary(request)
            .await
            .map(tonic::Response::into_inner)
            .map_err(|s| args.remote.status(s))
    });
    match result {
        Ok(Ok(r)) => {
            gov_common::outln!("{}", r.message);
            ExitCode::SUCCESS
        }
        Ok(Err(e)) | Err(e) => remote::fail(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_and_ratios_are_percentages() {
        assert_eq!(parse_share("10%"), Ok(10));
        assert!(parse_share("10").is_err());
        assert!(parse_share("0%").is_err());
        assert!(parse_share("12.5%").is_err());
        assert_eq!(parse_ratio("5%"), Ok(0.05));
        assert_eq!(parse_ratio("0%"), Ok(0.0));
        assert!(parse_ratio("150%").is_err());
        assert!(parse_ratio("NaN%").is_err());
        assert!(parse_window("500ms").is_err());
        assert!(parse_window("25h").is_err());
        assert_eq!(parse_window("5m"), Ok(Duration::from_secs(300)));
    }
}
