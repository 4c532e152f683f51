//! Small helpers of reaching the control plane that the control client and
//! the identity client share: the URL list, the wall clock in Unix ms, an
//! error's chain on one line.

use std::time::{SystemTime, UNIX_EPOCH};

/// The control plane URLs of `list` (comma-separated; at least one).
pub fn urls(list: &str) -> Vec<&str> {
    let urls: Vec<&str> = list
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .collect();
    if urls.is_empty() { vec![list] } else { urls }
}

/// Now, in Unix ms.
pub(crate) fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// `error: cause: cause`, on one line.
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        s.push_str(": ");
        s.push_str(&cause.to_string());
        source = cause.source();
    }
    s
}
