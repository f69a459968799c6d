use std::time::Duration;

use super::*;

fn envelope() -> Envelope {
    Envelope {
        topic: "orders.cancel-v1".into(),
        key: Some(b"order-42".to_vec()),
        value: b"cancel".to_vec(),
        headers: vec![Header { key: "trace".into(), value: b"abc".to_vec() }],
        partition: None,
        labels: Default::default(),
        max_lateness: None,
        dead_letter_topic: None,
    }
}

#[test]
fn a_plain_message_is_valid() {
    assert_eq!(envelope().validate(&Limits::default()), Ok(()));
}

#[test]
fn bad_topics_are_refused_with_the_reason() {
    for (topic, needle) in [
        ("", "empty"),
        ("has space", "contains ' '"),
        ("..", "may not"),
        (&"t".repeat(250), "longer than 249"),
    ] {
        let err = validate_topic_name(topic).unwrap_err();
        assert_eq!(err.field, "message.topic");
        assert!(err.reason.contains(needle), "{topic:?}: {err}");
    }
    assert!(validate_topic_name(&"t".repeat(249)).is_ok());
}

#[test]
fn empty_value_is_refused() {
    let mut e = envelope();
    e.value.clear();
    assert_eq!(e.validate(&Limits::default()).unwrap_err().field, "message.value");
}

#[test]
fn oversized_message_is_refused() {
    let limits = Limits { max_message_bytes: 100, ..Limits::default() };
    let mut e = envelope();
    e.value = vec![0; 100];
    let err = e.validate(&limits).unwrap_err();
    assert_eq!(err.field, "message");
    assert!(err.reason.contains("the limit is 100"), "{err}");
    e.value = vec![0; 100 - 8 - 8];
    assert_eq!(e.validate(&limits), Ok(()));
}

#[test]
fn header_limits_apply() {
    let limits = Limits { max_headers: 2, max_headers_bytes: 10, ..Limits::default() };
    let mut e = envelope();
    e.headers = vec![Header { key: "k".into(), value: vec![] }; 3];
    assert!(e.validate(&limits).unwrap_err().reason.contains("3 headers"));
    e.headers = vec![Header { key: "k".into(), value: vec![0; 10] }];
    assert!(e.validate(&limits).unwrap_err().reason.contains("11 bytes"));
    e.headers = vec![Header { key: "".into(), value: vec![] }];
    assert!(e.validate(&limits).unwrap_err().reason.contains("empty"));
    e.headers = vec![Header { key: ID_HEADER.into(), value: vec![] }];
    assert!(e.validate(&limits).unwrap_err().reason.contains("reserved"));
}

#[test]
fn a_dead_letter_topic_must_be_a_topic_and_another_one() {
    let with = |to: &str| Envelope { dead_letter_topic: Some(to.into()), ..envelope() };
    assert_eq!(with("orders.dead").validate(&Limits::default()), Ok(()));
    for to in ["", "no/slash", "orders.cancel-v1"] {
        let refused = with(to).validate(&Limits::default()).unwrap_err();
        assert_eq!(refused.field, "dead_letter_topic", "{to:?}: {refused:?}");
    }
}

#[test]
fn a_dead_letter_keeps_the_record_and_says_why() {
    let with_partition =
        Envelope { partition: Some(3), max_lateness: Some(Duration::from_secs(1)), ..envelope() };
    let expired =
        with_partition.dead_letter("orders.dead", &DeadReason::Expired { deadline: UnixMillis(1_500) }, 0);
    assert_eq!(
        (expired.topic.as_str(), expired.partition),
        ("orders.dead", None),
        "partitioned as the topic says"
    );
    assert_eq!((expired.key, expired.value), (envelope().key, envelope().value));
    let headers: Vec<(&str, &[u8])> =
        expired.headers.iter().map(|h| (h.key.as_str(), h.value.as_slice())).collect();
    assert_eq!(
        headers,
        [
            ("trace", &b"abc"[..]),
            (DEAD_LETTER_REASON_HEADER, b"expired"),
            (DEADLINE_HEADER, b"1500"),
            (ORIGINAL_TOPIC_HEADER, b"orders.cancel-v1"),
            (ORIGINAL_PARTITION_HEADER, b"3"),
            (ATTEMPTS_HEADER, b"0"),
        ]
    );
    let failed = envelope().dead_letter("orders.dead", &DeadReason::Failed { error: "too large".into() }, 5);
    let header = |key: &str| failed.headers.iter().find(|h| h.key == key).map(|h| h.value.as_slice());
    assert_eq!(header(DEAD_LETTER_REASON_HEADER), Some(&b"failed"[..]));
    assert_eq!(header(DEAD_LETTER_ERROR_HEADER), Some(&b"too large"[..]));
    assert_eq!(header(ATTEMPTS_HEADER), Some(&b"5"[..]));
    assert_eq!(header(ORIGINAL_PARTITION_HEADER), None, "it named none");
}

