//! Who owns what: one record per running daemon under `/run/mt6d`, so that every object mt6d
//! adds to the kernel has exactly one owner, a crashed owner's objects are found and removed
//! (`mt6d down`, or the next start), and a second daemon that would share anything with a
//! running one refuses before it touches anything.
//!
//! An instance is one daemon in one network namespace with one TUN device name; its files are
//! `/run/mt6d/<netns cookie>-<tun>.lock` and `.json`:
//! - the **lock file** holds the pid and is `flock`ed exclusively for the daemon's whole life.
//!   The kernel drops the lock when the process dies however it dies (SIGKILL, OOM, panic), so
//!   "the lock can be taken" is the test for a dead owner; a pid alone could have been reused.
//! - the **record** (JSON) lists what the instance shares with others (interfaces, TUN name,
//!   control socket, peers' true addresses) and the journal of its kernel changes, written
//!   *before* each change is made (write-ahead): sysctls with the value found before the
//!   first change, guard routes, routes, proxy neighbour entries, addresses. It is replaced
//!   atomically (write then rename), so a crash leaves the old or the new record, never half.
//!
//! A clean stop undoes everything but what keeps the protected side's packets off the public
//! link ([`kept_at_stop`]: the fail-closed guards, and the routes to the protected hosts on the
//! internal interface, by which the guards' "administratively prohibited" goes back to them
//! rather than out by a default route), and leaves the record with them (and
//! `stopped_cleanly`): the next start of an instance whose peers they serve adopts them without
//! a gap, and `mt6d down` removes them (docs/ARCHITECTURE.md "Fail closed").
//!
//! Starts and clean-ups take `/run/mt6d/registry.lock` while they read and write records, so
//! two daemons started at once cannot both pass the conflict check.
//!
//! Sysctls that several instances in one namespace change (`all/forwarding`) are shared: a new
//! instance copies the original a running one recorded instead of recording the value that one
//! set, and a stopping instance leaves such a sysctl alone while another running instance has
//! it recorded; the last one restores the original.
//!
//! The netns cookie (`SO_NETNS_COOKIE`) names the namespace; the kernel never reuses it before
//! a reboot, and `/run` is emptied at boot, so a record never refers to the wrong namespace.

use std::fs::File;
use std::io::Write as _;
use std::net::Ipv6Addr;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use mt6d_os::sysctl::Sysctl;
use mt6d_os::Netlink;
use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};

use crate::config::{Config, PeerConfig};

use super::error::GatewayError;

/// Where instance records live (tmpfs: gone after a reboot, like the kernel state they describe).
pub const STATE_DIR: &str = "/run/mt6d";

/// The state directory: `MT6D_STATE_DIR` if set (a daemon run as a user with capabilities but
/// no write access to /run/mt6d; with systemd, `RuntimeDirectory=mt6d` gives it one), else
/// [`STATE_DIR`]. Every daemon of a machine must use the same one for the conflict check to see
/// them all.
pub fn state_dir() -> PathBuf {
    std::env::var_os("MT6D_STATE_DIR")
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from(STATE_DIR), PathBuf::from)
}

/// mt6d's marker on every route (`rtm_protocol`, `ip -6 route show proto 109`), hashed or
/// true address (`IFA_PROTO`) and pinned neighbour entry (`NDA_PROTOCOL`) it adds. 109 is 0x6d, "m"; unused by the protocols iproute2
/// names in `/etc/iproute2/rt_protos`.
pub const MARKER: u8 = 109;

/// One kernel change of an instance, in the order made; clean-up undoes them newest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Change {
    /// A sysctl under /proc/sys (`net/ipv6/conf/all/forwarding`) and its value before mt6d.
    Sysctl { name: String, original: String },
    /// The fail-closed guard for a protected true address (see `system.rs`).
    Guard { dst: Ipv6Addr, len: u8 },
    /// A unicast route through `oif` (optionally `via` a router).
    Route {
        dst: Ipv6Addr,
        len: u8,
        oif: u32,
        #[serde(default)]
        via: Option<Ipv6Addr>,
    },
    /// A proxy neighbour entry on interface `index`.
    ProxyNeighbor { index: u32, addr: Ipv6Addr },
    /// An address on interface `index`.
    Address { index: u32, addr: Ipv6Addr, len: u8 },
    /// An address that was on interface `index` before and is put back (the original
    /// link-local address, with `randomize_link`).
    AddressBack { index: u32, addr: Ipv6Addr, len: u8 },
    /// The original MAC of interface `index` (`randomize_link`).
    LinkMac { index: u32, mac: [u8; 6] },
    /// The instance's nftables table (`inet TABLE`) on external interface `external`
    /// (docs/PROTOCOL.md §5.4).
    Firewall { table: String, external: String },
}

/// A peer as far as ownership goes: its remote true address is routed (and guarded) by exactly
/// one instance per namespace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerRecord {
    pub name: String,
    pub remote: Ipv6Addr,
}

impl PeerRecord {
    fn of(p: &PeerConfig) -> PeerRecord {
        PeerRecord {
            name: p.name.clone(),
            remote: p.stream.remote.true_addr,
        }
    }
}

/// The record of one instance (`<key>.json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub pid: u32,
    pub netns: u64,
    /// The namespace's inode number, to tell whether it still exists (0: unknown).
    #[serde(default)]
    pub netns_inode: u64,
    pub config: PathBuf,
    pub tun: String,
    pub external: String,
    pub internal: Option<String>,
    pub control_socket: PathBuf,
    pub peers: Vec<PeerRecord>,
    /// Index of the external interface when the daemon started; its hashed addresses carry
    /// [`MARKER`] there.
    #[serde(default)]
    pub external_index: u32,
    pub changes: Vec<Change>,
    /// The daemon stopped cleanly and left what [`kept_at_stop`] selects on record (with
    /// anything it could not undo): the next start adopts what its peers need, `mt6d down`
    /// removes it.
    #[serde(default)]
    pub stopped_cleanly: bool,
}

impl Record {
    /// The record a daemon for `cfg` in namespace `netns` starts with.
    pub fn for_config(cfg: &Config, netns: u64) -> Record {
        let g = &cfg.gateway;
        Record {
            pid: std::process::id(),
            netns,
            netns_inode: current_netns_inode(),
            config: std::fs::canonicalize(&cfg.path).unwrap_or_else(|_| cfg.path.clone()),
            tun: g.tun_name.clone(),
            external: g.external_interface.clone(),
            internal: g.internal_interface().map(str::to_owned),
            control_socket: g.control_socket.clone(),
            peers: cfg.peers.iter().map(PeerRecord::of).collect(),
            external_index: 0,
            changes: Vec::new(),
            stopped_cleanly: false,
        }
    }

