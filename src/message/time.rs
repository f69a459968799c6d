//! Time: wall-clock milliseconds, lengths of time as people write them,
//! and due times as a client asks for them.

use std::time::Duration;

/// The last second a protobuf Timestamp holds, 9999-12-31T23:59:59Z, in
/// seconds since the Unix epoch: no later time is taken from a request, as
/// none could be given back.
pub const LAST_TIMESTAMP_SECOND: i64 = 253_402_300_799;

/// Wall-clock milliseconds since the Unix epoch: the unit of every due time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct UnixMillis(pub u64);

impl UnixMillis {
    pub fn saturating_add(self, d: Duration) -> Self {
        UnixMillis(self.0.saturating_add(duration_ms(d)))
    }

    /// `d` before `self`; the epoch when that is before it.
    pub fn saturating_sub(self, d: Duration) -> Self {
        UnixMillis(self.0.saturating_sub(duration_ms(d)))
    }

    /// How far `self` lies after `earlier`; zero when it does not.
    pub fn since(self, earlier: UnixMillis) -> Duration {
        Duration::from_millis(self.0.saturating_sub(earlier.0))
    }

    /// As a protobuf timestamp, the wire's time.
    pub fn to_timestamp(self) -> prost_types::Timestamp {
        prost_types::Timestamp {
            seconds: (self.0 / 1000) as i64,
            nanos: ((self.0 % 1000) * 1_000_000) as i32,
        }
    }

    /// RFC 3339 with milliseconds, for people reading logs and the CLI.
    pub fn to_rfc3339(self) -> String {
        let secs = (self.0 / 1000) as i64;
        let nanos = (self.0 % 1000) as u32 * 1_000_000;
        chrono::DateTime::from_timestamp(secs, nanos)
            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
            .unwrap_or_else(|| format!("{}ms", self.0))
    }
}

pub fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A setting's length of time as a flag takes it, in the one unit that
/// measures it exactly, the largest such: `1098days`, `10m`, `200ms`
/// (never `3years 2days 6h`, which reads back as something else).
pub fn duration_text(d: Duration) -> String {
    const UNITS: [(&str, u128); 7] = [
        ("days", 86_400_000_000_000),
        ("h", 3_600_000_000_000),
        ("m", 60_000_000_000),
        ("s", 1_000_000_000),
        ("ms", 1_000_000),
        ("us", 1_000),
        ("ns", 1),
    ];
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".to_owned();
    }
    let (unit, size) = UNITS.into_iter().find(|(_, size)| nanos % size == 0).unwrap_or(("ns", 1));
    format!("{}{unit}", nanos / size)
}

/// When to deliver, as the client said it. Kept as given so that a retried
/// request with a relative delay is recognised as the same request minutes
/// later.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DueSpec {
    At(UnixMillis),
    After(Duration),
}

impl DueSpec {
    pub fn resolve(self, now: UnixMillis) -> UnixMillis {
        match self {
            DueSpec::At(t) => t,
            DueSpec::After(d) => now.saturating_add(d),
        }
    }

    /// As the store and the log keep it: the instant or the delay, in ms.
    pub fn stored(self) -> (Option<u64>, Option<u64>) {
        match self {
            DueSpec::At(t) => (Some(t.0), None),
            DueSpec::After(d) => (None, Some(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))),
        }
    }

    /// From what [`stored`](Self::stored) keeps; with neither, the due
    /// time `due` itself.
    pub fn from_stored(at_ms: Option<u64>, delay_ms: Option<u64>, due: UnixMillis) -> DueSpec {
        match (at_ms, delay_ms) {
            (_, Some(ms)) => DueSpec::After(Duration::from_millis(ms)),
            (Some(ms), None) => DueSpec::At(UnixMillis(ms)),
            (None, None) => DueSpec::At(due),
        }
    }
}
