//! `govc status`: what the control plane knows now, like
//! `istioctl proxy-status`: the applied version, every agent with the
//! version it enforces and its sync state, tripped fuses and engaged limits
//! with the time left before they release themselves.

use std::process::ExitCode;

use gov_proto::v1 as pb;

use crate::cmd::apply::{short, unsaved_detail};
use crate::remote::{self, RemoteArgs, human_ms, sync_name};
use crate::report::Output;

/// Show agents, sync state, tripped fuses and engaged limits.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Only this service.
    #[arg(long, short = 's', value_name = "SERVICE")]
    pub service: Option<String>,

    /// Every agent's row, however many (by default, beyond 100 agents, a
    /// count per service and state and the agents not SYNCED, at most 50).
    #[arg(long, conflicts_with = "summary")]
    pub agents: bool,

    /// The count per service and state and the agents not SYNCED (at most
    /// 50), however few agents there are.
    #[arg(long)]
    pub summary: bool,

    #[command(flatten)]
    pub remote: RemoteArgs,

    /// `text` for people, `json` for tools (the `ClusterView` message).
    #[arg(long, short = 'o', value_enum, default_value_t = Output::Text)]
    pub output: Output,
}

/// Up to this many agents `govc status` lists every one (as before
/// summaries); beyond, it summarises.
pub const TABLE_UP_TO: u32 = 100;

/// The most agents not SYNCED a summary lists.
pub const SUMMARY_ROWS: u32 = 50;

/// The agent rows to ask for: every agent (`--agents`, `-o json` for the
/// scripts that read every row), the summary's (`--summary`), or every
/// agent up to [`TABLE_UP_TO`] (one more tells there are more).
fn rows(args: &Args) -> (pb::AgentRows, u32) {
    if args.summary {
        (pb::AgentRows::NotSynced, SUMMARY_ROWS)
    } else if args.agents || args.output == Output::Json {
        (pb::AgentRows::All, 0)
    } else {
        (pb::AgentRows::All, TABLE_UP_TO + 1)
    }
}

pub fn run(args: Args) -> ExitCode {
    let service = args.service.clone().unwrap_or_default();
    let (agent_rows, max_agents) = rows(&args);
    let view = remote::block_on(async {
        let mut client = args.remote.connect().await?;
        let mut ask = async |agent_rows: pb::AgentRows, max_agents: u32| {
            let request = args.remote.request(pb::StatusRequest {
                service: service.clone(),
                agent_rows: agent_rows as i32,
                max_agents,
            })?;
            client
                .status(request)
                .await
                .map(tonic::Response::into_inner)
                .map_err(|s| args.remote.status(s))
        };
        let view = ask(agent_rows, max_agents).await?;
        if max_agents == TABLE_UP_TO + 1 && view.agents_left_out > 0 {
            // More than a table's worth: the summary instead.
            let summary = ask(pb::AgentRows::NotSynced, SUMMARY_ROWS).await?;
            return Ok((summary, true));
        }
        Ok((view, agent_rows == pb::AgentRows::NotSynced))
    });
    let (view, summary) = match view {
        Ok(Ok(v)) => v,
        Ok(Err(e)) | Err(e) => return remote::fail(e),
    };
    if let Some(service) = &args.service
        && knows_nothing_of(&view)
    {
        gov_common::errln!(
            "error: govd knows no service `{service}`: it is not in the applied policy and no agent of it is connected\n  help: `govc status` without `-s` lists every service"
        );
        return ExitCode::FAILURE;
    }
    // Still a readable status: exit 0 like every degraded state govc shows
    // (an UNSAVED agent, a NACK); the warning goes to stderr.
    if let Some(warning) = store_warning(&view) {
        gov_common::errln!("{warning}");
    }
    match args.output {
        Output::Json => match serde_json::to_value(&view)
            .map(table_words)
            .map(|v| store_flags(v, &view))
            .and_then(|v| serde_json::to_string_pretty(&v))
        {
            Ok(json) => gov_common::outln!("{json}"),
            Err(e) => {
                gov_common::errln!("error: cannot encode the view: {e}");
                return ExitCode::FAILURE;
            }
        },
        Output::Text if summary => {
            gov_common::out!("{}", render_summary(&view));
        }
        Output::Text => gov_common::out!("{}", render(&view)),
    }
    ExitCode::SUCCESS
}

