//! `govc fmt [--check|--write|--diff] FILE...`: print, check or rewrite
//! policies in the canonical layout.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crate::input;
use crate::report::{ReportArgs, Reporter};

/// Format policy files.
///
/// Without a flag, prints each file formatted to stdout.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The policy files (`-` reads standard input).
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,

    /// Print the files that are not formatted and exit 1 if there are any.
    #[arg(long)]
    pub check: bool,

    /// Rewrite files in place (only those that change) and print their names.
    #[arg(long, conflicts_with_all = ["check", "diff"])]
    pub write: bool,

    /// Print a unified diff of the changes (with `--check`, instead of the file names).
    #[arg(long)]
    pub diff: bool,

    #[command(flatten)]
    pub report: ReportArgs,
}

/// A file that could not be rewritten.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
#[error("cannot write `{}`", path.display())]
#[diagnostic(
    code(gov::io),
    help("check that the file and its directory are writable")
)]
struct WriteError {
    path: PathBuf,
    #[source]
    source: std::io::Error,
}

pub fn run(args: Args) -> ExitCode {
    if args.write && args.files.iter().any(|f| input::is_stdin(f)) {
        gov_common::errln!(
            "error: `--write` cannot rewrite standard input; leave out `--write` to print the result"
        );
        return ExitCode::from(crate::EXIT_USAGE);
    }
    let reporter = Reporter::new(args.report.error_format);
    let (files, errors) = input::expand(&args.files);
    let mut diagnostics: Vec<miette::Report> =
        errors.into_iter().map(miette::Report::new).collect();
    let mut unformatted = 0usize;
    let mut stdout = std::io::stdout().lock();
    for path in &files {
        let name = input::display_name(path);
        let src = match input::read_policy(path) {
            Ok(src) => src,
            Err(e) => {
                diagnostics.push(miette::Report::new(e));
                continue;
            }
        };
        let formatted = match gov_lang::format_source(&name, &src) {
            Ok(text) => text,
            Err(e) => {
                diagnostics.push(miette::Report::new(e));
                continue;
            }
        };
        let changed = formatted != src;
        unformatted += usize::from(changed);
        // Output to a closed stdout (`govc fmt x | head`) is not an error worth a panic.
        let _ = if args.write {
            if changed {
                match write_atomically(path, &formatted) {
                    Ok(()) => writeln!(stdout, "{name}"),
                    Err(source) => {
                        diagnostics.push(miette::Report::new(WriteError {
                            path: path.clone(),
                            source,
                        }));
                        Ok(())
                    }
                }
            } else {
                Ok(())
            }
        } else if args.diff {
            if changed {
                write!(stdout, "{}", unified_diff(&name, &src, &formatted))
            } else {
                Ok(())
            }
        } else if args.check {
            if changed {
                writeln!(stdout, "{name}")
            } else {
                Ok(())
            }
        } else {
            write!(stdout, "{formatted}")
        };
    }
    let _ = stdout.flush();
    let summary = reporter.emit(&diagnostics);
    if args.check && unformatted > 0 {
        let files = if unformatted == 1 {
            "file is"
        } else {
            "files are"
        };
        gov_common::errln!("{unformatted} {files} not formatted; run `govc fmt --write` to fix");
        return ExitCode::FAILURE;
    }
    summary.exit_code(false)
}

/// `--- a/NAME` / `+++ b/NAME` with three lines of context, as `git diff`
/// writes a relative path (`git apply` and `patch -p1` take it); an absolute
/// path is written as it is on both lines (`patch -p0`), not as `a//tmp/...`.
fn unified_diff(name: &str, old: &str, new: &str) -> String {
    let (from, to) = if name.starts_with('/') {
        (name.to_owned(), name.to_owned())
    } else {
        (format!("a/{name}"), format!("b/{name}"))
    };
    similar::TextDiff::from_lines(old, new)
        .unified_diff()
        .context_radius(3)
        .header(&from, &to)
        .to_string()
}

/// Writes `text` to a temporary file beside `path`, then renames it over
/// `path`, so a reader (or a crash) never sees half a file. The original
/// permissions are kept.
fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{file_name}.govc-fmt-{}.tmp", std::process::id()));
    let result = (|| {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(text.as_bytes())?;
        file.sync_all()?;
        let permissions = std::fs::metadata(path)?.permissions();
        std::fs::set_permissions(&tmp, permissions)?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}
