//! An adaptive bulkhead's limit over a replay: every move of it, and per
//! interval the range it took and the calls the rule admitted and rejected
//! (by arrival), so the report shows when the limit moved and what it cost.

use std::fmt::Write as _;

use serde::Serialize;

use super::calls::Calls;
use super::sim::{Got, Outcomes};

/// The most intervals a timeline has: longer replays get longer intervals.
const MAX_INTERVALS: u64 = 120;

/// One agent's adaptive limit over the replay.
#[derive(Debug, Serialize)]
pub struct LimitTimeline {
    pub instance: String,
    /// Every move, in time order (the first: the limit it started with).
    pub moves: Vec<LimitMove>,
    /// The length of one of `intervals`, in µs: whole seconds.
    pub interval_us: u64,
    pub intervals: Vec<LimitInterval>,
}

#[derive(Debug, Serialize)]
pub struct LimitMove {
    /// Unix µs (the log's clock), within 5 ms of the move.
    pub at_us: u64,
    pub limit: u32,
}

#[derive(Debug, Serialize)]
pub struct LimitInterval {
    /// Unix µs.
    pub from_us: u64,
    /// The lowest and the highest limit in force in the interval.
    pub limit_min: u32,
    pub limit_max: u32,
    /// Calls of the rule that arrived in the interval.
    pub admitted: u64,
    pub rejected: u64,
}

/// The timeline of `rule` (an index into `out.rules`) in one agent's
/// replay; `None` when the replay saw no limit of it.
pub fn timeline(out: &Outcomes, calls: &Calls, rule: u32, instance: &str) -> Option<LimitTimeline> {
    let moves: Vec<LimitMove> = out
        .limits
        .iter()
        .filter(|&&(r, _, _)| r == rule)
        .map(|&(_, at_us, limit)| LimitMove { at_us, limit })
        .collect();
    let first = moves.first()?;
    let arrivals = out.got.iter().map(|&(i, _)| calls.list[i].t_us);
    let from_us = arrivals
        .clone()
        .min()
        .unwrap_or(first.at_us)
        .min(first.at_us);
    let to_us = arrivals
        .max()
        .unwrap_or(0)
        .max(moves.last().map_or(0, |m| m.at_us));
    let span = to_us.saturating_sub(from_us);
    let secs = span.div_ceil(1_000_000).div_ceil(MAX_INTERVALS).max(1);
    let interval_us = secs * 1_000_000;
    let n = usize::try_from(span / interval_us + 1).unwrap_or(usize::MAX);
    let mut intervals: Vec<LimitInterval> = (0u64..)
        .take(n)
        .map(|k| LimitInterval {
            from_us: from_us.saturating_add(k * interval_us),
            limit_min: u32::MAX,
            limit_max: 0,
            admitted: 0,
            rejected: 0,
        })
        .collect();
    let index = |t_us: u64| usize::try_from(t_us.saturating_sub(from_us) / interval_us).ok();
    // The limit in force over each interval: the one before it, and every
    // move in it.
    let mut k = 0;
    let mut current = first.limit;
    for (slot, interval) in intervals.iter_mut().enumerate() {
        interval.limit_min = current;
        interval.limit_max = current;
        while let Some(m) = moves.get(k)
            && index(m.at_us).is_some_and(|i| i <= slot)
        {
            current = m.limit;
            interval.limit_min = interval.limit_min.min(current);
            interval.limit_max = interval.limit_max.max(current);
            k += 1;
        }
    }
    for &(i, got) in &out.got {
        if let Got::Rejected { rule: r, .. } = got
            && r == rule
            && let Some(slot) = index(calls.list[i].t_us).and_then(|s| intervals.get_mut(s))
        {
            slot.rejected += 1;
        }
    }
    for (i, by) in &out.admitted_by {
        if by.iter().any(|&(r, _)| r == rule)
            && let Some(slot) = index(calls.list[*i].t_us).and_then(|s| intervals.get_mut(s))
        {
            slot.admitted += 1;
        }
    }
    Some(LimitTimeline {
        instance: instance.to_owned(),
        moves,
        interval_us,
        intervals,
    })
}

/// The text report of a timeline, under its rule's lines.
pub fn text(out: &mut String, t: &LimitTimeline, start: &str) {
    let limits = t.moves.iter().map(|m| m.limit);
    let _ = writeln!(
        out,
        "    limit on {}: {} moves, from {} to {} (lowest {}, highest {}); per {}s from {start}:",
        t.instance,
        t.moves.len().saturating_sub(1),
        t.moves.first().map_or(0, |m| m.limit),
        t.moves.last().map_or(0, |m| m.limit),
        limits.clone().min().unwrap_or(0),
        limits.max().unwrap_or(0),
        t.interval_us / 1_000_000,
    );
    let Some(first) = t.intervals.first() else {
        return;
    };
    for i in &t.intervals {
        let range = if i.limit_min == i.limit_max {
            i.limit_min.to_string()
        } else {
            format!("{}..{}", i.limit_min, i.limit_max)
        };
        let _ = writeln!(
            out,
            "      +{:<5} limit {range:<7} {} admitted, {} rejected",
            format!("{}s", (i.from_us - first.from_us) / 1_000_000),
            i.admitted,
            i.rejected
        );
    }
}
