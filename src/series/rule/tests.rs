use super::*;

/// Unix milliseconds of a UTC time written as RFC 3339.
fn utc(text: &str) -> UnixMillis {
    UnixMillis(DateTime::parse_from_rfc3339(text).unwrap().timestamp_millis() as u64)
}

fn cron(expr: &str, zone: &str) -> Rule {
    Rule { every: Every::cron(expr, zone).unwrap(), bounds: Bounds::default(), jitter: Duration::ZERO }
}

fn texts(times: &[UnixMillis]) -> Vec<String> {
    times.iter().map(|t| t.to_rfc3339()).collect()
}

#[test]
fn a_daily_time_in_the_spring_gap_fires_once_right_after_it() {
    // Berlin, 2026-03-29: 02:00 CET becomes 03:00 CEST.
    let rule = cron("30 2 * * *", "Europe/Berlin");
    assert_eq!(
        texts(&rule.upcoming(utc("2026-03-27T12:00:00Z"), 0, 3)),
        ["2026-03-28T01:30:00.000Z", "2026-03-29T01:00:00.000Z", "2026-03-30T00:30:00.000Z"],
        "02:30 CET; then 03:00 CEST, the first instant after the gap; then 02:30 CEST"
    );
    // New York, 2026-03-08: 02:00 EST becomes 03:00 EDT.
    let rule = cron("30 2 * * *", "America/New_York");
    assert_eq!(
        texts(&rule.upcoming(utc("2026-03-07T12:00:00Z"), 0, 3)),
        ["2026-03-08T07:00:00.000Z", "2026-03-09T06:30:00.000Z", "2026-03-10T06:30:00.000Z"],
    );
}

#[test]
fn a_daily_time_the_autumn_repeats_fires_once_at_its_first() {
    // Berlin, 2026-10-25: 03:00 CEST becomes 02:00 CET; 02:30 happens twice.
    let rule = cron("30 2 * * *", "Europe/Berlin");
    assert_eq!(
        texts(&rule.upcoming(utc("2026-10-24T12:00:00Z"), 0, 2)),
        ["2026-10-25T00:30:00.000Z", "2026-10-26T01:30:00.000Z"],
        "02:30 CEST only, then 02:30 CET the next day"
    );
    // New York, 2026-11-01: 02:00 EDT becomes 01:00 EST; 01:30 happens twice.
    let rule = cron("30 1 * * *", "America/New_York");
    assert_eq!(
        texts(&rule.upcoming(utc("2026-10-31T12:00:00Z"), 0, 2)),
        ["2026-11-01T05:30:00.000Z", "2026-11-02T06:30:00.000Z"],
    );
}

#[test]
fn a_stepped_expression_fires_on_every_instant_the_clock_shows_it() {
    // Berlin's repeated hour: 02:00 and 02:30 CEST, then again in CET.
    let rule = cron("*/30 * * * *", "Europe/Berlin");
    assert_eq!(
        texts(&rule.upcoming(utc("2026-10-24T23:45:00Z"), 0, 5)),
        [
            "2026-10-25T00:00:00.000Z",
            "2026-10-25T00:30:00.000Z",
            "2026-10-25T01:00:00.000Z",
            "2026-10-25T01:30:00.000Z",
            "2026-10-25T02:00:00.000Z",
        ],
    );
    // Berlin's skipped hour: nothing between 02:00 and 03:00.
    assert_eq!(
        texts(&rule.upcoming(utc("2026-03-29T00:15:00Z"), 0, 3)),
        ["2026-03-29T00:30:00.000Z", "2026-03-29T01:00:00.000Z", "2026-03-29T01:30:00.000Z"],
        "01:30 CET, then 03:00 and 03:30 CEST"
    );
}

#[test]
fn seconds_and_names_are_understood() {
    let rule = cron("*/20 * * * * *", "UTC");
    assert_eq!(
        texts(&rule.upcoming(utc("2026-01-01T00:00:05Z"), 0, 3)),
        ["2026-01-01T00:00:20.000Z", "2026-01-01T00:00:40.000Z", "2026-01-01T00:01:00.000Z"],
    );
    let rule = cron("@hourly", "Asia/Kolkata");
    assert_eq!(
        texts(&rule.upcoming(utc("2026-01-01T00:10:00Z"), 0, 2)),
        ["2026-01-01T00:30:00.000Z", "2026-01-01T01:30:00.000Z"],
        "on the hour in a zone half an hour off UTC"
    );
}

