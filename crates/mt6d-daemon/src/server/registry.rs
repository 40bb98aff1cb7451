//! The server's clients: the million-peer index (`mt6d_proto::endpoint::PeerTable`) with, beside
//! it, what the packet path needs per client (its keys, its replay windows) and the set of hashed
//! addresses currently valid (what the neighbour responder answers for).
//!
//! A client is one of two kinds:
//! * **pre-shared** (`key=`): its sealer and opener are made from the stream by its first
//!   packet in each direction, and its one table entry (its stream's routes) carries everything;
//! * **handshake** (no `key=`): its table entry is its **link set** (the stream keyed by the link
//!   key, docs/PROTOCOL.md §9.1), and it keeps no other state until a handshake message with a
//!   valid link MAC arrives. Then it gets a [`Session`]: a responder-only
//!   `mt6d_proto::link::Link`, its receive keys and its send key. Each further route set the
//!   link binds (a session's, §9.8) is a **secondary** table entry ([`PeerTable::add_secondary`])
//!   mapped back to the client, added and removed by [`Registry::sync_sets`] as the link's
//!   events ask. When the keys expire with no rekey the session is dropped and the client is
//!   back to its link set alone.
//!
//! Route moves (docs/PROTOCOL.md §5.2): a client that moves an epoch to another attempt offset
//! (a collision on its link, a port it cannot bind) tells the server with a route move notice.
//! The worker that receives it checks and applies it under the client's own lock (a pre-shared
//! client's `RouteMoves` here, a handshake client's in its link's route set), answers with an ack
//! at once and asks the main thread to re-derive that entry's window
//! ([`Registry::sync_moves`]); from then on every rotation step derives the entry's routes at
//! the agreed offsets. The server never moves a route of its own: its whole prefix is
//! delivered locally, so no address of it can collide.
//!
//! One `RwLock` (parking_lot's) guards it: the workers take the read side once per batch of
//! datagrams (never per packet), the main thread the write side for a rotation step (at most
//! `STEP_CHUNK` clients per hold, then a fair hand-over to waiting workers), a set change, an
//! added or a removed client. A client's keys sit behind its own mutex, taken once per received batch by
//! the worker that received it: the reuseport hash is over the outer addresses, which change
//! every epoch, so two workers can hold datagrams of one client at an epoch switch
//! (docs/ARCHITECTURE.md, "The server role").

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::net::Ipv6Addr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use mt6d_proto::control_plan::{priming_window, SendWindow};
use mt6d_proto::endpoint::{IndexError, IndexSeed, PeerId, PeerTable, WindowDelta};
use mt6d_proto::handshake::{Handshake, HandshakeConfig};
use mt6d_proto::link::{Keys as LinkKeys, Link};
use mt6d_proto::moves::{NoticeError, RouteMoves, NOTICE_LEN};
use mt6d_proto::{Epoch, Opener, Route, Sealer, Stream, UnixTime};

use rand::{RngCore, SeedableRng};

use crate::config::{ClientConfig, ClientHandshake};

/// Send counters every client's sealer may use in this run: `[first, end)`, from the machine's
/// run generation (`crate::daemon::psk_counters`), so that no restart repeats a nonce under a
/// pre-shared key.
pub use crate::daemon::psk_counters::CounterRange;

/// A handshake client's live protocol state, made by its first authenticated handshake message.
#[derive(Debug)]
pub struct Session {
    pub link: Link,
    /// The link's keys as the workers use them: the receive keys, the send key it handed out
    /// last, and whether they expired (then the main thread drops the session).
    pub keys: LinkKeys,
    /// The table entries of the link's bound sets other than the link set: (set id, entry).
    pub bound: Vec<(u64, PeerId)>,
}

impl Session {
    /// The table entry of set `set` of client `id` (the link set is the client's own entry).
    pub fn entry_of(&self, id: PeerId, set: u64) -> Option<PeerId> {
        if set == 0 {
            return Some(id);
        }
        self.bound.iter().find(|(s, _)| *s == set).map(|(_, p)| *p)
    }
}

/// How a client is keyed.
#[derive(Debug)]
enum Keys {
    PreShared {
        /// The counter its sealer starts at when above the run's first: where an earlier
        /// incarnation of the same key in this run stopped ([`Registry::remove`]).
        first: u64,
        /// Made on the first packet to the client (derives its data key once).
        sealer: OnceLock<Box<Sealer>>,
        /// Made on the first packet from the client; its replay window lives in it.
        opener: Mutex<Option<Box<Opener>>>,
        /// Made on the client's first route move notice (§5.2).
        moves: Mutex<Option<Box<RouteMoves>>>,
    },
    Handshake {
        peer: ClientHandshake,
        session: Mutex<Option<Box<Session>>>,
    },
}

/// One client's packet-path state and what a reload compares. Traffic is counted per worker
/// and reason, not per client (`shared::ServerCounters`): a per-client counter would be an
/// atomic add per packet on a line two workers can share, for a figure nothing reads yet.
#[derive(Debug)]
pub struct Client {
    pub name: String,
    /// What a reload compares: a hash of the client's true address, prefix and key.
    pub fingerprint: [u8; 32],
    keys: Keys,
}

impl Client {
    fn new(
        name: String,
        fingerprint: [u8; 32],
        handshake: Option<&ClientHandshake>,
        first: u64,
    ) -> Client {
        let keys = match handshake {
            None => Keys::PreShared {
                first,
                sealer: OnceLock::new(),
                opener: Mutex::new(None),
                moves: Mutex::new(None),
            },
            Some(peer) => Keys::Handshake {
                peer: peer.clone(),
                session: Mutex::new(None),
            },
        };
        Client {
            name,
            fingerprint,
            keys,
        }
    }

    /// Whether the client handshakes (no pre-shared key).
    pub fn handshakes(&self) -> bool {
        matches!(self.keys, Keys::Handshake { .. })
    }

    /// The client's sealer, made from `stream` on first use (None for a handshake client). It
    /// numbers from the run's first counter, or from where an earlier incarnation of the key
    /// stopped in this run, and refuses past the key's packet limit counted from the run's first
    /// counter: the key's counters in this run are one contiguous run from `counters.first`,
    /// whatever removals and additions came between (docs/PROTOCOL.md §4.3).
    pub fn sealer(&self, stream: &Stream, counters: CounterRange) -> Option<&Sealer> {
        match &self.keys {
            Keys::PreShared { sealer, first, .. } => Some(sealer.get_or_init(|| {
                let limit = crate::daemon::psk_counters::packet_limit(stream.config().aead);
                Box::new(
                    stream
                        .sealer((*first).max(counters.first), counters.end)
                        .with_key_limit(counters.first.saturating_add(limit).min(counters.end)),
                )
            })),
            Keys::Handshake { .. } => None,
        }
    }

