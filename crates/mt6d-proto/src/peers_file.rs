//! The server role's peers file (seed 002; docs/CONFIG.md, "server role peers file"): one
//! client per line, for a server with up to a million of them, where a `[[peer]]` table per
//! client would be too slow to read and too long to write.
//!
//! ```text
//! # name        public key (base64, 32 bytes)                 true address       [psk (base64)]
//! alice         Sr+Xbsk1zWOyZ4MmCjIK6v2PeqfaZrnpZNYN76oF8VM=  2001:db8:b::1
//! bob           mU6VAR4mmhdjuZ3iQUEgSNXBwmsyjalqBFMKCsEYzHM=  2001:db8:b::2      3q2+7w...=
//! ```
//!
//! After the positional fields, two optional named ones (in any order): `prefix=ADDR/64`, the
//! /64 the client's hashed addresses live in when it is not the /64 of its true address (a
//! client gateway's external prefix), and `key=BASE64`, a pre-shared session key (what the
//! client's `[[peer]] key` holds): the server then uses that key for the client's routes and data
//! directly, as a gateway does with `key`, and runs no handshake with it. `key=` excludes a psk.
//!
//! Fields are separated by spaces or tabs; `#` starts a comment that runs to the end of the line;
//! blank lines are skipped. The fields follow the daemon's `[[peer]]` rules (crates/mt6d
//! `config/peer.rs`, `keys.rs`), which this crate cannot call: a name of letters, digits, `-`, `_`
//! and `.`; keys in standard padded base64 (what `mt6d pubkey` and `mt6d genpsk` print); a
//! protected host's address that is not unspecified, loopback, multicast or link-local. Two lines
//! with the same name, public key or true address are an error that names both lines.
//!
//! Sans-IO: it parses text it is given and reads no file. Errors name the line and the field,
//! never a key's text (a psk is a secret).

use std::fmt;
use std::net::Ipv6Addr;

use base64::Engine as _;

use crate::handshake::{Psk, PublicKey, KEY_LEN};
use crate::SessionKey;

/// One client of the server: a line of the peers file.
#[derive(Clone)]
pub struct PeerEntry {
    /// The client's name (logs, metrics).
    pub name: String,
    /// The client gateway's identity key.
    pub public_key: PublicKey,
    /// The client's protected host (the remote true address of its stream).
    pub true_addr: Ipv6Addr,
    /// The optional pre-shared key mixed into the link key and the handshake (docs/PROTOCOL.md
    /// §9.1).
    pub psk: Option<Psk>,
    /// The /64 of the client's hashed addresses (`prefix=`); `None`: the /64 of `true_addr`.
    pub prefix: Option<Ipv6Addr>,
    /// A pre-shared session key (`key=`): no handshake for this client.
    pub session_key: Option<SessionKey>,
    /// The line it came from, counted from 1.
    pub line: usize,
}

impl fmt::Debug for PeerEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PeerEntry")
            .field("name", &self.name)
            .field("public_key", &self.public_key)
            .field("true_addr", &self.true_addr)
            .field("psk", &self.psk.as_ref().map(|_| "[redacted]"))
            .field("prefix", &self.prefix)
            .field(
                "session_key",
                &self.session_key.as_ref().map(|_| "[redacted]"),
            )
            .field("line", &self.line)
            .finish()
    }
}

/// Which field of a line is at fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PeerField {
    /// The first field.
    Name,
    /// The second field.
    PublicKey,
    /// The third field.
    TrueAddress,
    /// The optional fourth field.
    Psk,
    /// `prefix=`.
    Prefix,
    /// `key=`.
    SessionKey,
}

impl fmt::Display for PeerField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PeerField::Name => "name",
            PeerField::PublicKey => "public key",
            PeerField::TrueAddress => "true address",
            PeerField::Psk => "pre-shared key",
            PeerField::Prefix => "prefix=",
            PeerField::SessionKey => "key=",
        })
    }
}

