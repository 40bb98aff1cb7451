//! One named nftables table, loaded and deleted as a whole through the `nft` program.
//!
//! **Why the `nft` program and not netlink.** nftables rules are bytecode for the kernel's
//! virtual machine (payload loads, comparisons, sets), and the only well-kept encoder of that
//! bytecode is libnftables, which `nft` wraps; the pure-Rust netlink crates that exist encode a
//! subset, with few users. A table is loaded rarely (start and exit), so a subprocess costs
//! nothing that matters, and the script is what an operator reads with `nft list table`.
//!
//! Every change is one `nft -f -` transaction, which the kernel applies atomically: loading
//! first declares the table, deletes it and creates it anew in the same transaction, so a table
//! left by a crashed run is replaced, never merged with, and a failed load changes nothing.
//! Deleting a table that does not exist is success (the same declare-then-delete idiom).
//! `nft` runs in the network namespace of the calling thread.

use std::io::{self, Write};
use std::process::{Command, Stdio};

use crate::error::{OsError, Result};

/// The program that loads rulesets (package `nftables` on Debian).
const NFT: &str = "nft";

/// A table of the `inet` family (IPv4 and IPv6 hooks) with a validated name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NftTable {
    name: String,
}

impl NftTable {
    /// `name` must be a plain identifier (letters, digits, `_`, not starting with a digit), so
    /// that it can be written into a script without quoting.
    pub fn new(name: &str) -> Result<NftTable> {
        let ok = name.len() <= 64
            && name
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !ok {
            return Err(OsError::InvalidArgument(format!(
                "nftables table name {name:?}: use letters, digits and _"
            )));
        }
        Ok(NftTable {
            name: name.to_string(),
        })
    }

    /// The table's name (without the family).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `inet NAME`, as `nft` spells it.
    pub fn spec(&self) -> String {
        format!("inet {}", self.name)
    }

    /// Replaces the table with one holding `body` (chains and sets, the text between the
    /// table's braces), in one atomic transaction.
    pub fn load(&self, body: &str) -> Result<()> {
        let spec = self.spec();
        let script =
            format!("table {spec} {{}}\ndelete table {spec}\ntable {spec} {{\n{body}\n}}\n");
        run(&script, &format!("load table {spec}"))
    }

    /// Deletes the table; a table that is not there is success.
    pub fn delete(&self) -> Result<()> {
        let spec = self.spec();
        run(
            &format!("table {spec} {{}}\ndelete table {spec}\n"),
            &format!("delete table {spec}"),
        )
    }

    /// Whether the table exists.
    pub fn exists(&self) -> Result<bool> {
        let spec = self.spec();
        let out = Command::new(NFT)
            .args(["list", "table", "inet", &self.name])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| spawn_error(e, &format!("list table {spec}")))?;
        Ok(out.status.success())
    }
}

/// An interface name as a quoted nft string. Linux allows almost any byte in a name; only the
/// characters below can be written into a script without escaping, and real names use no
/// others.
pub fn quoted_interface(name: &str) -> Result<String> {
    let ok = !name.is_empty()
        && name.len() < 16
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '@'));
    if !ok {
        return Err(OsError::InvalidArgument(format!(
            "interface name {name:?} cannot be used in an nftables rule (letters, digits, _ - . @ only)"
        )));
    }
    Ok(format!("\"{name}\""))
}

fn spawn_error(e: io::Error, op: &str) -> OsError {
    let source = if e.kind() == io::ErrorKind::NotFound {
        io::Error::new(
            io::ErrorKind::NotFound,
            "the `nft` program is not installed (Debian/Ubuntu: apt-get install nftables)",
        )
    } else {
        io::Error::new(e.kind(), format!("cannot run `{NFT}`: {e}"))
    };
    OsError::Nftables {
        op: op.to_string(),
        source,
    }
}

fn run(script: &str, op: &str) -> Result<()> {
    let mut child = Command::new(NFT)
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| spawn_error(e, op))?;
    let written = child
        .stdin
        .take()
        .map_or(Ok(()), |mut stdin| stdin.write_all(script.as_bytes()));
    let out = child.wait_with_output().map_err(|e| spawn_error(e, op))?;
    if out.status.success() {
        return written.map_err(|e| spawn_error(e, op));
    }
    let said = String::from_utf8_lossy(&out.stderr);
    Err(OsError::Nftables {
        op: op.to_string(),
        source: io::Error::other(format!("`nft -f -` {}: {}", out.status, said.trim())),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netns::{unique_name, Netns};

    #[test]
    fn a_missing_nft_program_is_named_with_its_package() {
        let e = spawn_error(
            io::Error::from(io::ErrorKind::NotFound),
            "load table inet x",
        );
        let text = e.to_string();
        assert!(text.contains("`nft` program is not installed"), "{text}");
        assert!(text.contains("apt-get install nftables"), "{text}");
    }

    #[test]
    fn names_that_cannot_be_written_into_a_script_are_refused() {
        assert!(NftTable::new("mt6d_mt6d0").is_ok());
        for bad in ["", "0abc", "a b", "a;b", "a}b", "a\"b", &"x".repeat(65)] {
            assert!(NftTable::new(bad).is_err(), "{bad:?}");
        }
        assert_eq!(quoted_interface("eth0.100").expect("valid"), "\"eth0.100\"");
        for bad in ["", "a\"b", "a b", "a}b", "averyveryverylongname"] {
            assert!(quoted_interface(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    #[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
    fn load_replaces_and_delete_is_idempotent_inside_a_namespace() {
        // scripts/install-deps.sh installs nft.
        Command::new(NFT)
            .arg("--version")
            .output()
            .expect("nft installed");
        let ns = Netns::create(&unique_name("nft")).expect("netns");
        ns.run(|| {
            let t = NftTable::new("mt6d_test").expect("name");
            assert!(!t.exists().expect("list"));
            t.delete().expect("deleting an absent table is success");
            let chain = "chain output { type filter hook output priority 0; policy accept; \
                         oifname \"lo\" icmpv6 type nd-redirect drop; }";
            t.load(chain).expect("load");
            t.load(chain).expect("load again replaces");
            assert!(t.exists().expect("list"));
            let e = t
                .load("chain broken { nonsense }")
                .expect_err("syntax error");
            assert!(e.to_string().contains("load table inet mt6d_test"), "{e}");
            assert!(
                e.to_string().contains("syntax error"),
                "nft's own words: {e}"
            );
            assert!(t.exists().expect("a failed load changes nothing"));
            t.delete().expect("delete");
            assert!(!t.exists().expect("list"));
        })
        .expect("run in namespace");
    }
}
