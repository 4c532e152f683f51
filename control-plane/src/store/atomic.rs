//! Writing a file whole or not at all: a temporary file beside it, synced,
//! renamed over it, and the directory synced.

use std::fs::{self, File};
use std::io::Write as _;
use std::path::Path;

use crate::error::{Error, StateIo};

/// Writes `bytes` to `path` so that readers see the old content or the new,
/// never a mix: temp file in the same directory, fsync, rename, fsync of the
/// directory (so the rename itself survives a crash).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    let dir = path.parent().unwrap_or_else(|| Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp.{}", std::process::id()));
    let result = (|| {
        let mut file = File::create(&tmp).map_err(|source| StateIo::new("create", &tmp, source))?;
        file.write_all(bytes)
            .map_err(|source| StateIo::new("write", &tmp, source))?;
        file.sync_all()
            .map_err(|source| StateIo::new("sync", &tmp, source))?;
        drop(file);
        fs::rename(&tmp, path).map_err(|source| StateIo::new("rename", path, source))?;
        let d = File::open(dir).map_err(|source| StateIo::new("open", dir, source))?;
        d.sync_all()
            .map_err(|source| StateIo::new("sync", dir, source))?;
        Ok(())
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}