    /// Ends a pre-shared client's sealing (it is being removed) and returns the first counter
    /// its sealer never used (None: it never sealed, or a handshake client).
    fn retire(&self) -> Option<u64> {
        match &self.keys {
            Keys::PreShared { sealer, .. } => sealer.get().map(|s| s.retire()),
            Keys::Handshake { .. } => None,
        }
    }

    /// Runs `f` with the client's opener, made from `stream` on first use (None for a
    /// handshake client).
    pub fn with_opener<R>(&self, stream: &Stream, f: impl FnOnce(&mut Opener) -> R) -> Option<R> {
        let Keys::PreShared { opener, .. } = &self.keys else {
            return None;
        };
        let mut guard = opener
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Some(f(guard.get_or_insert_with(|| Box::new(stream.opener()))))
    }

    /// The handshake client's session slot, locked (None for a pre-shared client). Lock order:
    /// the registry, then one client's session.
    pub fn session(&self) -> Option<MutexGuard<'_, Option<Box<Session>>>> {
        match &self.keys {
            Keys::Handshake { session, .. } => Some(
                session
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner),
            ),
            Keys::PreShared { .. } => None,
        }
    }

    /// A new session for this handshake client, whose link stream is `stream`, answering only
    /// (the server never initiates). None for a pre-shared client or without `template`.
    pub fn new_session(
        &self,
        template: Option<&HandshakeConfig>,
        stream: &Stream,
    ) -> Option<Result<Box<Session>, mt6d_proto::ProtoError>> {
        let Keys::Handshake { peer, .. } = &self.keys else {
            return None;
        };
        let mut cfg = template?.clone();
        cfg.remote_public = peer.public_key;
        cfg.psk = peer.psk.clone();
        cfg.remote_true = stream.remote_true();
        // The link key is the stream's: no second X25519.
        let link = stream.config().key.clone();
        Some(Handshake::with_link_key(cfg, link).map(|mut hs| {
            hs.set_responder_only();
            Box::new(Session {
                link: Link::with_handshake(stream.with_route_key(&stream.config().key), hs),
                keys: LinkKeys::new(),
                bound: Vec::new(),
            })
        }))
    }
}

/// The epochs of one table entry moved to another attempt offset (§5.2): the main thread's
/// copy of the client's `RouteMoves`, which rotation steps derive the entry's routes with.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Moved([Option<(Epoch, u8)>; 4]);

impl Moved {
    fn of(moves: &RouteMoves) -> Moved {
        let mut m = Moved::default();
        for (slot, moved) in m.0.iter_mut().zip(moves.moved()) {
            *slot = Some(moved);
        }
        m
    }

    fn offset(&self, e: Epoch) -> u8 {
        self.0
            .iter()
            .flatten()
            .find(|(m, _)| *m == e)
            .map_or(0, |(_, k)| *k)
    }

    /// Whether an epoch of the accept window (or a later one) is moved at `current`.
    fn live(&self, current: Epoch) -> bool {
        self.0
            .iter()
            .flatten()
            .any(|(e, k)| *k > 0 && e.0.saturating_add(1) >= current.0)
    }
}

/// What a table entry belongs to.
#[derive(Debug)]
enum Entry {
    /// A client's own entry: its stream (pre-shared) or link set (handshake).
    Client(Client),
    /// A further route set of the client whose entry is `client`.
    Set { client: PeerId, set: u64 },
}

/// Why a client could not be added.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("client {name:?} (peers file line {line}): {source}")]
    Stream {
        name: String,
        line: usize,
        source: mt6d_proto::ProtoError,
    },
    #[error("client {name:?} (peers file line {line}): {source}")]
    Index {
        name: String,
        line: usize,
        source: IndexError,
    },
    #[error("client {name:?} (peers file line {line}) is already served")]
    Duplicate { name: String, line: usize },
}

/// What [`Registry::handle_notice`] did with a valid notice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NoticeHandled {
    /// A route of the client moved to a new attempt offset.
    pub moved: bool,
    /// The table does not serve the client's moved routes yet: the main thread must run
    /// [`Registry::sync_moves`]; the ack waits for the client's next resend.
    pub pending: bool,
}

/// What a rotation step or a change did, for the logs and counters.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct StepReport {
    pub advanced: usize,
    /// Routes whose local (address, port) another route also claims: neither is served until
    /// one is left (the index's rule). Logged; the clients' next epoch resolves it.
    pub contested: usize,
}

/// The clients and their indexes.
#[derive(Debug)]
pub struct Registry {
    table: PeerTable,
    /// By table slot: a client, or a further route set of one.
    entries: Vec<Option<(PeerId, Entry)>>,
    by_name: HashMap<String, PeerId>,
    /// Local hashed addresses of every route in every window, with how many routes use each;
    /// kept only for the neighbour responder (`None` where the router routes the prefix).
    addresses: Option<HashMap<Ipv6Addr, u32>>,
    counters: CounterRange,
    /// The server's side of every handshake client's settings (its identity key, mode, AEAD,
    /// rekey interval); a client's public key, psk and true address complete it.
    handshake: Option<HandshakeConfig>,
    /// Handshake clients with a live session (made by the workers, dropped by the main thread).
    sessions: AtomicU64,
    /// The in-run retirement of pre-shared keys: for each key a removed client sealed with (by
    /// its counter state id, a one-way function of the send data key), the first counter it
    /// never used. A client added later with the same key, under any name or prefix, starts
    /// there. One entry per key removed in the run, kept for the run's life (under 100 bytes each).
    retired: HashMap<String, u64>,
    /// When to announce each entering route's server address to the router (priming,
    /// docs/PROTOCOL.md §5.1); None without priming.
    primes: Option<Primes>,
    /// Table entries with a moved epoch in or after their accept window (§5.2); empty unless a
    /// client moved, so a rotation step costs one `is_empty` for everyone else.
    moved: HashMap<PeerId, Moved>,
}

/// The priming schedule: one entry per route that entered a window and is not yet announced.
#[derive(Debug)]
struct Primes {
    heap: BinaryHeap<Reverse<(UnixTime, PeerId, Epoch)>>,
    rotation: Duration,
    jitter: bool,
    /// Draws each announcement's instant (docs/PROTOCOL.md §5.6).
    rng: rand::rngs::StdRng,
}

impl Primes {
    /// When a route whose epoch starts at `start` may be announced: from the longest lead to
    /// 250 ms before it, at an instant drawn for each route on its own (docs/PROTOCOL.md §5.6),
    /// so that neither the order of the announcements nor a client's offset from the boundary
    /// repeats from one epoch to the next. Without jitter every client switches at the same
    /// instant, and the longest lead is R/2, so a million clients are never announced in one
    /// burst; with jitter every client's boundaries are its own, and the gateway's window
    /// (`mt6d_proto::control_plan::priming_window`) is used.
    fn window(&self, start: UnixTime) -> SendWindow {
        if self.jitter {
            return priming_window(start);
        }
        let before = |d: Duration| {
            UnixTime::from_nanos(start.as_nanos().saturating_sub(d.as_nanos() as u64))
        };
        let longest = (self.rotation / 2).max(crate::daemon::neighbor::PRIME_LEAD);
        SendWindow::new(before(longest), before(crate::daemon::neighbor::PRIME_LEAD))
    }
}

