//! Key files: new keys from the OS's randomness, written base64 to files created with mode 0600,
//! and read back with a refusal of files others can read. Used by `mt6d keygen`, `pubkey`,
//! `genpsk`, the configuration and the demo.

use std::io::Write as _;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use base64::Engine as _;
use mt6d_proto::handshake::{PrivateKey, PublicKey, KEY_LEN};
use zeroize::Zeroizing;

/// Why a key could not be made, written or read; names the file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    #[error("no randomness from the OS: {0}")]
    Random(String),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is readable by others (mode {mode:03o}); run: chmod 600 {path}")]
    Permissions { path: PathBuf, mode: u32 },
    #[error("{what} is not valid base64")]
    Base64 { what: String },
    #[error("{what} is {len} bytes; a {kind} is {want} bytes")]
    Length {
        what: String,
        kind: &'static str,
        len: usize,
        want: usize,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> KeyError + '_ {
    move |source| KeyError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// 32 random bytes from the OS.
pub fn random32() -> Result<Zeroizing<[u8; 32]>, KeyError> {
    let mut key = Zeroizing::new([0u8; 32]);
    getrandom::fill(key.as_mut_slice()).map_err(|e| KeyError::Random(e.to_string()))?;
    Ok(key)
}

/// Base64 (standard alphabet, padded), as WireGuard writes keys.
pub fn encode(bytes: &[u8]) -> Zeroizing<String> {
    Zeroizing::new(base64::engine::general_purpose::STANDARD.encode(bytes))
}

/// Decodes base64 text (surrounding whitespace ignored); `what` names it in errors.
pub fn decode(text: &str, what: &str) -> Result<Zeroizing<Vec<u8>>, KeyError> {
    base64::engine::general_purpose::STANDARD
        .decode(text.trim())
        .map(Zeroizing::new)
        .map_err(|_| KeyError::Base64 { what: what.into() })
}

/// Decodes a 32-byte key; `kind` ("public key", ...) and `what` name it in errors.
pub fn decode32(
    text: &str,
    what: &str,
    kind: &'static str,
) -> Result<Zeroizing<[u8; KEY_LEN]>, KeyError> {
    let bytes = decode(text, what)?;
    let mut out = Zeroizing::new([0u8; KEY_LEN]);
    if bytes.len() != KEY_LEN {
        return Err(KeyError::Length {
            what: what.into(),
            kind,
            len: bytes.len(),
            want: KEY_LEN,
        });
    }
    out.copy_from_slice(&bytes);
    Ok(out)
}

/// A public key from its base64 text.
pub fn public_key(text: &str, what: &str) -> Result<PublicKey, KeyError> {
    Ok(PublicKey::from_bytes(*decode32(text, what, "public key")?))
}

/// The base64 text of a public key.
pub fn public_key_text(key: &PublicKey) -> String {
    base64::engine::general_purpose::STANDARD.encode(key.as_bytes())
}

/// `f` over every item, on every CPU, results in the items' order: for one X25519 per client
/// (the link keys of a server's clients; a million take half a minute on one core).
pub fn par_map<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let threads = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    let chunk = items.len().div_ceil(threads).max(1);
    let f = &f;
    std::thread::scope(|scope| {
        let handles: Vec<_> = items
            .chunks(chunk)
            .map(|part| scope.spawn(move || part.iter().map(f).collect::<Vec<R>>()))
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    })
}

/// Writes `text` and a newline to a new file with mode 0600; refuses to overwrite.
pub fn write_secret_file(path: &Path, text: &str) -> Result<(), KeyError> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(io(path))?;
    writeln!(f, "{text}").map_err(io(path))
}

/// Reads a secret file, refusing one that group or others can read.
pub fn read_secret_file(path: &Path) -> Result<Zeroizing<String>, KeyError> {
    let meta = std::fs::metadata(path).map_err(io(path))?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(KeyError::Permissions {
            path: path.to_path_buf(),
            mode,
        });
    }
    std::fs::read_to_string(path)
        .map(Zeroizing::new)
        .map_err(io(path))
}

/// Reads a private key file (base64, 0600).
pub fn read_private_key(path: &Path) -> Result<PrivateKey, KeyError> {
    let text = read_secret_file(path)?;
    let bytes = decode32(
        &text,
        &format!("private key file {}", path.display()),
        "private key",
    )?;
    Ok(PrivateKey::from_bytes(*bytes))
}

/// A new private key from the OS's randomness.
pub fn new_private_key() -> Result<PrivateKey, KeyError> {
    Ok(PrivateKey::generate(*random32()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_keys_are_private_and_read_back() {
        let dir = std::env::temp_dir().join(format!("mt6d-keys-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("a.key");
        let _ = std::fs::remove_file(&path);
        let key = new_private_key().expect("key");
        write_secret_file(&path, &encode(key.to_bytes().as_slice())).expect("write");
        let mode = std::fs::metadata(&path).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let back = read_private_key(&path).expect("read");
        assert_eq!(back.public_key(), key.public_key());
        assert!(
            matches!(write_secret_file(&path, "x"), Err(KeyError::Io { .. })),
            "never overwrites"
        );
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).expect("chmod");
        let e = read_private_key(&path)
            .expect_err("group-readable key refused")
            .to_string();
        assert!(e.contains("chmod 600") && e.contains("a.key"), "{e}");
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }

    #[test]
    fn bad_text_is_named() {
        let e = public_key("AAAA", "peer site-b public_key")
            .expect_err("short key")
            .to_string();
        assert!(
            e.contains("site-b") && e.contains("3 bytes") && e.contains("32"),
            "{e}"
        );
        let e = public_key("not base64!", "x")
            .expect_err("bad base64")
            .to_string();
        assert!(e.contains("base64"), "{e}");
        let k = new_private_key().expect("key").public_key();
        assert_eq!(public_key(&public_key_text(&k), "x").expect("roundtrip"), k);
    }
}