#[test]
fn an_interval_counts_in_absolute_time_from_its_anchor() {
    let anchor = utc("2026-10-24T23:15:00Z");
    let every = Every::interval(Duration::from_secs(3600), anchor).unwrap();
    let rule = Rule { every, bounds: Bounds::default(), jitter: Duration::ZERO };
    assert_eq!(rule.next_after(utc("2026-10-24T00:00:00Z"), 0), Some(anchor), "the anchor is the first");
    assert_eq!(
        texts(&rule.upcoming(anchor, 0, 3)),
        ["2026-10-25T00:15:00.000Z", "2026-10-25T01:15:00.000Z", "2026-10-25T02:15:00.000Z"],
        "an hour apart across Berlin's change too"
    );
}

#[test]
fn start_end_and_count_bound_the_series() {
    let mut rule = cron("0 * * * *", "UTC");
    rule.bounds.start = Some(utc("2026-05-01T10:00:00Z"));
    assert_eq!(
        rule.next_after(utc("2026-01-01T00:00:00Z"), 0),
        Some(utc("2026-05-01T10:00:00Z")),
        "from the start, on it"
    );
    rule.bounds.end = Some(utc("2026-05-01T12:00:00Z"));
    assert_eq!(rule.upcoming(utc("2026-01-01T00:00:00Z"), 0, 10).len(), 3, "10:00, 11:00, 12:00");
    rule.bounds.count = Some(5);
    assert_eq!(rule.upcoming(utc("2026-01-01T00:00:00Z"), 3, 10).len(), 2, "two left of five");
    assert_eq!(rule.next_after(utc("2026-01-01T00:00:00Z"), 5), None, "all five made");
}

#[test]
fn jitter_is_bounded_and_the_same_every_time_it_is_computed() {
    let mut rule = cron("0 9 * * *", "Europe/Berlin");
    rule.jitter = Duration::from_secs(60);
    let nominal = utc("2026-06-01T07:00:00Z");
    let due = rule.due("digest-42", nominal);
    assert!(due >= nominal && due.0 <= nominal.0 + 60_000, "{due:?}");
    assert_eq!(rule.due("digest-42", nominal), due);
    let spread: std::collections::BTreeSet<u64> =
        (0..50).map(|i| rule.due(&format!("digest-{i}"), nominal).0).collect();
    assert!(spread.len() > 40, "series spread over the minute: {}", spread.len());
    rule.jitter = Duration::ZERO;
    assert_eq!(rule.due("digest-42", nominal), nominal);
}

#[test]
fn refusals_say_what_is_wrong() {
    let refused = |expr: &str, zone: &str| Every::cron(expr, zone).unwrap_err().to_string();
    assert!(refused("0 9 * * *", "Mars/Olympus").contains("unknown time zone \"Mars/Olympus\""));
    assert!(refused("0 25 * * *", "UTC").contains("cron expression \"0 25 * * *\""));
    assert!(refused("every day", "UTC").contains("five fields"));
    assert!(refused("0 0 30 2 *", "UTC").contains("matches no time"));
    let short = Every::interval(Duration::from_millis(500), UnixMillis(0)).unwrap_err();
    assert!(short.to_string().contains("shorter than"), "{short}");
}

#[test]
fn missed_occurrences_fire_as_the_series_says() {
    // Every minute; down from 10:00:30 to 10:05:10: 10:01 to 10:05 missed.
    let rule = cron("* * * * *", "UTC");
    let (first, now) = (utc("2026-05-01T10:01:00Z"), utc("2026-05-01T10:05:10Z"));
    let after = Some(utc("2026-05-01T10:06:00Z"));
    let skip = rule.catch_up(first, now, 0, Missed::Skip);
    assert_eq!(skip, CatchUp { fire: vec![], skipped: 5, next: after });
    let latest = rule.catch_up(first, now, 0, Missed::Latest);
    assert_eq!(latest, CatchUp { fire: vec![utc("2026-05-01T10:05:00Z")], skipped: 4, next: after });
    let each = rule.catch_up(first, now, 0, Missed::Each { at_most: 3 });
    assert_eq!(
        texts(&each.fire),
        ["2026-05-01T10:03:00.000Z", "2026-05-01T10:04:00.000Z", "2026-05-01T10:05:00.000Z"]
    );
    assert_eq!((each.skipped, each.next), (2, after));
    let all = rule.catch_up(first, now, 0, Missed::Each { at_most: 100 });
    assert_eq!((all.fire.len(), all.skipped), (5, 0));
}

