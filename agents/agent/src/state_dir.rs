//! Files the agent keeps in its state directory (`--state-dir`: the last
//! good config, the latches, the endpoint sets), each written so that a
//! crash leaves the old file or the new one, never a mix.

use std::fs::{self, File};
use std::io::Write as _;
use std::path::{Path, PathBuf};

/// A failed step of [`write_atomically`].
#[derive(Debug)]
pub(crate) struct WriteFailed {
    pub(crate) op: &'static str,
    pub(crate) path: PathBuf,
    pub(crate) source: std::io::Error,
}

/// Replaces `dir/name` with `bytes` so that a crash at any point leaves the old
/// file or the new one, never a mix: a temp file, fsync, rename, fsync of the
/// directory. Creates `dir` if needed.
pub(crate) fn write_atomically(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), WriteFailed> {
    fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> WriteFailed + 'a {
        move |source| WriteFailed {
            op,
            path: path.to_owned(),
            source,
        }
    }
    fs::create_dir_all(dir).map_err(io("create", dir))?;
    let path = dir.join(name);
    let tmp = dir.join(format!(".{name}.tmp"));
    let mut file = File::create(&tmp).map_err(io("create", &tmp))?;
    let written = file
        .write_all(bytes)
        .map_err(io("write", &tmp))
        .and_then(|()| file.sync_all().map_err(io("sync", &tmp)));
    drop(file);
    let renamed = written.and_then(|()| fs::rename(&tmp, &path).map_err(io("rename", &path)));
    if renamed.is_err() {
        // A part-written temp file would keep a full disk full.
        let _ = fs::remove_file(&tmp);
    }
    renamed?;
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io("sync", dir))?;
    Ok(())
}
