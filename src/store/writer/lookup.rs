//! Reading a message for a change: as this round leaves it (its overlay),
//! else as stored; by id, by the id a caller names, or whole.

use super::{
    round::{Round, Stored},
    state::Writer,
};
use crate::{
    message::{MessageId, Scope, Visibility},
    store::{
        StoreError,
        options::cf,
        read,
        schema::{self, MessageRecord},
    },
};

impl Writer {
    pub(super) fn load(&self, r: &Round, id: &MessageId) -> Result<Option<Stored>, StoreError> {
        if let Some(stored) = r.overlay.get(id) {
            return Ok(stored.clone());
        }
        let read = read::record_with(&self.shared.db, id, None, &mut r.delivery_logs.borrow_mut())?;
        Ok(read.map(|(record, settlement)| Stored { record, settlement }))
    }

    /// The acceptance sequence of the message stored under `id`, reading
    /// its record alone.
    pub(super) fn seq_of(&self, r: &Round, id: &MessageId) -> Result<Option<u64>, StoreError> {
        if let Some(stored) = r.overlay.get(id) {
            return Ok(stored.as_ref().map(|s| s.record.seq));
        }
        let db = &self.shared.db;
        let Some(bytes) = db.get_pinned_cf(cf(db, schema::CF_MESSAGES), id.as_bytes())? else {
            return Ok(None);
        };
        Ok(Some(read::decode_stored(id, &bytes, None)?.0.seq))
    }

    /// The message `id` names for `scope`: in the caller's space, else in
    /// the shared one if the caller sees it there. A message the caller
    /// sees on a topic it does not cover is refused.
    pub(super) fn find(
        &self,
        r: &Round,
        scope: &Scope,
        id: &MessageId,
    ) -> Result<Option<(MessageId, Stored)>, StoreError> {
        for candidate in std::iter::once(id.clone()).chain(scope.fallback(id)) {
            let Some(stored) = self.load(r, &candidate)? else { continue };
            match scope.sees(&candidate, &stored.record.topic) {
                Visibility::Visible => return Ok(Some((candidate, stored))),
                Visibility::Forbidden => {
                    return Err(StoreError::Forbidden {
                        token: scope.name.to_string(),
                        topic: stored.record.topic,
                    });
                }
                Visibility::Hidden => {}
            }
        }
        Ok(None)
    }

    /// `read`, the record a caller read whole already, or else [`Self::whole`].
    pub(super) fn whole_unless_read(
        &self,
        r: &Round,
        id: &MessageId,
        read: Option<MessageRecord>,
    ) -> Result<Option<MessageRecord>, StoreError> {
        match read {
            Some(record) => Ok(Some(record)),
            None => self.whole(r, id),
        }
    }

    /// The record of `id`, whole, as this round leaves it; without what
    /// became of it (which would read its chunk's delivery log).
    pub(super) fn whole(&self, r: &Round, id: &MessageId) -> Result<Option<MessageRecord>, StoreError> {
        match r.overlay.get(id) {
            Some(stored) => Ok(stored.as_ref().map(|s| s.record.clone())),
            None => read::whole(&self.shared.db, id),
        }
    }
}
