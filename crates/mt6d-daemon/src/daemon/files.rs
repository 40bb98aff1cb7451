//! The daemon's own files under directories it shares with other programs (`/run/mt6d`, the
//! state directory, a control socket's directory): created readable by the daemon's user only,
//! and never through a symbolic link someone else left at the path.
//!
//! Instance records hold the peers' true addresses, lock files a pid, counter files where a
//! pre-shared key's nonces stand: none is anyone else's business. Under systemd the unit's
//! `UMask=0077` and `RuntimeDirectoryMode=0700` give the same modes; run by hand under a usual
//! umask (022), they did not: records were 0644 in a 0755 directory.

use std::fs::{DirBuilder, File, OpenOptions, Permissions};
use std::io;
use std::os::unix::fs::{
    DirBuilderExt as _, MetadataExt as _, OpenOptionsExt as _, PermissionsExt,
};
use std::path::Path;

/// Mode of every file the daemon writes for itself.
pub const FILE_MODE: u32 = 0o600;
/// Mode of every directory the daemon creates.
pub const DIR_MODE: u32 = 0o700;

/// Creates `dir` (and its missing parents) mode 0700. With `narrow`, a directory that exists
/// already with a wider mode is narrowed to 0700 if it is the daemon user's own and not a
/// sticky shared one: only for a directory that is mt6d's by definition (`/run/mt6d`), so that
/// what an earlier version created 0755 is closed on the next start. Without it, a wider mode
/// is only reported (a directory the operator chose may be shared with other programs).
pub fn private_dir(dir: &Path, narrow: bool) -> io::Result<()> {
    DirBuilder::new()
        .recursive(true)
        .mode(DIR_MODE)
        .create(dir)?;
    let meta = std::fs::metadata(dir)?;
    let mode = meta.mode() & 0o7777;
    if mode & 0o077 == 0 {
        return Ok(());
    }
    let sticky = mode & 0o1000 != 0;
    if narrow && meta.uid() == mt6d_os::effective_uid() && !sticky {
        std::fs::set_permissions(dir, Permissions::from_mode(DIR_MODE))
    } else {
        log::warn!(
            "{} is mode {mode:04o}: others can list the daemon's files there (their contents are 0600); `chmod 700` it",
            dir.display()
        );
        Ok(())
    }
}

/// A new temporary file at `path`, mode 0600, for a write that is then renamed into place.
/// Whatever was at `path` (a temporary file a crash left, or a symbolic link planted there)
/// is removed first, never followed: `unlink` removes a link itself, and the file is then
/// created with `O_EXCL | O_NOFOLLOW`, so a link made between the two fails the open instead
/// of redirecting the write.
pub fn create_temporary(path: &Path) -> io::Result<File> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

/// Opens (or creates) a long-lived file of the daemon's, such as a lock file, for reading and
/// writing, mode 0600, without following a symbolic link at `path`. One an earlier version
/// left with a wider mode is narrowed.
pub fn open_private(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)?;
    if file.metadata()?.mode() & 0o077 != 0 {
        file.set_permissions(Permissions::from_mode(FILE_MODE))?;
    }
    Ok(file)
}

/// None: nothing at `path`; Ok: a socket; Err: what else is there. Does not connect.
pub fn file_kind(path: &Path) -> std::io::Result<Option<Result<(), &'static str>>> {
    use std::os::unix::fs::FileTypeExt;
    let meta = match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        r => r?,
    };
    let ty = meta.file_type();
    Ok(Some(if ty.is_socket() {
        Ok(())
    } else if ty.is_symlink() {
        Err("a symbolic link")
    } else if ty.is_dir() {
        Err("a directory")
    } else if ty.is_file() {
        Err("a regular file")
    } else {
        Err("not a socket")
    }))
}

/// Why `path` cannot be the control socket, if it cannot: it exists and is not a socket. A
/// live socket is not refused here (`mt6d check` next to a running daemon); the bind refuses
/// it. Looks only at the file type: validating a config never connects anywhere.
pub fn refuse_non_socket(path: &Path) -> Result<(), String> {
    match file_kind(path) {
        Ok(Some(Err(kind))) => Err(format!(
            "control_socket {} exists and is {kind}; mt6d replaces only a socket nobody answers on and never deletes anything else: choose another path",
            path.display()
        )),
        Ok(_) => Ok(()),
        Err(e) => Err(format!("control_socket {}: {e}", path.display())),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test
mod tests {
    use super::*;
    use std::io::Write as _;

    fn scratch(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("mt6d-files-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().mode() & 0o777
    }

    /// Whatever the umask, directories are 0700 and files 0600; a 0755 directory of the
    /// daemon's own is narrowed.
    #[test]
    fn directories_are_0700_and_files_0600() {
        let d = scratch("modes");
        let nested = d.join("a/b");
        private_dir(&nested, false).unwrap();
        assert_eq!(
            (mode(&d), mode(&d.join("a")), mode(&nested)),
            (0o700, 0o700, 0o700)
        );
        std::fs::set_permissions(&nested, Permissions::from_mode(0o755)).unwrap();
        private_dir(&nested, false).unwrap();
        assert_eq!(mode(&nested), 0o755, "only narrowed when asked");
        private_dir(&nested, true).unwrap();
        assert_eq!(mode(&nested), 0o700, "an old 0755 directory is narrowed");
        let lock = nested.join("x.lock");
        drop(open_private(&lock).unwrap());
        assert_eq!(mode(&lock), 0o600);
        std::fs::set_permissions(&lock, Permissions::from_mode(0o644)).unwrap();
        drop(open_private(&lock).unwrap());
        assert_eq!(mode(&lock), 0o600, "an old 0644 file is narrowed");
        let tmp = nested.join("x.json.tmp");
        create_temporary(&tmp).unwrap().write_all(b"{}").unwrap();
        assert_eq!(mode(&tmp), 0o600);
        // A sticky directory (a shared /tmp) is never narrowed.
        let shared = d.join("shared");
        private_dir(&shared, true).unwrap();
        std::fs::set_permissions(&shared, Permissions::from_mode(0o1777)).unwrap();
        private_dir(&shared, true).unwrap();
        assert_eq!(std::fs::metadata(&shared).unwrap().mode() & 0o7777, 0o1777);
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// A symbolic link planted at a temporary file's path is replaced, never written through;
    /// a lock file path that is a link is refused.
    #[test]
    fn files_are_never_opened_through_a_symbolic_link() {
        let d = scratch("links");
        private_dir(&d, false).unwrap();
        let victim = d.join("victim");
        std::fs::write(&victim, "precious").unwrap();
        let victim_mode = mode(&victim);
        let tmp = d.join("rec.json.tmp");
        std::os::unix::fs::symlink(&victim, &tmp).unwrap();
        create_temporary(&tmp)
            .unwrap()
            .write_all(b"record")
            .unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        assert!(std::fs::symlink_metadata(&tmp).unwrap().is_file());
        assert_eq!(std::fs::read_to_string(&tmp).unwrap(), "record");
        let lock = d.join("x.lock");
        std::os::unix::fs::symlink(&victim, &lock).unwrap();
        let e = open_private(&lock).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ELOOP), "{e}");
        assert_eq!(mode(&victim), victim_mode, "the target's mode is untouched");
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
