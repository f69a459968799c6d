//! Bad input, against a real server over real gRPC: generated requests of
//! every kind of fault (bad topic names, oversized values and headers, due
//! times far past and beyond `--max-delay`, missing fields, oversized and
//! overlong batches, invalid UTF-8 where a string is expected), each with the
//! status code the API reference (docs/API.md) gives it; requests that claim to be larger
//! than the limit; and raw garbage on the gRPC port.
//!
//! Pass: no panic, the documented code every time, nothing stored for a
//! refused request (`Get` says NOT_FOUND, and nothing refused reaches the
//! topic), oversized requests refused from their length prefix, before the
//! body is sent.
//!
//! The expected code of each generated request comes from the category that
//! generated it, written from docs/API.md and the proto, not from the code
//! under test. `cargo test --test it bad_input:: -- --nocapture` shows the cases
//! per category.

use crate::common;

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    pin::Pin,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant, SystemTime},
};

use common::*;
use hourglass::proto;
use proptest::{collection::vec, prelude::*, test_runner::TestRunner};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tonic::{
    Code, Status,
    codegen::{Bytes, Service as _, http},
    transport::Channel,
};
use tonic_types::StatusExt as _;

// Limits the server runs with here: small, so that oversized requests are
// cheap to make.
const MAX_MESSAGE: usize = 4 * 1024;
const MAX_HEADERS: usize = 8;
const MAX_HEADERS_BYTES: usize = 512;
const MAX_DELAY: Duration = Duration::from_secs(24 * 3600);
const MAX_BATCH: usize = 40;
const MAX_BATCH_BYTES: usize = 128 * 1024;
/// The largest requests the server reads, per docs/API.md: one message with
/// 64 KiB to spare, or a batch of `--max-batch-bytes` (never less).
const MAX_ONE_REQUEST: usize = MAX_MESSAGE + 64 * 1024;
const MAX_BATCH_REQUEST: usize =
    if MAX_BATCH_BYTES > MAX_ONE_REQUEST { MAX_BATCH_BYTES } else { MAX_ONE_REQUEST };
const ONE_LIMIT: Expect = Expect::TooLarge(MAX_ONE_REQUEST, "--max-message-bytes");
const BATCH_LIMIT: Expect = Expect::TooLarge(MAX_BATCH_REQUEST, "--max-batch-bytes");
const PARTITIONS: i32 = 2;

async fn bed(prefix: &str) -> TestBed {
    TestBed::start_with(prefix, PARTITIONS, |c| {
        c.max_message_bytes = MAX_MESSAGE;
        c.max_headers = MAX_HEADERS;
        c.max_headers_bytes = MAX_HEADERS_BYTES;
        c.max_delay = MAX_DELAY.into();
        c.max_batch = MAX_BATCH;
        c.max_batch_bytes = MAX_BATCH_BYTES;
    })
    .await
}

// The wire types with every string as bytes, so that a request can carry
// what prost would refuse to encode as a string. They encode exactly as the
// real `proto` types do.