impl Registry {
    /// An empty registry for about `capacity` clients; `track_addresses` keeps the set of
    /// current addresses the neighbour responder asks (a hash-table change per route at every
    /// rotation, so only where it is needed).
    pub fn new(
        seed: IndexSeed,
        capacity: usize,
        counters: CounterRange,
        track_addresses: bool,
    ) -> Registry {
        Registry {
            table: PeerTable::with_capacity(seed, capacity),
            entries: Vec::with_capacity(capacity),
            by_name: HashMap::with_capacity(capacity),
            addresses: track_addresses.then(|| HashMap::with_capacity(capacity * 3)),
            counters,
            handshake: None,
            sessions: AtomicU64::new(0),
            retired: HashMap::new(),
            primes: None,
            moved: HashMap::new(),
        }
    }

    /// Turns priming on: from now on every route entering a window is scheduled for an
    /// announcement to the router ([`Registry::due_primes`]).
    pub fn enable_priming(&mut self, rotation: Duration, jitter: bool) {
        self.primes = Some(Primes {
            heap: BinaryHeap::new(),
            rotation,
            jitter,
            rng: rand::rngs::StdRng::from_os_rng(),
        });
    }

    /// Schedules the announcement of each route of `delta` (of entry `id`) that is current or
    /// in the future at `now`; the previous epoch's is never announced.
    fn schedule_primes(&mut self, id: PeerId, delta: &WindowDelta, now: UnixTime) {
        let (Some(p), Some(stream)) = (self.primes.as_mut(), self.table.stream(id)) else {
            return;
        };
        let current = stream.epoch_at(now);
        for r in delta.added().filter(|r| r.epoch >= current) {
            let window = p.window(stream.epoch_start(r.epoch));
            let rng = &mut p.rng;
            let at = window.draw(&mut || rng.next_u64());
            p.heap.push(Reverse((at, id, r.epoch)));
        }
    }

    /// When the next announcement is due (None: none scheduled, or no priming).
    pub fn next_prime(&self) -> Option<UnixTime> {
        self.primes
            .as_ref()
            .and_then(|p| p.heap.peek().map(|Reverse((t, _, _))| *t))
    }

    /// Takes up to `max` announcements due at `now`: the server's hashed addresses to announce
    /// (each route still in its window; a removed client's are skipped).
    pub fn due_primes(&mut self, now: UnixTime, max: usize) -> Vec<Ipv6Addr> {
        let mut out = Vec::new();
        let Some(p) = self.primes.as_mut() else {
            return out;
        };
        while out.len() < max {
            match p.heap.peek() {
                Some(Reverse((t, _, _))) if *t <= now => {}
                _ => break,
            }
            let Some(Reverse((_, id, epoch))) = p.heap.pop() else {
                break;
            };
            if let Some(r) = self.table.index().route(id, epoch) {
                out.push(*r.local.ip());
            }
        }
        out
    }

    /// Sets what handshake clients' sessions are made with (see [`Registry::handshake`]).
    pub fn set_handshake_template(&mut self, template: Option<HandshakeConfig>) {
        self.handshake = template;
    }

    /// The server's side of every handshake client's settings.
    pub fn handshake(&self) -> Option<&HandshakeConfig> {
        self.handshake.as_ref()
    }

    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    pub fn table(&self) -> &PeerTable {
        &self.table
    }

    pub fn counters(&self) -> CounterRange {
        self.counters
    }

    /// The client whose own entry is `id`, if `id` is still its.
    pub fn client(&self, id: PeerId) -> Option<&Client> {
        match self.entries.get(id.index() as usize) {
            Some(Some((held, Entry::Client(c)))) if *held == id => Some(c),
            _ => None,
        }
    }

    /// What table entry `id` (a lookup's answer) belongs to: the client's own id, the client,
    /// and the route set (0: the client's own entry, its stream or link set).
    pub fn resolve(&self, id: PeerId) -> Option<(PeerId, &Client, u64)> {
        match self.entries.get(id.index() as usize) {
            Some(Some((held, Entry::Client(c)))) if *held == id => Some((id, c, 0)),
            Some(Some((held, Entry::Set { client, set }))) if *held == id => {
                let c = self.client(*client)?;
                Some((*client, c, *set))
            }
            _ => None,
        }
    }

    pub fn id_of(&self, name: &str) -> Option<PeerId> {
        self.by_name.get(name).copied()
    }

    /// The running client that `cfg` may not be added beside, and why, as the peers file
    /// refuses two such lines: one keyed by the same key (a pre-shared `key=`, or a link key:
    /// the same public key and psk), whose routes the two would contest so that neither is
    /// served; one with the same public key, whose handshakes could answer either; one with
    /// the same true address, whose traffic could go to either. Clients named in `leaving`
    /// (removed by the same change) are not counted. Scans every client: called for a
    /// control-socket change, not per packet.
    pub fn clash(
        &self,
        cfg: &ClientConfig,
        leaving: &std::collections::HashSet<&str>,
    ) -> Option<(&str, &'static str)> {
        let key = cfg.stream.key.as_bytes();
        let host = cfg.stream.remote.true_addr;
        let public = cfg.handshake.as_ref().map(|h| h.public_key);
        self.by_name
            .iter()
            .filter(|(name, _)| !leaving.contains(name.as_str()))
            .find_map(|(name, &id)| {
                let stream = self.table.stream(id).map(Stream::config);
                let same_key = stream.is_some_and(|s| s.key.as_bytes() == key);
                let same_host = stream.is_some_and(|s| s.remote.true_addr == host);
                let same_public = match (public, self.client(id).map(|c| &c.keys)) {
                    (Some(p), Some(Keys::Handshake { peer, .. })) => peer.public_key == p,
                    _ => false,
                };
                if same_public {
                    Some((name.as_str(), "public key"))
                } else if same_key {
                    Some((name.as_str(), "session key"))
                } else if same_host {
                    Some((name.as_str(), "true address"))
                } else {
                    None
                }
            })
    }