    fn key(&self) -> String {
        instance_key(self.netns, &self.tun)
    }

    fn interfaces(&self) -> impl Iterator<Item = &str> {
        [
            Some(self.tun.as_str()),
            Some(self.external.as_str()),
            self.internal.as_deref(),
        ]
        .into_iter()
        .flatten()
    }

    /// What `self` and `other` would both own, in words; empty when nothing.
    pub fn shared_with(&self, other: &Record) -> Vec<String> {
        let mut shared = Vec::new();
        if self.control_socket == other.control_socket {
            shared.push(format!("control socket {}", self.control_socket.display()));
        }
        // Interfaces and routes are per namespace: in two namespaces the same names are
        // different objects.
        if self.netns != other.netns {
            return shared;
        }
        if self.tun == other.tun {
            shared.push(format!("TUN device {}", self.tun));
        }
        for mine in self.interfaces() {
            if mine != self.tun && other.interfaces().any(|o| o == mine) {
                shared.push(format!("interface {mine}"));
            }
        }
        for p in &self.peers {
            if let Some(o) = other.peers.iter().find(|o| o.remote == p.remote) {
                shared.push(format!(
                    "peer true address {} (here peer {:?}, there {:?})",
                    p.remote, p.name, o.name
                ));
            }
        }
        shared
    }

    fn sysctl_original(&self, name: &str) -> Option<&str> {
        self.changes.iter().find_map(|c| match c {
            Change::Sysctl { name: n, original } if n == name => Some(original.as_str()),
            _ => None,
        })
    }
}

fn current_netns_inode() -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/thread-self/ns/net").map_or(0, |m| m.ino())
}

/// Whether a network namespace with inode `ino` still exists: named (`/run/netns`) or entered
/// by some thread. A namespace kept only by an open descriptor is missed; that is the price of
/// not reading every process's descriptors, and costs only its leftovers' record.
fn netns_exists(ino: u64) -> bool {
    use std::os::unix::fs::MetadataExt;
    let is = |p: &Path| std::fs::metadata(p).is_ok_and(|m| m.ino() == ino);
    let named = std::fs::read_dir("/run/netns")
        .map(|d| d.flatten().any(|e| is(&e.path())))
        .unwrap_or(false);
    named
        || std::fs::read_dir("/proc").is_ok_and(|procs| {
            procs.flatten().any(|p| {
                std::fs::read_dir(p.path().join("task"))
                    .is_ok_and(|tasks| tasks.flatten().any(|t| is(&t.path().join("ns/net"))))
            })
        })
}

/// Removes the records of dead instances whose network namespace no longer exists (a lab torn
/// down after a daemon in it was killed): nothing they list exists any more. Their control
/// socket goes too when nobody answers on it.
fn collect_garbage(dir: &Path, found: &[Found], ours: u64) {
    for f in found.iter().filter(|f| !f.running) {
        let Some(r) = &f.record else {
            // A lock file whose daemon was refused or died before writing a record.
            if !dir.join(format!("{}.json", f.key)).exists() {
                let _ = std::fs::remove_file(dir.join(format!("{}.lock", f.key)));
            }
            continue;
        };
        if r.netns == ours || r.netns_inode == 0 || netns_exists(r.netns_inode) {
            continue;
        }
        log::debug!(
            "removing the record of mt6d pid {}: its network namespace is gone",
            r.pid
        );
        let _ = crate::control::remove_stale_socket(&r.control_socket);
        remove_files(dir, &f.key, true);
    }
}

/// The file name stem of an instance.
pub fn instance_key(netns: u64, tun: &str) -> String {
    format!("{netns:016x}-{tun}")
}

fn setup(msg: impl Into<String>) -> GatewayError {
    GatewayError::Setup(msg.into())
}

/// The registry lock, held while records are read and written.
struct Registry {
    _lock: Flock<File>,
}

impl Registry {
    fn lock(dir: &Path) -> Result<Registry, GatewayError> {
        // Only the default directory is mt6d's by definition; one named by MT6D_STATE_DIR may
        // be shared, and is only reported if wider than 0700.
        crate::daemon::files::private_dir(dir, dir == Path::new(STATE_DIR)).map_err(|e| {
            setup(format!(
                "cannot create state directory {}: {e}",
                dir.display()
            ))
        })?;
        let path = dir.join("registry.lock");
        let file = crate::daemon::files::open_private(&path)
            .map_err(|e| setup(format!("{}: {e}", path.display())))?;
        let lock = Flock::lock(file, FlockArg::LockExclusive)
            .map_err(|(_, e)| setup(format!("lock {}: {e}", path.display())))?;
        Ok(Registry { _lock: lock })
    }
}

/// Another instance's files as found in the state directory.
#[derive(Debug)]
pub struct Found {
    pub record: Option<Record>,
    /// The pid written in its lock file.
    pub pid: Option<u32>,
    /// Whether its lock is held: its daemon is running.
    pub running: bool,
    pub key: String,
}

/// Every instance record in `dir` except `except`, with whether its daemon still runs.
fn scan(dir: &Path, except: &str) -> Vec<Found> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(key) = name.strip_suffix(".lock") else {
            continue;
        };
        if key == except || key == "registry" {
            continue;
        }
        let lock_path = entry.path();
        let Ok(file) = File::open(&lock_path) else {
            continue;
        };
        let pid = std::fs::read_to_string(&lock_path)
            .ok()
            .and_then(|s| s.trim().parse().ok());
        let running = match Flock::lock(file, FlockArg::LockSharedNonblock) {
            Ok(_unlocked_on_drop) => false,
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => true,
            Err(_) => false,
        };
        let record = read_record(&dir.join(format!("{key}.json")));
        out.push(Found {
            record,
            pid,
            running,
            key: key.to_owned(),
        });
    }
    out
}

/// The daemons running now with a record in `dir` (normally [`state_dir`]), in key order:
/// what `mt6d status` lists when no socket is named. A record whose lock is free belongs to a
/// dead daemon and is left out.
pub fn running_instances(dir: &Path) -> Vec<(Record, u32)> {
    // Probing a lock takes it for a moment: under the registry lock, a daemon starting with the
    // same key cannot find its lock taken by this probe and refuse. A client that may not open
    // the registry (another user) probes without it.
    if !dir.is_dir() {
        return Vec::new();
    }
    let _registry = Registry::lock(dir).ok();
    let mut found: Vec<Found> = scan(dir, "").into_iter().filter(|f| f.running).collect();
    found.sort_by(|a, b| a.key.cmp(&b.key));
    found
        .into_iter()
        .filter_map(|f| {
            let pid = f.pid.or(f.record.as_ref().map(|r| r.pid))?;
            f.record.map(|r| (r, pid))
        })
        .collect()
}

