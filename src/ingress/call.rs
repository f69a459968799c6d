//! Turning an ingress partition's records into calls: each record the
//! call a client would make, in order per id, made again until answered
//! for good, with its topic's grant.

use std::{collections::HashSet, sync::Arc, time::Duration};

use futures_util::future;
use tokio_util::sync::CancellationToken;

use super::{
    feed::Raw,
    native::{self, Native},
};
use crate::{
    auth::{Access, Authenticator},
    message::{Limits, OnConflict},
    metrics, proto,
    scheduler::{Call, Scheduler},
};

/// How long one call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a call answered "try again" waits before it is.
pub(super) const BACKOFF: Duration = Duration::from_millis(500);

/// What makes the calls: the node's scheduler, the grants, the limits a
/// record is read against.
pub(super) struct Caller {
    pub(super) scheduler: Arc<dyn Scheduler>,
    pub(super) auth: Authenticator,
    pub(super) limits: Limits,
}

/// Where records come from: a partition of an ingress topic, and the
/// grant they are called with.
pub(super) struct Source<'a> {
    pub(super) topic: &'a str,
    pub(super) grant: Option<&'a str>,
    pub(super) partition: i32,
}

/// What became of one record.
enum Outcome {
    Done(&'static str),
    /// Refused for what it says, and why.
    Refused(String),
    /// Not answered for good: made again.
    Again(String),
}

/// The call a record asks for.
enum Ask {
    Schedule(Box<proto::ScheduleRequest>),
    Cancel(proto::CancelRequest),
}

/// Turns `records` into calls, in order per id; true once every one is
/// answered for good, false if `lost` first.
pub(super) async fn take(
    caller: &Caller,
    source: &Source<'_>,
    records: Vec<Raw>,
    lost: &CancellationToken,
) -> bool {
    let mut wave: Vec<(i64, Ask)> = Vec::new();
    let mut ids = HashSet::new();
    for raw in records {
        let parsed = native::parse(
            raw.key.as_deref(),
            raw.value.as_deref(),
            raw.headers.iter().map(|(k, v)| (k.as_str(), v.as_deref())),
            &caller.limits,
        );
        let ask = match parsed {
            Ok(Native::Schedule { id, envelope, requested, on_conflict }) => {
                let due = requested.resolve(raw.at);
                let due = std::time::UNIX_EPOCH + Duration::from_millis(due.0);
                let labels = envelope.labels.iter().map(|(k, v)| (k.to_owned(), v.to_owned())).collect();
                let max_lateness = envelope.max_lateness.map(crate::api::convert::wire_duration);
                let dead_letter_topic = envelope.dead_letter_topic.clone().unwrap_or_default();
                Ask::Schedule(Box::new(proto::ScheduleRequest {
                    // As a client sends it (the API's own conversion).
                    message: Some(proto::Message::from(envelope)),
                    due: Some(proto::schedule_request::Due::DeliverAt(due.into())),
                    id: Some(id.as_str().to_owned()),
                    labels,
                    max_lateness,
                    dead_letter_topic,
                    on_conflict: match on_conflict {
                        OnConflict::Reject => proto::OnConflict::Reject,
                        OnConflict::Replace => proto::OnConflict::Replace,
                    } as i32,
                }))
            }
            Ok(Native::Cancel(id)) => {
                Ask::Cancel(proto::CancelRequest { id: id.as_str().to_owned(), ..Default::default() })
            }
            Err(rejected) => {
                refused(
                    source,
                    raw.offset,
                    rejected.id.as_ref().map(|id| id.as_str()),
                    &rejected.reason.to_string(),
                );
                continue;
            }
        };
        let id = match &ask {
            Ask::Schedule(s) => s.id.clone().unwrap_or_default(),
            Ask::Cancel(c) => c.id.clone(),
        };
        if !ids.insert(id.clone()) {
            if !call_all(caller, source, std::mem::take(&mut wave), lost).await {
                return false;
            }
            ids = HashSet::from([id]);
        }
        wave.push((raw.offset, ask));
    }
    call_all(caller, source, wave, lost).await
}

/// Makes every call of `wave` (of distinct ids) until each is answered for
/// good; false if `lost` first.
async fn call_all(
    caller: &Caller,
    source: &Source<'_>,
    mut wave: Vec<(i64, Ask)>,
    lost: &CancellationToken,
) -> bool {
    while !wave.is_empty() {
        if lost.is_cancelled() {
            return false;
        }
        // The grant as the tokens file says now (it is reloaded on SIGHUP).
        let access = match caller.auth.named(source.grant) {
            Ok(access) => access,
            Err(why) => {
                for (offset, ask) in wave {
                    refused(source, offset, Some(ask_id(&ask)), &format!("the topic's grant {why}"));
                }
                return true;
            }
        };
        let outcomes = tokio::select! {
            // A call cut short is as a caller that went away: made or not,
            // the next owner makes it again.
            _ = lost.cancelled() => return false,
            outcomes = call_once(caller, &access, &wave) => outcomes,
        };
        let mut again = Vec::new();
        let mut last_error = None;
        for ((offset, ask), outcome) in wave.into_iter().zip(outcomes) {
            match outcome {
                Outcome::Done(how) => {
                    metrics::INGRESS_RECORDS.with_label_values(&[source.topic, how]).inc();
                }
                Outcome::Refused(why) => refused(source, offset, Some(ask_id(&ask)), &why),
                Outcome::Again(why) => {
                    last_error = Some(why);
                    again.push((offset, ask));
                }
            }
        }
        if let Some(why) = last_error {
            tracing::debug!(topic = source.topic, partition = source.partition, waiting = again.len(), error = %why, "Kafka-native schedules wait for their shards; trying again");
            if !pause(lost).await {
                return false;
            }
        }
        wave = again;
    }
    true
}

fn ask_id(ask: &Ask) -> &str {
    match ask {
        Ask::Schedule(s) => s.id.as_deref().unwrap_or_default(),
        Ask::Cancel(c) => &c.id,
    }
}

/// One try at every call of `wave`: the schedules as batches, the cancels
/// each on its own, all at once.
async fn call_once(caller: &Caller, access: &Access, wave: &[(i64, Ask)]) -> Vec<Outcome> {
    let call = Call {
        access: access.clone(),
        forwarded: false,
        deadline: Some(tokio::time::Instant::now() + CALL_TIMEOUT),
    };
    let schedules: Vec<(usize, proto::ScheduleRequest)> = wave
        .iter()
        .enumerate()
        .filter_map(|(i, (_, ask))| match ask {
            Ask::Schedule(s) => Some((i, (**s).clone())),
            Ask::Cancel(_) => None,
        })
        .collect();
    let batches = schedules.chunks(caller.limits.max_batch.max(1)).map(|chunk| {
        let (places, items): (Vec<usize>, Vec<proto::ScheduleRequest>) = chunk.iter().cloned().unzip();
        let call = &call;
        async move {
            let results = caller.scheduler.schedule_batch(call, "Ingress", items).await;
            places.into_iter().zip(results.into_iter().map(scheduled)).collect::<Vec<_>>()
        }
    });
    let cancels = wave.iter().enumerate().filter_map(|(i, (_, ask))| match ask {
        Ask::Cancel(c) => Some((i, c.clone())),
        Ask::Schedule(_) => None,
    });
    let cancels = cancels.map(|(i, request)| {
        let call = &call;
        async move {
            let outcome = match caller.scheduler.cancel(call, request).await {
                Ok(_) => Outcome::Done("cancelled"),
                Err(e) => by_status(tonic::Status::from(e)),
            };
            (i, outcome)
        }
    });
    let (batches, cancels) = tokio::join!(future::join_all(batches), future::join_all(cancels));
    let mut outcomes: Vec<Option<Outcome>> = (0..wave.len()).map(|_| None).collect();
    for (i, outcome) in batches.into_iter().flatten().chain(cancels) {
        outcomes[i] = Some(outcome);
    }
    outcomes.into_iter().map(|o| o.unwrap_or_else(|| Outcome::Again("no answer came".to_owned()))).collect()
}

fn scheduled(result: proto::ScheduleResult) -> Outcome {
    use proto::schedule_result::Result as R;
    match result.result {
        Some(R::Scheduled(s)) if s.duplicate => Outcome::Done("duplicate"),
        Some(R::Scheduled(s)) if s.outcome == proto::ScheduleOutcome::Replaced as i32 => {
            Outcome::Done("replaced")
        }
        Some(R::Scheduled(_)) => Outcome::Done("scheduled"),
        Some(R::Error(e)) => by_status(tonic::Status::new(tonic::Code::from_i32(e.code), e.message)),
        None => Outcome::Again("an empty answer".to_owned()),
    }
}

/// A refusal for what the record says, or an answer to try again later.
fn by_status(status: tonic::Status) -> Outcome {
    use tonic::Code;
    match status.code() {
        Code::InvalidArgument
        | Code::AlreadyExists
        | Code::PermissionDenied
        | Code::NotFound
        | Code::FailedPrecondition
        | Code::OutOfRange
        | Code::Unauthenticated => Outcome::Refused(format!("{:?}: {}", status.code(), status.message())),
        _ => Outcome::Again(format!("{:?}: {}", status.code(), status.message())),
    }
}

fn refused(source: &Source<'_>, offset: i64, id: Option<&str>, why: &str) {
    metrics::INGRESS_RECORDS.with_label_values(&[source.topic, "refused"]).inc();
    let (topic, partition) = (source.topic, source.partition);
    tracing::warn!(topic, partition, offset, id, reason = why, "a Kafka-native schedule was refused");
}

/// Waits a moment; false if `lost` first.
pub(super) async fn pause(lost: &CancellationToken) -> bool {
    tokio::select! {
        _ = lost.cancelled() => false,
        _ = tokio::time::sleep(BACKOFF) => true,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::{Error, message::UnixMillis, scheduler::Listing};

    /// A scheduler that notes every call, answers `again` ids UNAVAILABLE
    /// the first time, and refuses `refuse` ids as a bad request.
    #[derive(Default)]
    struct Noted {
        limits: Limits,
        calls: Mutex<Vec<String>>,
        again: Mutex<HashSet<String>>,
        refuse: HashSet<String>,
    }

    impl Noted {
        fn calls(&self) -> Vec<String> {
            self.calls.lock().unwrap().clone()
        }
    }

    #[tonic::async_trait]
    impl Scheduler for Noted {
        fn limits(&self) -> &Limits {
            &self.limits
        }

        async fn schedule(
            &self,
            _: &Call,
            _: proto::ScheduleRequest,
        ) -> Result<proto::ScheduleResponse, Error> {
            unreachable!("schedules go in batches")
        }

        async fn schedule_batch(
            &self,
            _: &Call,
            method: &'static str,
            items: Vec<proto::ScheduleRequest>,
        ) -> Vec<proto::ScheduleResult> {
            assert_eq!(method, "Ingress");
            use proto::schedule_result::Result as R;
            let error =
                |code: tonic::Code| R::Error(proto::ItemError { code: code as i32, ..Default::default() });
            (0..)
                .zip(items)
                .map(|(index, item)| {
                    let id = item.id.unwrap_or_default();
                    self.calls.lock().unwrap().push(format!("schedule {id}"));
                    let result = if self.again.lock().unwrap().remove(&id) {
                        error(tonic::Code::Unavailable)
                    } else if self.refuse.contains(&id) {
                        error(tonic::Code::InvalidArgument)
                    } else {
                        R::Scheduled(proto::ScheduleResponse { id, ..Default::default() })
                    };
                    proto::ScheduleResult { index, result: Some(result) }
                })
                .collect()
        }

        async fn cancel(
            &self,
            _: &Call,
            request: proto::CancelRequest,
        ) -> Result<proto::CancelResponse, Error> {
            self.calls.lock().unwrap().push(format!("cancel {}", request.id));
            Ok(proto::CancelResponse { outcome: proto::CancelOutcome::Cancelled as i32 })
        }

        async fn reschedule(
            &self,
            _: &Call,
            _: proto::RescheduleRequest,
        ) -> Result<proto::RescheduleResponse, Error> {
            unreachable!()
        }

        async fn get(&self, _: &Call, _: proto::GetRequest) -> Result<proto::GetResponse, Error> {
            unreachable!()
        }

        async fn list(&self, _: &Call, _: proto::ListRequest) -> Result<Listing, Error> {
            unreachable!()
        }

        async fn stats(&self, _: &Call) -> Result<proto::StatsResponse, Error> {
            unreachable!()
        }

        async fn forecast(
            &self,
            _: &Call,
            _: proto::ForecastRequest,
        ) -> Result<proto::ForecastResponse, Error> {
            unreachable!()
        }

        async fn describe(&self, _: &Call) -> Result<proto::DescribeClusterResponse, Error> {
            unreachable!()
        }
    }

    fn record(offset: i64, id: &str, schedule: bool) -> Raw {
        let headers = [("hourglass-topic", "orders"), ("hourglass-delay", "1s")];
        Raw {
            offset,
            at: UnixMillis(1_000),
            key: Some(id.as_bytes().to_vec()),
            value: schedule.then(|| b"v".to_vec()),
            headers: headers.iter().map(|(k, v)| ((*k).to_owned(), Some(v.as_bytes().to_vec()))).collect(),
        }
    }

    /// A partition's records are called in order per id: those of distinct
    /// ids together, one of an id already among them once those before it
    /// are answered for good (a retry included); a refusal is counted, and
    /// holds nothing back.
    #[tokio::test]
    async fn records_are_called_in_order_per_id_and_a_call_answered_try_again_is_made_again() {
        let noted = Arc::new(Noted {
            again: Mutex::new(HashSet::from(["b".to_owned()])),
            refuse: HashSet::from(["bad".to_owned()]),
            ..Noted::default()
        });
        let caller = Caller {
            scheduler: Arc::clone(&noted) as Arc<dyn Scheduler>,
            auth: Authenticator::disabled(),
            limits: Limits::default(),
        };
        let topic = format!("ingress-{}", std::process::id());
        let source = Source { topic: &topic, grant: None, partition: 0 };
        let records = vec![
            record(0, "a", true),
            record(1, "b", true),
            record(2, "bad", true),
            record(3, "a", false),
            record(4, "c", true),
        ];
        assert!(take(&caller, &source, records, &CancellationToken::new()).await);
        let calls = noted.calls();
        let at =
            |call: &str| calls.iter().rposition(|c| c == call).unwrap_or_else(|| panic!("{call}: {calls:?}"));
        assert_eq!(
            calls.iter().filter(|c| *c == "schedule b").count(),
            2,
            "b again after UNAVAILABLE: {calls:?}"
        );
        assert!(at("cancel a") > at("schedule a"), "a's tombstone after its schedule: {calls:?}");
        assert!(
            at("cancel a") > at("schedule b"),
            "the next wave after the first is answered for good: {calls:?}"
        );
        assert!(at("schedule c") > at("schedule b"), "{calls:?}");
        let count =
            |outcome: &str| metrics::INGRESS_RECORDS.with_label_values(&[topic.as_str(), outcome]).get();
        assert_eq!((count("scheduled"), count("cancelled"), count("refused")), (3, 1, 1));
        // The grant its topic names must be in the tokens file.
        let mapped = Source { topic: &topic, grant: Some("orders"), partition: 0 };
        assert!(take(&caller, &mapped, vec![record(5, "d", true)], &CancellationToken::new()).await);
        assert_eq!(count("refused"), 2, "no tokens file to find the grant in");
        assert!(!noted.calls().iter().any(|c| c == "schedule d"), "nothing called without its grant");
    }

    #[test]
    fn a_refusal_for_what_a_record_says_is_final_and_anything_else_is_tried_again() {
        use tonic::{Code, Status};
        for code in [Code::InvalidArgument, Code::AlreadyExists, Code::PermissionDenied, Code::NotFound] {
            assert!(matches!(by_status(Status::new(code, "x")), Outcome::Refused(_)), "{code:?}");
        }
        for code in [Code::Unavailable, Code::ResourceExhausted, Code::DeadlineExceeded, Code::Internal] {
            assert!(matches!(by_status(Status::new(code, "x")), Outcome::Again(_)), "{code:?}");
        }
    }

    #[test]
    fn a_retried_schedule_is_a_duplicate_a_replace_is_told_and_an_empty_answer_is_asked_again() {
        let ok = |outcome: proto::ScheduleOutcome| proto::ScheduleResult {
            index: 0,
            result: Some(proto::schedule_result::Result::Scheduled(proto::ScheduleResponse {
                id: "a".into(),
                deliver_at: None,
                duplicate: outcome == proto::ScheduleOutcome::Duplicate,
                outcome: outcome as i32,
            })),
        };
        assert!(matches!(scheduled(ok(proto::ScheduleOutcome::Created)), Outcome::Done("scheduled")));
        assert!(matches!(scheduled(ok(proto::ScheduleOutcome::Duplicate)), Outcome::Done("duplicate")));
        assert!(matches!(scheduled(ok(proto::ScheduleOutcome::Replaced)), Outcome::Done("replaced")));
        assert!(matches!(scheduled(proto::ScheduleResult { index: 0, result: None }), Outcome::Again(_)));
    }
}
