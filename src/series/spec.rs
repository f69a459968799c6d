//! What a series is, as a request gives it ([`proto::SeriesSpec`]) and as
//! the series room works with it ([`Spec`]): its template record, its
//! [`Rule`] and what it does after downtime. Everything a spec says is
//! checked here, with the field it is wrong in.

use std::time::Duration;

use super::rule::{Bounds, Every, Missed, Rule, RuleError};
use crate::{
    message::{
        Envelope, Invalid, LAST_TIMESTAMP_SECOND, Labels, MessageId, Tenant, UnixMillis, duration_text,
        shard_of,
    },
    proto,
};

/// The longest a series id may be: an occurrence's id is the series id, `@`
/// and up to 20 digits, within the 128 of a message id.
pub(crate) const MAX_ID_LEN: usize = 100;
/// The most jitter a series may have.
pub(crate) const MAX_JITTER: Duration = Duration::from_secs(3600);
/// How late an occurrence may be parked and still count as on time, unless
/// the series says.
pub(crate) const DEFAULT_MISSED_AFTER: Duration = Duration::from_secs(60);
/// How many missed occurrences FIRE_EACH fires, unless the series says.
pub(crate) const DEFAULT_AT_MOST: u32 = 10;
/// The most missed occurrences FIRE_EACH may fire.
pub(crate) const MAX_AT_MOST: u32 = 1000;
/// The longest `missed.after` may be.
pub(crate) const MAX_MISSED_AFTER: Duration = Duration::from_secs(7 * 24 * 3600);
/// How many occurrences of a series may wait at once to be judged on time
/// or missed: `missed.after` is at most this many times the series' gap
/// between two occurrences (at their closest), so that its driver keeps
/// each of them in view, and Pause, Update and Delete cancel every one.
pub(crate) const MAX_WAITING: u32 = 1000;

/// What the server allows a new series, from its settings.
#[derive(Debug, Clone)]
pub(crate) struct Limits {
    /// How far ahead of now a start or an end may lie (--max-delay).
    pub max_delay: Duration,
    /// The shortest gap between two occurrences (--series-min-interval);
    /// never less than [`MIN_INTERVAL`](super::rule::MIN_INTERVAL).
    pub min_interval: Duration,
    /// Series one tenant may have (--series-max-per-tenant).
    pub max_per_tenant: usize,
}

impl Limits {
    pub(crate) fn of(config: &crate::config::Config) -> Limits {
        Limits {
            max_delay: *config.max_delay,
            min_interval: *config.series_min_interval,
            max_per_tenant: config.series_max_per_tenant,
        }
    }
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_delay: crate::message::Limits::default().max_delay,
            min_interval: super::rule::MIN_INTERVAL,
            max_per_tenant: 10_000,
        }
    }
}

/// A new spec's checks: against the time now and the server's limits.
struct New<'a> {
    now: UnixMillis,
    limits: &'a Limits,
}

/// A checked spec.
#[derive(Debug, Clone)]
pub(crate) struct Spec {
    /// The record each occurrence produces, with the series' labels.
    pub template: Envelope,
    pub rule: Rule,
    pub missed: Missed,
    /// How late past its time an occurrence may be parked and count as on
    /// time.
    pub missed_after: Duration,
}

impl Spec {
    /// Checks `spec`, new at `now`, against `limits`; an interval counts
    /// from its start or, without one, from `anchor` (when the series was
    /// made).
    pub(crate) fn parse(
        spec: &proto::SeriesSpec,
        anchor: UnixMillis,
        now: UnixMillis,
        limits: &Limits,
    ) -> Result<Spec, Invalid> {
        Spec::check(spec, anchor, Some(New { now, limits }))
    }

    /// A spec read back from the store: as [`parse`](Self::parse), but
    /// neither a cron expression need match again nor the limits hold now
    /// (they were met when it was written, and may have been changed
    /// since).
    pub(crate) fn read(spec: &proto::SeriesSpec, anchor: UnixMillis) -> Result<Spec, Invalid> {
        Spec::check(spec, anchor, None)
    }

