//! The applied history as `govc history`, `govc show` and `govc rollback`
//! read it: the versions kept, newest first, and one version's sources.

use super::*;

/// The shortest version prefix `govc show` takes.
pub const MIN_PREFIX: usize = 6;

/// Why a version cannot be given.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum VersionError {
    #[error("no kept version starts with `{asked}`")]
    #[diagnostic(
        code(gov::govd::unknown_version),
        help("`govc history` lists the versions govd keeps (`govd --history` bounds them)")
    )]
    NotKept { asked: String },

    #[error("`{asked}` is the start of {count} kept versions")]
    #[diagnostic(
        code(gov::govd::ambiguous_version),
        help("give more of the version (`govc history` shows them)")
    )]
    Ambiguous { asked: String, count: usize },

    #[error("`{asked}` is not a version: give at least {MIN_PREFIX} hex digits")]
    #[diagnostic(code(gov::govd::bad_version))]
    Malformed { asked: String },
}

impl State {
    /// Every kept version (newest first), without sources; or, with
    /// `asked`, the one version it names, with its sources.
    pub fn versions(&self, asked: &str) -> Result<pb::HistoryResult, VersionError> {
        let applied = self.applied().map_or(String::new(), |a| a.version.clone());
        let record = |h: &HistoryEntry, sources: bool| pb::VersionRecord {
            version: h.version.clone(),
            who: h.who.clone(),
            at_unix_ms: h.at_unix_ms,
            services: h.services.clone(),
            sources: if sources {
                h.sources
                    .iter()
                    .map(|s| pb::SourceFile {
                        name: s.name.clone(),
                        text: s.text.clone(),
                    })
                    .collect()
            } else {
                Vec::new()
            },
        };
        let versions = if asked.is_empty() {
            self.history
                .iter()
                .rev()
                .map(|h| record(h, false))
                .collect()
        } else {
            let asked = asked.trim().to_ascii_lowercase();
            if asked.len() < MIN_PREFIX || !asked.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(VersionError::Malformed {
                    asked: gov_proto::printable::printable(&asked).into_owned(),
                });
            }
            // The same version applied twice is one version.
            let mut found: Vec<&HistoryEntry> = Vec::new();
            for h in self.history.iter().rev() {
                if h.version.starts_with(&asked) && !found.iter().any(|f| f.version == h.version) {
                    found.push(h);
                }
            }
            match found.as_slice() {
                [] => return Err(VersionError::NotKept { asked }),
                [one] => vec![record(one, true)],
                many => {
                    return Err(VersionError::Ambiguous {
                        asked,
                        count: many.len(),
                    });
                }
            }
        };
        Ok(pb::HistoryResult {
            versions,
            applied,
            govd_version: env!("CARGO_PKG_VERSION").to_owned(),
        })
    }
}
