//! Operations on many messages at once, made of the one-message calls of a
//! [`Scheduler`]: a listing picks them, page by page, and each is acted on
//! as its own call would. So every rule of those calls holds for each
//! message (the caller's tenant and topic grants, a cancel that meets a
//! produce waiting for its outcome), standalone and in a cluster alike (the
//! router lists every node and sends each cancel to its shard's owner).
//!
//! One call works for a bounded time and number of messages, then answers
//! with where to go on: a large set is walked in calls a client repeats,
//! never holding the store or a connection for long. What a repeated call
//! finds cancelled already is no longer pending, so it is not listed again.

use std::time::Duration;

use futures_util::{StreamExt as _, stream};
use tokio::time::Instant;

use crate::{
    Error, audit,
    message::{Invalid, SHARED_SPACE},
    proto,
    scheduler::{Call, Scheduler},
};

/// How long one call works, at most (less if the caller's deadline is
/// nearer).
const BUDGET: Duration = Duration::from_secs(2);
/// Messages one call acts on, at most.
const MAX_PER_CALL: usize = 10_000;
/// Messages listed per page.
const PAGE: u32 = 1_000;
/// Cancels under way at once.
const AT_ONCE: usize = 64;
/// Kept back from the caller's deadline, to answer in time.
const ANSWER_MARGIN: Duration = Duration::from_millis(200);

/// Cancels the pending messages `request` selects, from its page token on,
/// until the budget is spent or none is left.
pub(crate) async fn cancel_matching(
    scheduler: &dyn Scheduler,
    call: &Call,
    request: proto::CancelMatchingRequest,
) -> Result<proto::CancelMatchingResponse, Error> {
    if request.selector.trim().is_empty() {
        return Err(Invalid::new(
            "selector",
            "is empty: say which labels the messages to cancel carry (key=value, ...); every message of a \
             topic can be selected by a label each of them carries",
        )
        .into());
    }
    let started = Instant::now();
    let until = match call.deadline {
        Some(deadline) => (started + BUDGET).min(deadline.checked_sub(ANSWER_MARGIN).unwrap_or(started)),
        None => started + BUDGET,
    };
    let mut answer =
        proto::CancelMatchingResponse { next_page_token: request.page_token.clone(), ..Default::default() };
    let mut acted = 0;
    loop {
        let listing = scheduler
            .list(
                call,
                proto::ListRequest {
                    topic: request.topic.clone(),
                    dispatch_from: request.dispatch_from,
                    dispatch_to: request.dispatch_to,
                    page_size: PAGE,
                    page_token: answer.next_page_token.clone(),
                    selector: request.selector.clone(),
                    ..Default::default()
                },
            )
            .await?;
        // With the space of each: an operator's listing spans tenants, and
        // a tenant's holds the shared space's too.
        let ids: Vec<(String, String)> = listing
            .page
            .messages
            .into_iter()
            .map(|m| (m.id, if m.tenant.is_empty() { SHARED_SPACE.to_owned() } else { m.tenant }))
            .collect();
        acted += ids.len();
        let (selector, topic) = (&request.selector, &request.topic);
        let outcomes: Vec<(String, Result<proto::CancelResponse, Error>)> = stream::iter(ids)
            .map(|(id, tenant)| async move {
                // Only if it still matches when it is cancelled: a message
                // replaced since it was listed may carry other labels now.
                let cancel = proto::CancelRequest {
                    id: id.clone(),
                    selector: selector.clone(),
                    topic: topic.clone(),
                    tenant,
                };
                let outcome = scheduler.cancel(call, cancel).await;
                (id, outcome)
            })
            .buffer_unordered(AT_ONCE)
            .collect()
            .await;
        for (id, outcome) in outcomes {
            match outcome {
                Ok(r) if r.outcome() == proto::CancelOutcome::Cancelled => answer.cancelled += 1,
                Ok(r) => answer.not_cancelled.push(proto::NotCancelled {
                    id,
                    outcome: r.outcome,
                    error: String::new(),
                }),
                Err(e) => answer.not_cancelled.push(proto::NotCancelled {
                    id,
                    outcome: proto::CancelOutcome::Unspecified as i32,
                    error: tonic::Status::from(e).message().to_owned(),
                }),
            }
        }
        answer.next_page_token = listing.page.next_page_token;
        if answer.next_page_token.is_empty() || acted >= MAX_PER_CALL || Instant::now() >= until {
            let what = format!("selector={:?} topic={:?}", request.selector, request.topic);
            let outcome = format!("cancelled {} of {acted}", answer.cancelled);
            audit::record(&call.access, "CancelMatching", &what, Ok(&outcome));
            return Ok(answer);
        }
    }
}