#[test]
fn negative_partition_is_refused() {
    let mut e = envelope();
    e.partition = Some(-1);
    assert_eq!(e.validate(&Limits::default()).unwrap_err().field, "message.partition");
}

#[test]
fn ids_are_printable_and_bounded() {
    assert!(MessageId::parse("order-42:cancel").is_ok());
    assert!(MessageId::parse("").is_err());
    assert!(MessageId::parse("with space").is_err());
    assert!(MessageId::parse("tab\t").is_err());
    assert!(MessageId::parse("é").is_err());
    assert!(MessageId::parse(&"x".repeat(128)).is_ok());
    assert!(MessageId::parse(&"x".repeat(129)).is_err());
}

#[test]
fn generated_ids_are_unique_and_time_ordered() {
    let mut g = ulid::Generator::new();
    let ids: Vec<_> = (0..1000).map(|_| MessageId::generate(&mut g, None)).collect();
    let mut sorted = ids.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted, ids);
    assert!(ids.iter().all(|id| MessageId::parse(id.as_str()).is_ok()));
}

fn tenant(name: &str) -> Tenant {
    Tenant::parse(name).unwrap()
}

#[test]
fn each_tenant_has_an_id_space_of_its_own() {
    let (a, b) = (tenant("orders"), tenant("billing"));
    let shared = MessageId::parse("order-1").unwrap();
    let in_a = MessageId::parse_in(Some(&a), "order-1").unwrap();
    let in_b = MessageId::parse_in(Some(&b), "order-1").unwrap();
    assert!(shared != in_a && in_a != in_b, "one id, three messages");
    for id in [&shared, &in_a, &in_b] {
        assert_eq!(id.as_str(), "order-1");
        assert_eq!(id.to_string(), "order-1", "clients see their own id");
        assert_eq!(MessageId::from_stored(id.as_bytes()).as_ref(), Some(id), "round trip");
    }
    assert_eq!((shared.tenant(), in_a.tenant()), (None, Some("orders")));
    assert_eq!(in_a.qualified(), "orders/order-1");
    assert_eq!(in_a.shared(), shared);
    assert!(
        !shared.as_bytes().contains(&0) && in_a.as_bytes()[0] == 0,
        "a stored shared id is the id itself, as stores from before tenants hold it"
    );
    let generated = MessageId::generate(&mut ulid::Generator::new(), Some(&b));
    assert_eq!(generated.tenant(), Some("billing"));
    assert_eq!(MessageId::from_stored(b"\0no-end"), None);
    assert_eq!(MessageId::from_stored(b"\0t\0"), None, "an id is never empty");
}

