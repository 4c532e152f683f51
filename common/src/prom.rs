//! The Prometheus text exposition format, written by hand, for the `/metrics` of
//! `govd` and `gov-agent`, and the standard `process_*` families.
//!
//! A hand-written encoder is a screenful of code and needs no registry kept in
//! sync with rules that come and go with every config: each binary reads its
//! state when scraped and writes families with [`Encoder`].

use std::fmt::Write as _;

/// Writes metric families in the text format into a `String`.
#[derive(Debug, Default)]
pub struct Encoder {
    out: String,
}

impl Encoder {
    /// Starts a family: its `# HELP` and `# TYPE` lines.
    pub fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.out, "# HELP {name} {help}");
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
    }

    /// Writes one sample with `labels` (name, value) pairs.
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl Value) {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (label, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                self.out.push_str(label);
                self.out.push_str("=\"");
                escape_into(&mut self.out, v);
                self.out.push('"');
            }
            self.out.push('}');
        }
        self.out.push(' ');
        value.write(&mut self.out);
        self.out.push('\n');
    }

    pub fn finish(self) -> String {
        self.out
    }
}

/// A sample value.
pub trait Value {
    fn write(&self, out: &mut String);
}

impl Value for u64 {
    fn write(&self, out: &mut String) {
        let _ = write!(out, "{self}");
    }
}

impl Value for f64 {
    fn write(&self, out: &mut String) {
        if self.is_infinite() {
            out.push_str(if *self > 0.0 { "+Inf" } else { "-Inf" });
        } else {
            let _ = write!(out, "{self}");
        }
    }
}

/// Escapes a label value: backslash, double quote and newline.
fn escape_into(out: &mut String, value: &str) {
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// Renders a bucket bound the way Prometheus clients do (`0.01`, `1`, `+Inf`).
pub fn le_label(bound: f64) -> String {
    let mut s = String::new();
    bound.write(&mut s);
    s
}

#[cfg(feature = "daemon")]
pub use process::render_process;

#[cfg(feature = "daemon")]
mod process {
    use super::Encoder;

    /// The `process_*` families every Prometheus client library exports, read
    /// from `/proc/self` (Linux). A value that cannot be read is left out.
    pub fn render_process(enc: &mut Encoder) {
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
        // Fields after the command name, which is in parentheses and may hold spaces.
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map(|(_, rest)| rest.split_whitespace().collect())
            .unwrap_or_default();
        // `fields[0]` is field 3 of proc(5), the state.
        let field = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<u64>().ok());
        let ticks = rustix::param::clock_ticks_per_second() as f64;
        if let (Some(utime), Some(stime)) = (field(14), field(15)) {
            enc.family(
                "process_cpu_seconds_total",
                "counter",
                "Total user and system CPU time spent in seconds.",
            );
            enc.sample(
                "process_cpu_seconds_total",
                &[],
                (utime + stime) as f64 / ticks,
            );
        }
        if let Some(rss) = field(24) {
            enc.family(
                "process_resident_memory_bytes",
                "gauge",
                "Resident memory size in bytes.",
            );
            enc.sample(
                "process_resident_memory_bytes",
                &[],
                rss.saturating_mul(rustix::param::page_size() as u64),
            );
        }
        if let Some(vsize) = field(23) {
            enc.family(
                "process_virtual_memory_bytes",
                "gauge",
                "Virtual memory size in bytes.",
            );
            enc.sample("process_virtual_memory_bytes", &[], vsize);
        }
        let boot = std::fs::read_to_string("/proc/stat").ok().and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("btime "))
                .and_then(|v| v.trim().parse::<u64>().ok())
        });
        if let (Some(boot), Some(start)) = (boot, field(22)) {
            enc.family(
                "process_start_time_seconds",
                "gauge",
                "Start time of the process since unix epoch in seconds.",
            );
            enc.sample(
                "process_start_time_seconds",
                &[],
                boot as f64 + start as f64 / ticks,
            );
        }
        if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
            enc.family(
                "process_open_fds",
                "gauge",
                "Number of open file descriptors.",
            );
            enc.sample("process_open_fds", &[], dir.count() as u64);
        }
        let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile);
        if let Some(max) = limit.current {
            enc.family(
                "process_max_fds",
                "gauge",
                "Maximum number of open file descriptors.",
            );
            enc.sample("process_max_fds", &[], max);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_families_samples_and_escapes_labels() {
        let mut enc = Encoder::default();
        enc.family(
            "gov_agent_rule_admitted_total",
            "counter",
            "Calls admitted.",
        );
        enc.sample(
            "gov_agent_rule_admitted_total",
            &[("rule", "shop/a\"b")],
            3_u64,
        );
        enc.sample("gov_agent_up", &[], 1_u64);
        enc.sample("x_bucket", &[("le", &le_label(f64::INFINITY))], 0.5_f64);
        assert_eq!(
            enc.finish(),
            "# HELP gov_agent_rule_admitted_total Calls admitted.\n\
             # TYPE gov_agent_rule_admitted_total counter\n\
             gov_agent_rule_admitted_total{rule=\"shop/a\\\"b\"} 3\n\
             gov_agent_up 1\n\
             x_bucket{le=\"+Inf\"} 0.5\n",
        );
        assert_eq!(le_label(0.01), "0.01");
        assert_eq!(le_label(1.0), "1");
    }

    #[cfg(feature = "daemon")]
    #[test]
    fn process_families_are_read_from_proc() {
        let mut enc = Encoder::default();
        render_process(&mut enc);
        let text = enc.finish();
        for family in [
            "process_cpu_seconds_total ",
            "process_resident_memory_bytes ",
            "process_start_time_seconds ",
            "process_open_fds ",
            "process_max_fds ",
        ] {
            assert!(
                text.contains(&format!("\n{family}")),
                "no {family} in\n{text}"
            );
        }
    }
}