    fn check(spec: &proto::SeriesSpec, anchor: UnixMillis, new: Option<New>) -> Result<Spec, Invalid> {
        let template = spec.template.clone().ok_or_else(|| {
            Invalid::new("spec.template", "is missing: give the record each occurrence produces")
        })?;
        let mut template = Envelope::from(template);
        template.labels = Labels::new(spec.labels.clone().into_iter().collect::<Vec<_>>())
            .map_err(|e| Invalid::new("spec.labels", e.reason))?;
        let start = spec.start.map(|t| millis("spec.start", t, new.as_ref())).transpose()?;
        let end = spec.end.map(|t| millis("spec.end", t, new.as_ref())).transpose()?;
        if let (Some(start), Some(end)) = (start, end)
            && end < start
        {
            return Err(Invalid::new("spec.end", "is before spec.start"));
        }
        let every = match &spec.every {
            Some(proto::series_spec::Every::Cron(expr)) => {
                let zone = if spec.time_zone.is_empty() { "UTC" } else { spec.time_zone.as_str() };
                let every = if new.is_some() {
                    Every::cron(expr.trim(), zone)
                } else {
                    Every::cron_read(expr.trim(), zone)
                };
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
        // The closest two occurrences of a new series, from its start on:
        // what its jitter, its `missed.after` and the server's shortest
        // interval are held to.
        let gap = new.as_ref().and_then(|new| every.shortest_gap(start.unwrap_or(new.now).max(new.now)));
        if let (Some(new), Some(gap)) = (&new, gap)
            && gap < new.limits.min_interval
        {
            let field = match every {
                Every::Cron { .. } => "spec.cron",
                Every::Interval { .. } => "spec.interval",
            };
            return Err(Invalid::new(
                field,
                format!(
                    "fires {} apart at its closest; this server's series leave {} at least between two \
                     occurrences (--series-min-interval)",
                    duration_text(gap),
                    duration_text(new.limits.min_interval)
                ),
            ));
        }
        let jitter = spec.jitter.map(|d| duration("spec.jitter", d)).transpose()?.unwrap_or_default();
        if jitter > MAX_JITTER {
            return Err(Invalid::new("spec.jitter", format!("is {jitter:?}; the most is {MAX_JITTER:?}")));
        }
        // A jitter longer than the gap would move an occurrence past the
        // next one's time: the driver parks them in order, so the next
        // would be parked late, and judged missed.
        if let Some(gap) = gap
            && jitter > gap
        {
            return Err(Invalid::new(
                "spec.jitter",
                format!(
                    "is {}, longer than the {} between two occurrences at their closest: occurrences would \
                     come out of order, and be judged missed; give at most {}",
                    duration_text(jitter),
                    duration_text(gap),
                    duration_text(gap)
                ),
            ));
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
                d if new.is_some() && d > MAX_MISSED_AFTER => {
                    return Err(Invalid::new(
                        "spec.missed.after",
                        format!(
                            "is {}; the most is {}: an occurrence that late is missed",
                            duration_text(d),
                            duration_text(MAX_MISSED_AFTER)
                        ),
                    ));
                }
                d if gap.is_some_and(|gap| d > gap.saturating_mul(MAX_WAITING)) => {
                    let gap = gap.unwrap_or_default();
                    return Err(Invalid::new(
                        "spec.missed.after",
                        format!(
                            "is {}; for occurrences {} apart the most is {} ({MAX_WAITING} times that), so \
                             that no more than {MAX_WAITING} of them wait at once to be judged missed",
                            duration_text(d),
                            duration_text(gap),
                            duration_text(gap.saturating_mul(MAX_WAITING))
                        ),
                    ));
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
pub(crate) fn series_id(tenant: Option<&Tenant>, id: &str) -> Result<MessageId, Invalid> {
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
pub(crate) fn occurrence_id(series: &MessageId, at: UnixMillis, shards: u32) -> MessageId {
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

/// A time a spec gives, in Unix ms: from 1970 to the end of 9999 (what a
/// protobuf Timestamp holds), and, for a new spec, no further ahead than
/// --max-delay.
fn millis(field: &'static str, t: prost_types::Timestamp, new: Option<&New>) -> Result<UnixMillis, Invalid> {
    if t.seconds < 0 || !(0..1_000_000_000).contains(&t.nanos) {
        return Err(Invalid::new(field, "is not a time after 1970"));
    }
    if t.seconds > LAST_TIMESTAMP_SECOND {
        return Err(Invalid::new(
            field,
            format!(
                "is {} s after 1970, past 9999-12-31T23:59:59Z, the last time a Timestamp holds",
                t.seconds
            ),
        ));
    }
    // Within the range, neither can overflow.
    let at = UnixMillis(t.seconds as u64 * 1000 + (t.nanos as u64).div_ceil(1_000_000));
    if let Some(New { now, limits }) = new {
        let latest = now.saturating_add(limits.max_delay);
        if at > latest {
            return Err(Invalid::new(
                field,
                format!(
                    "{} is further ahead than the server's --max-delay of {} allows (the latest it takes now \
                     is {}); pick an earlier time, or raise --max-delay",
                    at.to_rfc3339(),
                    duration_text(limits.max_delay),
                    latest.to_rfc3339()
                ),
            ));
        }
    }
    Ok(at)
}

fn duration(field: &'static str, d: prost_types::Duration) -> Result<Duration, Invalid> {
    if d.seconds < 0 || d.nanos < 0 || d.nanos >= 1_000_000_000 {
        return Err(Invalid::new(field, "must be a duration of zero or more"));
    }
    Ok(Duration::new(d.seconds as u64, d.nanos as u32))
}

/// How an operator's `ListSeries` page token starts: the rest is the
/// stored id of the last series of the page, in hex (the page spans
/// tenants). Hex keeps the stored order: tokens compare as the ids do.
const EVERY: &str = "every:";

/// An operator's page token after `id`.
pub(crate) fn every_token_of(id: &MessageId) -> String {
    id.as_bytes().iter().fold(EVERY.to_owned(), |mut token, b| {
        token.push_str(&format!("{b:02x}"));
        token
    })
}

/// The series an operator's page token names.
pub(crate) fn every_token(token: &str) -> Option<MessageId> {
    let digits = token.strip_prefix(EVERY)?.as_bytes();
    if digits.len() % 2 != 0 {
        return None;
    }
    let bytes = digits
        .chunks(2)
        .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok())
        .collect::<Option<Vec<u8>>>()?;
    MessageId::from_stored(&bytes)
}

/// Where a listed series stands in a listing's order, as its page tokens
/// say it: its id, or for an operator's listing (`every`), which spans
/// tenants, its stored id as [`every_token_of`] writes it.
pub(crate) fn page_position(info: &proto::SeriesInfo, every: bool) -> String {
    if !every {
        return info.id.clone();
    }
    let tenant = Some(info.tenant.as_str()).filter(|t| !t.is_empty()).and_then(|t| Tenant::parse(t).ok());
    match series_id(tenant.as_ref(), &info.id) {
        Ok(id) => every_token_of(&id),
        Err(_) => info.id.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: UnixMillis = UnixMillis(1_800_000_000_000);

    fn every(seconds: i64) -> proto::SeriesSpec {
        proto::SeriesSpec {
            template: Some(proto::Message { topic: "t".into(), value: b"v".to_vec(), ..Default::default() }),
            every: Some(proto::series_spec::Every::Interval(prost_types::Duration { seconds, nanos: 0 })),
            ..Default::default()
        }
    }

    fn cron(expr: &str) -> proto::SeriesSpec {
        proto::SeriesSpec { every: Some(proto::series_spec::Every::Cron(expr.into())), ..every(60) }
    }

    fn at(seconds: i64) -> Option<prost_types::Timestamp> {
        Some(prost_types::Timestamp { seconds, nanos: 0 })
    }

    fn secs(seconds: i64) -> Option<prost_types::Duration> {
        Some(prost_types::Duration { seconds, nanos: 0 })
    }

    /// The field a new spec is refused in, with the default limits.
    fn refused(spec: proto::SeriesSpec) -> &'static str {
        Spec::parse(&spec, NOW, NOW, &Limits::default()).expect_err("refused").field
    }

    fn taken(spec: proto::SeriesSpec) {
        if let Err(e) = Spec::parse(&spec, NOW, NOW, &Limits::default()) {
            panic!("{spec:?}: {e}");
        }
    }

    #[test]
    fn a_start_or_end_past_9999_or_beyond_max_delay_is_refused() {
        let now = (NOW.0 / 1000) as i64;
        for t in [LAST_TIMESTAMP_SECOND + 1, i64::MAX] {
            assert_eq!(refused(proto::SeriesSpec { start: at(t), ..every(60) }), "spec.start");
            assert_eq!(refused(proto::SeriesSpec { end: at(t), ..cron("0 * * * *") }), "spec.end");
        }
        let four_years = 4 * 366 * 24 * 3600;
        assert_eq!(refused(proto::SeriesSpec { start: at(now + four_years), ..every(60) }), "spec.start");
        assert_eq!(refused(proto::SeriesSpec { end: at(now + four_years), ..every(60) }), "spec.end");
        taken(proto::SeriesSpec { start: at(now + 3600), end: at(now + 7200), ..every(60) });
        // Read back, a stored spec is not held to the limits of now.
        let stored = proto::SeriesSpec { start: at(now + four_years), ..every(60) };
        assert!(Spec::read(&stored, NOW).is_ok());
    }

    #[test]
    fn a_jitter_longer_than_the_closest_two_occurrences_is_refused() {
        assert_eq!(refused(proto::SeriesSpec { jitter: secs(11), ..every(10) }), "spec.jitter");
        assert_eq!(refused(proto::SeriesSpec { jitter: secs(11), ..cron("*/10 * * * * *") }), "spec.jitter");
        assert_eq!(refused(proto::SeriesSpec { jitter: secs(121), ..cron("0,2 9 * * *") }), "spec.jitter");
        taken(proto::SeriesSpec { jitter: secs(10), ..every(10) });
        taken(proto::SeriesSpec { jitter: secs(3600), ..cron("0 9 * * *") });
    }

    #[test]
    fn missed_after_is_bounded_by_a_week_and_by_the_gap() {
        let after = |seconds| Some(proto::Missed { after: secs(seconds), ..Default::default() });
        let daily = cron("0 9 * * *");
        assert_eq!(
            refused(proto::SeriesSpec { missed: after(7 * 86_400 + 1), ..daily.clone() }),
            "spec.missed.after"
        );
        taken(proto::SeriesSpec { missed: after(7 * 86_400), ..daily });
        // A series every second: no more than 1,000 of them waiting.
        assert_eq!(refused(proto::SeriesSpec { missed: after(1_001), ..every(1) }), "spec.missed.after");
        taken(proto::SeriesSpec { missed: after(1_000), ..every(1) });
    }

    #[test]
    fn a_series_closer_than_the_servers_shortest_interval_is_refused() {
        let limits = Limits { min_interval: Duration::from_secs(5), ..Limits::default() };
        let parse = |spec: proto::SeriesSpec| Spec::parse(&spec, NOW, NOW, &limits).map(|_| ());
        assert_eq!(parse(every(4)).unwrap_err().field, "spec.interval");
        assert_eq!(parse(cron("*/2 * * * * *")).unwrap_err().field, "spec.cron");
        assert!(parse(every(5)).is_ok());
        assert!(parse(cron("*/5 * * * * *")).is_ok());
    }

    /// The form a client may not take is the one occurrences have, and no
    /// series id has it.
    #[test]
    fn occurrence_ids_and_only_they_have_the_reserved_form() {
        use crate::message::occurrence_form;
        for shards in [1, 12, 256] {
            let series = series_id(None, "daily").unwrap();
            for at in [0, 5, 1_800_000_000_000, u64::MAX] {
                let id = occurrence_id(&series, UnixMillis(at), shards);
                assert!(occurrence_form(id.as_str()), "{id}");
            }
        }
        for id in ["daily", "a@b", "bob@example.com", "x@12abc", "@5", "x@", "x@1.", "x@1.b", "x@1@2"] {
            assert!(!occurrence_form(id), "{id}");
        }
        for id in ["x@5", "order-42@1700000000000", "s@1.7"] {
            assert!(occurrence_form(id), "{id}");
        }
    }
}
