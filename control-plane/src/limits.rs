//! What one `Apply` or dry run may ask of govd, checked before any compile
//! work: a hostile or mistaken client cannot make govd work without bound.

use crate::store::Source;

/// What one `Apply` or dry run may ask of govd.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Most bytes of source text (and file names), all files together.
    pub max_policy_bytes: usize,
    /// Most statements (`match`, `bulkhead`, `limit`, `fuse`, ... inside
    /// service blocks) in one policy: what the compiler's checks cost grows
    /// with it.
    pub max_statements: usize,
    /// Most diagnostics sent back; the rest are counted in one note.
    pub max_diagnostics: usize,
    /// Most compiles running at once (applies and dry runs together);
    /// further requests wait for a slot.
    pub concurrent_compiles: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_policy_bytes: 16 << 20,
            max_statements: 100_000,
            max_diagnostics: 1_000,
            concurrent_compiles: 2,
        }
    }
}

/// A request over one of the [`Limits`].
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum TooLarge {
    #[error(transparent)]
    #[diagnostic(transparent)]
    Bytes(#[from] TooManyBytes),

    #[error(transparent)]
    #[diagnostic(transparent)]
    Statements(#[from] TooManyStatements),
}

#[derive(Debug, thiserror::Error, miette::Diagnostic)]
#[error("the policy is {bytes} bytes, more than the {limit} bytes this govd accepts")]
#[diagnostic(
    code(gov::govd::policy_too_large),
    help("raise the limit with `govd --max-policy-bytes` (GOV_MAX_POLICY_BYTES)")
)]
pub struct TooManyBytes {
    pub bytes: usize,
    pub limit: usize,
}

#[derive(Debug, thiserror::Error, miette::Diagnostic)]
#[error(
    "the policy has more than {limit} statements in its service blocks, the most this govd compiles"
)]
#[diagnostic(
    code(gov::govd::too_many_statements),
    help("raise the limit with `govd --max-statements` (GOV_MAX_STATEMENTS)")
)]
pub struct TooManyStatements {
    pub limit: usize,
}

// === impl Limits ===

impl Limits {
    /// Refuses a policy over the size limit, before any compile work.
    pub fn check_policy(&self, sources: &[Source]) -> Result<(), TooLarge> {
        let bytes: usize = sources.iter().map(|s| s.text.len() + s.name.len()).sum();
        if bytes > self.max_policy_bytes {
            return Err(TooManyBytes {
                bytes,
                limit: self.max_policy_bytes,
            }
            .into());
        }
        Ok(())
    }

    /// Refuses a policy with more than `max_statements` statements.
    pub fn check_statements(&self, statements: usize) -> Result<(), TooLarge> {
        if statements > self.max_statements {
            return Err(TooManyStatements {
                limit: self.max_statements,
            }
            .into());
        }
        Ok(())
    }
}
