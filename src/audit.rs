//! The audit trail: one structured log line for each call that changes a
//! message, a policy or a series — cancel, reschedule (a re-drive is a
//! reschedule to now), cancel by selector, pause, resume, limit, deadline,
//! dead-letter topic, and a series created, changed, paused, resumed or
//! deleted — saying who (the token's name and tenant, and whether it acts
//! as an operator across tenants), the verb, what (ids or a selector) and
//! the outcome.
//!
//! The lines go to the tracing target `hourglass::audit` at INFO, so that
//! a deployment can keep them apart (`HOURGLASS_LOG=info,hourglass::audit=info`
//! keeps them; a log shipper can route on the target). They are written
//! where the change is decided, so the console's actions and the gRPC calls
//! leave the same lines; in cluster mode a call another node passed on is
//! recorded on the node that made it, with the grant the first node found.
//! Schedules are not recorded here (they are the traffic, counted in the
//! metrics), nor reads.
//!
//! A leaf: it reads the caller's [`Access`] and writes a log line; it
//! decides nothing.

use std::fmt::Display;

use crate::{Error, auth::Access};

/// The tracing target of the audit lines.
pub(crate) const TARGET: &str = "hourglass::audit";

/// Records that `access` asked for `verb` on `what`, and how it ended:
/// `Ok(outcome)` in a word or two (`cancelled`, `not_found`, ...), or the
/// error it was refused with.
pub(crate) fn record(access: &Access, verb: &'static str, what: &dyn Display, outcome: Result<&str, &Error>) {
    let scope = access.scope();
    let tenant = scope.tenant.as_ref().map_or("", |t| t.as_str());
    let operator = access.is_operator();
    let (outcome, error) = match outcome {
        Ok(outcome) => (outcome, None),
        Err(error) => ("refused", Some(error.to_string())),
    };
    tracing::info!(
        target: TARGET,
        token = access.name(),
        tenant,
        operator,
        verb,
        what = %what,
        outcome,
        error = error.as_deref(),
        "audit"
    );
}
