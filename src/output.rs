//! Writing result files atomically, so that neither a failure nor a kill
//! leaves a partial or temporary file behind. On Linux the contents go to
//! an unnamed file in the target folder (`O_TMPFILE`), which a kill, even
//! `SIGKILL`, simply discards, and which is linked under its name only once
//! written (straight to the name when it is new, else through a
//! `.NAME.autopar-*.tmp` name renamed over the old file at once). Elsewhere,
//! or on a file system without unnamed files, a named temp file of that form
//! is written and renamed into place.

use anyhow::{Context, Result};
use std::io::Write;
use std::path::Path;

/// The folder `path` goes in (`.` for a bare file name).
fn folder(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Fails when `path`'s folder does not exist, so slow commands can stop
/// before their work rather than after it.
pub fn check_folder(path: &Path) -> Result<()> {
    let dir = folder(path);
    if !dir.is_dir() {
        anyhow::bail!("{}: folder {} does not exist", path.display(), dir.display());
    }
    Ok(())
}

/// A named temp file for `path` in `dir`: hidden, and named for the file
/// and for autopar, so that one left over is plainly ours. Deleted when
/// dropped unless persisted.
fn named_temp(path: &Path, dir: &Path) -> Result<tempfile::NamedTempFile> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    tempfile::Builder::new()
        .prefix(&format!(".{name}.autopar-"))
        .suffix(".tmp")
        .tempfile_in(dir)
        .with_context(|| format!("{}: cannot create a file in {}", path.display(), dir.display()))
}

/// Writes `contents` to `path` atomically.
pub fn write_atomic(path: &Path, contents: &[u8]) -> Result<()> {
    let dir = folder(path);
    #[cfg(target_os = "linux")]
    if let Some(file) = unnamed::create(dir) {
        return unnamed::write(file, path, dir, contents);
    }
    let mut tmp = named_temp(path, dir)?;
    tmp.write_all(contents)
        .with_context(|| format!("{}: write failed", path.display()))?;
    // Temp files are created private; a result file is an ordinary one.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = tmp
            .as_file()
            .set_permissions(std::fs::Permissions::from_mode(0o644));
    }
    tmp.persist(path)
        .with_context(|| format!("{}: cannot move the finished file into place", path.display()))?;
    Ok(())
}

/// Unnamed files (`O_TMPFILE`), linked into the folder once written.
#[cfg(target_os = "linux")]
mod unnamed {
    use super::named_temp;
    use anyhow::{Context, Result};
    use rustix::fs::{linkat, open, AtFlags, Mode, OFlags, CWD};
    use rustix::io::Errno;
    use std::fs::File;
    use std::io::Write;
    use std::os::fd::AsRawFd;
    use std::path::Path;

    /// An unnamed file in `dir`, or `None` where the file system has none
    /// (the caller then writes a named temp file).
    pub fn create(dir: &Path) -> Option<File> {
        let flags = OFlags::TMPFILE | OFlags::WRONLY | OFlags::CLOEXEC;
        open(dir, flags, Mode::from_raw_mode(0o644)).ok().map(File::from)
    }

    /// Writes `contents` to `file` and links it as `path`.
    pub fn write(mut file: File, path: &Path, dir: &Path, contents: &[u8]) -> Result<()> {
        let failed = |what: &str| format!("{}: {what}", path.display());
        file.write_all(contents).with_context(|| failed("write failed"))?;
        let fd = format!("/proc/self/fd/{}", file.as_raw_fd());
        let link = |to: &Path| linkat(CWD, fd.as_str(), CWD, to, AtFlags::SYMLINK_FOLLOW);
        match link(path) {
            Ok(()) => return Ok(()),
            Err(Errno::EXIST) => {}
            Err(e) => return Err(e).with_context(|| failed("cannot link the finished file into place")),
        }
        // The name is taken: link under a free temp name (reserved by a
        // named temp file, dropped just before) and rename over it.
        let reserved = named_temp(path, dir)?.into_temp_path();
        let temp = reserved.to_path_buf();
        reserved
            .close()
            .with_context(|| failed("cannot name the finished file"))?;
        link(&temp).with_context(|| failed("cannot link the finished file"))?;
        std::fs::rename(&temp, path).map_err(|e| {
            let _ = std::fs::remove_file(&temp);
            anyhow::Error::new(e).context(failed("cannot move the finished file into place"))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A new file and a replaced one both end up whole, readable by all,
    /// with nothing else left in the folder.
    #[test]
    fn writes_new_and_replaced_files_and_leaves_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.json");
        write_atomic(&path, b"first").unwrap();
        write_atomic(&path, b"second").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"second");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["out.json"]);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode & 0o444, 0o444, "{mode:o}");
        }
        let err = write_atomic(&dir.path().join("no/such/out.json"), b"x").unwrap_err();
        assert!(format!("{err:#}").contains("no/such/out.json"), "{err:#}");
    }
}