    pub fn names(&self) -> impl Iterator<Item = &str> + '_ {
        self.by_name.keys().map(String::as_str)
    }

    /// Whether `addr` is one of the hashed addresses currently valid (any client, any epoch of
    /// its accept window): what the neighbour responder answers for.
    /// (False for every address when the registry does not track them.)
    pub fn is_current_address(&self, addr: Ipv6Addr) -> bool {
        self.addresses
            .as_ref()
            .is_some_and(|a| a.contains_key(&addr))
    }

    /// How many distinct hashed addresses are valid now (0 when not tracked).
    pub fn address_count(&self) -> usize {
        self.addresses.as_ref().map_or(0, HashMap::len)
    }

    /// Adds a client at `now`; its routes answer at once.
    pub fn add(&mut self, cfg: &ClientConfig, now: UnixTime) -> Result<PeerId, RegistryError> {
        if self.by_name.contains_key(&cfg.name) {
            return Err(RegistryError::Duplicate {
                name: cfg.name.clone(),
                line: cfg.line,
            });
        }
        let stream = Stream::new(cfg.stream.clone()).map_err(|source| RegistryError::Stream {
            name: cfg.name.clone(),
            line: cfg.line,
            source,
        })?;
        // Only after a removal in this run is there anything to look up: a start with a
        // million clients derives no extra key.
        let first = if cfg.handshake.is_none() && !self.retired.is_empty() {
            self.retired
                .get(&stream.counter_state_id())
                .copied()
                .unwrap_or(0)
        } else {
            0
        };
        let (id, delta) =
            self.table
                .add(stream, now, |_| 0)
                .map_err(|source| RegistryError::Index {
                    name: cfg.name.clone(),
                    line: cfg.line,
                    source,
                })?;
        let client = Client::new(
            cfg.name.clone(),
            fingerprint(cfg),
            cfg.handshake.as_ref(),
            first,
        );
        self.put(id, Entry::Client(client));
        self.by_name.insert(cfg.name.clone(), id);
        apply(self.addresses.as_mut(), &delta);
        self.schedule_primes(id, &delta, now);
        Ok(id)
    }

    fn put(&mut self, id: PeerId, entry: Entry) {
        let slot = id.index() as usize;
        if self.entries.len() <= slot {
            self.entries.resize_with(slot + 1, || None);
        }
        self.entries[slot] = Some((id, entry));
    }

    fn drop_entry(&mut self, id: PeerId) {
        self.moved.remove(&id);
        if let Some((_, delta)) = self.table.remove(id) {
            apply(self.addresses.as_mut(), &delta);
        }
        if let Some(slot) = self.entries.get_mut(id.index() as usize) {
            *slot = None;
        }
    }

    /// Brings client `id`'s secondary entries in line with the route sets its link binds now
    /// (after a handshake was answered or confirmed, a parent released, keys expired), and drops
    /// its session once its keys expired and nothing but the link set is left; then its routes
    /// in line with its route moves ([`Registry::sync_moves`]). Returns when the link next
    /// needs a timeout (None: no session). Called by the main thread.
    pub fn sync_sets(&mut self, id: PeerId, now: UnixTime) -> Option<UnixTime> {
        let client = self.client(id)?;
        if !client.handshakes() {
            // A pre-shared client has one entry and no session: only its moves can change.
            self.sync_moves(id, now);
            return None;
        }
        let mut guard = client.session()?;
        let session = guard.as_mut()?;
        let wanted: Vec<(u64, Stream)> = session
            .link
            .sets()
            .bound_sets()
            .filter(|s| !s.is_link())
            .map(|s| (s.id, s.stream.with_route_key(&s.stream.config().key)))
            .collect();
        // A set can be bound twice (the current set as the parent of an answered one).
        let mut wanted = wanted;
        wanted.sort_by_key(|(id, _)| *id);
        wanted.dedup_by_key(|(id, _)| *id);
        let stale: Vec<PeerId> = session
            .bound
            .iter()
            .filter(|(set, _)| !wanted.iter().any(|(w, _)| w == set))
            .map(|(_, p)| *p)
            .collect();
        session
            .bound
            .retain(|(set, _)| wanted.iter().any(|(w, _)| w == set));
        let new: Vec<(u64, Stream)> = wanted
            .into_iter()
            .filter(|(w, _)| !session.bound.iter().any(|(set, _)| set == w))
            .collect();
        let drop_session = session.keys.expired() && session.bound.is_empty() && new.is_empty();
        let next = (!drop_session)
            .then(|| session.link.poll_timeout())
            .flatten();
        if drop_session {
            *guard = None;
            self.sessions.fetch_sub(1, Ordering::Relaxed);
        }
        drop(guard);
        for p in stale {
            self.drop_entry(p);
        }
        let mut added = Vec::with_capacity(new.len());
        for (set, stream) in new {
            match self.table.add_secondary(stream, now, |_| 0) {
                Ok((p, delta)) => {
                    apply(self.addresses.as_mut(), &delta);
                    self.schedule_primes(p, &delta, now);
                    self.put(p, Entry::Set { client: id, set });
                    added.push((set, p));
                }
                Err(e) => log::warn!("cannot index a route set of a client: {e}"),
            }
        }
        if !added.is_empty() {
            if let Some(session) = self.client(id)?.session()?.as_mut() {
                session.bound.extend(added);
            }
        }
        self.sync_moves(id, now);
        next
    }

    /// A route move notice (or its ack) from pre-shared client `id` arrived on `arrived_on`, one
    /// of its accept routes (source checked, header protection removed): checks and applies it
    /// (§5.2) and hands `send` each answer that is due, header protection applied, with the
    /// route to send it on. Takes the client's moves lock only; callable under the read lock. A
    /// handshake client's notices go to its link instead (`Link::handle_notice`).
    ///
    /// The ack waits until the table serves the moved routes: while [`NoticeHandled::pending`]
    /// the caller asks the main thread for [`Registry::sync_moves`], and the client's next
    /// resend of its notice (every 200 ms until answered, §5.2) is answered. An ack therefore
    /// tells the client that the server receives and sends on the moved route.
    pub fn handle_notice(
        &self,
        id: PeerId,
        now: UnixTime,
        arrived_on: &Route,
        bytes: &[u8],
        mut send: impl FnMut(&Route, &[u8]),
    ) -> Result<NoticeHandled, NoticeError> {
        let (Some(stream), Some((_, client, _))) = (self.table.stream(id), self.resolve(id)) else {
            return Err(NoticeError::Malformed);
        };
        let Keys::PreShared { moves, .. } = &client.keys else {
            return Err(NoticeError::Malformed);
        };
        let mut guard = moves
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let m = guard.get_or_insert_with(|| Box::new(RouteMoves::new(stream)));
        let outcome = m.handle_notice(now, stream.epoch_at(now), arrived_on, bytes)?;
        let installed = self.moved.get(&id).copied().unwrap_or_default();
        if m.moved().any(|(e, k)| installed.offset(e) != k) {
            return Ok(NoticeHandled {
                moved: outcome.moved,
                pending: true,
            });
        }
        let schedule = stream.schedule_moved(now, m);
        let mut out = [0u8; NOTICE_LEN];
        while let Some(route) = m.poll_transmit(now, &schedule, &mut out) {
            if let Some(hk) = stream.send_header_key() {
                // A notice (32 bytes) is longer than the protected header.
                if hk.protect(&mut out).is_err() {
                    continue;
                }
            }
            send(&route, &out);
        }
        Ok(NoticeHandled {
            moved: outcome.moved,
            pending: false,
        })
    }

    /// Re-derives client `id`'s routes whose attempt offset changed (§5.2) from its moves: its
    /// own entry (pre-shared: its `RouteMoves`; handshake: its link set's) and each route set
    /// its session binds. Called by the main thread after a worker saw a route move.
    pub fn sync_moves(&mut self, id: PeerId, now: UnixTime) {
        let Some(client) = self.client(id) else {
            return;
        };
        let mut wanted: Vec<(PeerId, Moved)> = Vec::new();
        match &client.keys {
            Keys::PreShared { moves, .. } => {
                let guard = moves
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                if let Some(m) = guard.as_ref() {
                    wanted.push((id, Moved::of(m)));
                }
            }
            Keys::Handshake { session, .. } => {
                let guard = session
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                if let Some(s) = guard.as_ref() {
                    let sets = s.link.sets();
                    wanted.push((id, Moved::of(&sets.link().lock_moves())));
                    for (set, entry) in &s.bound {
                        if let Some(rs) = sets.bound_sets().find(|b| b.id == *set) {
                            wanted.push((*entry, Moved::of(&rs.lock_moves())));
                        }
                    }
                }
            }
        }
        for (entry, moved) in wanted {
            self.apply_moved(entry, moved, now);
        }
    }

    /// Installs `moved` as entry `id`'s offsets and re-derives the routes it changes.
    fn apply_moved(&mut self, id: PeerId, moved: Moved, now: UnixTime) {
        if self.moved.get(&id).copied().unwrap_or_default() == moved {
            return;
        }
        let Some(current) = self.table.stream(id).map(|s| s.epoch_at(now)) else {
            return;
        };
        if moved.live(current) {
            self.moved.insert(id, moved);
        } else {
            self.moved.remove(&id);
        }
        match self.table.refresh(id, now, |e| moved.offset(e)) {
            Ok(delta) => {
                apply(self.addresses.as_mut(), &delta);
                self.schedule_primes(id, &delta, now);
            }
            Err(e) => log::warn!("cannot re-index a moved route: {e}"),
        }
    }

    /// Removes a client: from this call on, none of its addresses answers.
    pub fn remove(&mut self, name: &str) -> bool {
        let Some(id) = self.by_name.remove(name) else {
            return false;
        };
        // Retired under the write lock: no worker seals with it any more, and a client added
        // later with the same key continues above every counter it used.
        if let (Some(next), Some(stream)) = (
            self.client(id).and_then(Client::retire),
            self.table.stream(id),
        ) {
            let next = next.min(self.counters.end);
            self.retired
                .entry(stream.counter_state_id())
                .and_modify(|n| *n = (*n).max(next))
                .or_insert(next);
        }
        let sets: Option<Vec<PeerId>> = self.client(id).and_then(|c| {
            c.session().and_then(|s| {
                s.as_ref()
                    .map(|s| s.bound.iter().map(|(_, p)| *p).collect())
            })
        });
        if sets.is_some() {
            self.sessions.fetch_sub(1, Ordering::Relaxed);
        }
        let sets = sets.unwrap_or_default();
        for p in sets {
            self.drop_entry(p);
        }
        self.drop_entry(id);
        true
    }

    /// When [`Registry::step`] must run next.
    pub fn poll_timeout(&self) -> Option<UnixTime> {
        self.table.poll_timeout()
    }

    /// Advances the clients whose epoch boundary has passed.
    pub fn step(&mut self, now: UnixTime) -> StepReport {
        let mut report = StepReport::default();
        while self.step_at_most(now, usize::MAX, &mut report) {}
        report
    }

    /// Advances at most `max` of the clients whose epoch boundary has passed, adding to
    /// `report`; true when a due client is left. The main thread holds the write lock for one
    /// such step at a time and hands it to waiting workers in between: at a million clients a
    /// 10 ms wake-up finds about a thousand boundaries due, 2-3 ms of work that the workers
    /// would otherwise wait out.
    pub fn step_at_most(&mut self, now: UnixTime, max: usize, report: &mut StepReport) -> bool {
        let mut addresses = self.addresses.as_mut();
        let mut entered = Vec::new();
        let priming = self.primes.is_some();
        let moved = &self.moved;
        let step = self.table.handle_timeout_at_most(
            now,
            max,
            |id, e| {
                if moved.is_empty() {
                    return 0;
                }
                moved.get(&id).map_or(0, |m| m.offset(e))
            },
            |id, delta| {
                report.advanced += 1;
                report.contested += delta.contested().count();
                apply(addresses.as_deref_mut(), delta);
                if priming {
                    entered.push((id, delta.clone()));
                }
            },
        );
        for (id, delta) in entered {
            self.schedule_primes(id, &delta, now);
        }
        if !self.moved.is_empty() {
            let table = &self.table;
            self.moved
                .retain(|id, m| table.stream(*id).is_some_and(|s| m.live(s.epoch_at(now))));
        }
        step.more
    }

    /// Whether `name` is served with exactly this configuration (reloads replace changed clients).
    pub fn unchanged(&self, cfg: &ClientConfig) -> bool {
        self.id_of(&cfg.name)
            .and_then(|id| self.client(id))
            .is_some_and(|c| c.fingerprint == fingerprint(cfg))
    }

    /// A worker made a session for a client ([`Client::new_session`]).
    pub fn note_session(&self) {
        self.sessions.fetch_add(1, Ordering::Relaxed);
    }

    /// How many clients have a live handshake session, and how many secondary route sets are
    /// indexed (for the logs). O(1).
    pub fn session_counts(&self) -> (u64, usize) {
        (
            self.sessions.load(Ordering::Relaxed),
            self.table.len().saturating_sub(self.by_name.len()),
        )
    }
}

