//! The daemon's only clock reading. The protocol crate never reads the clock itself
//! (../shared/STYLE.md §3); everything time-dependent is computed from what this returns.

use std::time::{SystemTime, UNIX_EPOCH};

use mt6d_proto::UnixTime;

/// Wall-clock time now. Both gateways derive epochs from it, so it must be synchronised (NTP);
/// the accept window tolerates skew of up to half a rotation interval.
pub fn now() -> UnixTime {
    // A clock before 1970 is a broken host; epoch 0 then makes the peers disagree visibly
    // (drops counted as unknown_address) rather than crashing the daemon.
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    UnixTime::from_nanos(nanos)
}
