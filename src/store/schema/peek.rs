//! Reading a due entry's id and topic without decoding it.

use super::DUE_ENTRY_MARK;

/// The id (as stored) and the topic of a due entry, read without decoding
/// it: what a walk needs to step over the entries of a held topic. None
/// for a legacy entry, or bytes that are not an entry.
pub(crate) fn peek_due_entry(bytes: &[u8]) -> Option<(&[u8], &[u8])> {
    let (&DUE_ENTRY_MARK, rest) = bytes.split_first()? else { return None };
    let (mut id, mut topic) = (None, None);
    for (field, value) in fields(rest) {
        match field {
            1 => id = Some(value?),
            2 => topic = fields(value?).find(|(f, _)| *f == 1).and_then(|(_, v)| v),
            _ => {}
        }
    }
    Some((id?, topic?))
}

/// The fields of a protobuf message: each field number, with its bytes if
/// it is length-delimited. Stops at the first malformed field.
fn fields(mut buf: &[u8]) -> impl Iterator<Item = (u64, Option<&[u8]>)> {
    fn take<'a>(buf: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        (buf.len() >= n).then(|| {
            let (value, rest) = buf.split_at(n);
            *buf = rest;
            value
        })
    }
    std::iter::from_fn(move || {
        if buf.is_empty() {
            return None;
        }
        let key = prost::encoding::decode_varint(&mut buf).ok()?;
        let value = match key & 7 {
            0 => prost::encoding::decode_varint(&mut buf).ok().map(|_| None)?,
            1 => take(&mut buf, 8).map(|_| None)?,
            5 => take(&mut buf, 4).map(|_| None)?,
            2 => {
                let len = usize::try_from(prost::encoding::decode_varint(&mut buf).ok()?).ok()?;
                Some(take(&mut buf, len)?)
            }
            _ => return None,
        };
        Some((key >> 3, value))
    })
}
