//! The state directory's part files (`parts.rs`): read them all, write a
//! plan's puts (each atomically, `atomic.rs`) and removals, and remove the
//! temp files a killed govd left.

use std::fs::{self, File};
use std::path::Path;

use super::atomic::write_atomic;
use super::parts::{Op, is_part};
use crate::error::{Error, StateIo};

/// The names of the part files in `dir`.
pub(super) fn part_names(dir: &Path) -> Result<Vec<String>, Error> {
    let entries = fs::read_dir(dir).map_err(|source| StateIo::new("read", dir, source))?;
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| StateIo::new("read", dir, source))?;
        if let Some(name) = entry.file_name().to_str()
            && is_part(name)
        {
            names.push(name.to_owned());
        }
    }
    names.sort();
    Ok(names)
}

/// Every part file of `dir`, by name. A file removed between the listing
/// and its read (a write running in another process) is left out.
pub(super) fn read_parts(dir: &Path) -> Result<Vec<(String, Vec<u8>)>, Error> {
    let mut parts = Vec::new();
    for name in part_names(dir)? {
        let path = dir.join(&name);
        match fs::read(&path) {
            Ok(bytes) => parts.push((name, bytes)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(StateIo::new("read", &path, source).into()),
        }
    }
    Ok(parts)
}

/// Writes `ops` in order, each put atomically, then syncs the directory
/// once after removals (so that they survive a crash too), then removes
/// `legacy` (the file the parts replace) when named. A put that fails fails
/// the write, and so does one of the `first` removals (made before the
/// puts, `parts::Plan::first`); another removal that fails is logged and
/// returned (to try again with the next write: what is left is repaired at
/// load, `parts.rs`).
pub(super) fn write(
    dir: &Path,
    ops: &[Op],
    first: usize,
    legacy: Option<&Path>,
) -> Result<Vec<String>, Error> {
    let mut removed = false;
    let mut left = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        match op {
            Op::Put(name, bytes) => write_atomic(&dir.join(name), bytes)?,
            Op::Delete(name) => match fs::remove_file(dir.join(name)) {
                Ok(()) => removed = true,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(source) if i < first => {
                    return Err(StateIo::new("remove", &dir.join(name), source).into());
                }
                Err(error) => {
                    tracing::warn!(part = %name, %error, "cannot remove a part of the state directory; trying again with the next write");
                    left.push(name.clone());
                }
            },
        }
    }
    if let Some(path) = legacy {
        match fs::remove_file(path) {
            Ok(()) => removed = true,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(StateIo::new("remove", path, source).into()),
        }
    }
    if removed {
        let d = File::open(dir).map_err(|source| StateIo::new("open", dir, source))?;
        d.sync_all()
            .map_err(|source| StateIo::new("sync", dir, source))?;
    }
    Ok(left)
}

/// Removes the temp files of [`write_atomic`] that a killed govd left in
/// `dir` (`.NAME.tmp.PID`): the directory has one writer, this process, so
/// none of them is being written. A file that cannot be removed is logged
/// and left; it is never read.
pub(super) fn remove_stale_temp_files(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if !is_temp_file_name(name) {
            continue;
        }
        let path = entry.path();
        match fs::remove_file(&path) {
            Ok(()) => {
                tracing::info!(path = %path.display(), "removed a temp file a stopped govd left")
            }
            Err(error) => {
                tracing::warn!(path = %path.display(), %error, "cannot remove a temp file a stopped govd left")
            }
        }
    }
}

/// `.NAME.tmp.PID`, as [`write_atomic`] names its temp files.
fn is_temp_file_name(name: &str) -> bool {
    name.starts_with('.')
        && name.rsplit_once(".tmp.").is_some_and(|(head, pid)| {
            head.len() > 1 && !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit())
        })
}