#[derive(Clone, PartialEq, prost::Message)]
struct WireHeader {
    #[prost(bytes = "vec", tag = "1")]
    key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    value: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct WireMessage {
    #[prost(bytes = "vec", tag = "1")]
    topic: Vec<u8>,
    #[prost(bytes = "vec", optional, tag = "2")]
    key: Option<Vec<u8>>,
    #[prost(bytes = "vec", tag = "3")]
    value: Vec<u8>,
    #[prost(message, repeated, tag = "4")]
    headers: Vec<WireHeader>,
    #[prost(int32, optional, tag = "5")]
    partition: Option<i32>,
}

/// `ScheduleRequest`; `deliver_at` and `delay` are the `due` oneof (at
/// most one is set).
#[derive(Clone, PartialEq, prost::Message)]
struct WireRequest {
    #[prost(message, optional, tag = "1")]
    message: Option<WireMessage>,
    #[prost(message, optional, tag = "2")]
    deliver_at: Option<prost_types::Timestamp>,
    #[prost(message, optional, tag = "3")]
    delay: Option<prost_types::Duration>,
    #[prost(bytes = "vec", optional, tag = "4")]
    id: Option<Vec<u8>>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct WireBatch {
    #[prost(message, repeated, tag = "1")]
    requests: Vec<WireRequest>,
}

/// Replaced, when the request is sent, by an id unique to this run.
const FRESH_ID: &[u8] = b"\x00fresh";

/// What docs/API.md says the server answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expect {
    /// OK. `now`: due at once (so it must reach the topic).
    Scheduled { now: bool },
    /// INVALID_ARGUMENT naming `field` in a BadRequest detail.
    Invalid(&'static str),
    /// NOT_FOUND: the topic does not exist.
    UnknownTopic,
    /// INVALID_ARGUMENT: the request does not decode (e.g. a string that is
    /// not UTF-8). Fails a whole batch or ends a stream.
    Undecodable,
    /// Larger than the server reads (this many bytes, set by this flag):
    /// refused whole, unread.
    TooLarge(usize, &'static str),
}

#[derive(Clone, Debug)]
struct Case {
    what: &'static str,
    request: WireRequest,
    expect: Expect,
}

fn unix_now() -> i64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs() as i64
}

fn delay(seconds: i64, nanos: i32) -> Option<prost_types::Duration> {
    Some(prost_types::Duration { seconds, nanos })
}

fn at(seconds: i64, nanos: i32) -> Option<prost_types::Timestamp> {
    Some(prost_types::Timestamp { seconds, nanos })
}

/// A valid request, due at once, for `topic`.
fn base(topic: &str) -> WireRequest {
    WireRequest {
        message: Some(WireMessage {
            topic: topic.as_bytes().to_vec(),
            key: None,
            value: b"v".to_vec(),
            headers: vec![],
            partition: None,
        }),
        deliver_at: None,
        delay: delay(0, 0),
        id: Some(FRESH_ID.to_vec()),
    }
}

fn msg(r: &mut WireRequest) -> &mut WireMessage {
    r.message.as_mut().unwrap()
}

fn case(what: &'static str, request: WireRequest, expect: Expect) -> Case {
    Case { what, request, expect }
}

fn valid_header() -> impl Strategy<Value = WireHeader> {
    ("[a-zA-Z0-9_.é-]{1,12}", vec(any::<u8>(), 0..32))
        .prop_filter("not reserved", |(k, _)| !k.starts_with("hourglass-"))
        .prop_map(|(k, value)| WireHeader { key: k.into_bytes(), value })
}

/// A due time that is now or in the past, however far.
fn due_now(
    now: i64,
) -> impl Strategy<Value = (Option<prost_types::Timestamp>, Option<prost_types::Duration>)> {
    prop_oneof![
        Just((None, delay(0, 0))),
        (0..1_000_000i32).prop_map(|nanos| (None, delay(0, nanos))),
        (prop_oneof![Just(i64::MIN), Just(-1), Just(0), i64::MIN..now - 1], 0..1_000_000_000i32)
            .prop_map(|(s, n)| (at(s, n), None)),
    ]
}

/// Requests that must be accepted.
fn scheduled(topic: String, now: i64) -> BoxedStrategy<Case> {
    let t = topic.clone();
    let deliver_now = (
        due_now(now),
        proptest::option::of(vec(any::<u8>(), 0..64)),
        vec(valid_header(), 0..=MAX_HEADERS),
        proptest::option::of(0..PARTITIONS),
        any::<bool>(),
    )
        .prop_map(move |((deliver_at, d), key, headers, partition, with_id)| {
            let mut r = base(&t);
            (r.deliver_at, r.delay) = (deliver_at, d);
            let m = msg(&mut r);
            (m.key, m.headers, m.partition) = (key, headers, partition);
            if !with_id {
                r.id = None;
            }
            case("valid, due now or in the past", r, Expect::Scheduled { now: true })
        });
    let t = topic;
    let max = MAX_DELAY.as_secs() as i64;
    let later = (3600..max - 3600, any::<bool>()).prop_map(move |(secs, absolute)| {
        let mut r = base(&t);
        if absolute {
            (r.deliver_at, r.delay) = (at(now + secs, 0), None);
        } else {
            r.delay = delay(secs, 0);
        }
        case("valid, due within --max-delay", r, Expect::Scheduled { now: false })
    });
    prop_oneof![3 => deliver_now, 1 => later].boxed()
}

fn bad_topic(topic: String) -> BoxedStrategy<Case> {
    let bad_char = any::<char>().prop_filter("outside Kafka's topic alphabet", |c| {
        !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
    });
    let name = prop_oneof![
        Just(String::new()),
        Just(".".to_owned()),
        Just("..".to_owned()),
        "[a-zA-Z0-9._-]{250,300}",
        ("[a-z0-9]{0,10}", bad_char, "[a-z0-9]{0,10}").prop_map(|(a, c, b)| format!("{a}{c}{b}")),
    ];
    name.prop_map(move |name| {
        let mut r = base(&topic);
        msg(&mut r).topic = name.into_bytes();
        case("bad topic name", r, Expect::Invalid("message.topic"))
    })
    .boxed()
}

fn unknown_topic(topic: String) -> BoxedStrategy<Case> {
    "nx-[a-z0-9._-]{1,40}"
        .prop_map(move |name| {
            let mut r = base(&topic);
            msg(&mut r).topic = name.into_bytes();
            case("unknown topic", r, Expect::UnknownTopic)
        })
        .boxed()
}

fn bad_value_or_headers(topic: String) -> BoxedStrategy<Case> {
    let t = topic.clone();
    let empty_value = vec(valid_header(), 0..3).prop_map(move |headers| {
        let mut r = base(&t);
        let m = msg(&mut r);
        (m.value, m.headers, m.key) = (vec![], headers, Some(b"k".to_vec()));
        case("empty value", r, Expect::Invalid("message.value"))
    });
    let t = topic.clone();
    let too_many = (MAX_HEADERS + 1..MAX_HEADERS + 40).prop_map(move |n| {
        let mut r = base(&t);
        msg(&mut r).headers = vec![WireHeader { key: b"h".to_vec(), value: vec![] }; n];
        case("too many headers", r, Expect::Invalid("message.headers"))
    });
    let t = topic.clone();
    let too_big = (1..=MAX_HEADERS, 1..4 * MAX_HEADERS_BYTES).prop_map(move |(n, extra)| {
        let mut r = base(&t);
        let mut headers = vec![WireHeader { key: b"h".to_vec(), value: vec![] }; n];
        headers[0].value = vec![b'x'; MAX_HEADERS_BYTES + extra - n];
        msg(&mut r).headers = headers;
        case("headers over --max-headers-bytes", r, Expect::Invalid("message.headers"))
    });
    let t = topic;
    let bad_key = (prop_oneof![Just(String::new()), "hourglass-[a-z-]{0,10}"], vec(valid_header(), 0..3))
        .prop_map(move |(key, mut headers)| {
            let mut r = base(&t);
            headers.push(WireHeader { key: key.into_bytes(), value: b"x".to_vec() });
            msg(&mut r).headers = headers;
            case("empty or reserved header key", r, Expect::Invalid("message.headers"))
        });
    prop_oneof![empty_value, too_many, too_big, bad_key].boxed()
}

/// Key, value and headers around `--max-message-bytes`: at or under is
/// fine, over is refused.
fn message_size(topic: String) -> BoxedStrategy<Case> {
    (0..64usize, 0..100usize, prop_oneof![-3..=3i64, 4..=3 * MAX_MESSAGE as i64])
        .prop_map(move |(key_len, header_len, over)| {
            let mut r = base(&topic);
            let m = msg(&mut r);
            let header = WireHeader { key: b"h".to_vec(), value: vec![b'x'; header_len] };
            let fixed = key_len + header.key.len() + header.value.len();
            let value_len = ((MAX_MESSAGE - fixed) as i64 + over).max(1) as usize;
            m.key = Some(vec![b'k'; key_len]);
            m.headers = vec![header];
            m.value = vec![b'v'; value_len];
            if fixed + value_len <= MAX_MESSAGE {
                case("message at or under --max-message-bytes", r, Expect::Scheduled { now: true })
            } else {
                case("message over --max-message-bytes", r, Expect::Invalid("message"))
            }
        })
        .boxed()
}

fn bad_partition(topic: String) -> BoxedStrategy<Case> {
    prop_oneof![i32::MIN..0, PARTITIONS..=i32::MAX]
        .prop_map(move |p| {
            let mut r = base(&topic);
            msg(&mut r).partition = Some(p);
            case("partition out of range", r, Expect::Invalid("message.partition"))
        })
        .boxed()
}

fn bad_due(topic: String, now: i64) -> BoxedStrategy<Case> {
    let beyond = MAX_DELAY.as_secs() as i64 + 3600;
    let t = topic.clone();
    let too_far =
        (beyond..=i64::MAX, 0..1_000_000_000i32, any::<bool>()).prop_map(move |(secs, nanos, absolute)| {
            let mut r = base(&t);
            if absolute {
                (r.deliver_at, r.delay) = (at(now.saturating_add(secs), nanos), None);
            } else {
                r.delay = delay(secs, nanos);
            }
            case("due beyond --max-delay", r, Expect::Invalid("due"))
        });
    let t = topic;
    let shape = prop_oneof![
        (i64::MIN..0, 0..1_000_000_000i32).prop_map(|(s, n)| (None, delay(s, n), "delay")),
        (0..1000i64, i32::MIN..0).prop_map(|(s, n)| (None, delay(s, n), "delay")),
        (0..1000i64, 1_000_000_000..=i32::MAX).prop_map(|(s, n)| (None, delay(s, n), "delay")),
        (any::<i64>(), prop_oneof![i32::MIN..0, 1_000_000_000..=i32::MAX]).prop_map(|(s, n)| (
            at(s, n),
            None,
            "deliver_at"
        )),
        Just((None, None, "due")),
    ]
    .prop_map(move |(deliver_at, d, field)| {
        let mut r = base(&t);
        (r.deliver_at, r.delay) = (deliver_at, d);
        case("malformed or missing due time", r, Expect::Invalid(field))
    });
    prop_oneof![too_far, shape].boxed()
}

fn missing_message(topic: String) -> BoxedStrategy<Case> {
    Just(())
        .prop_map(move |()| {
            let mut r = base(&topic);
            r.message = None;
            case("message missing", r, Expect::Invalid("message"))
        })
        .boxed()
}

fn bad_id(topic: String) -> BoxedStrategy<Case> {
    let bad_char = any::<char>().prop_filter("not printable ASCII", |c| !c.is_ascii_graphic());
    prop_oneof![
        Just(String::new()),
        "[!-~]{129,300}",
        ("[a-z0-9]{0,10}", bad_char, "[a-z0-9]{0,10}").prop_map(|(a, c, b)| format!("{a}{c}{b}")),
    ]
    .prop_map(move |id| {
        let mut r = base(&topic);
        r.id = Some(id.into_bytes());
        case("malformed id", r, Expect::Invalid("id"))
    })
    .boxed()
}

/// Byte sequences that are not UTF-8: a stray continuation byte, an
/// overlong encoding, a truncated sequence, a surrogate, bytes never used.
fn not_utf8() -> impl Strategy<Value = Vec<u8>> {
    let bad = prop_oneof![
        Just(vec![0x80]),
        Just(vec![0xc0, 0x80]),
        Just(vec![0xe2, 0x82]),
        Just(vec![0xed, 0xa0, 0x80]),
        Just(vec![0xff]),
        Just(vec![0xf8, 0x88, 0x80, 0x80, 0x80]),
    ];
    ("[a-z0-9]{0,8}", bad, "[a-z0-9]{0,8}")
        .prop_map(|(a, bad, b)| [a.as_bytes(), &bad, b.as_bytes()].concat())
}

fn invalid_utf8(topic: String) -> BoxedStrategy<Case> {
    (not_utf8(), 0..3u8)
        .prop_map(move |(bytes, place)| {
            let mut r = base(&topic);
            match place {
                0 => msg(&mut r).topic = bytes,
                1 => msg(&mut r).headers = vec![WireHeader { key: bytes, value: b"x".to_vec() }],
                _ => r.id = Some(bytes),
            }
            case("a string that is not UTF-8", r, Expect::Undecodable)
        })
        .boxed()
}

/// A request larger than the server reads at all.
fn too_large(topic: String) -> BoxedStrategy<Case> {
    (1..16 * 1024usize)
        .prop_map(move |extra| {
            let mut r = base(&topic);
            msg(&mut r).value = vec![b'v'; MAX_ONE_REQUEST + extra];
            case("request over the size limit", r, ONE_LIMIT)
        })
        .boxed()
}

/// Every category; with the odd unreadably large request when `large`,
/// and without strings that are not UTF-8 when not `utf8` (one such item
/// fails a whole batch).
fn any_case(topic: &str, now: i64, large: bool, utf8: u32) -> BoxedStrategy<Case> {
    let t = || topic.to_owned();
    let mut options = vec![
        (4, scheduled(t(), now)),
        (2, bad_topic(t())),
        (1, unknown_topic(t())),
        (3, bad_value_or_headers(t())),
        (3, message_size(t())),
        (1, bad_partition(t())),
        (3, bad_due(t(), now)),
        (1, missing_message(t())),
        (2, bad_id(t())),
    ];
    if utf8 > 0 {
        options.push((utf8, invalid_utf8(t())));
    }
    if large {
        options.push((1, too_large(t())));
    }
    proptest::strategy::Union::new_weighted(options).boxed()
}

/// A run's state: the server, a connection to it, and what was accepted.
struct Env {
    bed: TestBed,
    grpc: tonic::client::Grpc<Channel>,
    run: String,
    next: AtomicU64,
    /// Accepted ids, and whether each is due at once.
    accepted: Mutex<HashMap<String, bool>>,
    /// Refused ids that must stay unknown.
    refused: Mutex<Vec<String>>,
    /// Cases seen per category.
    seen: Mutex<BTreeMap<&'static str, usize>>,
}

impl Env {
    async fn start(prefix: &str) -> Env {
        let bed = bed(prefix).await;
        drop(bed.server.client().await);
        let channel =
            Channel::from_shared(format!("http://{}", bed.server.addr)).unwrap().connect().await.unwrap();
        Env {
            bed,
            grpc: tonic::client::Grpc::new(channel),
            run: random_name("p"),
            next: AtomicU64::new(0),
            accepted: Mutex::default(),
            refused: Mutex::default(),
            seen: Mutex::default(),
        }
    }

