//! Small text formats shared by the screens.

/// A duration as operators read it: `850ms`, `12s`, `3m05s`, `2h00m`, `3d04h`.
/// The TUI and `govc status` both print durations with it.
pub fn duration(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        _ if ms < 1000 => format!("{ms}ms"),
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        3600..86_400 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{:02}h", s / 86_400, s % 86_400 / 3600),
    }
}

/// "12s ago" for a past Unix time, "-" when unknown (0).
pub(crate) fn ago(now_ms: u64, then_ms: u64) -> String {
    if then_ms == 0 {
        return "-".into();
    }
    let d = now_ms.saturating_sub(then_ms);
    if d < 1000 {
        "now".into()
    } else {
        format!("{} ago", duration(d))
    }
}

/// The first 8 characters of a content hash, after any `algo:` prefix.
pub(crate) fn short_version(v: &str) -> &str {
    let v = v.rsplit_once(':').map_or(v, |(_, h)| h);
    v.get(..8).unwrap_or(v)
}

/// A rate with at most 3 significant digits: `0`, `0.4`, `12.5`, `340`, `1.2k`.
pub(crate) fn rate(r: f64) -> String {
    if r <= 0.0 {
        "0".into()
    } else if r < 10.0 {
        let s = format!("{r:.1}");
        s.strip_suffix(".0").map_or(s.clone(), str::to_owned)
    } else if r < 1000.0 {
        format!("{r:.0}")
    } else if r < 1_000_000.0 {
        format!("{:.1}k", r / 1000.0)
    } else {
        format!("{:.1}M", r / 1_000_000.0)
    }
}

/// Cuts `s` to at most `max` characters, marking the cut with `…`.
pub(crate) fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_owned();
    }
    let mut out: String = s.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// A text bar `█████░░░░░` of `width` cells filled to `value / max`.
pub(crate) fn bar(value: u64, max: u64, width: usize) -> String {
    let filled = if max == 0 {
        0
    } else {
        let f = u128::from(value.min(max)) * width as u128 / u128::from(max);
        usize::try_from(f).unwrap_or(width)
    };
    let mut s = "█".repeat(filled);
    s.push_str(&"░".repeat(width - filled));
    s
}

/// The label of latency bucket `i` (`≤10ms`, ..., `>1s`), from the wire's
/// bounds ([`gov_proto::LATENCY_BOUNDS_MS`]; the last bucket is open).
pub(crate) fn latency_bound(i: usize) -> String {
    let bounds = gov_proto::LATENCY_BOUNDS_MS;
    match bounds.get(i) {
        Some(ms) => format!("≤{}", duration(*ms)),
        None => format!(">{}", duration(bounds[bounds.len() - 1])),
    }
}

/// The bucket label under which quantile `q` (0..1) of the calls finished;
/// `None` with no calls.
pub(crate) fn quantile_bucket(buckets: &[u64], q: f64) -> Option<String> {
    let total: u64 = buckets.iter().sum();
    if total == 0 {
        return None;
    }
    let rank = ((total as f64) * q).ceil().max(1.0) as u64;
    let mut seen = 0;
    for (i, n) in buckets.iter().enumerate() {
        seen += n;
        if seen >= rank {
            return Some(latency_bound(i));
        }
    }
    Some(latency_bound(buckets.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(duration(850), "850ms");
        assert_eq!(duration(12_000), "12s");
        assert_eq!(duration(185_000), "3m05s");
        assert_eq!(duration(7_200_000), "2h00m");
        assert_eq!(duration(3 * 86_400_000 + 4 * 3_600_000), "3d04h");
        assert_eq!(ago(10_000, 0), "-");
        assert_eq!(ago(10_000, 9_500), "now");
        assert_eq!(ago(10_000, 7_000), "3s ago");
    }

    #[test]
    fn versions_rates_bars() {
        assert_eq!(short_version("sha256:0123456789abcdef"), "01234567");
        assert_eq!(short_version("abc"), "abc");
        assert_eq!(rate(0.0), "0");
        assert_eq!(rate(0.44), "0.4");
        assert_eq!(rate(3.0), "3");
        assert_eq!(rate(340.2), "340");
        assert_eq!(rate(1234.0), "1.2k");
        assert_eq!(bar(5, 10, 10), "█████░░░░░");
        assert_eq!(bar(50, 10, 4), "████");
        assert_eq!(bar(1, 0, 3), "░░░");
        assert_eq!(truncate("abcdef", 4), "abc…");
    }

    #[test]
    fn quantiles() {
        let b = [50, 30, 10, 5, 3, 1, 1, 0];
        assert_eq!(quantile_bucket(&b, 0.5).as_deref(), Some("≤10ms"));
        assert_eq!(quantile_bucket(&b, 0.9).as_deref(), Some("≤50ms"));
        assert_eq!(quantile_bucket(&b, 0.99).as_deref(), Some("≤500ms"));
        let labels: Vec<String> = (0..8).map(latency_bound).collect();
        assert_eq!(
            labels,
            [
                "≤10ms", "≤20ms", "≤50ms", "≤100ms", "≤200ms", "≤500ms", "≤1s", ">1s"
            ]
        );
        assert_eq!(quantile_bucket(&[0; 8], 0.5), None);
    }
}
