//! When the dispatcher last had produces unanswered: a file in the store's
//! directory holding that time (Unix milliseconds, by the dispatcher's
//! clock) and the machine's boot id, rewritten at most every [`EVERY`]
//! while it has, so that after an unclean stop the search for what the
//! stopped process produced unrecorded knows how long ago its last
//! requests could have been sent, and which messages it cannot have
//! produced at all: a message is handed to the producer once due, and
//! then the time is written within [`SLACK`], so one due later than the
//! time plus [`SLACK`] never left the process.
//!
//! A record handed to the Kafka client can reach the broker, and be
//! appended, a little after the process that sent it died; the search
//! reads on past the partitions' ends for [`LATE_APPENDS`] after that.
//! Without the file it counts from the store's open, as if the process
//! died just then, and every restart after a kill -9 waits that long
//! before it produces anything, whenever the kill came.
//!
//! The file is not synced: a kill leaves the kernel's copy, which is what
//! counts. A machine that lost power, or a store moved to another machine,
//! may come back with an older time: the boot id then differs (Linux's
//! `/proc/sys/kernel/random/boot_id`) and the time is not used, as where
//! there is no file or no boot id to compare. A wall clock set back across
//! the restart makes the wait whole again; one set forward shortens it.
//!
//! [`LATE_APPENDS`]: super::reconcile::LATE_APPENDS

use std::{
    fs::File,
    os::unix::fs::FileExt as _,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use crate::message::UnixMillis;

/// The file, in the store's directory (RocksDB leaves files it does not
/// know alone; a store restored from a backup removes it).
const FILE: &str = crate::store::IN_FLIGHT_FILE;
/// Most time between two writes while produces are unanswered.
pub(super) const EVERY: Duration = Duration::from_millis(100);
/// How far the time in the file may be behind the last moment the
/// process had produces unanswered: a write skipped for [`EVERY`], the
/// loop's pass that writes it held up by a slow commit.
pub(super) const SLACK: Duration = Duration::from_millis(500);

pub(super) struct Pulse {
    path: PathBuf,
    /// This machine's boot id; none known: the file is never written.
    boot: Option<Vec<u8>>,
    file: Option<File>,
    written: Option<Instant>,
}

impl Pulse {
    /// The time the file holds, as the last process left it, if it was
    /// written since this machine booted: `None` if there is none (a store
    /// of a release without it), it cannot be read, or it was written
    /// before a reboot or on another machine.
    pub(super) fn last(store_dir: &Path) -> Option<UnixMillis> {
        Self::read(store_dir, &boot_id()?)
    }

    fn read(store_dir: &Path, boot: &[u8]) -> Option<UnixMillis> {
        let bytes = std::fs::read(store_dir.join(FILE)).ok()?;
        let (time, written_in) = bytes.split_at_checked(8)?;
        (written_in == boot).then(|| UnixMillis(u64::from_le_bytes(time.try_into().expect("eight bytes"))))
    }

    /// This process's pulse. The file keeps the last process's time until
    /// this one has a produce unanswered: a process stopped before it
    /// produced anything (during its search, say) leaves the time of the
    /// one before it, whose requests may still be arriving.
    pub(super) fn start(store_dir: &Path) -> Pulse {
        Pulse { path: store_dir.join(FILE), boot: boot_id(), file: None, written: None }
    }

    /// Produces are unanswered at `now`: written unless written less than
    /// [`EVERY`] ago.
    pub(super) fn beat(&mut self, now: UnixMillis) {
        if self.written.is_some_and(|at| at.elapsed() < EVERY) {
            return;
        }
        self.written = Some(Instant::now());
        self.write(now);
    }

    fn write(&mut self, at: UnixMillis) {
        let Some(boot) = &self.boot else { return };
        if self.file.is_none() {
            let opened = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&self.path);
            match opened {
                Ok(file) => self.file = Some(file),
                Err(e) => {
                    tracing::debug!(path = %self.path.display(), error = %e, "opening the in-flight file failed");
                    return;
                }
            }
        }
        let mut bytes = at.0.to_le_bytes().to_vec();
        bytes.extend_from_slice(boot);
        if let Some(file) = &self.file
            && let Err(e) = file.write_all_at(&bytes, 0)
        {
            // Without it, the next restart after a kill waits as long as
            // it did before the file existed: nothing is lost.
            tracing::debug!(path = %self.path.display(), error = %e, "writing the in-flight file failed");
            self.file = None;
        }
    }
}

/// The id the kernel gave this boot of the machine.
fn boot_id() -> Option<Vec<u8>> {
    let id = std::fs::read("/proc/sys/kernel/random/boot_id").ok()?;
    let id = id.trim_ascii();
    (!id.is_empty()).then(|| id.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_time_written_while_produces_are_unanswered_is_read_back_in_the_same_boot() {
        let dir = tempfile::tempdir().unwrap();
        let (boot, other) = (b"boot-1".to_vec(), b"boot-2".as_slice());
        assert_eq!(Pulse::read(dir.path(), &boot), None, "no file: nothing known");
        let mut earlier = 700u64.to_le_bytes().to_vec();
        earlier.extend_from_slice(&boot);
        std::fs::write(dir.path().join(FILE), &earlier).unwrap();
        let mut pulse = Pulse { boot: Some(boot.clone()), ..Pulse::start(dir.path()) };
        assert_eq!(
            Pulse::read(dir.path(), &boot),
            Some(UnixMillis(700)),
            "the last process's, until this one produces"
        );
        assert_eq!(Pulse::read(dir.path(), other), None, "written before a reboot: not used");
        pulse.beat(UnixMillis(1_000));
        pulse.beat(UnixMillis(1_050));
        assert_eq!(Pulse::read(dir.path(), &boot), Some(UnixMillis(1_000)), "at most every {EVERY:?}");
        std::thread::sleep(EVERY);
        pulse.beat(UnixMillis(1_200));
        assert_eq!(Pulse::read(dir.path(), &boot), Some(UnixMillis(1_200)));
        std::fs::write(dir.path().join(FILE), 1_300u64.to_le_bytes()).unwrap();
        assert_eq!(Pulse::read(dir.path(), &boot), None, "a file without a boot id: not used");
    }

    #[test]
    fn this_machine_has_a_boot_id() {
        let dir = tempfile::tempdir().unwrap();
        let mut pulse = Pulse::start(dir.path());
        assert!(pulse.boot.is_some(), "Linux gives every boot an id");
        pulse.beat(UnixMillis(1_000));
        assert_eq!(Pulse::last(dir.path()), Some(UnixMillis(1_000)));
    }
}