/// A hash of what identifies a client's stream: its true address, prefix and key.
pub fn fingerprint(cfg: &ClientConfig) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    h.update(&cfg.stream.remote.true_addr.octets());
    h.update(
        &cfg.stream
            .remote
            .external_prefix
            .map_or([0; 16], |p| p.octets()),
    );
    h.update(cfg.stream.key.as_bytes());
    *h.finalize().as_bytes()
}

/// Keeps the address counts in step with a window change.
fn apply(addresses: Option<&mut HashMap<Ipv6Addr, u32>>, delta: &WindowDelta) {
    let Some(addresses) = addresses else {
        return;
    };
    for r in delta.added() {
        *addresses.entry(*r.local.ip()).or_insert(0) += 1;
    }
    for r in delta.removed() {
        let a = *r.local.ip();
        if let Some(n) = addresses.get_mut(&a) {
            *n -= 1;
            if *n == 0 {
                addresses.remove(&a);
            }
        }
    }
}

/// Adds to a counter (relaxed: statistics).
pub fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test
mod tests {
    use super::*;
    use crate::config::ServerConfig;
    use std::path::Path;
    use std::time::Duration;

    fn config() -> ServerConfig {
        ServerConfig::parse(
            Path::new("s.toml"),
            "[server]\nexternal_interface = \"eth0\"\nprefix = \"2001:db8:5::/64\"\n\
             true_address = \"2001:db8:5:1::1\"\npeers_file = \"c\"\n\
             client_routes = [\"2001:db8:c0::/44\"]\nrotation_secs = 1\n",
        )
        .unwrap()
    }