fn read_record(path: &Path) -> Option<Record> {
    let text = std::fs::read_to_string(path).ok()?;
    match serde_json::from_str(&text) {
        Ok(r) => Some(r),
        Err(e) => {
            log::warn!("{}: unreadable instance record: {e}", path.display());
            None
        }
    }
}

/// The running daemon's claim on its instance: the held lock and the record it keeps current.
#[derive(Debug)]
pub struct Instance {
    dir: PathBuf,
    key: String,
    record: Record,
    _lock: Flock<File>,
}

impl Instance {
    /// Claims the instance `cfg` describes in the calling thread's namespace, before anything
    /// is touched: refuses if a running daemon would share anything with it (naming its pid
    /// and what they share), then removes what dead instances of this namespace that share
    /// something with it left behind (their guards last), and writes a fresh record.
    pub fn claim(cfg: &Config, nl: &mut Netlink) -> Result<Instance, GatewayError> {
        Instance::claim_in(&state_dir(), cfg, nl)
    }

    fn claim_in(dir: &Path, cfg: &Config, nl: &mut Netlink) -> Result<Instance, GatewayError> {
        let netns = mt6d_os::current_cookie().map_err(|source| GatewayError::Os {
            what: "identify the network namespace".into(),
            source,
        })?;
        let mut record = Record::for_config(cfg, netns);
        let key = record.key();
        let _registry = Registry::lock(dir)?;

        let lock_path = dir.join(format!("{key}.lock"));
        let mut lock = take_lock(&lock_path, &record)?;

        let others = scan(dir, &key);
        collect_garbage(dir, &others, netns);
        for o in others.iter().filter(|o| o.running) {
            let Some(theirs) = &o.record else { continue };
            let shared = record.shared_with(theirs);
            if !shared.is_empty() {
                // Nothing of ours exists yet: leave no lock file behind (unless a dead
                // predecessor's record needs it to stay visible).
                if !dir.join(format!("{key}.json")).exists() {
                    let _ = std::fs::remove_file(&lock_path);
                }
                return Err(setup(format!(
                    "another mt6d (pid {}, config {}) is running and would share {} with this one; refusing before touching anything",
                    o.pid.unwrap_or(theirs.pid),
                    theirs.config.display(),
                    shared.join(", ")
                )));
            }
        }

        // Our own instance's record from a daemon that died, and dead instances of this
        // namespace that overlap us: their leftovers would collide with what we add.
        let own_stale = read_record(&dir.join(format!("{key}.json")));
        let mut dead: Vec<(String, Record)> =
            own_stale.map(|r| (key.clone(), r)).into_iter().collect();
        for o in others.into_iter().filter(|o| !o.running) {
            if let Some(r) = o.record {
                if r.netns == netns && !record.shared_with(&r).is_empty() {
                    dead.push((o.key, r));
                }
            }
        }
        adopt_dead(nl, cfg, (dir, &key), &mut record, &dead);

        // Our lock file says who holds it.
        lock.set_len(0)
            .map_err(|e| setup(format!("{}: {e}", lock_path.display())))?;
        writeln!(&mut *lock, "{}", record.pid)
            .map_err(|e| setup(format!("{}: {e}", lock_path.display())))?;
        record.external_index = nl.link_index(&record.external).unwrap_or(0);
        let inst = Instance {
            dir: dir.to_path_buf(),
            key,
            record,
            _lock: lock,
        };
        inst.persist()?;
        Ok(inst)
    }

    /// The record as it stands.
    pub fn record(&self) -> &Record {
        &self.record
    }

    /// Writes `change` to the record before it is made (write-ahead), so that a crash right
    /// after making it still leaves it on record.
    pub fn record_change(&mut self, change: Change) -> Result<(), GatewayError> {
        if self.record.changes.contains(&change) {
            return Ok(());
        }
        self.record.changes.push(change);
        self.persist()
    }

    /// Sets sysctl `name` to `value`, recording its original value first (only the first
    /// time: a value this instance set is never taken for an original). Any sysctl under
    /// `/proc/sys/net` can be changed this way, and every one is restored at clean-up.
    pub fn set_sysctl(&mut self, name: &Sysctl, value: &str) -> Result<(), GatewayError> {
        let os = |what: String| move |source| GatewayError::Os { what, source };
        if self.record.sysctl_original(name.name()).is_none() {
            // A running instance of this namespace that changed it holds the true original.
            let shared = {
                let _registry = Registry::lock(&self.dir)?;
                scan(&self.dir, &self.key)
                    .into_iter()
                    .filter(|o| o.running)
                    .filter_map(|o| o.record)
                    .filter(|r| r.netns == self.record.netns)
                    .find_map(|r| r.sysctl_original(name.name()).map(str::to_owned))
            };
            let original = match shared {
                Some(v) => v,
                None => name
                    .get()
                    .map_err(os(format!("read sysctl {}", name.name())))?,
            };
            self.record_change(Change::Sysctl {
                name: name.name().to_owned(),
                original,
            })?;
        }
        name.set(value)
            .map_err(os(format!("set sysctl {} = {value}", name.name())))
    }

    /// A clean stop: undoes every recorded change but what [`kept_at_stop`] selects, newest
    /// first. That stays, in the kernel and on the record (marked `stopped_cleanly`), for the
    /// next start to adopt or `mt6d down` to remove; with nothing kept the record is removed
    /// when the instance is dropped. Returns the failures.
    pub fn clean_up(&mut self, nl: &mut Netlink) -> Vec<String> {
        let internal = self
            .record
            .internal
            .as_deref()
            .and_then(|n| nl.link_index(n).ok());
        let (left, mut kept) = {
            let _registry = Registry::lock(&self.dir).ok();
            clean_up(nl, &self.record, &self.dir, &self.key, |c| {
                kept_at_stop(c, internal)
            })
        };
        kept.reverse();
        self.record.stopped_cleanly = !kept.is_empty();
        self.record.changes = kept;
        if let Err(e) = self.persist() {
            log::error!("{e}");
        }
        if !left.is_empty() {
            log::warn!(
                "could not undo everything; run `mt6d down` to retry: {}",
                left.join("; ")
            );
        }
        left
    }