/// `value` with the words the tables print (`SYNCED`, `READY`, `OPEN`,
/// `bulkhead`) in place of the proto enum names (`SYNC_STATE_SYNCED`, ...), so
/// that a script reads what a person reads.
fn table_words(mut value: serde_json::Value) -> serde_json::Value {
    let mut words: Vec<(&str, &str)> = Vec::new();
    for n in 0..=5 {
        if let Ok(s) = pb::SyncState::try_from(n) {
            words.push((s.as_str_name(), sync_name(s)));
        }
        if let Ok(p) = pb::Phase::try_from(n) {
            words.push((p.as_str_name(), p.word()));
        }
        if let Ok(f) = pb::FuseState::try_from(n) {
            words.push((f.as_str_name(), fuse_word(f)));
        }
        if let Ok(m) = pb::Mode::try_from(n) {
            words.push((m.as_str_name(), mode_word(m)));
        }
    }
    // Every value a kind can have, so that a new kind needs no change here.
    for n in 0..=i32::from(u8::MAX) {
        if let Ok(k) = pb::RuleKind::try_from(n) {
            words.push((k.as_str_name(), k.word()));
        }
    }
    fn walk(v: &mut serde_json::Value, words: &[(&str, &str)]) {
        match v {
            serde_json::Value::String(s) => {
                if let Some((_, w)) = words.iter().find(|(name, _)| name == s) {
                    *s = (*w).to_owned();
                }
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(|i| walk(i, words)),
            serde_json::Value::Object(map) => map.values_mut().for_each(|i| walk(i, words)),
            _ => {}
        }
    }
    walk(&mut value, &words);
    value
}

/// `value` with the store's `writable` and `leader` written out when false
/// (proto3 JSON leaves out a field at its default), so that a script reads
/// `.store.writable == false` rather than a missing field.
fn store_flags(mut value: serde_json::Value, view: &pb::ClusterView) -> serde_json::Value {
    if let (Some(store), Some(out)) = (&view.store, value.get_mut("store")) {
        out["writable"] = store.writable.into();
        out["leader"] = store.leader.into();
    }
    value
}

/// A fuse state as the table prints it.
fn fuse_word(state: pb::FuseState) -> &'static str {
    match state {
        pb::FuseState::HalfOpen => "HALF-OPEN",
        pb::FuseState::Closed => "CLOSED",
        _ => "OPEN",
    }
}

/// A rule's mode as `-o json` prints it (`shadow`, `enforce`).
fn mode_word(mode: pb::Mode) -> &'static str {
    match mode {
        pb::Mode::Shadow => "shadow",
        pb::Mode::Enforce => "enforce",
        pb::Mode::Unspecified => "unspecified",
    }
}

/// Whether `rule` is in mode shadow in the view.
fn is_shadow(view: &pb::ClusterView, rule: &str) -> bool {
    view.rules
        .iter()
        .any(|r| r.rule == rule && r.mode() == pb::Mode::Shadow)
}

/// `OPEN` or, for a rule in mode shadow, `OPEN (SHADOW)`: a latch that
/// rejects nothing.
fn latch_word(view: &pb::ClusterView, rule: &str, word: &str) -> String {
    if is_shadow(view, rule) {
        format!("{word} (SHADOW)")
    } else {
        word.to_owned()
    }
}

/// The rules in mode shadow: how long, and what they would have rejected.
fn render_shadow(view: &pb::ClusterView, out: &mut String) {
    let shadow: Vec<&pb::RuleView> = view
        .rules
        .iter()
        .filter(|r| r.mode() == pb::Mode::Shadow)
        .collect();
    if shadow.is_empty() {
        return;
    }
    let mut rows = vec![
        ["RULE", "KIND", "MODE", "FOR", "WOULD REJECT", "ADMITTED"]
            .map(String::from)
            .to_vec(),
    ];
    for r in shadow {
        let stats = r.stats.clone().unwrap_or_default();
        let would = stats.shadow_rejected.unwrap_or_default();
        let by_reason = would.by_reason();
        let total = would.total();
        let reasons: Vec<String> = by_reason
            .iter()
            .filter(|(_, n)| *n > 0)
            .map(|(reason, n)| format!("{reason} {n}"))
            .collect();
        rows.push(vec![
            r.rule.clone(),
            r.kind().word().into(),
            "SHADOW".into(),
            if r.shadow_since_unix_ms == 0 {
                "-".into()
            } else {
                human_ms(view.at_unix_ms.saturating_sub(r.shadow_since_unix_ms))
            },
            if reasons.is_empty() {
                total.to_string()
            } else {
                format!("{total} ({})", reasons.join(", "))
            },
            stats.admitted.to_string(),
        ]);
    }
    out.push('\n');
    out.push_str(&remote::table(&rows));
}

