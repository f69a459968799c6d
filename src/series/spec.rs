//! What a series is, as a request gives it ([`proto::SeriesSpec`]) and as
//! the series room works with it ([`Spec`]): its template record, its
//! [`Rule`] and what it does after downtime. Everything a spec says is
//! checked here, with the field it is wrong in.

use std::time::Duration;

use super::rule::{Bounds, Every, Missed, Rule, RuleError};
use crate::{
    message::{Envelope, Invalid, Labels, MessageId, Tenant, UnixMillis, shard_of},
    proto,
};

/// The longest a series id may be: an occurrence's id is the series id, `@`
/// and up to 20 digits, within the 128 of a message id.
pub const MAX_ID_LEN: usize = 100;
/// The most jitter a series may have.
pub const MAX_JITTER: Duration = Duration::from_secs(3600);
/// How late an occurrence may be parked and still count as on time, unless
/// the series says.
pub const DEFAULT_MISSED_AFTER: Duration = Duration::from_secs(60);
/// How many missed occurrences FIRE_EACH fires, unless the series says.
pub const DEFAULT_AT_MOST: u32 = 10;
/// The most missed occurrences FIRE_EACH may fire.
pub const MAX_AT_MOST: u32 = 1000;

/// A checked spec.
#[derive(Debug, Clone)]
pub struct Spec {
    /// The record each occurrence produces, with the series' labels.
    pub template: Envelope,
    pub rule: Rule,
    pub missed: Missed,
    /// How late past its time an occurrence may be parked and count as on
    /// time.
    pub missed_after: Duration,
}

impl Spec {
    /// Checks `spec`; an interval counts from its start or, without one,
    /// from `anchor` (when the series was made).
    pub fn parse(spec: &proto::SeriesSpec, anchor: UnixMillis) -> Result<Spec, Invalid> {
        Spec::check(spec, anchor, true)
    }

    /// A spec read back from the store: as [`parse`](Self::parse), but a
    /// cron expression need not match again.
    pub fn read(spec: &proto::SeriesSpec, anchor: UnixMillis) -> Result<Spec, Invalid> {
        Spec::check(spec, anchor, false)
    }

    fn check(spec: &proto::SeriesSpec, anchor: UnixMillis, new: bool) -> Result<Spec, Invalid> {
        let template = spec.template.clone().ok_or_else(|| {
            Invalid::new("spec.template", "is missing: give the record each occurrence produces")
        })?;
        let mut template = Envelope::from(template);
        template.labels = Labels::new(spec.labels.clone().into_iter().collect::<Vec<_>>())
            .map_err(|e| Invalid::new("spec.labels", e.reason))?;
        let start = spec.start.map(|t| millis("spec.start", t)).transpose()?;
        let end = spec.end.map(|t| millis("spec.end", t)).transpose()?;
        if let (Some(start), Some(end)) = (start, end)
            && end < start
        {
            return Err(Invalid::new("spec.end", "is before spec.start"));
        }
        let every = match &spec.every {
            Some(proto::series_spec::Every::Cron(expr)) => {
                let zone = if spec.time_zone.is_empty() { "UTC" } else { spec.time_zone.as_str() };
                let every =
                    if new { Every::cron(expr.trim(), zone) } else { Every::cron_read(expr.trim(), zone) };
                every.map_err(|e| match e {
                    RuleError::Zone(_) => Invalid::new("spec.time_zone", e.to_string()),
                    _ => Invalid::new("spec.cron", e.to_string()),
                })?
            }
            Some(proto::series_spec::Every::Interval(d)) => {
                if !spec.time_zone.is_empty() {
                    return Err(Invalid::new(
                        "spec.time_zone",
                        "applies to cron only: an interval counts absolute time, which no zone moves",
                    ));
                }
                let every = duration("spec.interval", *d)?;
                Every::interval(every, start.unwrap_or(anchor))
                    .map_err(|e| Invalid::new("spec.interval", e.to_string()))?
            }
            None => {
                return Err(Invalid::new(
                    "spec.every",
                    "is missing: set cron (\"0 9 * * MON-FRI\") or interval (\"60s\")",
                ));
            }
        };
        let jitter = spec.jitter.map(|d| duration("spec.jitter", d)).transpose()?.unwrap_or_default();
        if jitter > MAX_JITTER {
            return Err(Invalid::new("spec.jitter", format!("is {jitter:?}; the most is {MAX_JITTER:?}")));
        }
        let count = (spec.count > 0).then_some(spec.count);
        let missed = spec.missed.unwrap_or_default();
        let policy = match proto::MissedPolicy::try_from(missed.policy) {
            Ok(proto::MissedPolicy::Unspecified | proto::MissedPolicy::FireOne) => Missed::Latest,
            Ok(proto::MissedPolicy::Skip) => Missed::Skip,
            Ok(proto::MissedPolicy::FireEach) => {
                let at_most = if missed.at_most == 0 { DEFAULT_AT_MOST } else { missed.at_most };
                if at_most > MAX_AT_MOST {
                    return Err(Invalid::new(
                        "spec.missed.at_most",
                        format!("is {at_most}; the most is {MAX_AT_MOST}"),
                    ));
                }
                Missed::Each { at_most }
            }
            Err(_) => {
                return Err(Invalid::new(
                    "spec.missed.policy",
                    format!("is {}, not one of SKIP (1), FIRE_ONE (2) and FIRE_EACH (3)", missed.policy),
                ));
            }
        };
        let missed_after = match missed.after {
            None => DEFAULT_MISSED_AFTER,
            Some(d) => match duration("spec.missed.after", d)? {
                d if d.is_zero() => DEFAULT_MISSED_AFTER,
                d if d < Duration::from_secs(1) => {
                    return Err(Invalid::new("spec.missed.after", format!("is {d:?}; it is 1s at least")));
                }
                d => d,
            },
        };
        Ok(Spec {
            template,
            rule: Rule { every, bounds: Bounds { start, end, count }, jitter },
            missed: policy,
            missed_after,
        })
    }
}

