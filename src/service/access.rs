//! The service's methods for a caller with an [`Access`]: the same requests,
//! limited to the topics the caller's token covers.
//!
//! - `Schedule`: a topic outside the grant is PERMISSION_DENIED; nothing is
//!   stored.
//! - `ScheduleBatch` and `ScheduleStream`: each item for a topic outside the
//!   grant is answered with a PERMISSION_DENIED item error and not stored;
//!   the other items are scheduled as usual, as for any other item error.
//! - `Get`, `Cancel`, `Reschedule`: the stored message's topic must be
//!   covered too, else PERMISSION_DENIED and nothing changes. A grant of
//!   `*` skips that look-up.

use super::{ScheduleCommand, Service};
use crate::{
    Error,
    auth::Access,
    message::{CancelOutcome, DueSpec, Invalid, MessageId, Scheduled, ScheduledMessage, UnixMillis},
};

impl Service {
    pub async fn schedule_for(&self, access: &Access, cmd: ScheduleCommand) -> Result<Scheduled, Error> {
        access.check(&cmd.envelope.topic)?;
        self.schedule(cmd).await
    }

    /// As [`Service::schedule_batch`]; items for topics outside the grant
    /// are answered with [`Error::Forbidden`] and not stored.
    pub async fn schedule_batch_for(
        &self,
        access: &Access,
        items: Vec<Result<ScheduleCommand, Invalid>>,
    ) -> Result<Vec<Result<Scheduled, Error>>, Error> {
        // A batch over the item limit is refused whole, whoever sends it.
        if access.is_unrestricted() || items.len() > self.limits.max_batch {
            return self.schedule_batch(items).await;
        }
        let mut refused: Vec<Option<Error>> = Vec::with_capacity(items.len());
        let mut allowed = Vec::with_capacity(items.len());
        for item in items {
            match item.as_ref().map(|cmd| access.check(&cmd.envelope.topic)) {
                Ok(Err(forbidden)) => refused.push(Some(forbidden)),
                _ => {
                    refused.push(None);
                    allowed.push(item);
                }
            }
        }
        let mut stored =
            if allowed.is_empty() { Vec::new() } else { self.schedule_batch(allowed).await? }.into_iter();
        Ok(refused
            .into_iter()
            .map(|refusal| match refusal {
                Some(forbidden) => Err(forbidden),
                None => stored.next().expect("one answer per allowed item"),
            })
            .collect())
    }

    pub async fn get_for(&self, access: &Access, id: MessageId) -> Result<ScheduledMessage, Error> {
        let message = self.get(id).await?;
        access.check(&message.envelope.topic)?;
        Ok(message)
    }

    pub async fn cancel_for(&self, access: &Access, id: MessageId) -> Result<CancelOutcome, Error> {
        self.check_stored(access, &id).await?;
        self.cancel(id).await
    }

    pub async fn reschedule_for(
        &self,
        access: &Access,
        id: MessageId,
        due: DueSpec,
    ) -> Result<UnixMillis, Error> {
        self.check_stored(access, &id).await?;
        self.reschedule(id, due).await
    }

    /// The caller may touch the message stored under `id`, if there is one.
    /// A message's topic never changes, so the check holds for what follows.
    async fn check_stored(&self, access: &Access, id: &MessageId) -> Result<(), Error> {
        if access.is_unrestricted() {
            return Ok(());
        }
        match self.store.get(id.clone()).await? {
            Some(message) => access.check(&message.envelope.topic),
            None => Ok(()),
        }
    }
}
