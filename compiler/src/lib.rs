//! The gov compiler: from parsed `.gov` files to one `TargetConfig` per
//! service.
//!
//! ```
//! use gov_compiler::{SourceFile, check, compile};
//!
//! let files = [SourceFile::new("a.gov", "service a { capacity workers 4 }")];
//! assert!(!check(&files).diagnostics.has_errors());
//! let compiled = compile(&files).map_err(|d| d.to_string())?;
//! assert_eq!(compiled.bundle.targets[0].service, "a");
//! # Ok::<(), String>(())
//! ```
//!
//! - [`fn@check`] parses every file, resolves names and runs every check and
//!   lint (`check/*.rs`), returning every diagnostic, never only the first.
//! - [`compile`] lowers a policy without errors to a [`Bundle`]: one
//!   [`TargetConfig`] per service with defaults applied and a content-hash
//!   `version` (see [`lower`]).
//! - [`plan()`] diffs two bundles per service and per rule.

pub use gov_proto::v1::{Bundle, TargetConfig};

pub mod check;
mod diagnostic;
mod first_defined;
mod kind;
pub mod lower;
mod outlier;
mod paths;
pub mod plan;
mod resolve;
mod suggest;
pub mod units;

pub use diagnostic::{Diagnostic, Diagnostics};
pub use first_defined::FirstDefinedHere;
pub use plan::{Plan, plan};

/// One `.gov` file: its name (shown in diagnostics and source references)
/// and its text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceFile {
    pub name: String,
    pub text: String,
}

impl SourceFile {
    pub fn new(name: impl Into<String>, text: impl Into<String>) -> Self {
        SourceFile {
            name: name.into(),
            text: text.into(),
        }
    }
}

/// What [`fn@check`] found.
#[derive(Debug)]
pub struct Checked {
    /// Syntax errors (per file, in file order), then semantic errors, then
    /// lint warnings.
    pub diagnostics: Diagnostics,
    /// The resolved policy, when there is no error.
    pub model: Option<Model>,
}

/// A resolved policy without errors: every file with its syntax tree.
#[derive(Debug)]
pub struct Model {
    files: Vec<(SourceFile, gov_lang::ast::Policy)>,
}

impl Model {
    /// The files and their syntax trees, in the order given.
    pub fn files(&self) -> impl Iterator<Item = (&SourceFile, &gov_lang::ast::Policy)> {
        self.files.iter().map(|(f, p)| (f, p))
    }

    /// The names of every service, sorted.
    pub fn service_names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self
            .files
            .iter()
            .flat_map(|(_, p)| p.items.iter())
            .filter_map(|item| match item {
                gov_lang::ast::Item::Service(s) => Some(s.name.node.as_str()),
                gov_lang::ast::Item::Registry(_) => None,
            })
            .collect();
        names.sort_unstable();
        names
    }

    /// Lowers the policy to a bundle (cannot fail: the model has no errors).
    pub fn lower(&self) -> Bundle {
        let files: Vec<_> = self.files.iter().map(|(f, p)| (f, p)).collect();
        with_ctx(&files, resolve::Skipped::default(), lower::bundle)
    }
}

/// The output of [`compile`]: the bundle and the warnings.
#[derive(Debug)]
pub struct Compiled {
    pub bundle: Bundle,
    pub warnings: Diagnostics,
}

/// Parses, resolves and checks every file, and reports every diagnostic.
pub fn check(files: &[SourceFile]) -> Checked {
    let (diagnostics, parsed) = analyze(files);
    let model = (!diagnostics.has_errors()).then(|| Model {
        files: files
            .iter()
            .cloned()
            .zip(parsed.into_iter().flatten())
            .collect(),
    });
    Checked { diagnostics, model }
}

/// Checks and lowers: the bundle and its warnings, or every diagnostic when
/// there is an error.
pub fn compile(files: &[SourceFile]) -> Result<Compiled, Diagnostics> {
    let (diagnostics, parsed) = analyze(files);
    if diagnostics.has_errors() {
        return Err(diagnostics);
    }
    let pairs: Vec<_> = files.iter().zip(parsed.iter().flatten()).collect();
    let bundle = with_ctx(&pairs, resolve::Skipped::default(), lower::bundle);
    Ok(Compiled {
        bundle,
        warnings: diagnostics,
    })
}