    /// The request as sent: a fresh id where the case asked for one.
    fn materialize(&self, case: &Case) -> (WireRequest, Option<String>) {
        let mut r = case.request.clone();
        *self.seen.lock().unwrap().entry(case.what).or_default() += 1;
        if r.id.as_deref() == Some(FRESH_ID) {
            let id = format!("{}-{}", self.run, self.next.fetch_add(1, Ordering::Relaxed));
            r.id = Some(id.clone().into_bytes());
            return (r, Some(id));
        }
        (r, None)
    }

    async fn unary<Req, Resp>(&self, path: &'static str, request: Req) -> Result<Resp, Status>
    where
        Req: prost::Message + Send + Sync + 'static,
        Resp: prost::Message + Default + Send + Sync + 'static,
    {
        let mut grpc = self.grpc.clone();
        grpc.ready().await.map_err(|e| Status::unavailable(e.to_string()))?;
        grpc.unary(
            tonic::Request::new(request),
            http::uri::PathAndQuery::from_static(path),
            tonic_prost::ProstCodec::default(),
        )
        .await
        .map(tonic::Response::into_inner)
    }

    fn record(&self, id: Option<String>, expect: Expect, answered_id: Option<&str>) {
        match (expect, answered_id) {
            (Expect::Scheduled { now }, Some(answered)) => {
                self.accepted.lock().unwrap().insert(answered.to_owned(), now);
            }
            _ => {
                if let Some(id) = id {
                    self.refused.lock().unwrap().push(id);
                }
            }
        }
    }

    /// Afterwards: every refused id is unknown, every accepted one known,
    /// and the topic holds exactly the accepted records due at once.
    async fn verify_store_and_topic(&self) {
        let refused = self.refused.lock().unwrap().clone();
        for id in &refused {
            let got: Result<proto::GetResponse, Status> = self
                .unary(
                    "/hourglass.v1.Scheduler/Get",
                    proto::GetRequest { id: id.clone(), ..Default::default() },
                )
                .await;
            let status = got.expect_err("a refused request was stored");
            assert_eq!(status.code(), Code::NotFound, "{id}: {status:?}");
        }
        let accepted = self.accepted.lock().unwrap().clone();
        let due_now: HashSet<String> =
            accepted.iter().filter(|(_, now)| **now).map(|(id, _)| id.clone()).collect();
        for (id, now) in &accepted {
            let got: proto::GetResponse = self
                .unary(
                    "/hourglass.v1.Scheduler/Get",
                    proto::GetRequest { id: id.clone(), ..Default::default() },
                )
                .await
                .unwrap_or_else(|s| panic!("accepted {id} is unknown: {s:?}"));
            if !now {
                assert_eq!(got.state(), proto::State::Pending, "{id}");
            }
        }
        let bed = &self.bed;
        let within = Duration::from_secs(60);
        let got = consume_async(&bed.broker, &bed.topic, due_now.len(), within, Duration::from_secs(2)).await;
        let mut seen = HashSet::new();
        for r in &got {
            assert!(seen.insert(r.id().to_owned()), "{} delivered twice", r.id());
        }
        assert_eq!(seen, due_now, "the topic holds exactly the accepted records that were due");
        eprintln!(
            "{}: {} accepted ({} delivered), {} refused with an id, all absent; cases per category: {:?}",
            self.run,
            accepted.len(),
            got.len(),
            refused.len(),
            self.seen.lock().unwrap()
        );
    }
}

/// Checks a refusal against what was expected of it.
fn check_refusal(what: &str, expect: Expect, status: &Status) -> Result<(), TestCaseError> {
    let context = format!("{what}: expected {expect:?}, got {status:?}");
    match expect {
        Expect::Scheduled { .. } => return Err(TestCaseError::fail(context)),
        Expect::Invalid(field) => {
            prop_assert_eq!(status.code(), Code::InvalidArgument, "{}", context);
            let details = status.get_error_details();
            let violations = details.bad_request().map(|b| b.field_violations.clone()).unwrap_or_default();
            prop_assert!(violations.iter().any(|v| v.field == field), "{}", context);
        }
        Expect::UnknownTopic => {
            prop_assert_eq!(status.code(), Code::NotFound, "{}", context);
            prop_assert!(status.message().contains("does not exist"), "{}", context);
        }
        Expect::Undecodable => {
            prop_assert_eq!(status.code(), Code::InvalidArgument, "{}", context);
            prop_assert!(status.message().contains("does not decode"), "{}", context);
        }
        Expect::TooLarge(bytes, flag) => {
            check_too_large(status, bytes, flag)
                .map_err(|e| TestCaseError::fail(format!("{context}: {e}")))?;
        }
    }
    Ok(())
}

/// How a request over the size limit is refused: INVALID_ARGUMENT, like a
/// batch with too many items, naming the limit and the flag that sets it.
fn check_too_large(status: &Status, bytes: usize, flag: &str) -> Result<(), String> {
    if status.code() != Code::InvalidArgument {
        return Err(format!("code {:?}, not InvalidArgument", status.code()));
    }
    let message = status.message();
    if !message.contains(&format!("at most {bytes} bytes")) || !message.contains(flag) {
        return Err(format!("the message does not name the limit ({bytes}, {flag}): {message:?}"));
    }
    Ok(())
}

fn runner(cases: u32) -> TestRunner {
    TestRunner::new(proptest::test_runner::Config {
        cases,
        failure_persistence: None,
        max_shrink_iters: 64,
        ..proptest::test_runner::Config::default()
    })
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

const UNARY_CASES: u32 = 300;

#[test]
fn each_schedule_request_gets_its_documented_code() {
    let rt = runtime();
    let env = rt.block_on(Env::start("bad-one"));
    let started = Instant::now();
    let strategy = any_case(&env.bed.topic, unix_now(), true, 2);
    let result = runner(UNARY_CASES).run(&strategy, |case| {
        rt.block_on(async {
            let (request, id) = env.materialize(&case);
            let reply: Result<proto::ScheduleResponse, Status> =
                env.unary("/hourglass.v1.Scheduler/Schedule", request).await;
            match reply {
                Ok(reply) => {
                    prop_assert!(
                        matches!(case.expect, Expect::Scheduled { .. }),
                        "{}: expected {:?}, was accepted",
                        case.what,
                        case.expect
                    );
                    prop_assert!(!reply.duplicate);
                    if let Some(id) = &id {
                        prop_assert_eq!(&reply.id, id);
                    }
                    env.record(id, case.expect, Some(&reply.id));
                }
                Err(status) => {
                    check_refusal(case.what, case.expect, &status)?;
                    env.record(id, case.expect, None);
                }
            }
            Ok(())
        })
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    rt.block_on(env.verify_store_and_topic());
    eprintln!(
        "each_schedule_request_gets_its_documented_code: {UNARY_CASES} cases in {:?}",
        started.elapsed()
    );
    rt.block_on(env.bed.server.stop());
}

/// What a batch or a stream of `cases` must answer as a whole.
fn whole(cases: &[Case], sent: &WireBatch) -> Option<Expect> {
    // The length is judged before anything is decoded.
    if prost::Message::encoded_len(sent) > MAX_BATCH_REQUEST {
        Some(BATCH_LIMIT)
    } else if cases.iter().any(|c| c.expect == Expect::Undecodable) {
        Some(Expect::Undecodable)
    } else if cases.len() > MAX_BATCH {
        Some(Expect::Invalid("requests"))
    } else {
        None
    }
}

fn item_status(item: &proto::ItemError) -> Status {
    if item.field.is_empty() {
        return Status::new(Code::from_i32(item.code), item.message.clone());
    }
    let details =
        tonic_types::ErrorDetails::with_bad_request_violation(item.field.clone(), item.message.clone());
    Status::with_error_details(Code::from_i32(item.code), item.message.clone(), details)
}

fn check_item(
    case: &Case,
    answer: &proto::ScheduleResult,
    id: Option<&str>,
    env: &Env,
) -> Result<(), TestCaseError> {
    use proto::schedule_result::Result as Item;
    match answer.result.as_ref() {
        Some(Item::Scheduled(s)) => {
            prop_assert!(
                matches!(case.expect, Expect::Scheduled { .. }),
                "{}: expected {:?}, was accepted",
                case.what,
                case.expect
            );
            if let Some(id) = id {
                prop_assert_eq!(&s.id, id);
            }
            env.record(id.map(str::to_owned), case.expect, Some(&s.id));
        }
        Some(Item::Error(e)) => {
            check_refusal(case.what, case.expect, &item_status(e))?;
            env.record(id.map(str::to_owned), case.expect, None);
        }
        None => return Err(TestCaseError::fail("an empty answer")),
    }
    Ok(())
}

/// Items for a batch or a stream: one in four lists has an item that does
/// not decode, at a random place.
fn items(topic: &str, len: std::ops::RangeInclusive<usize>) -> impl Strategy<Value = Vec<Case>> + use<> {
    let undecodable =
        proptest::option::weighted(0.25, (any::<prop::sample::Index>(), invalid_utf8(topic.to_owned())));
    (vec(any_case(topic, unix_now(), false, 0), len), undecodable).prop_map(|(mut cases, bad)| {
        if let Some((at, case)) = bad {
            cases.insert(at.index(cases.len() + 1), case);
        }
        cases
    })
}

#[test]
fn each_item_of_a_batch_gets_its_documented_code() {
    let rt = runtime();
    let env = rt.block_on(Env::start("bad-batch"));
    let started = Instant::now();
    let strategy = items(&env.bed.topic, 0..=MAX_BATCH + 4);
    let whole_refusals = AtomicU64::new(0);
    let result = runner(60).run(&strategy, |cases| {
        rt.block_on(async {
            let (requests, ids): (Vec<_>, Vec<_>) = cases.iter().map(|c| env.materialize(c)).unzip();
            let batch = WireBatch { requests };
            let expect_whole = whole(&cases, &batch);
            let reply: Result<proto::ScheduleBatchResponse, Status> =
                env.unary("/hourglass.v1.Scheduler/ScheduleBatch", batch).await;
            match (expect_whole, reply) {
                (Some(expect), Err(status)) => {
                    check_refusal("the whole batch", expect, &status)?;
                    whole_refusals.fetch_add(1, Ordering::Relaxed);
                    for id in ids.into_iter().flatten() {
                        env.refused.lock().unwrap().push(id);
                    }
                }
                (Some(expect), Ok(_)) => {
                    return Err(TestCaseError::fail(format!("expected the batch refused as {expect:?}")));
                }
                (None, Err(status)) => return Err(TestCaseError::fail(format!("batch refused: {status:?}"))),
                (None, Ok(reply)) => {
                    prop_assert_eq!(reply.results.len(), cases.len());
                    for (i, ((case, answer), id)) in cases.iter().zip(&reply.results).zip(&ids).enumerate() {
                        prop_assert_eq!(answer.index, i as u64);
                        check_item(case, answer, id.as_deref(), &env)?;
                    }
                }
            }
            Ok(())
        })
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    eprintln!("batches refused whole: {} of 60", whole_refusals.load(Ordering::Relaxed));
    rt.block_on(env.verify_store_and_topic());
    eprintln!("each_item_of_a_batch_gets_its_documented_code: 60 batches in {:?}", started.elapsed());
    rt.block_on(env.bed.server.stop());
}

#[test]
fn each_item_of_a_stream_gets_its_documented_code() {
    let rt = runtime();
    let env = rt.block_on(Env::start("bad-stream"));
    let started = Instant::now();
    let strategy = items(&env.bed.topic, 1..=60);
    let result = runner(30).run(&strategy, |cases| {
        rt.block_on(async {
            let (requests, ids): (Vec<_>, Vec<_>) = cases.iter().map(|c| env.materialize(c)).unzip();
            // The stream is answered up to the first request that does not
            // decode, then ends with its status; nothing after it is read.
            let broken = cases.iter().position(|c| c.expect == Expect::Undecodable);
            let mut grpc = env.grpc.clone();
            grpc.ready().await.unwrap();
            let reply = grpc
                .streaming(
                    tonic::Request::new(tokio_stream::iter(requests)),
                    http::uri::PathAndQuery::from_static("/hourglass.v1.Scheduler/ScheduleStream"),
                    tonic_prost::ProstCodec::<WireRequest, proto::ScheduleResult>::default(),
                )
                .await
                .map_err(|s| TestCaseError::fail(format!("the stream was refused: {s:?}")))?;
            let mut answers = reply.into_inner();
            let mut answered = 0;
            let end = loop {
                match answers.message().await {
                    Ok(Some(answer)) => {
                        prop_assert!(answered < cases.len(), "more answers than requests");
                        prop_assert_eq!(answer.index, answered as u64);
                        check_item(&cases[answered], &answer, ids[answered].as_deref(), &env)?;
                        answered += 1;
                    }
                    Ok(None) => break None,
                    Err(status) => break Some(status),
                }
            };
            match (broken, end) {
                (None, None) => prop_assert_eq!(answered, cases.len()),
                (Some(at), Some(status)) => {
                    prop_assert_eq!(answered, at, "answered up to the undecodable request");
                    check_refusal("the stream's end", Expect::Undecodable, &status)?;
                    for id in ids[at..].iter().flatten() {
                        env.refused.lock().unwrap().push(id.clone());
                    }
                }
                (broken, end) => {
                    return Err(TestCaseError::fail(format!("broken at {broken:?}, ended with {end:?}")));
                }
            }
            Ok(())
        })
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    rt.block_on(env.verify_store_and_topic());
    eprintln!("each_item_of_a_stream_gets_its_documented_code: 30 streams in {:?}", started.elapsed());
    rt.block_on(env.bed.server.stop());
}

#[test]
fn cancel_get_and_reschedule_refuse_bad_ids_and_due_times() {
    let rt = runtime();
    let env = rt.block_on(Env::start("bad-ids"));
    let ids = prop_oneof![
        Just(Vec::new()),
        "[!-~]{129,200}".prop_map(String::into_bytes),
        ("[a-z]{0,5}", any::<char>().prop_filter("", |c| !c.is_ascii_graphic()))
            .prop_map(|(a, c)| format!("{a}{c}").into_bytes()),
        not_utf8(),
    ];
    #[derive(Clone, PartialEq, prost::Message)]
    struct WireId {
        #[prost(bytes = "vec", tag = "1")]
        id: Vec<u8>,
    }
    let result = runner(60).run(&ids, |id| {
        rt.block_on(async {
            let utf8 = std::str::from_utf8(&id).is_ok();
            for path in [
                "/hourglass.v1.Scheduler/Cancel",
                "/hourglass.v1.Scheduler/Get",
                "/hourglass.v1.Scheduler/Reschedule",
            ] {
                let status = match path {
                    "/hourglass.v1.Scheduler/Cancel" => {
                        env.unary::<_, proto::CancelResponse>(path, WireId { id: id.clone() }).await.err()
                    }
                    "/hourglass.v1.Scheduler/Get" => {
                        env.unary::<_, proto::GetResponse>(path, WireId { id: id.clone() }).await.err()
                    }
                    _ => {
                        env.unary::<_, proto::RescheduleResponse>(path, WireId { id: id.clone() }).await.err()
                    }
                };
                let status =
                    status.ok_or_else(|| TestCaseError::fail(format!("{path} accepted id {id:?}")))?;
                let expect = if utf8 { Expect::Invalid("id") } else { Expect::Undecodable };
                check_refusal(path, expect, &status)?;
            }
            Ok(())
        })
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    // A well-formed id nobody scheduled: Cancel says so, Get and
    // Reschedule are NOT_FOUND; a bad due time on Reschedule is named.
    rt.block_on(async {
        let mut client = env.bed.server.client().await;
        let outcome = client
            .cancel(proto::CancelRequest { id: "never-was".into(), ..Default::default() })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(outcome.outcome(), proto::CancelOutcome::NotFound);
        let status =
            client.get(proto::GetRequest { id: "never-was".into(), ..Default::default() }).await.unwrap_err();
        assert_eq!(status.code(), Code::NotFound);
        let reschedule = |due| proto::RescheduleRequest { id: "never-was".into(), due, ..Default::default() };
        let status = client
            .reschedule(reschedule(Some(proto::reschedule_request::Due::Delay(prost_types::Duration {
                seconds: 60,
                nanos: 0,
            }))))
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::NotFound);
        for (due, field) in [
            (None, "due"),
            (
                Some(proto::reschedule_request::Due::Delay(prost_types::Duration { seconds: -1, nanos: 0 })),
                "delay",
            ),
            (
                Some(proto::reschedule_request::Due::Delay(prost_types::Duration {
                    seconds: MAX_DELAY.as_secs() as i64 + 3600,
                    nanos: 0,
                })),
                "due",
            ),
            (
                Some(proto::reschedule_request::Due::DeliverAt(prost_types::Timestamp {
                    seconds: 1,
                    nanos: -1,
                })),
                "deliver_at",
            ),
        ] {
            let status = client.reschedule(reschedule(due)).await.unwrap_err();
            check_refusal("reschedule", Expect::Invalid(field), &status).unwrap();
        }
        env.bed.server.stop().await;
    });
}

/// A request body that sends `prefix` and then nothing, never ending.
fn stalled_body(prefix: Vec<u8>) -> tonic::body::Body {
    let first = futures_util::stream::iter([Ok::<_, std::convert::Infallible>(Bytes::from(prefix))]);
    let stream = futures_util::StreamExt::chain(first, futures_util::stream::pending());
    tonic::body::Body::new(axum::body::Body::from_stream(stream))
}

/// Sends `body` to `method` on a fresh connection; the final status, from
/// the headers of a trailers-only answer or from the trailers.
async fn raw_call(addr: std::net::SocketAddr, method: &str, body: tonic::body::Body) -> Status {
    use tonic::codegen::Body as _;
    let mut channel = Channel::from_shared(format!("http://{addr}")).unwrap().connect().await.unwrap();
    let request = http::Request::builder()
        .method("POST")
        .uri(format!("http://{addr}/hourglass.v1.Scheduler/{method}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(body)
        .unwrap();
    std::future::poll_fn(|cx| channel.poll_ready(cx)).await.unwrap();
    let response = channel.call(request).await.unwrap();
    if let Some(status) = Status::from_header_map(response.headers()) {
        return status;
    }
    let mut body = response.into_body();
    loop {
        match std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
            Some(Ok(frame)) => {
                if let Ok(trailers) = frame.into_trailers() {
                    return Status::from_header_map(&trailers).expect("trailers carry a status");
                }
            }
            Some(Err(status)) => return status,
            None => panic!("the answer ended without a status"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_request_is_refused_from_its_length_prefix() {
    let TestBed { server, topic: _topic, broker: _broker, dir: _dir } = bed("prefix").await;
    let _warm = server.client().await;
    // A single Schedule is held to one message's limit, below the batch's.
    const { assert!(MAX_ONE_REQUEST < MAX_BATCH_REQUEST) };
    for (method, limit) in
        [("Schedule", ONE_LIMIT), ("ScheduleBatch", BATCH_LIMIT), ("ScheduleStream", ONE_LIMIT)]
    {
        let Expect::TooLarge(bytes, flag) = limit else { unreachable!() };
        for claimed in [bytes as u32 + 1, u32::MAX] {
            // The 5-byte gRPC frame header (uncompressed, length), then the
            // body is withheld for good: only the header can be judged.
            let mut prefix = vec![0];
            prefix.extend_from_slice(&claimed.to_be_bytes());
            let call = raw_call(server.addr, method, stalled_body(prefix));
            let status = tokio::time::timeout(Duration::from_secs(60), call)
                .await
                .unwrap_or_else(|_| panic!("{method}: no answer while the body is withheld"));
            eprintln!("{method}, {claimed} bytes claimed: {:?} {:?}", status.code(), status.message());
            if let Err(e) = check_too_large(&status, bytes, flag) {
                panic!("{method}, {claimed} bytes claimed: {e}");
            }
            assert!(status.message().contains(&claimed.to_string()), "the size is named: {status:?}");
        }
    }
    server.stop().await;
}

/// Panics anywhere in the process outside the test code itself: a server
/// task that panics is caught by tokio and would otherwise go unseen.
fn watch_for_panics() -> Arc<Mutex<Vec<String>>> {
    static PANICS: std::sync::OnceLock<Arc<Mutex<Vec<String>>>> = std::sync::OnceLock::new();
    PANICS
        .get_or_init(|| {
            let panics = Arc::new(Mutex::new(Vec::new()));
            let seen = Arc::clone(&panics);
            let default = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                let at = info.location().map(|l| l.file().to_owned()).unwrap_or_default();
                if !at.starts_with("tests/") {
                    seen.lock().unwrap_or_else(|e| e.into_inner()).push(format!("{info}"));
                }
                default(info);
            }));
            panics
        })
        .clone()
}

/// Random HTTP/2 frames: a 9-byte header (a length that may lie, any
/// type, flags and stream id) and a short payload.
fn random_frames(rng: &mut impl rand::Rng) -> Vec<u8> {
    let mut out = Vec::new();
    for _ in 0..rng.random_range(1..20) {
        let payload: Vec<u8> = (0..rng.random_range(0..64)).map(|_| rng.random()).collect();
        let len = if rng.random_bool(0.8) { payload.len() as u32 } else { rng.random_range(0..1 << 24) };
        out.extend_from_slice(&len.to_be_bytes()[1..]);
        out.push(rng.random_range(0..12));
        out.push(rng.random());
        out.extend_from_slice(&rng.random_range(0u32..16).to_be_bytes());
        out.extend_from_slice(&payload);
    }
    out
}

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_on_the_grpc_port_hurts_nothing() {
    use rand::{Rng as _, SeedableRng as _};
    let panics = watch_for_panics();
    let TestBed { broker, topic, dir: _dir, server } = bed("garbage").await;
    let mut client = server.client().await;
    let seed: u64 = rand::random();
    eprintln!("garbage seed {seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    const CONNECTIONS: usize = 400;
    let mut payloads = Vec::with_capacity(CONNECTIONS);
    for i in 0..CONNECTIONS {
        let bytes: Vec<u8> = match i % 4 {
            0 => (0..rng.random_range(0..4096)).map(|_| rng.random()).collect(),
            1 => [PREFACE, &random_frames(&mut rng)].concat(),
            // A valid preface and empty SETTINGS, then garbage frames.
            2 => [PREFACE, &[0, 0, 0, 4, 0, 0, 0, 0, 0][..], &random_frames(&mut rng)].concat(),
            _ => {
                let garbage: Vec<u8> = (0..rng.random_range(0..512)).map(|_| rng.random()).collect();
                [
                    &b"POST /hourglass.v1.Scheduler/Schedule HTTP/1.1\r\ncontent-type: application/grpc\r\n"
                        [..],
                    &garbage,
                ]
                .concat()
            }
        };
        payloads.push(bytes);
    }
    let addr = server.addr;
    let mut tasks = tokio::task::JoinSet::new();
    let mut closed_by_server = 0;
    let mut payloads = payloads.into_iter().peekable();
    while payloads.peek().is_some() {
        for bytes in payloads.by_ref().take(25) {
            tasks.spawn(async move {
                let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
                // The server may hang up before all is written; fine.
                let _ = socket.write_all(&bytes).await;
                let _ = socket.shutdown().await;
                let mut sink = Vec::new();
                let read = tokio::time::timeout(Duration::from_secs(10), socket.read_to_end(&mut sink)).await;
                read.is_ok()
            });
        }
        while let Some(done) = tasks.join_next().await {
            closed_by_server += usize::from(done.unwrap());
        }
    }
    eprintln!("garbage: {CONNECTIONS} connections, {closed_by_server} closed by the server");

    // gRPC frames whose protobuf body is garbage, on real calls.
    let mut refused: BTreeMap<String, usize> = BTreeMap::new();
    for _ in 0..200 {
        let body: Vec<u8> = (0..rng.random_range(1..256)).map(|_| rng.random()).collect();
        let decodes = <proto::ScheduleRequest as prost::Message>::decode(&body[..]).is_ok();
        let mut framed = vec![0];
        framed.extend_from_slice(&(body.len() as u32).to_be_bytes());
        framed.extend_from_slice(&body);
        let status = raw_call(addr, "Schedule", tonic::body::Body::new(axum::body::Body::from(framed))).await;
        if decodes {
            // Random fields: never a complete, valid request in practice,
            // and whatever it is, it is the client's fault.
            assert!(matches!(status.code(), Code::InvalidArgument | Code::NotFound), "{status:?}");
        } else {
            assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
            assert!(status.message().contains("does not decode"), "{status:?}");
        }
        *refused.entry(format!("{:?}", status.code())).or_default() += 1;
    }
    eprintln!("garbage gRPC bodies: {refused:?}");
    // Framing faults are protocol errors: INTERNAL, as the gRPC spec
    // requires for a compressed flag without an encoding.
    for framed in [vec![1, 0, 0, 0, 1, 0], vec![7, 0, 0, 0, 0], vec![0, 0, 0, 0, 100, 1, 2, 3]] {
        let status =
            raw_call(addr, "Schedule", tonic::body::Body::new(axum::body::Body::from(framed.clone()))).await;
        eprintln!("framing {framed:?}: {:?} {:?}", status.code(), status.message());
        assert_eq!(status.code(), Code::Internal, "{status:?}");
        assert!(
            status.message().contains("protocol error") || status.message().contains("Unexpected EOF"),
            "{status:?}"
        );
    }

    // The server still serves, and nothing panicked.
    let reply = client.schedule(request(&topic, "after", Duration::ZERO)).await.unwrap().into_inner();
    let got = consume_async(&broker, &topic, 1, Duration::from_secs(30), Duration::from_millis(500)).await;
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].id(), reply.id);
    let panicked = panics.lock().unwrap().clone();
    assert!(panicked.is_empty(), "the server panicked: {panicked:?}");
    server.stop().await;
}
