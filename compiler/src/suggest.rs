//! "Did you mean" suggestions for unknown names.

/// The known name closest to `unknown`, if one is close enough to be a typo.
///
/// Close enough: a Damerau-Levenshtein distance of at most a third of the
/// longer name (at least 1), or one name is a case-insensitive match.
pub(crate) fn closest<'a>(
    unknown: &str,
    known: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    let mut best: Option<(usize, &'a str)> = None;
    for candidate in known {
        if candidate.eq_ignore_ascii_case(unknown) {
            return Some(candidate);
        }
        let distance = strsim::damerau_levenshtein(unknown, candidate);
        let allowed = (unknown.len().max(candidate.len()) / 3).max(1);
        if distance <= allowed && best.is_none_or(|(d, _)| distance < d) {
            best = Some((distance, candidate));
        }
    }
    best.map(|(_, name)| name)
}

/// A help line: "did you mean `x`?" or a list of what exists.
pub(crate) fn help(what: &str, unknown: &str, known: &[&str]) -> String {
    if let Some(name) = closest(unknown, known.iter().copied()) {
        return format!("did you mean `{name}`?");
    }
    match known {
        [] => format!("no {what} is defined here; define it first"),
        _ => {
            let list: Vec<String> = known.iter().take(8).map(|k| format!("`{k}`")).collect();
            let more = if known.len() > 8 { ", ..." } else { "" };
            format!("defined {what} names: {}{more}", list.join(", "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggests_typos_not_strangers() {
        let known = ["supplier", "slow", "writes"];
        assert_eq!(closest("suplier", known), Some("supplier"));
        assert_eq!(closest("slwo", known), Some("slow"));
        assert_eq!(closest("Writes", known), Some("writes"));
        assert_eq!(closest("inventory", known), None);
    }
}