    /// The fail-closed guards on record (what a clean stop leaves).
    pub fn guards(&self) -> usize {
        self.record
            .changes
            .iter()
            .filter(|c| matches!(c, Change::Guard { .. }))
            .count()
    }

    /// Undoes one change this instance made and takes it off the record (a reload removing a
    /// peer). What could not be undone stays on record, for the clean-up at exit or `mt6d down`.
    pub fn undo(&mut self, nl: &mut Netlink, change: &Change) -> Result<(), GatewayError> {
        undo_one(nl, change).map_err(|e| setup(format!("undo {change:?}: {}", error_chain(&e))))?;
        self.record.changes.retain(|c| c != change);
        self.persist()
    }

    /// Refuses peers that a running daemon of this namespace already routes (the same check
    /// as at start-up, for peers a reload adds), naming its pid and the address.
    pub fn admit_peers(&self, peers: &[&PeerConfig]) -> Result<(), GatewayError> {
        let _registry = Registry::lock(&self.dir)?;
        for o in scan(&self.dir, &self.key).into_iter().filter(|o| o.running) {
            let Some(theirs) = &o.record else { continue };
            if theirs.netns != self.record.netns {
                continue;
            }
            for p in peers.iter().map(|p| PeerRecord::of(p)) {
                if let Some(t) = theirs.peers.iter().find(|t| t.remote == p.remote) {
                    return Err(setup(format!(
                        "peer {:?}: another mt6d (pid {}, config {}) routes its true address {} (as peer {:?})",
                        p.name,
                        o.pid.unwrap_or(theirs.pid),
                        theirs.config.display(),
                        p.remote,
                        t.name
                    )));
                }
            }
        }
        Ok(())
    }

    /// Records `peers` as this instance's (a reload), so that the conflict checks of other
    /// starts see them.
    pub fn set_peers(&mut self, peers: &[&PeerConfig]) -> Result<(), GatewayError> {
        self.record.peers = peers.iter().map(|p| PeerRecord::of(p)).collect();
        self.persist()
    }

    fn persist(&self) -> Result<(), GatewayError> {
        let path = self.dir.join(format!("{}.json", self.key));
        let tmp = self.dir.join(format!("{}.json.tmp", self.key));
        let text = serde_json::to_vec_pretty(&self.record)
            .map_err(|e| setup(format!("encode {}: {e}", path.display())))?;
        crate::daemon::files::create_temporary(&tmp)
            .and_then(|mut f| f.write_all(&text))
            .and_then(|()| std::fs::rename(&tmp, &path))
            .map_err(|e| setup(format!("write {}: {e}", path.display())))
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        // Changes still listed were not undone: keep them on record for `mt6d down`.
        if self.record.changes.is_empty() {
            remove_files(&self.dir, &self.key, true);
        } else if let Err(e) = self.persist() {
            log::warn!("{e}");
        }
    }
}

/// What a clean stop leaves in place (docs/ARCHITECTURE.md "Fail closed"): the fail-closed
/// guards, and the /128 routes on the internal interface (index `internal`), which in gateway
/// mode are the routes to the protected hosts. With only the guards, a protected host's packet
/// to its peer meets the guard, and the kernel's ICMPv6 "administratively prohibited" back to
/// the host, with the packet quoted, would follow a default route onto the public link.
pub fn kept_at_stop(c: &Change, internal: Option<u32>) -> bool {
    match c {
        Change::Guard { .. } => true,
        Change::Route {
            len: 128,
            oif,
            via: None,
            ..
        } => Some(*oif) == internal,
        _ => false,
    }
}

/// Removes an instance's record and lock file once nothing of it is left; with `done` false
/// both stay (what could not be undone stays on record, and the lock file keeps the record
/// visible to the scans of other starts).
fn remove_files(dir: &Path, key: &str, done: bool) {
    if done {
        let _ = std::fs::remove_file(dir.join(format!("{key}.json")));
        let _ = std::fs::remove_file(dir.join(format!("{key}.lock")));
    }
}

/// Removes the addresses and neighbour entries carrying [`MARKER`] on `r`'s external interface
/// (hashed addresses and pinned peers; the interface belongs to one instance per namespace),
/// then undoes `r`'s changes newest first.
/// A sysctl another running instance of the namespace also recorded is left to that one, and a
/// change `keep` selects is left in place for the caller to take over.
/// Continues past failures; returns them and the changes kept.
fn clean_up(
    nl: &mut Netlink,
    r: &Record,
    dir: &Path,
    own_key: &str,
    keep: impl Fn(&Change) -> bool,
) -> (Vec<String>, Vec<Change>) {
    nl.set_marker(MARKER);
    let running: Vec<Record> = scan(dir, own_key)
        .into_iter()
        .filter(|o| o.running)
        .filter_map(|o| o.record)
        .filter(|o| o.netns == r.netns)
        .collect();
    let mut failed = Vec::new();
    let mut kept = Vec::new();
    // Hashed addresses first: they are what the peer sends to.
    if r.external_index != 0 {
        match nl.list_addresses(r.external_index) {
            Ok(list) => {
                for a in list.iter().filter(|a| a.proto == MARKER) {
                    if let Err(e) = nl.del_address(r.external_index, a.addr, a.prefix_len) {
                        failed.push(error_chain(&e));
                    }
                }
            }
            Err(e) => log::debug!("hashed addresses of {}: {}", r.external, error_chain(&e)),
        }
        // The peer's hashed addresses pinned to its MAC (one segment, docs/PROTOCOL.md §5.2):
        // permanent entries would outlive the daemon.
        match nl.list_neighbors(r.external_index) {
            Ok(list) => {
                for n in list.iter().filter(|n| n.proto == MARKER) {
                    if let Err(e) = nl.del_neighbor(r.external_index, n.addr) {
                        failed.push(error_chain(&e));
                    }
                }
            }
            Err(e) => log::debug!("neighbour entries of {}: {}", r.external, error_chain(&e)),
        }
    }
    for c in r.changes.iter().rev() {
        if keep(c) {
            kept.push(c.clone());
            continue;
        }
        let result = match c {
            Change::Sysctl { name, .. }
                if running.iter().any(|o| o.sysctl_original(name).is_some()) =>
            {
                log::info!("{name}: left as is for the other mt6d of this namespace");
                Ok(())
            }
            c => undo_one(nl, c),
        };
        if let Err(e) = result {
            failed.push(format!("undo {c:?}: {}", error_chain(&e)));
        }
    }
    (failed, kept)
}