/// Why a peers file was refused. Every variant names the line (counted from 1).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PeersFileError {
    /// The bytes are not UTF-8.
    #[error("line {line}: not UTF-8 text")]
    NotUtf8 {
        /// The line.
        line: usize,
    },
    /// Fewer than three or more than four fields.
    #[error("line {line}: {found} fields; a peer line is `name public-key true-address [psk] [prefix=ADDR/64] [key=BASE64]`")]
    FieldCount {
        /// The line.
        line: usize,
        /// Fields found.
        found: usize,
    },
    /// A field that does not parse; `fault` says why (never the key text).
    #[error("line {line}: {field}: {fault}")]
    BadField {
        /// The line.
        line: usize,
        /// Which field.
        field: PeerField,
        /// What is wrong with it.
        fault: String,
    },
    /// A name, public key or true address given on two lines.
    #[error("line {line}: {field} {value} is already on line {first_line}")]
    Duplicate {
        /// The later line.
        line: usize,
        /// The earlier line.
        first_line: usize,
        /// Which field.
        field: PeerField,
        /// The value (for a public key, its first 8 bytes in hex as in logs).
        value: String,
    },
}

/// Parses a peers file given as bytes (module docs); see [`parse`].
pub fn parse_bytes(bytes: &[u8]) -> Result<Vec<PeerEntry>, PeersFileError> {
    match std::str::from_utf8(bytes) {
        Ok(text) => parse(text),
        Err(e) => {
            let line = 1 + bytes[..e.valid_up_to()]
                .iter()
                .filter(|&&b| b == b'\n')
                .count();
            Err(PeersFileError::NotUtf8 { line })
        }
    }
}

/// Parses a peers file (module docs): its entries in file order, or the first fault. The
/// duplicate checks sort the entries' names, keys and addresses (O(n log n), no hash of
/// file-controlled data, nothing random) and report the pair whose later line comes first.
pub fn parse(text: &str) -> Result<Vec<PeerEntry>, PeersFileError> {
    let mut entries = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let content = raw.split_once('#').map_or(raw, |(before, _)| before);
        let found = content.split_ascii_whitespace().count();
        let mut fields = content.split_ascii_whitespace();
        let (Some(name), Some(public), Some(addr)) = (fields.next(), fields.next(), fields.next())
        else {
            if found == 0 {
                continue;
            }
            return Err(PeersFileError::FieldCount { line, found });
        };
        let mut entry = PeerEntry {
            name: peer_name(name, line)?.to_owned(),
            public_key: PublicKey::from_bytes(*key32(public, line, PeerField::PublicKey)?),
            true_addr: true_address(addr, line)?,
            psk: None,
            prefix: None,
            session_key: None,
            line,
        };
        for (n, field) in fields.enumerate() {
            if let Some(p) = field.strip_prefix("prefix=") {
                if entry.prefix.is_some() {
                    return Err(bad(line, PeerField::Prefix, "given twice"));
                }
                entry.prefix = Some(prefix64(p, line)?);
            } else if let Some(k) = field.strip_prefix("key=") {
                if entry.session_key.is_some() {
                    return Err(bad(line, PeerField::SessionKey, "given twice"));
                }
                let k = key32(k, line, PeerField::SessionKey)?;
                let key = SessionKey::from_bytes(&k[..])
                    .map_err(|e| bad(line, PeerField::SessionKey, e.to_string()))?;
                entry.session_key = Some(key);
            } else if n == 0 {
                entry.psk = Some(Psk::from_bytes(*key32(field, line, PeerField::Psk)?));
            } else {
                return Err(PeersFileError::FieldCount { line, found });
            }
        }
        if entry.psk.is_some() && entry.session_key.is_some() {
            return Err(bad(
                line,
                PeerField::SessionKey,
                "a pre-shared session key replaces the handshake, so a psk (which adds to the handshake) cannot go with it",
            ));
        }
        entries.push(entry);
    }
    check_unique(&entries)?;
    Ok(entries)
}

