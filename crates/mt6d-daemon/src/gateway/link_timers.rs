//! When the main thread visits a peer's link (docs/ARCHITECTURE.md, "The endpoint contract"):
//! at the link's own `poll_timeout`, kept in a deadline heap, or at once when a packet thread
//! flagged the peer ([`Attention`]: a handshake message, a notice or a new key's first packet
//! arrived, or a packet found no key). A tick costs O(log n) per due peer and nothing for the
//! others: no peer's lock is taken unless it is due.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Mutex;

use mt6d_proto::UnixTime;

use super::routing::RouteTable;
use crate::daemon::wakeup::Nudge;

/// Peers the packet threads flagged for the main thread, by table generation and peer index.
/// Pushed once per event (a flag's first raise, a control message), never per data packet;
/// the push that finds the queue empty wakes the main thread (the later ones find it awake or
/// about to wake: it takes the whole queue after each wake-up).
#[derive(Debug, Default)]
pub struct Attention {
    queue: Mutex<Vec<(u64, usize)>>,
    /// The main thread's wake-up (None: nobody sleeps on this queue, as in unit tests).
    wake: Option<Nudge>,
}

impl Attention {
    /// A queue whose first push after each take wakes the main thread through `wake`.
    pub fn new(wake: Nudge) -> Attention {
        Attention {
            queue: Mutex::default(),
            wake: Some(wake),
        }
    }

    /// Peer `peer` of the table of `generation` needs its link visited.
    pub fn push(&self, generation: u64, peer: usize) {
        let first = {
            let mut q = self
                .queue
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            q.push((generation, peer));
            q.len() == 1
        };
        if first {
            if let Some(w) = &self.wake {
                w.nudge();
            }
        }
    }

    fn take(&self, out: &mut Vec<(u64, usize)>) {
        let mut q = self
            .queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        out.append(&mut q);
    }
}

/// The deadline of every peer's link, for one table generation.
#[derive(Debug, Default)]
pub struct LinkTimers {
    generation: Option<u64>,
    /// (deadline, peer) with lazy deletion: an entry counts only if it matches `at`.
    heap: BinaryHeap<Reverse<(UnixTime, usize)>>,
    at: Vec<Option<UnixTime>>,
    flagged: Vec<(u64, usize)>,
}

impl LinkTimers {
    /// Fills `due` with the peers of `table` to visit at `now`, each once: those whose deadline
    /// passed and those flagged. A new peer set (another generation) makes every peer due.
    pub fn due(
        &mut self,
        table: &RouteTable,
        attention: &Attention,
        now: UnixTime,
        due: &mut Vec<usize>,
    ) {
        self.due_of(table.generation, table.peers.len(), attention, now, due);
    }

    fn due_of(
        &mut self,
        generation: u64,
        peers: usize,
        attention: &Attention,
        now: UnixTime,
        due: &mut Vec<usize>,
    ) {
        due.clear();
        self.flagged.clear();
        attention.take(&mut self.flagged);
        if self.generation != Some(generation) {
            self.generation = Some(generation);
            self.heap.clear();
            self.at = vec![None; peers];
            due.extend(0..peers);
            return;
        }
        while let Some(&Reverse((t, i))) = self.heap.peek() {
            if t > now {
                break;
            }
            self.heap.pop();
            if self.at.get(i).copied().flatten() == Some(t) {
                self.at[i] = None;
                due.push(i);
            }
        }
        due.extend(
            self.flagged
                .iter()
                .filter(|(g, i)| *g == generation && *i < peers)
                .map(|(_, i)| *i),
        );
        due.sort_unstable();
        due.dedup();
    }

    /// Peer `peer`'s next visit (None: only a flag brings it back).
    pub fn schedule(&mut self, peer: usize, at: Option<UnixTime>) {
        let Some(slot) = self.at.get_mut(peer) else {
            return;
        };
        *slot = at;
        if let Some(t) = at {
            self.heap.push(Reverse((t, peer)));
        }
    }

    /// The earliest deadline held (it may belong to a peer rescheduled since: waking for it
    /// early costs one turn).
    pub fn next_due(&self) -> Option<UnixTime> {
        self.heap.peek().map(|Reverse((t, _))| *t)
    }

    /// Entries held (tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.heap.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> UnixTime {
        UnixTime::from_millis(v)
    }

    #[test]
    fn a_push_wakes_the_main_thread_once_until_it_takes_the_queue() {
        let mut wait = crate::daemon::wakeup::MainWait::without_signals().expect("wait set");
        let att = Attention::new(wait.nudge());
        let pusher = {
            let att = std::sync::Arc::new(att);
            let a = std::sync::Arc::clone(&att);
            (std::thread::spawn(move || a.push(1, 3)), att)
        };
        let woke = wait.wait(std::time::Duration::from_secs(60)).expect("wait");
        pusher.0.join().expect("pusher");
        let att = pusher.1;
        assert!(woke.thread, "{woke:?}");
        let mut t = LinkTimers::default();
        let mut due = Vec::new();
        t.due_of(1, 4, &att, ms(0), &mut due);
        att.push(1, 2);
        att.push(1, 1);
        assert!(wait.wait(std::time::Duration::ZERO).expect("wait").thread);
        assert!(
            wait.wait(std::time::Duration::ZERO)
                .expect("wait")
                .timed_out(),
            "the second push found the queue non-empty: no second wake-up"
        );
        t.due_of(1, 4, &att, ms(1), &mut due);
        assert_eq!(due, vec![1, 2]);
    }

    #[test]
    fn only_due_and_flagged_peers_are_visited_and_a_new_peer_set_visits_all() {
        let mut t = LinkTimers::default();
        let att = Attention::default();
        let mut due = Vec::new();
        // First sight of generation 1 with 4 peers: all due.
        t.due_of(1, 4, &att, ms(0), &mut due);
        assert_eq!(due, vec![0, 1, 2, 3]);
        t.schedule(0, Some(ms(100)));
        t.schedule(1, Some(ms(50)));
        t.schedule(2, None);
        t.schedule(3, Some(ms(500)));
        // Rescheduled later: the earlier entry no longer counts.
        t.schedule(1, Some(ms(300)));
        t.due_of(1, 4, &att, ms(120), &mut due);
        assert_eq!(due, vec![0]);
        t.due_of(1, 4, &att, ms(310), &mut due);
        assert_eq!(due, vec![1]);
        assert_eq!(t.len(), 1, "stale and popped entries are gone");
        // Flags: of this generation and an existing peer only, each peer once.
        att.push(0, 2);
        att.push(1, 9);
        att.push(1, 2);
        att.push(1, 2);
        t.due_of(1, 4, &att, ms(320), &mut due);
        assert_eq!(due, vec![2]);
        t.due_of(1, 4, &att, ms(330), &mut due);
        assert!(due.is_empty(), "flags are taken once");
        // A new generation: every peer of it.
        t.due_of(2, 2, &att, ms(340), &mut due);
        assert_eq!(due, vec![0, 1]);
    }
}
