//! Saved plans (`govc plan FILE... --out PLAN`, then `govc apply PLAN`): the
//! sources that were planned, the plan as it was shown, and the version it
//! was planned against, so that the apply is what was reviewed or nothing
//! (terraform's stale-plan rule: govd refuses it if another version was
//! applied since).

use std::path::Path;

/// What `govc plan --out` writes (JSON).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct SavedPlan {
    /// The format, [`FORMAT`].
    pub gov_plan: u32,
    /// The version in force when planned ([`super::apply::NOTHING_APPLIED`]
    /// when nothing was).
    pub planned_against: String,
    /// The plan as `govc plan` printed it.
    pub plan: String,
    pub sources: Vec<Source>,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Source {
    pub name: String,
    pub text: String,
}

/// The format of [`SavedPlan`] this govc writes and reads.
pub const FORMAT: u32 = 1;

/// The saved plan in `text`, if it is one (`None`: a policy file). A file
/// that says it is a saved plan but cannot be read as one is an error.
pub fn parse(path: &Path, text: &str) -> Option<Result<SavedPlan, String>> {
    let value: serde_json::Value = serde_json::from_str(text).ok()?;
    value.get("gov_plan")?;
    Some(
        serde_json::from_value::<SavedPlan>(value)
            .map_err(|e| format!("`{}` is not a saved plan govc can read: {e}", path.display()))
            .and_then(|plan| {
                if plan.gov_plan == FORMAT {
                    Ok(plan)
                } else {
                    Err(format!(
                        "`{}` is a saved plan of format {}, this govc reads format {FORMAT}: make the plan again with this govc",
                        path.display(),
                        plan.gov_plan
                    ))
                }
            }),
    )
}

/// Writes `plan` to `path` (owner-readable only: it holds the policy).
pub fn write(path: &Path, plan: &SavedPlan) -> Result<(), String> {
    let json = serde_json::to_string_pretty(plan).map_err(|e| e.to_string())?;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let write = |mut file: std::fs::File| std::io::Write::write_all(&mut file, json.as_bytes());
    options
        .open(path)
        .and_then(write)
        .map_err(|e| format!("cannot write the plan to `{}`: {e}", path.display()))
}
