//! Recurring schedules (series): a template message and a rule of when it
//! recurs, each occurrence an ordinary parked message.
//!
//! - [`rule`]: when occurrences fall (cron in a time zone, or an interval),
//!   within a start, an end and a count, with a stable jitter; and what
//!   fires of the occurrences missed while hourglass or Kafka was down.

pub mod rule;