/// A series id in `tenant`'s space: a message id's rules, at most
/// [`MAX_ID_LEN`] long, without `@` (which joins it to an occurrence's
/// time).
pub fn series_id(tenant: Option<&Tenant>, id: &str) -> Result<MessageId, Invalid> {
    if id.len() > MAX_ID_LEN {
        return Err(Invalid::new(
            "id",
            format!("is {} bytes long; a series id has at most {MAX_ID_LEN}", id.len()),
        ));
    }
    if id.contains('@') {
        return Err(Invalid::new("id", "contains '@', which joins a series id to an occurrence's time"));
    }
    MessageId::parse_in(tenant, id)
}

/// Ids an occurrence may take before the plain one is kept: far more than
/// any shard count needs (about as many as there are shards).
const PLACEMENT_TRIES: u32 = 1 << 16;

/// The id of the occurrence of series `series` at nominal time `at`, in
/// the series' own shard of `shards`: `<series>@<ms>`, or, where that id
/// hashes to another shard, `<series>@<ms>.<n>` with the least `n` that
/// hashes to the series' shard. A series and its occurrences are one
/// shard's, so its owner parks, reads and cancels them itself (in a
/// cluster, without another node); the same inputs always give the same
/// id, so a retry parks the same message.
pub fn occurrence_id(series: &MessageId, at: UnixMillis, shards: u32) -> MessageId {
    let tenant = series.tenant().map(|t| Tenant::parse(t).expect("a stored tenant is valid"));
    let make = |text: &str| {
        MessageId::parse_in(tenant.as_ref(), text).expect("a series id and a time make a valid id")
    };
    let home = shard_of(series, shards);
    let base = format!("{}@{}", series.as_str(), at.0);
    let plain = make(&base);
    if shard_of(&plain, shards) == home {
        return plain;
    }
    (1..=PLACEMENT_TRIES)
        .map(|n| make(&format!("{base}.{n}")))
        .find(|id| shard_of(id, shards) == home)
        .unwrap_or(plain)
}

fn millis(field: &'static str, t: prost_types::Timestamp) -> Result<UnixMillis, Invalid> {
    if t.seconds < 0 || !(0..1_000_000_000).contains(&t.nanos) {
        return Err(Invalid::new(field, "is not a time after 1970"));
    }
    Ok(UnixMillis((t.seconds as u64).saturating_mul(1000) + (t.nanos as u64).div_ceil(1_000_000)))
}

fn duration(field: &'static str, d: prost_types::Duration) -> Result<Duration, Invalid> {
    if d.seconds < 0 || d.nanos < 0 || d.nanos >= 1_000_000_000 {
        return Err(Invalid::new(field, "must be a duration of zero or more"));
    }
    Ok(Duration::new(d.seconds as u64, d.nanos as u32))
}