/// Parses every file and runs every check. The second value has one entry
/// per file: its tree, or what parsed of it when it has syntax errors
/// (`None` when nothing could be recovered).
///
/// The checks run on what parsed, so that fixing one typo does not reveal a
/// new wave of errors; names whose definitions were skipped for a syntax
/// error are not reported unknown (see [`resolve::Skipped`]).
fn analyze(files: &[SourceFile]) -> (Diagnostics, Vec<Option<gov_lang::ast::Policy>>) {
    let mut out = Vec::new();
    let mut parsed = Vec::with_capacity(files.len());
    let mut skipped = resolve::Skipped::default();
    for (file, result) in parse_all(files).into_iter().enumerate() {
        let broken = !result.errors.is_empty();
        out.extend(result.errors.into_iter().map(Diagnostic::from));
        skipped.add(file, broken && result.policy.is_none(), &result.skipped);
        parsed.push(result.policy);
    }
    let pairs: Vec<_> = files
        .iter()
        .zip(parsed.iter())
        .filter_map(|(f, p)| p.as_ref().map(|p| (f, p)))
        .collect();
    // Files index the trees that parsed: renumber the skipped statements.
    let present: Vec<Option<usize>> = parsed
        .iter()
        .scan(0, |next, p| {
            Some(p.as_ref().map(|_| {
                *next += 1;
                *next - 1
            }))
        })
        .collect();
    skipped.renumber(&present);
    let semantic = with_ctx(&pairs, skipped, |cx| {
        let mut v = Vec::new();
        check::run(cx, &mut v);
        // Errors before warnings; each group in file order, then text order.
        let file_of = |d: &Diagnostic| {
            let name = d.src().map(|s| s.name());
            cx.files
                .iter()
                .position(|f| Some(f.name) == name)
                .unwrap_or(usize::MAX)
        };
        let mut keyed: Vec<_> = v
            .into_iter()
            .map(|d| ((d.is_warning(), file_of(&d), d.offset()), d))
            .collect();
        keyed.sort_by_key(|(key, _)| *key);
        keyed.into_iter().map(|(_, d)| d).collect::<Vec<_>>()
    });
    out.extend(semantic);
    (Diagnostics(out), parsed)
}

/// Below this much text, threads cost more than they save.
const PARALLEL_PARSE_BYTES: usize = 256 * 1024;

/// Parses every file, in order. Files are independent, so a large policy in
/// several files is parsed on every core (file `i` on thread `i % n`).
fn parse_all(files: &[SourceFile]) -> Vec<gov_lang::Parsed> {
    let parse = |f: &SourceFile| gov_lang::parse_partial(&f.name, &f.text);
    let total: usize = files.iter().map(|f| f.text.len()).sum();
    let threads = std::thread::available_parallelism()
        .map_or(1, std::num::NonZeroUsize::get)
        .min(files.len());
    if threads <= 1 || total < PARALLEL_PARSE_BYTES {
        return files.iter().map(parse).collect();
    }
    let mut results: Vec<_> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                scope.spawn(move || {
                    files
                        .iter()
                        .enumerate()
                        .skip(t)
                        .step_by(threads)
                        .map(|(i, f)| (i, parse(f)))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| {
                h.join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect()
    });
    results.sort_by_key(|(i, _)| *i);
    results.into_iter().map(|(_, r)| r).collect()
}

fn with_ctx<T>(
    files: &[(&SourceFile, &gov_lang::ast::Policy)],
    skipped: resolve::Skipped,
    f: impl FnOnce(&resolve::Ctx<'_>) -> T,
) -> T {
    let files = files
        .iter()
        .map(|(file, policy)| resolve::File::new(&file.name, &file.text, policy))
        .collect();
    let cx = resolve::Ctx::new(files, skipped);
    f(&cx)
}
