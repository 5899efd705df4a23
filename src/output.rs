//! Writing result files atomically: a temp file in the target folder, renamed
//! into place, so a failure never leaves a partial file behind.

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

/// Writes `contents` to `path` atomically.
pub fn write_atomic(path: &Path, contents: &[u8]) -> Result<()> {
    let dir = folder(path);
    let mut tmp = tempfile::NamedTempFile::new_in(dir)
        .with_context(|| format!("{}: cannot create a file in {}", path.display(), dir.display()))?;
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