    fn clients(n: u8) -> Vec<ClientConfig> {
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD;
        let text: String = (1..=n)
            .map(|i| {
                format!(
                    "c{i} {} 2001:db8:c1:1::{i} key={} prefix=2001:db8:c1::/64\n",
                    b64.encode([i; 32]),
                    b64.encode([i ^ 0x80; 32])
                )
            })
            .collect();
        config()
            .clients_from(&mt6d_proto::peers_file::parse(&text).unwrap())
            .unwrap()
    }

    fn registry() -> Registry {
        Registry::new(
            IndexSeed::from_bytes([7; 16]),
            8,
            CounterRange {
                first: 1 << 40,
                end: 2 << 40,
            },
            true,
        )
    }

    /// A pre-shared client that moves an epoch (§5.2) tells the server with a notice: the server
    /// checks it, answers with an ack the client accepts, and from the main thread's
    /// `sync_moves` on receives and sends on the moved route; an epoch moved before it entered
    /// the window enters it moved. A forged notice moves nothing.
    #[test]
    fn a_client_s_route_move_notice_moves_its_route_on_the_server() {
        use mt6d_proto::moves::{CollisionOutcome, RouteMoves};
        let mut r = registry();
        let cs = clients(2);
        for c in &cs {
            r.add(c, UnixTime::from_nanos(1_700_000_000_000_000_000))
                .unwrap();
        }
        let id = r.id_of("c1").unwrap();
        let client = Stream::new(cs[0].stream.mirrored()).unwrap();
        let mut moves = RouteMoves::new(&client);
        let e = client.epoch_at(UnixTime::from_nanos(1_700_000_000_000_000_000));
        // 100 ms into epoch e: the client moves e (a port it cannot bind) and e+2.
        let now = client
            .epoch_start(e)
            .saturating_add(Duration::from_millis(100));
        assert_eq!(moves.move_locally(now, e, e), CollisionOutcome::Moved(1));
        let e2 = e.next().next();
        assert_eq!(moves.move_locally(now, e, e2), CollisionOutcome::Moved(1));
        // The server's view of a client route: the same four fields the other way round.
        let mirror = |c: Route| Route {
            local: c.remote,
            remote: c.local,
            epoch: c.epoch,
        };
        let moved_e = mirror(client.route_with_attempt(e, 1));
        assert_ne!(moved_e, mirror(client.route(e)));
        let finds = |r: &Registry, route: &Route| {
            r.table()
                .lookup_local(*route.local.ip(), route.local.port())
                .map(|(p, _)| p)
        };
        assert_eq!(finds(&r, &moved_e), None, "not before the notice");

        // A forged notice (one bit of its MAC) is refused and moves nothing.
        let schedule = client.schedule_moved(now, &moves);
        let mut notices = Vec::new();
        let mut out = [0u8; NOTICE_LEN];
        while let Some(route) = moves.poll_transmit(now, &schedule, &mut out) {
            notices.push((route, out));
        }
        assert_eq!(notices.len(), 2);
        for (route, _) in &notices {
            // Notices about e travel on e-1, the last agreed route (§5.2).
            assert_eq!(route.epoch, e.0.checked_sub(1).map(Epoch).unwrap());
        }
        let arrived_on = *r.table().index().route(id, Epoch(e.0 - 1)).unwrap();
        assert_eq!(arrived_on, mirror(notices[0].0));
        let mut forged = notices[0].1;
        forged[31] ^= 1;
        let got = r.handle_notice(id, now, &arrived_on, &forged, |_, _| panic!("answered"));
        assert_eq!(got, Err(NoticeError::BadMac));

        // The real ones: applied, but not answered before the table serves the moved routes.
        for (_, bytes) in &notices {
            let got = r.handle_notice(id, now, &arrived_on, bytes, |_, _| panic!("answered"));
            assert_eq!(
                got,
                Ok(NoticeHandled {
                    moved: true,
                    pending: true
                })
            );
        }
        assert_eq!(
            finds(&r, &moved_e),
            None,
            "not before the main thread's sync"
        );
        r.sync_sets(id, now);
        assert_eq!(finds(&r, &moved_e), Some(id), "the moved route answers");
        // The client's resends are answered, with acks the client accepts.
        let mut acks = Vec::new();
        for (_, bytes) in &notices {
            let got = r.handle_notice(id, now, &arrived_on, bytes, |route, ack| {
                acks.push((*route, ack.to_vec()))
            });
            assert_eq!(
                got,
                Ok(NoticeHandled {
                    moved: false,
                    pending: false
                })
            );
        }
        // The acks owed to the first two notices leave with the first resend, then the second
        // resend's own.
        assert_eq!(acks.len(), 3);
        for (route, mut ack) in acks {
            // On the last agreed route: the moved one, which both sides now use.
            assert_eq!(route, moved_e);
            if let Some(hk) = client.recv_header_key() {
                hk.unprotect(&mut ack).unwrap();
            }
            let outcome = moves.handle_notice(now, e, &mirror(route), &ack);
            assert!(!outcome.unwrap().moved);
        }
        assert!(moves.settled(), "both moves confirmed by the server's acks");
        assert_eq!(
            finds(&r, &mirror(client.route(e))),
            None,
            "the old one does not"
        );
        assert_eq!(r.table().send_route(id), Some(&moved_e));
        assert!(r.is_current_address(*moved_e.local.ip()));

        // Into e+1: e+2 enters the window at its moved offset, and leaves it at e+4.
        let moved_e2 = mirror(client.route_with_attempt(e2, 1));
        let mut t = now;
        while client.epoch_at(t) < e.next() {
            t = t.saturating_add(Duration::from_millis(10));
            r.step(t);
        }
        assert_eq!(finds(&r, &moved_e2), Some(id));
        assert_eq!(finds(&r, &mirror(client.route(e2))), None);
        while client.epoch_at(t) < e2.next().next() {
            t = t.saturating_add(Duration::from_millis(10));
            r.step(t);
        }
        assert_eq!(finds(&r, &moved_e2), None);
        assert!(
            r.moved.is_empty(),
            "nothing kept once the moved epochs left"
        );
        // The other client never moved.
        let other = r.id_of("c2").unwrap();
        assert!(r.table().send_route(other).is_some());
    }