#[test]
fn a_catch_up_keeps_to_the_count_and_the_end() {
    let mut rule = cron("* * * * *", "UTC");
    let (first, now) = (utc("2026-05-01T10:01:00Z"), utc("2026-05-01T10:05:10Z"));
    rule.bounds.count = Some(3);
    let each = rule.catch_up(first, now, 1, Missed::Each { at_most: 100 });
    assert_eq!(
        each,
        CatchUp { fire: vec![first, utc("2026-05-01T10:02:00Z")], skipped: 0, next: None },
        "two were left"
    );
    rule.bounds = Bounds { end: Some(utc("2026-05-01T10:07:00Z")), ..Bounds::default() };
    let skip = rule.catch_up(first, utc("2026-05-01T10:09:00Z"), 0, Missed::Skip);
    assert_eq!((skip.skipped, skip.next), (7, None), "10:01 to 10:07, and over");
}

#[test]
fn a_long_outage_of_a_frequent_series_is_looked_at_up_to_a_bound() {
    let rule = cron("* * * * * *", "UTC");
    let (first, now) = (utc("2026-05-01T00:00:00Z"), utc("2026-05-08T00:00:00Z"));
    let latest = rule.catch_up(first, now, 0, Missed::Latest);
    assert_eq!(latest.fire, [now], "the latest, not the last looked at");
    assert_eq!(latest.skipped, MISSED_LOOKED_AT as u64);
    assert_eq!(latest.next, Some(utc("2026-05-08T00:00:01Z")), "goes on after now");
    let each = rule.catch_up(first, now, 0, Missed::Each { at_most: 2 });
    assert_eq!(texts(&each.fire), ["2026-05-07T23:59:59.000Z", "2026-05-08T00:00:00.000Z"]);
    let every = Every::interval(Duration::from_secs(1), first).unwrap();
    let rule = Rule { every, bounds: Bounds::default(), jitter: Duration::ZERO };
    assert_eq!(
        rule.catch_up(first, utc("2026-05-08T00:00:00.500Z"), 0, Missed::Latest).fire,
        [now],
        "an interval too"
    );
}

/// A time past what `i64` milliseconds hold is no time: a cast would wrap
/// it to one before 1970, and the series would fire in 1970 forever.
#[test]
fn a_time_beyond_any_calendar_has_no_occurrence() {
    let mut rule = cron("0 * * * *", "UTC");
    let beyond = UnixMillis(i64::MAX as u64 + 1);
    assert_eq!(rule.every.next_after(beyond), None);
    assert_eq!(rule.every.at_or_before(UnixMillis(u64::MAX)), None);
    rule.bounds.start = Some(UnixMillis(u64::MAX));
    assert_eq!(rule.next_after(UnixMillis(0), 0), None, "not 1970");
    // Past chrono's last year, yet within i64.
    assert_eq!(rule.every.next_after(UnixMillis(i64::MAX as u64 / 2)), None);
}

#[test]
fn an_interval_of_any_length_neither_wraps_nor_panics() {
    let every = Every::interval(Duration::from_secs(u64::MAX), UnixMillis(1_000)).unwrap();
    assert_eq!(every.next_after(UnixMillis(0)), Some(UnixMillis(1_000)));
    assert_eq!(every.next_after(UnixMillis(1_000)), None, "the next lies past the last millisecond");
}

#[test]
fn the_shortest_gap_is_the_interval_or_a_cron_expressions_closest_two() {
    let from = utc("2026-01-01T00:00:00Z");
    let every = Every::interval(Duration::from_secs(90), from).unwrap();
    assert_eq!(every.shortest_gap(from), Some(Duration::from_secs(90)));
    let gap = |expr: &str| cron(expr, "Europe/Berlin").every.shortest_gap(from);
    assert_eq!(gap("*/10 * * * * *"), Some(Duration::from_secs(10)));
    assert_eq!(gap("0 9 * * MON-FRI"), Some(Duration::from_secs(24 * 3600)));
    // Two minutes apart once a day.
    assert_eq!(gap("0,2 9 * * *"), Some(Duration::from_secs(120)));
    // A burst on one day of the year, months away.
    assert_eq!(gap("*/5 0 24 12 *"), Some(Duration::from_secs(300)));
}