#[test]
fn tenant_names_are_checked() {
    assert!(Tenant::parse("orders-eu.1_a").is_ok());
    for bad in ["", "has space", "a/b", "nul\0", &"t".repeat(65)] {
        assert!(Tenant::parse(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn a_scope_sees_its_space_and_the_shared_one_on_its_topics() {
    let scope = Scope::tenant(
        "orders-service",
        tenant("orders"),
        vec![TopicPattern::parse("orders.*").unwrap(), TopicPattern::parse("audit").unwrap()],
    );
    let mine = scope.id("x").unwrap();
    let shared = MessageId::parse("x").unwrap();
    let theirs = MessageId::parse_in(Some(&tenant("billing")), "x").unwrap();
    assert_eq!(mine.tenant(), Some("orders"));
    assert_eq!(scope.fallback(&mine), Some(shared.clone()));
    assert_eq!(scope.sees(&mine, "orders.paid"), Visibility::Visible);
    assert_eq!(scope.sees(&mine, "payments"), Visibility::Forbidden, "its own, on a topic it lost");
    assert_eq!(scope.sees(&shared, "audit"), Visibility::Visible);
    assert_eq!(scope.sees(&shared, "payments"), Visibility::Hidden, "shared, not its topic");
    assert_eq!(scope.sees(&theirs, "orders.paid"), Visibility::Hidden, "another tenant's, even on its topic");
    assert!(scope.sees_space(None) && scope.sees_space(Some("orders")) && !scope.sees_space(Some("billing")));

    let everything = Scope::everything();
    assert!(everything.is_everything());
    assert_eq!(everything.fallback(&shared), None);
    for id in [&mine, &shared, &theirs] {
        assert_eq!(everything.sees(id, "payments"), Visibility::Visible);
    }
    let wildcard = Scope::tenant("ops", tenant("ops"), vec![TopicPattern::Any]);
    assert!(wildcard.covers("anything") && !wildcard.is_everything(), "a tenant is never everything");

    // An operator sees every space, names another tenant's message by its
    // tenant, and never falls back from it to the shared space.
    let operator = wildcard.clone().across_tenants();
    assert!(operator.is_everything() && operator.sees_space(Some("billing")));
    assert_eq!(operator.sees(&theirs, "payments"), Visibility::Visible);
    let named = operator.id_of("billing", "x").unwrap();
    assert_eq!(named, theirs);
    assert_eq!(operator.fallback(&named), None, "another tenant's id is that tenant's alone");
    assert_eq!(operator.fallback(&operator.id("x").unwrap()), Some(shared.clone()));
    assert_eq!(wildcard.id_of("billing", "x").unwrap_err().field, "tenant", "a tenant names no other");
    assert_eq!(wildcard.id_of("ops", "x").unwrap(), wildcard.id("x").unwrap(), "its own tenant named");
    // The shared space has a name of its own, which any caller may use
    // (what it sees there is as ever).
    assert_eq!(operator.id_of(SHARED_SPACE, "x").unwrap(), shared);
    assert_eq!(wildcard.id_of(SHARED_SPACE, "x").unwrap(), shared);
    assert!(Tenant::parse(SHARED_SPACE).is_err(), "no tenant can be called so");
}

#[test]
fn due_resolution_and_max_delay() {
    let now = UnixMillis(1_000_000);
    assert_eq!(DueSpec::After(Duration::from_millis(1500)).resolve(now), UnixMillis(1_001_500));
    assert_eq!(DueSpec::At(UnixMillis(5)).resolve(now), UnixMillis(5));
    let limits = Limits { max_delay: Duration::from_secs(10), ..Limits::default() };
    assert!(limits.check_due(UnixMillis(5), now).is_ok(), "past is delivered at once");
    assert!(limits.check_due(UnixMillis(1_010_000), now).is_ok());
    let err = limits.check_due(UnixMillis(1_010_001), now).unwrap_err();
    assert!(err.reason.contains("--max-delay"), "{err}");
}

#[test]
fn cancel_transitions() {
    let delivered = State::Delivered(Delivery { partition: 0, offset: 1, delivered_at: UnixMillis(1) });
    assert_eq!(State::Pending { attempts: 2, last_error: None }.cancel(), Ok(()));
    assert_eq!(delivered.cancel(), Err(CancelOutcome::AlreadyDelivered));
    assert_eq!(State::Cancelled { at: UnixMillis(1) }.cancel(), Err(CancelOutcome::AlreadyCancelled));
    let failed = State::Failed { reason: "x".into(), attempts: 5, at: UnixMillis(1) };
    assert_eq!(failed.cancel(), Err(CancelOutcome::AlreadyFailed));
}

#[test]
fn reschedule_transitions() {
    let delivered = State::Delivered(Delivery { partition: 0, offset: 1, delivered_at: UnixMillis(1) });
    assert_eq!(State::Pending { attempts: 0, last_error: None }.reschedule(), Ok(()));
    let failed = State::Failed { reason: "x".into(), attempts: 5, at: UnixMillis(1) };
    assert_eq!(failed.reschedule(), Ok(()), "a failed message can be re-driven");
    assert_eq!(delivered.reschedule(), Err(RescheduleRefusal::AlreadyDelivered));
    assert_eq!(State::Cancelled { at: UnixMillis(1) }.reschedule(), Err(RescheduleRefusal::AlreadyCancelled));
}

#[test]
fn rfc3339_has_milliseconds() {
    assert_eq!(UnixMillis(1_700_000_000_123).to_rfc3339(), "2023-11-14T22:13:20.123Z");
}

#[test]
fn page_tokens_round_trip() {
    for (at, seq) in [(0, 0), (1_700_000_000_123, 42), (u64::MAX, u64::MAX)] {
        for shard in [0, 1, 255, u32::MAX] {
            let token = PageToken { dispatch_at: UnixMillis(at), shard, seq };
            assert_eq!(PageToken::decode(&token.encode()), Ok(token));
        }
    }
    let one_shard = PageToken { dispatch_at: UnixMillis(0xfeed), shard: 0, seq: 0xbeef };
    assert_eq!(one_shard.encode(), "01000000000000feed000000000000beef", "as every earlier release wrote it");
}

proptest::proptest! {
    #[test]
    fn page_tokens_round_trip_through_text(at: u64, shard: u32, seq: u64) {
        let token = PageToken { dispatch_at: UnixMillis(at), shard, seq };
        proptest::prop_assert_eq!(PageToken::decode(&token.encode()), Ok(token));
    }

    #[test]
    fn page_tokens_refuse_any_other_text(text in "0[12][0-9a-f]{32,40}|[0-9a-f]{0,44}|.{0,44}") {
        let ok = PageToken::decode(&text);
        proptest::prop_assert!(ok.is_err() || ok.map(|t| t.encode()) == Ok(text.clone()));
    }
}

#[test]
fn bad_page_tokens_are_refused_by_name() {
    let good = PageToken { dispatch_at: UnixMillis(0xfeed), shard: 0, seq: 0xbeef }.encode();
    let v2 = PageToken { dispatch_at: UnixMillis(0xfeed), shard: 3, seq: 0xbeef }.encode();
    let v2_as_v1 = format!("01{}", &v2[2..]);
    let wrong_version = format!("02{}", &good[2..]);
    let non_hex = format!("zz{}", &good[2..]);
    let multibyte = format!("é{}", &good[2..]);
    let upper = good.to_uppercase();
    for token in [
        "",
        "abc",
        &good[..32],
        &wrong_version,
        &non_hex,
        &multibyte,
        &upper,
        &format!("{good}00"),
        &v2_as_v1,
    ] {
        assert_eq!(PageToken::decode(token).unwrap_err().field, "page_token", "{token:?}");
    }
}

#[test]
fn list_queries_are_checked() {
    let q = |from: Option<u64>, to: Option<u64>, page_size| ListQuery {
        from: from.map(UnixMillis),
        to: to.map(UnixMillis),
        page_size,
        ..ListQuery::default()
    };
    assert_eq!(q(None, None, 0).validate(), Ok(ListQuery::DEFAULT_PAGE_SIZE));
    assert_eq!(q(Some(1), Some(2), 1000).validate(), Ok(1000));
    assert_eq!(q(None, None, 1001).validate().unwrap_err().field, "page_size");
    assert_eq!(q(Some(2), Some(2), 10).validate().unwrap_err().field, "dispatch_to");
    assert_eq!(q(Some(3), Some(2), 10).validate().unwrap_err().field, "dispatch_to");
    let bad_topic = ListQuery { topic: Some("no spaces".into()), ..ListQuery::default() };
    assert_eq!(bad_topic.validate().unwrap_err().field, "topic");
}

#[test]
fn a_due_record_carries_the_clients_headers_then_its_id_due_time_and_tenant() {
    let envelope = envelope();
    let shared = MessageId::parse("order-42").unwrap();
    let out = Outgoing { id: &shared, due: UnixMillis(1_700_000_000_123), envelope: &envelope };
    let headers: Vec<_> = out.headers("1700000000123").collect();
    assert_eq!(
        headers,
        [("trace", &b"abc"[..]), (ID_HEADER, &b"order-42"[..]), (DUE_HEADER, &b"1700000000123"[..]),],
        "the shared space has no tenant header"
    );

    let tenant = Tenant::parse("acme").unwrap();
    let theirs = MessageId::parse_in(Some(&tenant), "order-42").unwrap();
    let out = Outgoing { id: &theirs, ..out };
    let headers: Vec<_> = out.headers("1700000000123").collect();
    assert_eq!(headers[1], (ID_HEADER, &b"order-42"[..]), "the id without its tenant");
    assert_eq!(headers[3], (TENANT_HEADER, &b"acme"[..]));
}