/// Undoes one recorded change (a sysctl: restores its original, whoever else shares it; the
/// caller decides that).
fn undo_one(nl: &mut Netlink, c: &Change) -> Result<(), mt6d_os::OsError> {
    match c {
        Change::Sysctl { name, original } => {
            match Sysctl::new(name).and_then(|s| s.set(original)) {
                // The interface went away (the TUN device with the dead process), and
                // its settings with it.
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
                r => r,
            }
        }
        Change::Guard { dst, len } => nl.del_guard_route(*dst, *len),
        Change::Route { dst, len, oif, .. } => nl.del_route(*dst, *len, *oif),
        Change::ProxyNeighbor { index, addr } => nl.del_proxy_neighbor(*index, *addr),
        Change::Address { index, addr, len } => nl.del_address(*index, *addr, *len),
        Change::AddressBack { index, addr, len } => {
            // In use before the daemon started: no second DAD, its prefix route as before.
            let flags = mt6d_os::AddrFlags {
                nodad: true,
                noprefixroute: false,
            };
            nl.add_address(*index, *addr, *len, flags)
        }
        Change::LinkMac { index, mac } => nl.link_set_mac(*index, *mac),
        Change::Firewall { table, external } => {
            // The addresses just removed made the kernel send MLD reports leaving their
            // groups, repeated once within the report interval (RFC 3810 §6.1): the table
            // must still drop the repeat.
            std::thread::sleep(super::quiet::mld_repeat_window(external));
            mt6d_os::nftables::NftTable::new(table).and_then(|t| t.delete())
        }
    }
}

/// An error with its causes, `a: b: c`, so the kernel's errno text is never lost.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let text = c.to_string();
        if !s.contains(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
        cur = c.source();
    }
    s
}

/// What `mt6d down` did.
#[derive(Debug, Default)]
pub struct DownReport {
    /// The dead daemon's pid and config, when there was a record.
    pub owner: Option<(u32, PathBuf)>,
    pub undone: usize,
    pub failed: Vec<String>,
    /// The daemon had stopped cleanly: what was undone are the guards its stop left.
    pub stopped_cleanly: bool,
}

/// `mt6d down -c FILE`: removes what a daemon for `cfg` in this namespace left behind (after a
/// clean stop, its fail-closed guards; after a crash, everything), guards included, and
/// restores its sysctls; starts nothing. Refuses while a daemon for the instance runs.
pub fn down(cfg: &Config) -> Result<DownReport, GatewayError> {
    let mut nl = Netlink::open().map_err(|source| GatewayError::Os {
        what: "open rtnetlink".into(),
        source,
    })?;
    down_in(&state_dir(), cfg, &mut nl)
}

fn down_in(dir: &Path, cfg: &Config, nl: &mut Netlink) -> Result<DownReport, GatewayError> {
    let netns = mt6d_os::current_cookie().map_err(|source| GatewayError::Os {
        what: "identify the network namespace".into(),
        source,
    })?;
    let mine = Record::for_config(cfg, netns);
    let key = mine.key();
    let _registry = Registry::lock(dir)?;
    let lock_path = dir.join(format!("{key}.lock"));
    let _lock = match File::options()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&lock_path)
    {
        Err(_) => None,
        Ok(file) => match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(l) => Some(l),
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => {
                let pid = std::fs::read_to_string(&lock_path).unwrap_or_default();
                return Err(setup(format!(
                    "mt6d pid {} is running for this configuration (TUN {}); stop it first (SIGTERM: it removes all but its fail-closed guards, which `mt6d down` then lifts)",
                    pid.trim(),
                    mine.tun
                )));
            }
            Err((_, e)) => return Err(setup(format!("lock {}: {e}", lock_path.display()))),
        },
    };
    let mut report = DownReport::default();
    let record = match read_record(&dir.join(format!("{key}.json"))) {
        Some(r) => r,
        None => {
            // No record (never started here, or stopped cleanly): still sweep hashed
            // addresses with our marker, unless a running instance owns that interface.
            let busy = scan(dir, &key)
                .into_iter()
                .filter(|o| o.running)
                .filter_map(|o| o.record)
                .any(|o| !mine.shared_with(&o).is_empty());
            if busy {
                return Ok(report);
            }
            Record {
                external_index: nl.link_index(&mine.external).unwrap_or(0),
                ..mine
            }
        }
    };
    if !record.changes.is_empty() {
        report.owner = Some((record.pid, record.config.clone()));
        report.stopped_cleanly = record.stopped_cleanly;
    }
    report.undone = record.changes.len();
    report.failed = clean_up(nl, &record, dir, &key, |_| false).0;
    remove_files(dir, &key, report.failed.is_empty());
    // The dead daemon's control socket, if it is one that nobody answers on.
    let _ = crate::control::remove_stale_socket(&record.control_socket);
    Ok(report)
}

/// The instance's lock file, locked: refused at once when another daemon holds it (it would
/// share the TUN device).
fn take_lock(lock_path: &Path, record: &Record) -> Result<Flock<std::fs::File>, GatewayError> {
    let file = crate::daemon::files::open_private(lock_path)
        .map_err(|e| setup(format!("{}: {e}", lock_path.display())))?;
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(l) => Ok(l),
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => {
            let pid = std::fs::read_to_string(lock_path).unwrap_or_default();
            Err(setup(format!(
                "another mt6d (pid {}) is running in this network namespace and would share TUN device {} with this one; refusing before touching anything: stop it first (SIGTERM) or set another tun_name",
                pid.trim(),
                record.tun
            )))
        }
        Err((_, e)) => Err(setup(format!("lock {}: {e}", lock_path.display()))),
    }
}

