//! Wall-clock instants as plain values. The crate never reads a clock: callers pass `now` in.

use std::time::Duration;

/// An instant as nanoseconds since the Unix epoch (1970-01-01T00:00:00Z), as the caller's clock saw it.
///
/// Both gateways derive the epoch (and therefore every hashed address) from this value, so it must be
/// wall-clock time (e.g. `SystemTime::now()`), not a monotonic clock.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct UnixTime(u64);

impl UnixTime {
    /// From nanoseconds since the Unix epoch.
    pub const fn from_nanos(ns: u64) -> Self {
        Self(ns)
    }
    /// From milliseconds since the Unix epoch (saturates at `u64::MAX` ns, year 2554).
    pub const fn from_millis(ms: u64) -> Self {
        Self(ms.saturating_mul(1_000_000))
    }
    /// From seconds since the Unix epoch (saturates).
    pub const fn from_secs(s: u64) -> Self {
        Self(s.saturating_mul(1_000_000_000))
    }
    /// Nanoseconds since the Unix epoch.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }
    /// Milliseconds since the Unix epoch, rounded down.
    pub const fn as_millis(self) -> u64 {
        self.0 / 1_000_000
    }
    /// `self + d`, saturating.
    pub fn saturating_add(self, d: Duration) -> Self {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        Self(self.0.saturating_add(ns))
    }
    /// `self - d`, saturating at the Unix epoch.
    pub fn saturating_sub(self, d: Duration) -> Self {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        Self(self.0.saturating_sub(ns))
    }
    /// Time from `earlier` to `self`, zero if `earlier` is later.
    pub fn saturating_duration_since(self, earlier: UnixTime) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversions() {
        let t = UnixTime::from_millis(1_700_000_000_123);
        assert_eq!(t.as_nanos(), 1_700_000_000_123_000_000);
        assert_eq!(t.as_millis(), 1_700_000_000_123);
        assert_eq!(UnixTime::from_secs(2).as_millis(), 2000);
        assert_eq!(UnixTime::from_secs(u64::MAX).as_nanos(), u64::MAX);
        assert_eq!(
            t.saturating_add(Duration::from_millis(1)).as_millis(),
            1_700_000_000_124
        );
        assert_eq!(
            UnixTime::from_nanos(5)
                .saturating_sub(Duration::from_secs(1))
                .as_nanos(),
            0
        );
        assert!(UnixTime::from_secs(1) < UnixTime::from_secs(2));
    }
}
