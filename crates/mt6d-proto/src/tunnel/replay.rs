//! Anti-replay window for tunnel counters (RFC 6479 style: a ring of 64-bit blocks, advanced a block
//! at a time, so the check is O(1) and the window never needs shifting bit by bit).

const BLOCK_BITS: u64 = 64;
const BLOCKS: usize = 64; // 4096 bits.
const RING_BITS: u64 = BLOCK_BITS * BLOCKS as u64;

/// Accepts each counter at most once, and only while it is within [`ReplayWindow::SIZE`] of the
/// highest counter accepted so far.
#[derive(Debug, Clone)]
pub struct ReplayWindow {
    /// Highest counter accepted (meaningful once `any` is true).
    top: u64,
    any: bool,
    bitmap: [u64; BLOCKS],
}

impl Default for ReplayWindow {
    fn default() -> Self {
        Self::new()
    }
}

impl ReplayWindow {
    /// Counters older than `top - SIZE` are refused: 4096 bits minus the block being filled.
    pub const SIZE: u64 = RING_BITS - BLOCK_BITS;

    /// An empty window (accepts any first counter).
    pub fn new() -> Self {
        Self {
            top: 0,
            any: false,
            bitmap: [0; BLOCKS],
        }
    }

    fn position(counter: u64) -> (usize, u64) {
        // (counter / 64) % 64 < 64 fits usize.
        (
            ((counter / BLOCK_BITS) % BLOCKS as u64) as usize,
            1u64 << (counter % BLOCK_BITS),
        )
    }

    /// The highest counter accepted so far (None before the first).
    pub fn top(&self) -> Option<u64> {
        self.any.then_some(self.top)
    }

    /// True if `counter` would be accepted now. Does not change the window (call before decrypting).
    pub fn check(&self, counter: u64) -> bool {
        if !self.any || counter > self.top {
            return true;
        }
        if self.top - counter >= Self::SIZE {
            return false;
        }
        let (block, bit) = Self::position(counter);
        self.bitmap[block] & bit == 0
    }

    /// Records `counter` as seen (call only after the tag verified). Returns false, changing nothing,
    /// if it would not pass `check`.
    pub fn update(&mut self, counter: u64) -> bool {
        if !self.check(counter) {
            return false;
        }
        if !self.any || counter > self.top {
            let new_block = counter / BLOCK_BITS;
            let clear = if self.any {
                (new_block - self.top / BLOCK_BITS).min(BLOCKS as u64)
            } else {
                BLOCKS as u64
            };
            for i in 1..=clear {
                let b = (new_block.wrapping_sub(i - 1) % BLOCKS as u64) as usize;
                self.bitmap[b] = 0;
            }
            self.top = counter;
            self.any = true;
        }
        let (block, bit) = Self::position(counter);
        self.bitmap[block] |= bit;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_order_duplicates_and_old() {
        let mut w = ReplayWindow::new();
        let base = 1_700_000_000_000_000_000u64;
        for c in base..base + 10_000 {
            assert!(w.update(c));
            assert!(!w.check(c));
        }
        let top = base + 9_999;
        assert!(!w.update(top - 5));
        assert!(!w.check(top - ReplayWindow::SIZE));
        const { assert!(ReplayWindow::SIZE >= 2048) };
    }

    #[test]
    fn reordered_within_window() {
        let mut w = ReplayWindow::new();
        assert!(w.update(5000));
        assert!(w.update(5000 - 2047));
        assert!(w.update(4000));
        assert!(!w.update(4000));
        assert!(w.update(4001));
        // A jump far ahead clears everything; the old ones are now too old.
        assert!(w.update(1_000_000));
        assert!(!w.check(4002));
        assert!(w.check(999_999));
        assert!(w.update(999_999));
        assert!(!w.update(999_999));
    }

    #[test]
    fn jump_by_less_than_a_ring_clears_stale_bits() {
        let mut w = ReplayWindow::new();
        assert!(w.update(64));
        // 64 + 4096 maps to the same block as 64; 64 itself is now too old, but a fresh counter in
        // the same block must be accepted.
        assert!(w.update(64 + 4096 + 1));
        assert!(w.update(64 + 4096));
        assert!(w.check(64 + 4096 - 100));
    }
}