/// The rules that expire: when, and the time left (`expired` once it has
/// passed: no agent enforces them).
fn render_expiring(view: &pb::ClusterView, out: &mut String) {
    let expiring: Vec<&pb::RuleView> = view
        .rules
        .iter()
        .filter(|r| r.expires_at_unix_ms > 0)
        .collect();
    if expiring.is_empty() {
        return;
    }
    let mut rows = vec![
        ["RULE", "KIND", "EXPIRES (UTC)", "LEFT"]
            .map(String::from)
            .to_vec(),
    ];
    for r in expiring {
        rows.push(vec![
            r.rule.clone(),
            r.kind().word().into(),
            gov_common::instant::Utc(r.expires_at_unix_ms).to_string(),
            match r.expires_at_unix_ms.checked_sub(view.at_unix_ms) {
                Some(left) if left > 0 => gov_common::instant::left(left),
                _ => "expired".into(),
            },
        ]);
    }
    out.push('\n');
    out.push_str(&remote::table(&rows));
}

/// The slow-start weight as a percentage (`-` before its lifecycle said one).
fn weight(a: &pb::AgentView) -> String {
    match (a.phase(), a.weight_milli_percent) {
        (pb::Phase::Unspecified | pb::Phase::Starting, _) => "-".into(),
        (_, w) => format!("{}%", w / 1000),
    }
}

/// The callers a removal waits for, in the words of `-o json`'s
/// `removal_waiting_on`.
fn removal_waiting_on(a: &pb::AgentView) -> String {
    format!(
        "removal waiting on {} (not yet acknowledged the endpoints without it)",
        a.removal_waiting_on.join(", ")
    )
}

/// Whether a view filtered by service holds nothing at all: no agent, rule,
/// fuse or limit (the service is unknown, or misspelt).
fn knows_nothing_of(view: &pb::ClusterView) -> bool {
    view.agents.is_empty()
        && view.agent_counts.is_empty()
        && view.rules.is_empty()
        && view.fuses.is_empty()
        && view.limits.is_empty()
}

/// The store and its health: `etcd://HOSTS/PREFIX: quorum 1s ago, leader b
/// (this replica), last write 3s ago`, or what fails and since when.
fn store_line(store: &pb::StoreHealth, now: u64) -> String {
    let ago = |then: u64| match then {
        0 => "never since govd started".to_owned(),
        then => format!("{} ago", human_ms(now.saturating_sub(then))),
    };
    let etcd = store.store.starts_with("etcd://");
    let mut parts = Vec::new();
    match (store.writable, etcd) {
        (true, true) => parts.push(format!("quorum {}", ago(store.quorum_unix_ms))),
        (true, false) => parts.push("writable".to_owned()),
        (false, true) => parts.push(format!(
            "NO QUORUM since {} (last quorum {})",
            ago(store.failing_since_unix_ms),
            ago(store.quorum_unix_ms)
        )),
        (false, false) => parts.push(format!(
            "NOT WRITABLE since {}",
            ago(store.failing_since_unix_ms)
        )),
    }
    if etcd {
        let leader = match (store.leader_name.as_str(), store.leader) {
            (_, true) => "this replica",
            ("", false) => "unknown",
            (name, false) => name,
        };
        // Without a quorum, who leads is what this replica last knew.
        parts.push(match (store.writable, store.leader) {
            (true, true) => "this replica leads".to_owned(),
            (true, false) => format!("leader {leader}"),
            (false, _) => format!("leader when last known {leader}"),
        });
    }
    parts.push(format!("last write {}", ago(store.last_write_unix_ms)));
    if store.writable && !store.last_error.is_empty() {
        parts.push(format!("last failure {}", ago(store.last_error_unix_ms)));
    }
    let line = format!("{}: {}", store.store, parts.join(", "));
    gov_proto::printable::printable(&line).into_owned()
}

/// The warning `govc status` prints (to stderr) when govd's store cannot
/// take writes: applies and releases fail until it can.
fn store_warning(view: &pb::ClusterView) -> Option<String> {
    let store = view.store.as_ref().filter(|s| !s.writable)?;
    let since = human_ms(view.at_unix_ms.saturating_sub(store.failing_since_unix_ms));
    let (what, help) = if store.store.starts_with("etcd://") {
        (
            format!("etcd has no quorum from this replica since {since} ago"),
            "bring a majority of the etcd members of govd's --store back, or check this replica's network to them; see docs/operations.md, \"Replicas on etcd\"",
        )
    } else {
        (
            format!("govd cannot write its state directory since {since} ago"),
            "make govd's --state-dir writable (or free disk space); see docs/operations.md, \"State and failure behaviour\"",
        )
    };
    Some(format!(
        "warning: {what}: applies and releases will fail\n  cause: {}\n  help: {help}",
        gov_proto::printable::printable(&store.last_error)
    ))
}