    #[test]
    fn clients_answer_on_their_window_and_stop_at_removal() {
        let mut r = registry();
        let now = UnixTime::from_nanos(1_700_000_000_000_000_000);
        let cs = clients(3);
        for c in &cs {
            r.add(c, now).unwrap();
        }
        assert!(matches!(
            r.add(&cs[0], now),
            Err(RegistryError::Duplicate { .. })
        ));
        assert_eq!(r.len(), 3);
        let id = r.id_of("c2").unwrap();
        let route = *r.table().send_route(id).unwrap();
        assert!(r.is_current_address(*route.local.ip()));
        assert_eq!(
            r.table()
                .lookup_local(*route.local.ip(), route.local.port())
                .map(|(p, _)| p),
            Some(id)
        );
        assert_eq!(r.address_count(), 9);
        assert!(r.remove("c2"));
        assert!(!r.remove("c2"));
        assert!(r
            .table()
            .lookup_local(*route.local.ip(), route.local.port())
            .is_none());
        assert!(!r.is_current_address(*route.local.ip()));
        assert!(r.client(id).is_none());
        assert_eq!(r.address_count(), 6);
        // A reload keeps a line that did not change and replaces one that did.
        assert!(r.unchanged(&cs[0]));
        let mut moved = cs[0].clone();
        moved.stream.remote.true_addr = "2001:db8:c1:1::99".parse().unwrap();
        assert!(!r.unchanged(&moved));
        assert!(!r.unchanged(&cs[1]), "removed");
    }

    /// A client added beside a running one with its key or true address is named as the
    /// clash, unless the running one leaves in the same change.
    #[test]
    fn a_clash_with_a_running_client_is_named() {
        use std::collections::HashSet;
        let mut r = registry();
        let now = UnixTime::from_nanos(1_700_000_000_000_000_000);
        let cs = clients(3);
        r.add(&cs[0], now).unwrap();
        r.add(&cs[1], now).unwrap();
        let none = HashSet::new();
        assert_eq!(r.clash(&cs[2], &none), None);
        let mut same_key = cs[2].clone();
        same_key.stream.key = cs[1].stream.key.clone();
        assert_eq!(r.clash(&same_key, &none), Some(("c2", "session key")));
        let mut same_host = cs[2].clone();
        same_host.stream.remote.true_addr = cs[0].stream.remote.true_addr;
        assert_eq!(r.clash(&same_host, &none), Some(("c1", "true address")));
        let leaving: HashSet<&str> = ["c2"].into();
        assert_eq!(r.clash(&same_key, &leaving), None);
    }

    #[test]
    fn the_address_set_follows_every_window_through_jittered_rotations() {
        let mut r = registry();
        let mut now = UnixTime::from_nanos(1_700_000_000_000_000_000);
        let mut cs = clients(20);
        for c in &mut cs {
            c.stream.jitter = true;
        }
        for c in &cs {
            r.add(c, now).unwrap();
        }
        for _ in 0..2_000 {
            now = now.saturating_add(Duration::from_millis(10));
            if r.poll_timeout().is_some_and(|d| d <= now) {
                r.step(now);
            }
            for c in &cs {
                let id = r.id_of(&c.name).unwrap();
                let stream = r.table().stream(id).unwrap();
                let e = stream.epoch_at(now);
                for route in r.table().index().window(id) {
                    assert!(r.is_current_address(*route.local.ip()), "{route:?}");
                }
                // The epochs around now are in the window (what the clients send on).
                for epoch in [e, e.next()] {
                    let want = stream.route(epoch);
                    assert!(
                        r.is_current_address(*want.local.ip()),
                        "epoch {epoch:?} of {} missing at {now:?}",
                        c.name
                    );
                }
            }
        }
    }

    #[test]
    fn what_a_client_sends_to_is_in_the_address_set() {
        use mt6d_lab::server_lab::ServerLab;
        let spec = ServerLab::spec(1, Duration::from_secs(1), true);
        let cfg = ServerConfig::parse(
            Path::new("s.toml"),
            &ServerLab::server_config_with(1.0, 2, Path::new("/tmp"), true),
        )
        .unwrap();
        let text: String = (0..400)
            .map(|i| spec.peers_line(&format!("c{i}"), i))
            .collect();
        let cs = cfg
            .clients_from(&mt6d_proto::peers_file::parse(&text).unwrap())
            .unwrap();
        let mut r = registry();
        let mut now = UnixTime::from_nanos(1_795_681_511_000_000_000);
        for c in &cs {
            r.add(c, now).unwrap();
        }
        let mut table = PeerTable::with_capacity(IndexSeed::from_bytes([1; 16]), 400);
        let ids: Vec<PeerId> = (0..400)
            .map(|i| table.add(spec.stream_for_test(i), now, |_| 0).unwrap().0)
            .collect();
        for _ in 0..1_000 {
            now = now.saturating_add(Duration::from_millis(50));
            if r.poll_timeout().is_some_and(|d| d <= now) {
                r.step(now);
            }
            table.handle_timeout(now, |_, _| 0, |_, _| {});
            for (i, id) in ids.iter().enumerate() {
                let to = table.send_route(*id).unwrap().remote;
                assert!(
                    r.is_current_address(*to.ip()),
                    "client {i} sends to {to} at {now:?}"
                );
            }
        }
    }

    #[test]
    fn without_the_responder_no_address_set_is_kept() {
        let mut r = Registry::new(
            IndexSeed::from_bytes([7; 16]),
            8,
            CounterRange {
                first: 1 << 40,
                end: 2 << 40,
            },
            false,
        );
        let now = UnixTime::from_nanos(1_700_000_000_000_000_000);
        let c = &clients(1)[0];
        let id = r.add(c, now).unwrap();
        let route = *r.table().send_route(id).unwrap();
        assert_eq!(r.address_count(), 0);
        assert!(!r.is_current_address(*route.local.ip()));
        assert!(r
            .table()
            .lookup_local(*route.local.ip(), route.local.port())
            .is_some());
    }