/// `ADDR/64`: the /64 a client's hashed addresses are placed in.
fn prefix64(text: &str, line: usize) -> Result<Ipv6Addr, PeersFileError> {
    let fault = || {
        bad(
            line,
            PeerField::Prefix,
            format!("{text:?} is not an IPv6 /64 (ADDR/64)"),
        )
    };
    let (addr, len) = text.split_once('/').ok_or_else(fault)?;
    let addr: Ipv6Addr = addr.parse().map_err(|_| fault())?;
    if len != "64" {
        return Err(fault());
    }
    if u128::from(addr) & u128::from(u64::MAX) != 0 {
        return Err(bad(
            line,
            PeerField::Prefix,
            format!("{text}: host bits set; a /64 ends in ::"),
        ));
    }
    if addr.is_unspecified()
        || addr.is_loopback()
        || addr.is_multicast()
        || addr.segments()[0] & 0xffc0 == 0xfe80
    {
        return Err(bad(
            line,
            PeerField::Prefix,
            format!("{text} cannot hold a client's hashed addresses"),
        ));
    }
    Ok(addr)
}

fn bad(line: usize, field: PeerField, fault: impl Into<String>) -> PeersFileError {
    PeersFileError::BadField {
        line,
        field,
        fault: fault.into(),
    }
}

/// The daemon's `[[peer]]` name rule.
fn peer_name(name: &str, line: usize) -> Result<&str, PeersFileError> {
    if name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    {
        Ok(name)
    } else {
        Err(bad(
            line,
            PeerField::Name,
            format!("{name:?} uses a character other than letters, digits, '-', '_' and '.'"),
        ))
    }
}

/// A 32-byte key in standard padded base64, as the daemon's key files hold them.
fn key32(
    text: &str,
    line: usize,
    field: PeerField,
) -> Result<zeroize::Zeroizing<[u8; KEY_LEN]>, PeersFileError> {
    let mut out = zeroize::Zeroizing::new([0u8; KEY_LEN]);
    // Decoding into a buffer one byte larger than a key tells a long key from a short one
    // without an allocation.
    let mut buf = zeroize::Zeroizing::new([0u8; KEY_LEN + 1]);
    match base64::engine::general_purpose::STANDARD.decode_slice(text, &mut buf[..]) {
        Ok(KEY_LEN) => {
            out.copy_from_slice(&buf[..KEY_LEN]);
            Ok(out)
        }
        Ok(n) => Err(bad(line, field, format!("{n} bytes; a key is {KEY_LEN}"))),
        Err(base64::DecodeSliceError::OutputSliceTooSmall) => Err(bad(
            line,
            field,
            format!("longer than {KEY_LEN} bytes; a key is {KEY_LEN}"),
        )),
        Err(base64::DecodeSliceError::DecodeError(_)) => Err(bad(
            line,
            field,
            "not valid base64 (standard alphabet, padded)",
        )),
    }
}

/// The daemon's rule for a protected host's address.
fn true_address(text: &str, line: usize) -> Result<Ipv6Addr, PeersFileError> {
    let addr: Ipv6Addr = text.parse().map_err(|_| {
        bad(
            line,
            PeerField::TrueAddress,
            format!("{text:?} is not an IPv6 address"),
        )
    })?;
    if addr.is_unspecified() || addr.is_loopback() || addr.is_multicast() {
        return Err(bad(
            line,
            PeerField::TrueAddress,
            format!("{addr} cannot be a protected host's address"),
        ));
    }
    if addr.segments()[0] & 0xffc0 == 0xfe80 {
        return Err(bad(
            line,
            PeerField::TrueAddress,
            format!(
                "{addr} is link-local: a protected host needs a global or unique-local address"
            ),
        ));
    }
    Ok(addr)
}

/// The duplicate among `items` (value, line) whose later line is smallest, as (first line,
/// later line, value).
fn first_duplicate<T: Ord + Copy>(mut items: Vec<(T, usize)>) -> Option<(usize, usize, T)> {
    items.sort_unstable();
    // Sorted by (value, line): a run of equal values starts at its first line.
    let mut best: Option<(usize, usize, T)> = None;
    let mut run_start = 0;
    for i in 1..items.len() {
        if items[i].0 != items[run_start].0 {
            run_start = i;
            continue;
        }
        let (first, later) = (items[run_start].1, items[i].1);
        if best.is_none_or(|(_, b, _)| later < b) {
            best = Some((first, later, items[i].0));
        }
    }
    best
}

