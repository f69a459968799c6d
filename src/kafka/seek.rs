//! Reading a partition from an offset on a broker that may skip the rest
//! of a batch.
//!
//! A broker answers a fetch from an offset inside a batch of records with
//! the whole batch, and the client drops the records before the offset.
//! One that answers from the next batch instead (Tansu 0.6 does) skips the
//! rest of that batch without an error: a gap like the ones compaction
//! leaves. So a read starts a little before the offset (what it reads
//! before the offset is left out), and if its first record still lies past
//! the offset, it starts twice as far back, until the first record is at
//! or before the offset, or it reads from the partition's start: then the
//! gap is real.

/// How far before the offset a read starts at first.
pub(crate) const REWIND: i64 = 512;

/// Where a reader was put to read a partition from `next` on: at `at`,
/// somewhat before it (not before `floor`, where the partition starts),
/// and the first record read is checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Seek {
    pub next: i64,
    pub at: i64,
    pub floor: i64,
}

impl Seek {
    /// A read from `next` of a partition that starts at `floor`.
    pub(crate) fn to(next: i64, floor: i64) -> Seek {
        Seek { next, at: (next - REWIND).max(floor), floor }
    }

    /// What to do once the first record read from `at` is at `first`
    /// (`i64::MAX`: none came although the partition goes on past `next`):
    /// `None`, read on; else read again from where it says.
    pub(crate) fn check(self, first: i64) -> Option<Seek> {
        if first <= self.next || self.at <= self.floor {
            return None;
        }
        let back = (self.next - self.at).max(1).saturating_mul(2);
        Some(Seek { at: (self.next - back).max(self.floor), ..self })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seek_starts_before_the_offset_and_goes_further_back_while_the_first_record_is_past_it() {
        let put = Seek::to(10_000, 0);
        assert_eq!(put, Seek { next: 10_000, at: 10_000 - REWIND, floor: 0 });
        assert_eq!(put.check(9_600), None, "a batch from before the offset: read on");
        assert_eq!(put.check(10_000), None, "from the offset itself");
        let again = put.check(10_004).expect("a batch skipped: further back");
        assert_eq!(again, Seek { next: 10_000, at: 10_000 - 2 * REWIND, floor: 0 });
        assert_eq!(again.check(10_004).unwrap().at, 10_000 - 4 * REWIND);
        let start = Seek { next: 10_000, at: 0, floor: 0 };
        assert_eq!(start.check(10_004), None, "from the start, the gap is real: compaction");
        assert_eq!(Seek::to(100, 0), Seek { next: 100, at: 0, floor: 0 });
        assert_eq!(Seek { next: 5_000, at: 4_000, floor: 0 }.check(6_000).unwrap().at, 3_000);
    }

    #[test]
    fn a_seek_goes_no_further_back_than_where_the_partition_starts() {
        let put = Seek::to(10_000, 9_800);
        assert_eq!(put.at, 9_800, "not before the partition's start");
        assert_eq!(put.check(10_050), None, "read from the start: the gap is real");
        let put = Seek::to(10_000, 9_000);
        assert_eq!(put.check(i64::MAX).unwrap().at, 9_000, "twice as far back, down to the start");
    }
}
