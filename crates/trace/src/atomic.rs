//! Files that appear whole or not at all, and never through someone else's link.
//!
//! An [`AtomicFile`] is written under a fresh name in the target's folder, created with
//! `O_CREAT | O_EXCL` (so a file or symlink planted under that name fails the create instead
//! of being followed), flushed, synced and renamed over the target only by
//! [`AtomicFile::commit`]. Dropped uncommitted, or when [`remove_temporaries`] runs (the CLI
//! calls it on Ctrl-C, SIGTERM and SIGHUP), it leaves nothing behind.

use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Temporary files of writes in progress, for [`remove_temporaries`].
static IN_PROGRESS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
/// Tells apart the temporary names one process makes.
static NEXT: AtomicU64 = AtomicU64::new(0);

/// A file being written to a temporary name beside its target.
#[derive(Debug)]
pub struct AtomicFile {
    target: PathBuf,
    tmp: PathBuf,
    out: Option<BufWriter<File>>,
    /// Renamed over the target: nothing to remove.
    committed: bool,
}

impl AtomicFile {
    /// Start writing `target`. Errors name the temporary file.
    pub fn create(target: &Path) -> io::Result<AtomicFile> {
        let name = target.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let mut tries = 0;
        loop {
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let tmp = target.with_file_name(format!(".{name}.{}-{n}.tmp", std::process::id()));
            match OpenOptions::new().write(true).create_new(true).open(&tmp) {
                Ok(file) => {
                    lock().push(tmp.clone());
                    let out = Some(BufWriter::with_capacity(256 * 1024, file));
                    let target = target.to_path_buf();
                    return Ok(AtomicFile { target, tmp, out, committed: false });
                }
                // Someone else's file (or link) has the name: take another.
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists && tries < 100 => tries += 1,
                Err(e) => return Err(io::Error::new(e.kind(), format!("{}: {e}", tmp.display()))),
            }
        }
    }

    /// Flush, sync and rename over the target: from here the target is the new file whole.
    pub fn commit(mut self) -> io::Result<()> {
        let out = self.out.take().expect("an uncommitted file has its writer");
        let file = out.into_inner().map_err(io::IntoInnerError::into_error)?;
        file.sync_all()?;
        drop(file);
        std::fs::rename(&self.tmp, &self.target)?;
        self.committed = true;
        forget(&self.tmp);
        Ok(())
    }
}

impl Write for AtomicFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.out.as_mut().expect("an uncommitted file has its writer").write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.as_mut().expect("an uncommitted file has its writer").flush()
    }
}

impl Drop for AtomicFile {
    /// Uncommitted, or a commit that failed: the temporary goes.
    fn drop(&mut self) {
        if !self.committed {
            drop(self.out.take());
            let _ = std::fs::remove_file(&self.tmp);
            forget(&self.tmp);
        }
    }
}

fn lock() -> std::sync::MutexGuard<'static, Vec<PathBuf>> {
    IN_PROGRESS.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn forget(tmp: &Path) {
    lock().retain(|p| p != tmp);
}

/// Remove the temporary file of every write in progress (for an interrupt handler).
pub fn remove_temporaries() {
    for tmp in lock().drain(..) {
        let _ = std::fs::remove_file(tmp);
    }
}

/// Whether `a` and `b` name the same file, links followed: the same device and inode when
/// both exist, else the same absolute path.
pub fn same_file(a: &Path, b: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        if let (Ok(x), Ok(y)) = (std::fs::metadata(a), std::fs::metadata(b)) {
            return (x.dev(), x.ino()) == (y.dev(), y.ino());
        }
    }
    let absolute = |p: &Path| {
        let parent = p.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        parent.canonicalize().ok().map(|d| d.join(p.file_name().unwrap_or_default()))
    };
    match (absolute(a), absolute(b)) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `remove_temporaries` removes every write in progress in the process: the tests that
    /// write take turns.
    static SERIAL: Mutex<()> = Mutex::new(());

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("allocsim-atomic-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn the_target_changes_only_on_commit_and_nothing_is_left_behind() {
        let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let dir = scratch("commit");
        let target = dir.join("out.txt");
        std::fs::write(&target, "old").unwrap();
        let mut f = AtomicFile::create(&target).unwrap();
        f.write_all(b"new").unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"old");
        f.commit().unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"new");
        let mut g = AtomicFile::create(&target).unwrap();
        g.write_all(b"half").unwrap();
        drop(g);
        assert_eq!(std::fs::read(&target).unwrap(), b"new");
        assert_eq!(names(&dir), ["out.txt"]);
        let mut h = AtomicFile::create(&target).unwrap();
        h.write_all(b"interrupted").unwrap();
        remove_temporaries();
        assert_eq!(names(&dir), ["out.txt"]);
        drop(h);
        // A rename that fails (the target is a folder with a file in it) leaves nothing either.
        std::fs::create_dir(dir.join("sub")).unwrap();
        std::fs::write(dir.join("sub/x"), "x").unwrap();
        let mut k = AtomicFile::create(&dir.join("sub")).unwrap();
        k.write_all(b"data").unwrap();
        assert!(k.commit().is_err());
        assert_eq!(names(&dir), ["out.txt", "sub"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[cfg(unix)]
    #[test]
    fn a_planted_link_is_not_followed() {
        let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let dir = scratch("link");
        let victim = dir.join("victim");
        std::fs::write(&victim, "precious").unwrap();
        // Plant links under the next few temporary names this process could pick.
        let next = NEXT.load(Ordering::Relaxed);
        for n in next..next + 5 {
            let name = format!(".out.{}-{n}.tmp", std::process::id());
            std::os::unix::fs::symlink(&victim, dir.join(name)).unwrap();
        }
        let mut f = AtomicFile::create(&dir.join("out")).unwrap();
        f.write_all(b"mine").unwrap();
        f.commit().unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        assert_eq!(std::fs::read(dir.join("out")).unwrap(), b"mine");
        let link = dir.join("link");
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        assert!(same_file(&link, &victim) && !same_file(&link, &dir.join("out")));
        assert!(same_file(&dir.join("new"), &dir.join("./new")), "neither exists");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