/// The text form (a pure function of the view, so it can be tested).
/// Where each service reads its consumers from, whether that proves
/// anything, and how many of its instances take mutual TLS (which `peer`
/// and `trusted from peer` need).
fn render_consumers(view: &pb::ClusterView, out: &mut String) {
    if view.consumer_sources.is_empty() {
        return;
    }
    let mut rows = vec![
        ["SERVICE", "CONSUMER FROM", "VERIFIED", "MTLS"]
            .map(String::from)
            .to_vec(),
    ];
    let mut sources: Vec<_> = view.consumer_sources.iter().collect();
    sources.sort();
    for (service, source) in sources {
        let (instances, mtls) = instances(view, service);
        let needs_peer = source.starts_with("peer") || source.contains("trusted from peer");
        let verified = if source.starts_with("header") && !source.contains("trusted from peer") {
            "no (any client can claim any consumer)"
        } else {
            "yes"
        };
        let mut mtls_word = format!("{mtls} of {instances} instances");
        if needs_peer && mtls < instances {
            mtls_word.push_str(" (the others verify no caller: --inbound-mtls)");
        }
        rows.push(vec![
            service.clone(),
            source.clone(),
            verified.into(),
            mtls_word,
        ]);
    }
    out.push('\n');
    out.push_str(&remote::table(&rows));
}

/// The instances of `service` and how many of them take mutual TLS: from
/// the counts (a summary carries no row of a SYNCED agent), or from the
/// rows of a govd older than the counts.
fn instances(view: &pb::ClusterView, service: &str) -> (u64, u64) {
    if view.agent_counts.is_empty() {
        let rows = view.agents.iter().filter(|a| a.service == service);
        let (n, mtls) = rows.fold((0, 0), |(n, m), a| (n + 1, m + u64::from(a.inbound_mtls)));
        return (n, mtls);
    }
    view.agent_counts
        .iter()
        .filter(|c| c.service == service)
        .fold((0, 0), |(n, m), c| {
            (n + u64::from(c.agents), m + u64::from(c.inbound_mtls))
        })
}

/// The states a summary counts, in its columns' order.
const COUNTED: [pb::SyncState; 5] = [
    pb::SyncState::Synced,
    pb::SyncState::Stale,
    pb::SyncState::Nacked,
    pb::SyncState::Unsaved,
    pb::SyncState::Disconnected,
];

/// The agents per service and state, then the rows of those not SYNCED
/// (the view of a `NotSynced` request): readable at 10,000 agents.
fn agents_summary(view: &pb::ClusterView, out: &mut String) {
    if view.agent_counts.is_empty() {
        out.push_str("No agents.\n");
        return;
    }
    let mut header = vec!["SERVICE".to_owned(), "AGENTS".to_owned()];
    header.extend(COUNTED.iter().map(|s| sync_name(*s).to_owned()));
    let mut rows = vec![header];
    let mut services: Vec<&str> = view
        .agent_counts
        .iter()
        .map(|c| c.service.as_str())
        .collect();
    services.dedup();
    let count = |service: &str, state: Option<pb::SyncState>| -> u64 {
        view.agent_counts
            .iter()
            .filter(|c| c.service == service && state.is_none_or(|s| c.state() == s))
            .map(|c| u64::from(c.agents))
            .sum()
    };
    for service in &services {
        let mut row = vec![(*service).to_owned(), count(service, None).to_string()];
        row.extend(COUNTED.iter().map(|s| count(service, Some(*s)).to_string()));
        rows.push(row);
    }
    out.push_str(&remote::table(&rows));
    let listed = view.agents.len() as u64;
    let not_synced = listed + u64::from(view.agents_left_out);
    out.push('\n');
    if not_synced == 0 {
        out.push_str("Every agent is SYNCED (`govc status --agents` lists them).\n");
        return;
    }
    if view.agents_left_out == 0 {
        out.push_str(&format!("Not SYNCED: {not_synced}.\n"));
    } else {
        out.push_str(&format!(
            "Not SYNCED: {not_synced}, the first {listed} listed (`govc status --agents` lists every agent, with `-s SERVICE` one service's).\n"
        ));
    }
    agents_table(view, out);
}