    #[test]
    fn priming_announces_each_entering_address_once_before_its_epoch() {
        let mut r = registry();
        r.enable_priming(Duration::from_secs(1), false);
        let start = UnixTime::from_nanos(1_700_000_000_000_000_000);
        let cs = clients(20);
        for c in &cs {
            r.add(c, start).unwrap();
        }
        // At start: the current epoch's address at once (its lead has passed), never the
        // previous epoch's.
        let now_due = r.due_primes(start, usize::MAX);
        assert_eq!(now_due.len(), 20, "the current epoch of each client");
        let mut now = start;
        let mut announced: Vec<(Ipv6Addr, UnixTime)> = Vec::new();
        for _ in 0..300 {
            now = now.saturating_add(Duration::from_millis(10));
            if r.poll_timeout().is_some_and(|d| d <= now) {
                r.step(now);
            }
            for a in r.due_primes(now, usize::MAX) {
                announced.push((a, now));
            }
        }
        // Each later announcement precedes the first use of its address by 250 ms to R/2, and
        // without jitter (one boundary for all) the clients' leads differ: no burst.
        let mut leads = std::collections::BTreeSet::new();
        for c in &cs {
            let id = r.id_of(&c.name).unwrap();
            let stream = r.table().stream(id).unwrap();
            for (a, at) in &announced {
                for e in 0..6u64 {
                    let epoch = mt6d_proto::Epoch(stream.epoch_at(start).0 + e);
                    if stream.route(epoch).local.ip() == a {
                        let lead = stream.epoch_start(epoch).saturating_duration_since(*at);
                        assert!(
                            lead >= Duration::from_millis(240)
                                && lead <= Duration::from_millis(500),
                            "{} epoch {epoch:?}: announced {lead:?} ahead",
                            c.name
                        );
                        leads.insert(lead.as_millis() / 20);
                    }
                }
            }
        }
        assert!(announced.len() >= 20 * 2, "{}", announced.len());
        let distinct: std::collections::HashSet<_> = announced.iter().map(|(a, _)| a).collect();
        assert_eq!(distinct.len(), announced.len(), "each address once");
        assert!(leads.len() >= 5, "leads spread: {leads:?}");
        // No client keeps its offset from the boundary, nor its place among the others, from
        // one epoch to the next: both are drawn afresh for every route.
        let mut by_client: Vec<Vec<Duration>> = Vec::new();
        for c in &cs {
            let id = r.id_of(&c.name).unwrap();
            let stream = r.table().stream(id).unwrap();
            let mut leads = Vec::new();
            for (a, at) in &announced {
                for e in 1..6u64 {
                    let epoch = mt6d_proto::Epoch(stream.epoch_at(start).0 + e);
                    if stream.route(epoch).local.ip() == a {
                        leads.push(stream.epoch_start(epoch).saturating_duration_since(*at));
                    }
                }
            }
            by_client.push(leads);
        }
        let kept = by_client
            .iter()
            .filter(|l| {
                l.len() >= 2
                    && l.windows(2)
                        .all(|w| w[0].abs_diff(w[1]) < Duration::from_millis(20))
            })
            .count();
        assert!(
            kept <= 2,
            "clients with a fixed offset: {kept} of 20: {by_client:?}"
        );
    }

    /// The counter field of a sealed payload (before header protection).
    fn counter_of(out: &[u8]) -> u64 {
        u64::from_be_bytes(out[..8].try_into().unwrap())
    }

    /// Seals `n` keepalives to client `name` and returns their counters.
    fn seal_to(r: &Registry, name: &str, n: usize) -> Vec<u64> {
        let id = r.id_of(name).unwrap();
        let (client, stream) = (r.client(id).unwrap(), r.table().stream(id).unwrap());
        let route = *r.table().send_route(id).unwrap();
        let sealer = client.sealer(stream, r.counters()).unwrap();
        let mut out = [0u8; 64];
        (0..n)
            .map(|_| {
                sealer.seal_keepalive(&route, &mut out).unwrap();
                counter_of(&out)
            })
            .collect()
    }

    #[test]
    fn a_client_removed_and_added_again_never_seals_a_counter_it_used() {
        // `mt6d peer remove` + `mt6d peer add`, a reload that changed its prefix, or one that
        // renamed it: the key is the same, so its counters must go on rising.
        let mut r = registry();
        let now = UnixTime::from_nanos(1_700_000_000_000_000_000);
        let c = clients(2).remove(0);
        let mut renamed = c.clone();
        renamed.name = "renamed".into();
        let mut moved = c.clone();
        moved.stream.remote.external_prefix = Some("2001:db8:c2::".parse().unwrap());
        let mut used = Vec::new();
        for incarnation in [&c, &moved, &renamed, &c] {
            r.add(incarnation, now).unwrap();
            used.extend(seal_to(&r, &incarnation.name, 3));
            assert!(r.remove(&incarnation.name));
        }
        assert!(
            used.windows(2).all(|w| w[0] < w[1]),
            "counters repeat or go back under one key: {used:x?}"
        );
    }

    #[test]
    fn a_pre_shared_key_stops_at_the_aes_gcm_limit() {
        // RFC 9001 §6.6: 2^23 packets under one AES-GCM key (docs/PROTOCOL.md §4.3).
        let mut r = registry();
        let now = UnixTime::from_nanos(1_700_000_000_000_000_000);
        let c = &clients(1)[0];
        assert_eq!(c.stream.aead, mt6d_proto::AeadAlg::Aes256Gcm);
        let id = r.add(c, now).unwrap();
        let (client, stream) = (r.client(id).unwrap(), r.table().stream(id).unwrap());
        let route = *r.table().send_route(id).unwrap();
        let sealer = client.sealer(stream, r.counters()).unwrap();
        let mut out = [0u8; 64];
        let limit = 1u64 << 23;
        for i in 0..limit - 1 {
            assert!(
                sealer.seal_keepalive(&route, &mut out).is_ok(),
                "packet {i}"
            );
        }
        // Removed and added again, the key keeps its count.
        assert!(r.remove(&c.name));
        r.add(c, now).unwrap();
        assert_eq!(
            seal_to(&r, &c.name, 1).len(),
            1,
            "the last packet of the budget"
        );
        let id = r.id_of(&c.name).unwrap();
        let (client, stream) = (r.client(id).unwrap(), r.table().stream(id).unwrap());
        let route = *r.table().send_route(id).unwrap();
        assert!(
            client
                .sealer(stream, r.counters())
                .unwrap()
                .seal_keepalive(&route, &mut out)
                .is_err(),
            "sealed past the limit"
        );
    }

    #[test]
    fn a_step_moves_every_window_by_one_epoch() {
        let mut r = registry();
        let now = UnixTime::from_nanos(1_700_000_000_000_000_000);
        for c in &clients(4) {
            r.add(c, now).unwrap();
        }
        let due = r.poll_timeout().unwrap();
        assert!(due > now && due <= now.saturating_add(Duration::from_secs(1)));
        let report = r.step(due);
        assert_eq!(report.advanced, 4);
        assert_eq!(r.address_count(), 12);
        let id = r.id_of("c1").unwrap();
        let stream = r.table().stream(id).unwrap();
        assert_eq!(
            r.table().send_route(id).unwrap().epoch,
            stream.epoch_at(due)
        );
    }
}
