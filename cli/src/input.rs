//! Reading policy files for any command.
//!
//! A file is read up to one byte past [`gov_lang::MAX_SOURCE_BYTES`], so an
//! enormous file costs no more memory than the limit and the parser still
//! reports it as too large. The path `-` is standard input.

use std::io::Read as _;
use std::path::{Path, PathBuf};

/// A policy file that could not be read.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum InputError {
    #[error("cannot read `{}`", path.display())]
    #[diagnostic(code(gov::io), help("check that the file exists and is readable"))]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("`{}` is not UTF-8 text (invalid byte at offset {offset})", path.display())]
    #[diagnostic(code(gov::encoding), help("save the policy as UTF-8"))]
    NotUtf8 { path: PathBuf, offset: usize },
    #[error("no `.gov` file below `{}`", path.display())]
    #[diagnostic(
        code(gov::io),
        help("name `.gov` files, or a directory that holds some (read recursively)")
    )]
    EmptyDir { path: PathBuf },
}

/// The policy files `paths` name: each file as given (`-` too), and for each
/// directory every `*.gov` file below it, in path order. The errors of the
/// paths that could not be listed come back beside the files that could.
pub fn expand(paths: &[PathBuf]) -> (Vec<PathBuf>, Vec<InputError>) {
    let mut files = Vec::new();
    let mut errors = Vec::new();
    for path in paths {
        if is_stdin(path) || !path.is_dir() {
            files.push(path.clone());
            continue;
        }
        let mut found = Vec::new();
        match collect(path, &mut found) {
            Ok(()) if found.is_empty() => errors.push(InputError::EmptyDir { path: path.clone() }),
            Ok(()) => {
                found.sort();
                files.extend(found);
            }
            Err(source) => errors.push(InputError::Read {
                path: path.clone(),
                source,
            }),
        }
    }
    (files, errors)
}

/// Every `*.gov` file below `dir` (hidden directories and links left out, so a
/// `.git` or a link cycle is never walked).
fn collect(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        let path = entry.path();
        let hidden = entry.file_name().to_string_lossy().starts_with('.');
        if kind.is_dir() && !hidden {
            collect(&path, out)?;
        } else if kind.is_file() && path.extension().is_some_and(|e| e == "gov") {
            out.push(path);
        }
    }
    Ok(())
}

/// The text of the policy at `path`.
pub fn read_policy(path: &Path) -> Result<String, InputError> {
    let read = |source| InputError::Read {
        path: path.to_owned(),
        source,
    };
    let limit = u64::try_from(gov_lang::MAX_SOURCE_BYTES)
        .unwrap_or(u64::MAX)
        .saturating_add(1);
    let mut bytes = Vec::new();
    if is_stdin(path) {
        let stdin = std::io::stdin().lock();
        stdin.take(limit).read_to_end(&mut bytes).map_err(read)?;
    } else {
        let file = std::fs::File::open(path).map_err(read)?;
        file.take(limit).read_to_end(&mut bytes).map_err(read)?;
    }
    String::from_utf8(bytes).map_err(|e| InputError::NotUtf8 {
        path: path.to_owned(),
        offset: e.utf8_error().valid_up_to(),
    })
}

/// The name diagnostics use for `path`: the path as the user wrote it, or
/// `<stdin>`.
pub fn display_name(path: &Path) -> String {
    if is_stdin(path) {
        "<stdin>".to_owned()
    } else {
        path.display().to_string()
    }
}

/// `-` stands for standard input.
pub fn is_stdin(path: &Path) -> bool {
    path.as_os_str() == "-"
}