/// `govc status` beyond [`TABLE_UP_TO`] agents, or with `--summary`: the
/// agents counted per service and state and those not SYNCED listed, then
/// what [`render`] shows after the agents.
pub fn render_summary(view: &pb::ClusterView) -> String {
    render_with(view, agents_summary)
}

/// `govc status` with every agent's row.
pub fn render(view: &pb::ClusterView) -> String {
    render_with(view, |view, out| {
        if view.agents.is_empty() {
            out.push_str("No agents.\n");
        } else {
            agents_table(view, out);
        }
    })
}

/// One row per agent of the view.
fn agents_table(view: &pb::ClusterView, out: &mut String) {
    let mut rows = vec![
        [
            "SERVICE",
            "INSTANCE",
            "ADDRESS",
            "STATE",
            "PHASE",
            "WEIGHT",
            "VERSION",
            "LAST GOOD",
            "DETAIL",
        ]
        .map(String::from)
        .to_vec(),
    ];
    for a in &view.agents {
        let mut detail = match (a.rule.is_empty(), a.reason.is_empty()) {
            // The agent's reason usually names the rule already (`rule `x`: ...`).
            (false, _) if !a.reason.contains(&a.rule) => format!("rule {}: {}", a.rule, a.reason),
            (false, _) => a.reason.clone(),
            (true, false) if a.state() == pb::SyncState::Unsaved => unsaved_detail(&a.reason),
            (true, false) => a.reason.clone(),
            (true, true) => String::new(),
        };
        if !a.removal_waiting_on.is_empty() {
            if !detail.is_empty() {
                detail.push_str("; ");
            }
            detail.push_str(&removal_waiting_on(a));
        }
        rows.push(vec![
            a.service.clone(),
            a.instance.clone(),
            if a.address.is_empty() {
                "-".into()
            } else {
                a.address.clone()
            },
            sync_name(a.state()).into(),
            a.phase().word().into(),
            weight(a),
            short(&a.version),
            short(&a.last_good_version),
            detail,
        ]);
    }
    out.push_str(&remote::table(&rows));
}