fn check_unique(entries: &[PeerEntry]) -> Result<(), PeersFileError> {
    let dup = |first_line, line, field, value| PeersFileError::Duplicate {
        line,
        first_line,
        field,
        value,
    };
    // Each check reports its first duplicate; the one on the earliest later line wins.
    let mut found: Vec<PeersFileError> = Vec::new();
    let names = entries.iter().map(|e| (e.name.as_str(), e.line)).collect();
    if let Some((first, line, name)) = first_duplicate(names) {
        found.push(dup(first, line, PeerField::Name, format!("{name:?}")));
    }
    let keys = entries
        .iter()
        .map(|e| (*e.public_key.as_bytes(), e.line))
        .collect();
    if let Some((first, line, key)) = first_duplicate(keys) {
        let key = PublicKey::from_bytes(key).to_string();
        found.push(dup(first, line, PeerField::PublicKey, key));
    }
    let addrs = entries.iter().map(|e| (e.true_addr, e.line)).collect();
    if let Some((first, line, addr)) = first_duplicate(addrs) {
        found.push(dup(first, line, PeerField::TrueAddress, addr.to_string()));
    }
    match found.into_iter().min_by_key(|e| match e {
        PeersFileError::Duplicate { line, .. } => *line,
        _ => usize::MAX,
    }) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const K1: &str = "Sr+Xbsk1zWOyZ4MmCjIK6v2PeqfaZrnpZNYN76oF8VM=";
    const K2: &str = "mU6VAR4mmhdjuZ3iQUEgSNXBwmsyjalqBFMKCsEYzHM=";
    const K3: &str = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=";

    fn err(text: &str) -> PeersFileError {
        parse(text).unwrap_err()
    }

    #[test]
    fn lines_comments_and_blank_lines() {
        let text = format!(
            "# clients\n\nalice {K1} 2001:db8:b::1\n  \t\nbob\t{K2}   2001:db8:b::2 {K3} # with psk\r\n"
        );
        let e = parse(&text).unwrap();
        assert_eq!(e.len(), 2);
        assert_eq!(
            (e[0].name.as_str(), e[0].line, e[0].psk.is_none()),
            ("alice", 3, true)
        );
        assert_eq!(e[0].true_addr, "2001:db8:b::1".parse::<Ipv6Addr>().unwrap());
        assert_eq!(e[0].public_key.as_bytes()[..2], [0x4a, 0xbf]);
        assert_eq!((e[1].name.as_str(), e[1].line), ("bob", 5));
        assert_eq!(e[1].psk.as_ref().map(|p| p.as_bytes()[0]), Some(0));
        assert!(parse("").unwrap().is_empty());
        assert!(parse("# only a comment").unwrap().is_empty());
    }

    #[test]
    fn named_fields_give_the_prefix_and_a_session_key() {
        let e = parse(&format!(
            "a {K1} 2001:db8:b:1::1 prefix=2001:db8:b::/64 key={K2}\nb {K3} 2001:db8::2 {K2} prefix=2001:db8:c::/64"
        ))
        .unwrap();
        assert_eq!(e[0].prefix, Some("2001:db8:b::".parse().unwrap()));
        assert_eq!(
            e[0].session_key.as_ref().map(|k| k.as_bytes()[0]),
            Some(0x99)
        );
        assert!(e[0].psk.is_none());
        assert!(e[1].psk.is_some() && e[1].session_key.is_none());
        assert!(!format!("{e:?}").contains(K2));
        let field = |text: String| match err(&text) {
            PeersFileError::BadField { line, field, fault } => (line, field, fault),
            e => panic!("{e:?}"),
        };
        for bad_prefix in ["2001:db8::/48", "2001:db8::1/64", "ff02::/64", "nonsense"] {
            let (_, f, _) = field(format!("a {K1} 2001:db8::1 prefix={bad_prefix}"));
            assert_eq!(f, PeerField::Prefix, "{bad_prefix}");
        }
        let (_, f, fault) = field(format!("a {K1} 2001:db8::1 {K2} key={K3}"));
        assert_eq!(f, PeerField::SessionKey);
        assert!(fault.contains("psk"), "{fault}");
        let (_, f, _) = field(format!("a {K1} 2001:db8::1 key={K3} key={K3}"));
        assert_eq!(f, PeerField::SessionKey);
        // A psk after a named field is a misplaced field.
        assert_eq!(
            err(&format!("a {K1} 2001:db8::1 prefix=2001:db8::/64 {K2}")),
            PeersFileError::FieldCount { line: 1, found: 5 }
        );
    }

    #[test]
    fn debug_hides_the_psk() {
        let e = parse(&format!("a {K1} 2001:db8::1 {K2}")).unwrap();
        let s = format!("{e:?}");
        assert!(s.contains("[redacted]") && !s.contains(K2), "{s}");
    }

    #[test]
    fn faults_name_the_line_and_field() {
        let ok = format!("alice {K1} 2001:db8:b::1\n");
        assert_eq!(
            err(&format!("{ok}bob {K2}\n")),
            PeersFileError::FieldCount { line: 2, found: 2 }
        );
        assert_eq!(
            err(&format!("{ok}bob {K2} 2001:db8::2 {K3} extra\n")),
            PeersFileError::FieldCount { line: 2, found: 5 }
        );
        let field = |text: &str| match err(text) {
            PeersFileError::BadField { line, field, fault } => (line, field, fault),
            e => panic!("{e:?}"),
        };
        assert_eq!(
            field(&format!("{ok}b@d {K2} 2001:db8::2")).1,
            PeerField::Name
        );
        let (line, f, fault) = field(&format!("{ok}bob not*base64 2001:db8::2"));
        assert_eq!((line, f), (2, PeerField::PublicKey));
        assert!(fault.contains("base64"), "{fault}");
        let (_, f, fault) = field(&format!("bob {} 2001:db8::2", "AAAA"));
        assert_eq!(f, PeerField::PublicKey);
        assert_eq!(fault, "3 bytes; a key is 32");
        let long = "A".repeat(48);
        let (_, _, fault) = field(&format!("bob {long} 2001:db8::2"));
        assert!(fault.starts_with("longer than 32"), "{fault}");
        for bad_addr in [
            "10.0.0.1",
            "::",
            "::1",
            "ff02::1",
            "fe80::1",
            "2001:db8::/64",
        ] {
            let (line, f, _) = field(&format!("{ok}\nbob {K2} {bad_addr}"));
            assert_eq!((line, f), (3, PeerField::TrueAddress), "{bad_addr}");
        }
        let (_, f, fault) = field(&format!("bob {K2} 2001:db8::2 {}", &K3[..40]));
        assert_eq!(f, PeerField::Psk);
        assert!(!fault.contains(&K3[..40]), "{fault}");
        assert_eq!(
            parse_bytes(b"# ok\n\xff\n").unwrap_err(),
            PeersFileError::NotUtf8 { line: 2 }
        );
    }

    #[test]
    fn duplicates_name_both_lines() {
        let dup = |text: String| match err(&text) {
            PeersFileError::Duplicate {
                line,
                first_line,
                field,
                ..
            } => (first_line, line, field),
            e => panic!("{e:?}"),
        };
        assert_eq!(
            dup(format!(
                "a {K1} 2001:db8::1\nb {K2} 2001:db8::2\n\na {K3} 2001:db8::3"
            )),
            (1, 4, PeerField::Name)
        );
        assert_eq!(
            dup(format!(
                "a {K1} 2001:db8::1\nb {K2} 2001:db8::2\nc {K1} 2001:db8::3"
            )),
            (1, 3, PeerField::PublicKey)
        );
        assert_eq!(
            dup(format!(
                "a {K1} 2001:db8::1\nb {K2} 2001:db8::2\nc {K3} 2001:db8:0::2"
            )),
            (2, 3, PeerField::TrueAddress)
        );
        // The duplicate whose later line comes first is reported, whatever its field.
        assert_eq!(
            dup(format!(
                "a {K1} 2001:db8::1\nb {K2} 2001:db8::2\nc {K3} 2001:db8::1\nb {K1} 2001:db8::4"
            )),
            (1, 3, PeerField::TrueAddress)
        );
        // A psk may serve several clients (it is mixed with each client's public key, §9.1).
        assert!(parse(&format!("a {K1} 2001:db8::1 {K3}\nb {K2} 2001:db8::2 {K3}")).is_ok());
    }
}