/// Cleans up after the dead instances `dead` (their kernel state, files) and takes over what
/// this instance needs of it: the fail-closed guards of its protected addresses, the routes to
/// its protected hosts and the nftables table of its TUN name.
fn adopt_dead(
    nl: &mut Netlink,
    cfg: &Config,
    (dir, key): (&Path, &String),
    record: &mut Record,
    dead: &[(String, Record)],
) {
    // The nftables table this instance loads next replaces a dead one's of the same name in
    // one transaction: taken over rather than deleted, it keeps dropping the MLD reports the
    // removed addresses repeat, and the start skips the deletion's wait for that repeat
    // (about 1.2 s, the largest part of a restart after a crash).
    let successor_table = super::quiet::table_name(&record.tun);
    // The guards of the addresses this instance protects are adopted, never lifted: between
    // the predecessor's stop (or crash) and this start's TUN routes they are all that keeps
    // the protected side's packets off the public link. Set-up adds them again in place
    // (`NLM_F_REPLACE`). A guard for an address no peer of ours has goes: nothing protects
    // that address by configuration any more.
    let guarded: Vec<Ipv6Addr> = cfg
        .peers
        .iter()
        .map(|p| p.stream.remote.true_addr)
        .collect();
    // The routes to our protected hosts on our internal interface: without them, from the
    // predecessor's clean-up to our own set-up, the guards' ICMPv6 errors to those hosts
    // would follow a default route onto the public link.
    let internal = cfg
        .gateway
        .internal_interface()
        .and_then(|n| nl.link_index(n).ok());
    let protected: Vec<Ipv6Addr> = cfg.peers.iter().map(|p| p.stream.local.true_addr).collect();
    for (k, r) in dead {
        if r.stopped_cleanly {
            log::info!(
                "adopting the fail-closed guards mt6d pid {} ({}) left at its stop",
                r.pid,
                r.config.display()
            );
        } else {
            log::info!(
                "cleaning up after mt6d pid {} ({}), which did not stop cleanly",
                r.pid,
                r.config.display()
            );
        }
        let (left, mut kept) = clean_up(nl, r, dir, key, |c| match c {
            Change::Firewall { table, external } => {
                *table == successor_table && *external == record.external
            }
            Change::Guard { dst, len: 128 } => guarded.contains(dst),
            Change::Route {
                dst,
                len: 128,
                oif,
                via: None,
            } => Some(*oif) == internal && protected.contains(dst),
            _ => false,
        });
        // Oldest first again (clean-up walks the journal backwards).
        kept.reverse();
        for c in kept {
            if !record.changes.contains(&c) {
                log::debug!("taken over from pid {}: {c:?}", r.pid);
                record.changes.push(c);
            }
        }
        // Our own predecessor's files are ours now: the lock file is the one we hold, the
        // record is rewritten below. Removing them would unlink the lock we hold and hide
        // this daemon from every other start's conflict check.
        if *k != *key {
            remove_files(dir, k, left.is_empty());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(netns: u64, tun: &str, ext: &str, sock: &str, remote: &str) -> Record {
        Record {
            pid: 1,
            netns,
            netns_inode: 0,
            config: "/etc/mt6d/a.toml".into(),
            tun: tun.into(),
            external: ext.into(),
            internal: Some(format!("in-{tun}")),
            control_socket: sock.into(),
            peers: vec![PeerRecord {
                name: "b".into(),
                remote: remote.parse().expect("literal"),
            }],
            external_index: 0,
            changes: Vec::new(),
            stopped_cleanly: false,
        }
    }

    #[test]
    fn sharing_is_per_namespace_except_the_control_socket() {
        let a = record(1, "mt6d0", "eth0", "/run/mt6d/a.sock", "2001:db8:1::b");
        let b = record(1, "mt6d1", "eth2", "/run/mt6d/b.sock", "2001:db8:2::b");
        assert!(a.shared_with(&b).is_empty(), "{:?}", a.shared_with(&b));
        let same_ext = Record {
            external: "eth0".into(),
            ..b.clone()
        };
        assert_eq!(a.shared_with(&same_ext), vec!["interface eth0"]);
        let same_tun = record(1, "mt6d0", "eth8", "/y.sock", "2001:db8:3::b");
        assert_eq!(
            a.shared_with(&same_tun),
            vec!["TUN device mt6d0", "interface in-mt6d0"]
        );
        let same_peer = record(1, "mt6d1", "eth9", "/x.sock", "2001:db8:1::b");
        let shared = a.shared_with(&same_peer);
        assert_eq!(shared.len(), 1, "{shared:?}");
        assert!(shared[0].starts_with("peer true address 2001:db8:1::b"));
        let other_ns = record(2, "mt6d0", "eth0", "/run/mt6d/b.sock", "2001:db8:1::b");
        assert!(a.shared_with(&other_ns).is_empty());
        let other_ns_same_socket = Record {
            control_socket: "/run/mt6d/a.sock".into(),
            ..other_ns
        };
        assert_eq!(
            a.shared_with(&other_ns_same_socket),
            vec!["control socket /run/mt6d/a.sock"]
        );
    }

    #[test]
    fn record_round_trips_through_json() {
        let mut r = record(7, "mt6d0", "eth0", "/s", "2001:db8::b");
        r.changes = vec![
            Change::Sysctl {
                name: "net/ipv6/conf/all/forwarding".into(),
                original: "0".into(),
            },
            Change::Guard {
                dst: "2001:db8::b".parse().expect("literal"),
                len: 128,
            },
            Change::Route {
                dst: "2001:db8::".parse().expect("literal"),
                len: 64,
                oif: 3,
                via: None,
            },
        ];
        let text = serde_json::to_string(&r).expect("encode");
        assert!(text.contains("\"kind\":\"guard\""), "{text}");
        let back: Record = serde_json::from_str(&text).expect("decode");
        assert_eq!(back, r);
        assert_eq!(
            back.sysctl_original("net/ipv6/conf/all/forwarding"),
            Some("0")
        );
        assert_eq!(instance_key(0xab, "mt6d0"), "00000000000000ab-mt6d0");
    }

    fn config(tun: &str, ext: &str, int: &str, remote: &str, dir: &Path) -> Config {
        let text = format!(
            "[gateway]\ninternal_interface = \"{int}\"\nexternal_interface = \"{ext}\"\ntun_name = \"{tun}\"\ncontrol_socket = \"{}/{tun}.sock\"\n\n[[peer]]\nname = \"p\"\nlocal_host = \"2001:db8:1::a\"\nremote_host = \"{remote}\"\nkey = \"AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=\"\n",
            dir.display()
        );
        Config::parse(&dir.join(format!("{tun}.toml")), &text).expect("valid config")
    }

    /// Two instances in one namespace share `all/forwarding`: the second records the true
    /// original (the first's), the first stopping leaves it alone, the last restores it. A
    /// "crashed" instance (lock released, record kept) is cleaned up by the next start, which
    /// records the true original again; an overlapping start is refused naming the pid.
    #[test]
    #[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
    fn shared_sysctls_crash_records_and_conflicts_in_a_namespace() {
        let ns = mt6d_os::Netns::create(&mt6d_os::unique_name("st")).expect("netns");
        let dir = fresh_dir("mt6d-state-ns");
        ns.run(|| {
            let fwd = Sysctl::ipv6_conf("all", "forwarding").expect("name");
            fwd.set("0").expect("start from 0");
            let mut nl = Netlink::open().expect("netlink");
            let a_cfg = config("ta", "ea", "ia", "2001:db8:1::b", &dir);
            let b_cfg = config("tb", "eb", "ib", "2001:db8:2::b", &dir);
            let mut a = Instance::claim_in(&dir, &a_cfg, &mut nl).expect("claim a");
            a.set_sysctl(&fwd, "1").expect("a sets");
            let mut b = Instance::claim_in(&dir, &b_cfg, &mut nl).expect("claim b");
            b.set_sysctl(&fwd, "1").expect("b sets");
            assert_eq!(b.record().sysctl_original(fwd.name()), Some("0"));

            // Same external interface as a running instance: refused, naming its pid.
            let clash = config("tc", "ea", "ic", "2001:db8:3::b", &dir);
            let e = Instance::claim_in(&dir, &clash, &mut nl).expect_err("refused");
            let text = e.to_string();
            assert!(
                text.contains(&format!("pid {}", std::process::id()))
                    && text.contains("interface ea"),
                "{text}"
            );
            // The same TUN name in the same namespace: refused too.
            assert!(Instance::claim_in(&dir, &a_cfg, &mut nl).is_err());

            assert!(a.clean_up(&mut nl).is_empty());
            drop(a);
            assert_eq!(fwd.get().expect("read"), "1", "b still needs forwarding");

            // b "crashes": its lock goes, its record stays.
            drop(b);
            assert!(dir.join(format!("{}.json", b_key(&dir))).exists());
            let mut b2 = Instance::claim_in(&dir, &b_cfg, &mut nl).expect("claim after crash");
            assert_eq!(
                fwd.get().expect("read"),
                "0",
                "the dead instance's original restored"
            );
            b2.set_sysctl(&fwd, "1").expect("set again");
            assert_eq!(b2.record().sysctl_original(fwd.name()), Some("0"));
            assert!(b2.clean_up(&mut nl).is_empty());
            drop(b2);
            assert_eq!(fwd.get().expect("read"), "0");
        })
        .expect("run in namespace");
        let left: Vec<_> = std::fs::read_dir(&dir)
            .expect("dir")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n != "registry.lock")
            .collect();
        assert!(left.is_empty(), "files left: {left:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Whatever the umask, the state directory the daemon creates is 0700 and its records and
    /// lock files 0600 (a record holds the peers' true addresses); a symbolic link planted at
    /// the record's temporary path is replaced, not written through.
    #[test]
    #[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
    fn records_are_private_whatever_the_umask() {
        use std::os::unix::fs::PermissionsExt as _;
        let ns = mt6d_os::Netns::create(&mt6d_os::unique_name("st")).expect("netns");
        let base = fresh_dir("mt6d-state-modes");
        let dir = base.join("run");
        let victim = base.join("victim");
        std::fs::write(&victim, "precious").expect("write");
        let mode = |p: &Path| {
            std::fs::symlink_metadata(p)
                .expect("exists")
                .permissions()
                .mode()
                & 0o777
        };
        let victim_mode = mode(&victim);
        // The usual umask of a shell (the daemon run by hand), whatever the test runner's.
        let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o022));
        ns.run(|| {
            let mut nl = Netlink::open().expect("netlink");
            let cfg = config("tm", "em", "im", "2001:db8:5::b", &base);
            let mut a = Instance::claim_in(&dir, &cfg, &mut nl).expect("claim");
            let key = key_of(&dir, "-tm");
            assert_eq!(mode(&dir), 0o700, "state directory");
            assert_eq!(mode(&dir.join(format!("{key}.json"))), 0o600, "record");
            assert_eq!(mode(&dir.join(format!("{key}.lock"))), 0o600, "lock");
            assert_eq!(mode(&dir.join("registry.lock")), 0o600, "registry lock");
            std::os::unix::fs::symlink(&victim, dir.join(format!("{key}.json.tmp")))
                .expect("plant a link");
            a.set_peers(&[]).expect("rewrite the record");
            assert_eq!(std::fs::read_to_string(&victim).expect("read"), "precious");
            assert_eq!(mode(&victim), victim_mode);
            assert_eq!(mode(&dir.join(format!("{key}.json"))), 0o600, "record");
            assert!(a.clean_up(&mut nl).is_empty());
        })
        .expect("run in namespace");
        nix::sys::stat::umask(old);
        let _ = std::fs::remove_dir_all(&base);
    }

    /// The key of the record in `dir` whose TUN suffix is `tun`.
    fn key_of(dir: &Path, tun: &str) -> String {
        std::fs::read_dir(dir)
            .expect("dir")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .find_map(|n| {
                n.strip_suffix(".json")
                    .filter(|k| k.ends_with(tun))
                    .map(str::to_string)
            })
            .expect("the record")
    }

    /// A daemon restarted after a crash takes its predecessor's nftables table over (the load
    /// that follows replaces it atomically) instead of deleting it and waiting out the MLD
    /// repeat; clean-up at exit still deletes it.
    #[test]
    #[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
    fn a_restart_after_a_crash_takes_the_firewall_table_over() {
        let ns = mt6d_os::Netns::create(&mt6d_os::unique_name("st")).expect("netns");
        let dir = fresh_dir("mt6d-state-fw");
        ns.run(|| {
            let mut nl = Netlink::open().expect("netlink");
            let cfg = config("tf", "ef", "if", "2001:db8:4::b", &dir);
            let name = crate::gateway::quiet::table_name("tf");
            let table = mt6d_os::nftables::NftTable::new(&name).expect("name");
            let change = Change::Firewall {
                table: name.clone(),
                external: "ef".into(),
            };
            let mut a = Instance::claim_in(&dir, &cfg, &mut nl).expect("claim");
            a.record_change(change.clone()).expect("record");
            table
                .load("chain input { type filter hook input priority 0; }")
                .expect("load");
            drop(a); // a crash: the record stays, the table too

            let started = std::time::Instant::now();
            let mut b = Instance::claim_in(&dir, &cfg, &mut nl).expect("claim after crash");
            let took = started.elapsed();
            assert!(table.exists().expect("list"), "the table was deleted");
            assert_eq!(b.record().changes, vec![change], "not taken over");
            // Deleting it would have waited out the MLD repeat (over a second).
            assert!(took < std::time::Duration::from_millis(900), "{took:?}");
            assert!(b.clean_up(&mut nl).is_empty());
            assert!(!table.exists().expect("list"), "left behind at exit");
            drop(b);
        })
        .expect("run in namespace");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A source address for [`guarded`]: without one the kernel refuses a send before it looks
    /// at the route (EADDRNOTAVAIL).
    const SOURCE: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0xff, 0, 0, 0, 0, 1);

    /// What the kernel does with a datagram to `addr` in a namespace without a default route:
    /// a guard refuses it (EACCES); without one there is no route (ENETUNREACH).
    fn guarded(addr: Ipv6Addr) -> bool {
        let sock = std::net::UdpSocket::bind((SOURCE, 0)).expect("udp");
        match sock.send_to(b"x", (addr, 9)) {
            Err(e) if e.raw_os_error() == Some(libc::EACCES) => true,
            Err(e) if e.raw_os_error() == Some(libc::ENETUNREACH) => false,
            r => panic!("send to {addr}: {r:?}"),
        }
    }

    /// A clean stop undoes all but the guards and leaves them on record; the next start of the
    /// same configuration adopts the guard of its peer (never lifted in between) and removes
    /// the one of an address it has no peer for, and is itself visible to the conflict check
    /// (adopting its predecessor's record does not unlink the lock file it holds); `mt6d down`
    /// lifts the rest and removes the files.
    #[test]
    #[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
    fn a_clean_stop_keeps_the_guards_and_the_next_start_adopts_them() {
        let ns = mt6d_os::Netns::create(&mt6d_os::unique_name("st")).expect("netns");
        let dir = fresh_dir("mt6d-state-stop");
        ns.run(|| {
            let mut nl = Netlink::open().expect("netlink");
            let lo = nl.link_index("lo").expect("lo");
            nl.link_set_up(lo).expect("lo up");
            let flags = mt6d_os::AddrFlags {
                nodad: true,
                noprefixroute: false,
            };
            nl.add_address(lo, SOURCE, 128, flags).expect("source");
            nl.set_marker(MARKER);
            let ours: Ipv6Addr = "2001:db8:5::b".parse().expect("literal");
            let gone: Ipv6Addr = "2001:db8:6::b".parse().expect("literal");
            let cfg = config("tg", "eg", "ig", &ours.to_string(), &dir);
            let fwd = Sysctl::ipv6_conf("all", "forwarding").expect("name");
            fwd.set("0").expect("start from 0");
            let mut a = Instance::claim_in(&dir, &cfg, &mut nl).expect("claim");
            for dst in [ours, gone] {
                a.record_change(Change::Guard { dst, len: 128 })
                    .expect("record");
                nl.add_guard_route(dst, 128).expect("guard");
            }
            a.set_sysctl(&fwd, "1").expect("forwarding");
            assert!(a.clean_up(&mut nl).is_empty());
            assert_eq!(a.guards(), 2);
            assert!(a.record().stopped_cleanly);
            drop(a);
            assert_eq!(fwd.get().expect("read"), "0", "the stop restores sysctls");
            assert!(guarded(ours) && guarded(gone), "the stop lifted a guard");

            let b = Instance::claim_in(&dir, &cfg, &mut nl).expect("claim after the stop");
            assert_eq!(
                b.record().changes,
                vec![Change::Guard {
                    dst: ours,
                    len: 128
                }],
                "the guard of our peer is adopted"
            );
            assert!(!b.record().stopped_cleanly);
            assert!(guarded(ours), "the start lifted the guard of its own peer");
            assert!(!guarded(gone), "a guard no peer needs any more stays");
            let twin = Instance::claim_in(&dir, &cfg, &mut nl);
            assert!(
                twin.is_err(),
                "a second daemon of the same instance was admitted"
            );
            let mut b = b;
            assert!(b.clean_up(&mut nl).is_empty());
            drop(b);
            assert!(guarded(ours));

            let report = down_in(&dir, &cfg, &mut nl).expect("down");
            assert!(report.stopped_cleanly && report.undone == 1, "{report:?}");
            assert!(report.failed.is_empty(), "{report:?}");
            assert!(!guarded(ours), "down left the guard");
        })
        .expect("run in namespace");
        let left: Vec<_> = std::fs::read_dir(&dir)
            .expect("dir")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n != "registry.lock")
            .collect();
        assert!(left.is_empty(), "files left: {left:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// An empty scratch directory of this test process under the system's temporary one.
    fn fresh_dir(tag: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        dir
    }

    fn b_key(dir: &Path) -> String {
        std::fs::read_dir(dir)
            .expect("dir")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .find_map(|n| n.strip_suffix("-tb.json").map(|k| format!("{k}-tb")))
            .expect("b's record")
    }

    /// Records of dead instances whose namespace is gone are removed at the next start; those
    /// of a namespace that exists, or whose namespace is unknown, stay.
    #[test]
    fn records_of_vanished_namespaces_are_collected() {
        let dir = fresh_dir("mt6d-state-gc");
        let mut gone = record(1, "a", "e", "/nonexistent/a.sock", "2001:db8::b");
        gone.netns_inode = u64::MAX;
        let mut here = record(1, "b", "e", "/nonexistent/b.sock", "2001:db8::b");
        here.netns_inode = current_netns_inode();
        let unknown = record(1, "c", "e", "/nonexistent/c.sock", "2001:db8::b");
        for (k, r) in [("ga", &gone), ("hb", &here), ("uc", &unknown)] {
            std::fs::write(
                dir.join(format!("{k}.json")),
                serde_json::to_vec(r).expect("json"),
            )
            .expect("write");
            std::fs::write(dir.join(format!("{k}.lock")), "1\n").expect("write");
        }
        std::fs::write(dir.join("orphan.lock"), "").expect("write");
        collect_garbage(&dir, &scan(&dir, "none"), 2);
        let mut left: Vec<_> = std::fs::read_dir(&dir)
            .expect("dir")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["hb.json", "hb.lock", "uc.json", "uc.lock"]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A lock held by a live open file description is "running"; once dropped (as the kernel
    /// does when a process dies), the same file is "stale", whatever pid it names.
    #[test]
    fn a_released_lock_is_stale_whatever_pid_it_names() {
        let dir = fresh_dir("mt6d-state");
        let r = record(9, "mt6d0", "eth0", "/s", "2001:db8::b");
        std::fs::write(dir.join("x.json"), serde_json::to_vec(&r).expect("encode")).expect("w");
        std::fs::write(dir.join("x.lock"), "4242\n").expect("write");
        let held = Flock::lock(
            File::open(dir.join("x.lock")).expect("open"),
            FlockArg::LockExclusive,
        )
        .expect("lock");
        let found = scan(&dir, "none");
        assert_eq!(found.len(), 1);
        assert!(found[0].running);
        assert_eq!(found[0].pid, Some(4242));
        assert_eq!(found[0].record.as_ref(), Some(&r));
        drop(held);
        assert!(!scan(&dir, "none")[0].running);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