fn render_with(view: &pb::ClusterView, agents: impl Fn(&pb::ClusterView, &mut String)) -> String {
    let mut out = String::new();
    let version = if view.version.is_empty() {
        "nothing applied yet".to_owned()
    } else {
        view.version.clone()
    };
    out.push_str(&format!("Applied version: {version}\n"));
    if let Some(store) = &view.store {
        out.push_str(&format!("Store: {}\n", store_line(store, view.at_unix_ms)));
    }
    if let Some(canary) = &view.canary {
        out.push_str(&crate::cmd::canary::status_lines(canary, view.at_unix_ms));
    }
    out.push('\n');
    agents(view, &mut out);
    render_consumers(view, &mut out);
    let now = view.at_unix_ms;
    out.push('\n');
    if view.fuses.is_empty() {
        out.push_str("No tripped fuses.\n");
    } else {
        let mut rows = vec![
            ["FUSE", "STATE", "FOR", "RECOVERS IN", "REASON"]
                .map(String::from)
                .to_vec(),
        ];
        for f in &view.fuses {
            rows.push(vec![
                f.rule.clone(),
                latch_word(view, &f.rule, fuse_word(f.state())),
                human_ms(now.saturating_sub(f.since_unix_ms)),
                if f.remaining_ms == 0 {
                    "manual (govc release fuse)".into()
                } else {
                    human_ms(f.remaining_ms)
                },
                f.reason.clone(),
            ]);
        }
        out.push_str(&remote::table(&rows));
    }
    if view.limits.is_empty() {
        out.push_str("No engaged limits.\n");
    } else {
        let mut rows = vec![
            ["LIMIT", "KEY", "FOR", "RELEASES IN", "REASON"]
                .map(String::from)
                .to_vec(),
        ];
        for l in &view.limits {
            rows.push(vec![
                latch_word(view, &l.rule, &l.rule),
                // A limit keyed by consumer or called service: one row per
                // latched key (`govc release limit RULE --key KEY`).
                if l.key.is_empty() {
                    "-".into()
                } else {
                    l.key.clone()
                },
                human_ms(now.saturating_sub(l.since_unix_ms)),
                if l.remaining_ms == 0 {
                    "manual (govc release limit)".into()
                } else {
                    human_ms(l.remaining_ms)
                },
                l.reason.clone(),
            ]);
        }
        out.push_str(&remote::table(&rows));
    }
    render_shadow(view, &mut out);
    render_expiring(view, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_uses_the_words_of_the_tables() {
        let view = pb::ClusterView {
            agents: vec![pb::AgentView {
                state: pb::SyncState::Synced as i32,
                phase: pb::Phase::Warming as i32,
                ..Default::default()
            }],
            fuses: vec![pb::FuseView {
                state: pb::FuseState::HalfOpen as i32,
                ..Default::default()
            }],
            ..Default::default()
        };
        let json = table_words(serde_json::to_value(&view).unwrap()).to_string();
        assert!(json.contains("\"SYNCED\""), "{json}");
        assert!(json.contains("\"WARMING\""), "{json}");
        assert!(json.contains("\"HALF-OPEN\""), "{json}");
        assert!(
            !json.contains("SYNC_STATE_") && !json.contains("PHASE_"),
            "{json}"
        );
    }

    #[test]
    fn consumers_say_what_they_prove_and_which_instances_verify_callers() {
        let agent = |service: &str, instance: &str, mtls: bool| pb::AgentView {
            service: service.into(),
            instance: instance.into(),
            inbound_mtls: mtls,
            ..Default::default()
        };
        let view = pb::ClusterView {
            agents: vec![
                agent("inv", "inv-1", true),
                agent("inv", "inv-2", false),
                agent("web", "web-1", false),
            ],
            consumer_sources: [
                ("inv".to_string(), "peer on invalid reject".to_string()),
                ("web".to_string(), "header \"x-gov-consumer\"".to_string()),
            ]
            .into(),
            ..Default::default()
        };
        let text = render(&view);
        let line = |service: &str| {
            text.lines()
                .find(|l| l.starts_with(service) && l.contains("of"))
                .unwrap_or_else(|| panic!("no consumer row of {service}:\n{text}"))
                .to_owned()
        };
        let inv = line("inv ");
        assert!(
            inv.contains("peer on invalid reject") && inv.contains("yes"),
            "{inv}"
        );
        assert!(
            inv.contains("1 of 2 instances (the others verify no caller"),
            "{inv}"
        );
        let web = line("web ");
        assert!(
            web.contains("no (any client can claim any consumer)"),
            "{web}"
        );
        assert!(
            web.contains("0 of 1 instances") && !web.contains("others"),
            "{web}"
        );
    }

    #[test]
    fn ten_thousand_agents_read_as_a_count_per_service_and_state() {
        // What govd answers `govc status` at 10,000 agents (104 STALE):
        // the counts, and the first 50 agents not SYNCED.
        let count = |service: &str, state: pb::SyncState, agents: u32| pb::AgentCount {
            service: service.into(),
            state: state as i32,
            agents,
            inbound_mtls: 0,
        };
        let stale = |i: usize| pb::AgentView {
            service: "order".into(),
            instance: format!("order-{i:05}"),
            address: "10.0.0.1:8080".into(),
            state: pb::SyncState::Stale as i32,
            version: "bbbbbbbbbbbbbbbb".into(),
            last_good_version: "aaaaaaaaaaaaaaaa".into(),
            ..Default::default()
        };
        let view = pb::ClusterView {
            version: "bbbbbbbbbbbbbbbb".into(),
            agents: (0..50).map(stale).collect(),
            agents_left_out: 54,
            agent_counts: vec![
                count("order", pb::SyncState::Synced, 7_396),
                count("order", pb::SyncState::Stale, 104),
                count("pay", pb::SyncState::Synced, 2_500),
            ],
            consumer_sources: [("pay".to_owned(), "peer on invalid reject".to_owned())].into(),
            ..Default::default()
        };
        let text = render_summary(&view);
        assert!(
            text.contains("SERVICE  AGENTS  SYNCED  STALE  NACKED  UNSAVED  DISCONNECTED"),
            "{text}"
        );
        assert!(
            text.contains("order    7500    7396    104    0       0        0"),
            "{text}"
        );
        assert!(text.contains("pay      2500    2500    0"), "{text}");
        assert!(
            text.contains(
                "Not SYNCED: 104, the first 50 listed (`govc status --agents` lists every agent"
            ),
            "{text}"
        );
        assert!(text.contains("order-00049"), "{text}");
        assert!(
            text.contains("0 of 2500 instances (the others verify no caller"),
            "the instances come from the counts: {text}"
        );
        let lines = text.lines().count();
        assert!(lines < 80, "{lines} lines:\n{text}");

        let all_synced = pb::ClusterView {
            agent_counts: vec![count("order", pb::SyncState::Synced, 10_000)],
            ..Default::default()
        };
        let text = render_summary(&all_synced);
        assert!(
            text.contains("Every agent is SYNCED (`govc status --agents` lists them)."),
            "{text}"
        );
        assert!(
            !knows_nothing_of(&all_synced),
            "agents without rows are known"
        );
    }

    #[test]
    fn status_reads_like_proxy_status() {
        let view = pb::ClusterView {
            at_unix_ms: 10_000_000,
            version: "0123456789abcdef".into(),
            agents: vec![
                pb::AgentView {
                    service: "order".into(),
                    instance: "order-1".into(),
                    address: "127.0.0.1:9001".into(),
                    state: pb::SyncState::Synced as i32,
                    version: "aaaaaaaaaaaaaaaa".into(),
                    last_good_version: "aaaaaaaaaaaaaaaa".into(),
                    phase: pb::Phase::Warming as i32,
                    weight_milli_percent: 40_000,
                    ..Default::default()
                },
                pb::AgentView {
                    service: "order".into(),
                    instance: "order-2".into(),
                    state: pb::SyncState::Nacked as i32,
                    reason: "scope cluster needs redis".into(),
                    rule: "order/crm".into(),
                    version: "bbbbbbbbbbbbbbbb".into(),
                    last_good_version: "aaaaaaaaaaaaaaaa".into(),
                    ..Default::default()
                },
            ],
            fuses: vec![pb::FuseView {
                rule: "order/mdm".into(),
                state: pb::FuseState::Open as i32,
                since_unix_ms: 9_940_000,
                reason: "system_errors 10 >= 10 over 10s".into(),
                ..Default::default()
            }],
            limits: vec![pb::LimitView {
                rule: "order/crm".into(),
                since_unix_ms: 9_000_000,
                remaining_ms: 6_200_000,
                reason: "calls 100 per 1s".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let text = render(&view);
        assert!(text.contains("Applied version: 0123456789abcdef"), "{text}");
        assert!(
            text.contains(
                "order-1   127.0.0.1:9001  SYNCED  WARMING  40%     aaaaaaaaaaaa  aaaaaaaaaaaa"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "NACKED  -        -       bbbbbbbbbbbb  aaaaaaaaaaaa  rule order/crm: scope cluster needs redis"
            ),
            "{text}"
        );
        assert!(
            text.contains("order/mdm  OPEN   1m00s  manual (govc release fuse)"),
            "{text}"
        );
        assert!(text.contains("order/crm  -    16m40s  1h43m"), "{text}");
    }

    #[test]
    fn an_unsaved_agent_shows_what_it_enforces_and_what_a_restart_goes_back_to() {
        let view = pb::ClusterView {
            version: "bbbbbbbbbbbbbbbb".into(),
            agents: vec![pb::AgentView {
                service: "order".into(),
                instance: "order-1".into(),
                state: pb::SyncState::Unsaved as i32,
                reason: "no space left on device".into(),
                version: "bbbbbbbbbbbbbbbb".into(),
                last_good_version: "aaaaaaaaaaaaaaaa".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let text = render(&view);
        assert!(
            text.contains(
                "UNSAVED  -      -       bbbbbbbbbbbb  aaaaaaaaaaaa  not saved, lost on restart: no space left on device"
            ),
            "{text}"
        );
        let json = table_words(serde_json::to_value(&view).unwrap()).to_string();
        assert!(json.contains("\"state\":\"UNSAVED\""), "{json}");
    }

    #[test]
    fn shadow_rules_show_how_long_and_what_they_would_have_rejected() {
        let rule = |name: &str, kind: pb::RuleKind, mode: pb::Mode, since: u64| pb::RuleView {
            rule: name.into(),
            kind: kind as i32,
            mode: mode as i32,
            shadow_since_unix_ms: since,
            stats: Some(pb::RuleStats {
                admitted: 900,
                shadow_rejected: (mode == pb::Mode::Shadow).then(|| pb::Rejections {
                    limit_calls: 120,
                    limit_bytes: 3,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let view = pb::ClusterView {
            at_unix_ms: 10_000_000,
            rules: vec![
                rule(
                    "order/trial",
                    pb::RuleKind::Limit,
                    pb::Mode::Shadow,
                    9_100_000,
                ),
                rule("order/slow", pb::RuleKind::Bulkhead, pb::Mode::Enforce, 0),
            ],
            limits: vec![pb::LimitView {
                rule: "order/trial".into(),
                since_unix_ms: 9_990_000,
                ..Default::default()
            }],
            ..Default::default()
        };
        let text = render(&view);
        assert!(
            text.contains(
                "order/trial  limit  SHADOW  15m00s  123 (limit_calls 120, limit_bytes 3)  900"
            ),
            "{text}"
        );
        assert!(!text.contains("order/slow"), "{text}");
        // Its latch rejects nothing: marked.
        assert!(text.contains("order/trial (SHADOW)  -    10s"), "{text}");
        let json = table_words(serde_json::to_value(&view).unwrap());
        assert_eq!(json["rules"][0]["mode"], "shadow");
        assert_eq!(json["rules"][0]["shadow_since_unix_ms"], 9_100_000);
        assert_eq!(json["rules"][1]["mode"], "enforce");
    }

    #[test]
    fn the_store_line_says_what_fails_since_when_and_a_warning_says_what_it_breaks() {
        let etcd = |writable: bool| pb::ClusterView {
            at_unix_ms: 1_000_000,
            version: "0123456789abcdef".into(),
            store: Some(pb::StoreHealth {
                store: "etcd://127.0.0.1:2379,127.0.0.1:2380/gov".into(),
                writable,
                failing_since_unix_ms: if writable { 0 } else { 986_000 },
                last_error: "etcd (http://127.0.0.1:2379) failed to read the leader key".into(),
                last_error_unix_ms: 999_000,
                last_write_unix_ms: 880_000,
                quorum_unix_ms: if writable { 999_000 } else { 984_000 },
                leader: false,
                leader_name: "b".into(),
            }),
            ..Default::default()
        };
        let text = render(&etcd(true));
        assert!(
            text.starts_with(
                "Applied version: 0123456789abcdef\nStore: etcd://127.0.0.1:2379,127.0.0.1:2380/gov: quorum 1s ago, leader b, last write 2m00s ago, last failure 1s ago\n\n"
            ),
            "{text}"
        );
        assert_eq!(store_warning(&etcd(true)), None);
        let text = render(&etcd(false));
        assert!(
            text.contains(
                "gov: NO QUORUM since 14s ago (last quorum 16s ago), leader when last known b, last write 2m00s ago\n"
            ),
            "{text}"
        );
        let warning = store_warning(&etcd(false)).unwrap();
        assert!(
            warning.starts_with(
                "warning: etcd has no quorum from this replica since 14s ago: applies and releases will fail\n  cause: etcd (http://127.0.0.1:2379) failed to read the leader key\n  help: "
            ),
            "{warning}"
        );
        let view = etcd(false);
        let json = store_flags(serde_json::to_value(&view).unwrap(), &view);
        assert_eq!(json["store"]["writable"], false);
        assert_eq!(json["store"]["leader"], false);
        assert_eq!(json["store"]["failing_since_unix_ms"], 986_000);

        let dir = pb::ClusterView {
            at_unix_ms: 1_000_000,
            store: Some(pb::StoreHealth {
                store: "directory /var/lib/gov".into(),
                writable: false,
                failing_since_unix_ms: 940_000,
                last_error: "cannot create `/var/lib/gov/.state.json.tmp.7`: Read-only file system (os error 30)".into(),
                leader: true,
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(
            render(&dir).contains(
                "Store: directory /var/lib/gov: NOT WRITABLE since 1m00s ago, last write never since govd started\n"
            ),
            "{}",
            render(&dir)
        );
        let warning = store_warning(&dir).unwrap();
        assert!(
            warning.starts_with(
                "warning: govd cannot write its state directory since 1m00s ago: applies and releases will fail\n  cause: cannot create `/var/lib/gov/.state.json.tmp.7`: Read-only"
            ),
            "{warning}"
        );
        // A govd from before the store's health: no line.
        assert!(!render(&pb::ClusterView::default()).contains("Store:"));
    }

    #[test]
    fn a_removal_names_the_callers_it_waits_for_in_the_table_and_in_json() {
        let view = pb::ClusterView {
            agents: vec![pb::AgentView {
                service: "inv".into(),
                instance: "inv-b".into(),
                state: pb::SyncState::Synced as i32,
                phase: pb::Phase::Draining as i32,
                removal_waiting_on: vec!["web/web-1".into(), "web/web-2".into()],
                ..Default::default()
            }],
            ..Default::default()
        };
        let text = render(&view);
        assert!(
            text.contains("removal waiting on web/web-1, web/web-2"),
            "{text}"
        );
        let json = table_words(serde_json::to_value(&view).unwrap()).to_string();
        assert!(
            json.contains(r#""removal_waiting_on":["web/web-1","web/web-2"]"#),
            "{json}"
        );
    }
}
