//! What the handshake runs and the restart storm share: the generator's shards (one thread's
//! clients, prefix and sockets each), running a closure on all of them beside the server's
//! control, and the server of a handshake run.

use std::path::Path;
use std::time::Duration;

use mt6d_lab::handshake_clients::{HandshakeClients, HandshakeCounters};
use mt6d_lab::server_lab::ServerLab;

/// One generator thread's share of a handshake run's clients: its own hashed /64 (routed to
/// the client namespace), receiving port and sockets, so no thread waits for another.
pub(super) struct Shard {
    pub(super) set: HandshakeClients,
}

/// How often a generator thread looks through its clients under way for a retry that is due
/// (the handshake's backoff is 1 s or more, a request's 1 s): not on every turn of its loop,
/// where it would cost O(clients under way) each time.
pub(super) const RETRY_SCAN: Duration = Duration::from_millis(10);

/// What one generator thread measured in one phase.
#[derive(Debug, Default)]
pub(super) struct ShardRun {
    /// Seconds from the phase's origin to each client served, in order.
    pub(super) served: Vec<f64>,
    /// Storm only: seconds from each served client's first recovery initiation to its service.
    pub(super) waited: Vec<f64>,
    /// Storm only: seconds from the phase's origin to each client's first recovery initiation.
    pub(super) first_initiation: Vec<f64>,
    /// CPU seconds the thread used in the phase.
    pub(super) cpu_secs: f64,
    /// The longest turn of the thread's loop, in seconds: how long its clients went unattended.
    pub(super) longest_turn: f64,
}

/// Runs `f` on every shard, one scoped thread each, while the calling thread runs `main`
/// (which may control the server); `abort` is set if `main` fails, so the shards give up.
pub(super) fn on_shards<M>(
    shards: &mut [Shard],
    abort: &std::sync::atomic::AtomicBool,
    main: impl FnOnce() -> Result<M, String>,
    f: impl Fn(usize, &mut HandshakeClients) -> Result<ShardRun, String> + Sync,
) -> Result<(M, Vec<ShardRun>), String> {
    use std::sync::atomic::Ordering;
    std::thread::scope(|scope| {
        let f = &f;
        let handles: Vec<_> = shards
            .iter_mut()
            .enumerate()
            .map(|(k, sh)| scope.spawn(move || f(k, &mut sh.set)))
            .collect();
        let m = main();
        if m.is_err() {
            abort.store(true, Ordering::Relaxed);
        }
        let runs: Vec<Result<ShardRun, String>> = handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect();
        let m = m?;
        Ok((m, runs.into_iter().collect::<Result<Vec<_>, _>>()?))
    })
}

/// A handshake run's server: where it runs, its files, and how it started.
pub(super) struct HandshakeServer<'a> {
    pub(super) lab: &'a ServerLab,
    pub(super) mt6d: &'a Path,
    pub(super) config: &'a Path,
    pub(super) dir: &'a Path,
    /// The first process's log.
    pub(super) log: &'a Path,
    /// Clients.
    pub(super) n: usize,
    /// Generator threads.
    pub(super) threads: usize,
    /// Seconds from the first process's start to its "serving" line.
    pub(super) ready: f64,
}

/// Every shard's counters added up.
pub(super) fn total_counters(shards: &[Shard]) -> HandshakeCounters {
    shards
        .iter()
        .fold(HandshakeCounters::default(), |mut t, sh| {
            let c = sh.set.counters;
            t.initiations += c.initiations;
            t.completed += c.completed;
            t.requests += c.requests;
            t.served += c.served;
            t.late += c.late;
            t.lost += c.lost;
            t.wrong_route += c.wrong_route;
            t.rejected += c.rejected;
            t
        })
}
