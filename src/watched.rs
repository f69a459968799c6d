//! Files the server follows while it runs (the tokens file, the TLS
//! certificate, key and client CA): looked at every two seconds and acted
//! on when their contents change. A Kubernetes Secret mounted as a volume
//! is updated in place (a new directory swapped in under a symlink) with
//! no signal to the process; following the contents catches that, and
//! any other way of replacing a file, whatever its times say.
//!
//! Only a digest of the contents is kept: the files hold secrets (tokens,
//! a private key). A leaf: it reads files and says whether they changed.

use std::{path::PathBuf, time::Duration};

use sha2::{Digest as _, Sha256};

/// How often followed files are read.
const EVERY: Duration = Duration::from_secs(2);

/// The contents of some files, as last seen.
pub(crate) struct Watched {
    paths: Vec<PathBuf>,
    seen: Option<[u8; 32]>,
}

impl Watched {
    /// Starts from the files' contents now: made before the files are
    /// first loaded, so that a change while they load is not missed.
    pub(crate) fn new(paths: Vec<PathBuf>) -> Watched {
        let mut watched = Watched { paths, seen: None };
        watched.seen = watched.read();
        watched
    }

    /// Whether the files' contents differ from what was last seen (which
    /// they then are). A file that cannot be read, such as one being
    /// replaced, is no change: the next look finds the new one.
    pub(crate) fn changed(&mut self) -> bool {
        match self.read() {
            Some(now) if self.seen.as_ref() != Some(&now) => {
                self.seen = Some(now);
                true
            }
            _ => false,
        }
    }

    /// Forgets what was seen: the next look is a change. For a reload
    /// that could not read the files: it is tried again.
    pub(crate) fn forget(&mut self) {
        self.seen = None;
    }

    /// A digest of every file's length and bytes, in order; none if one is
    /// unreadable.
    fn read(&self) -> Option<[u8; 32]> {
        let mut digest = Sha256::new();
        for path in &self.paths {
            let bytes = std::fs::read(path).ok()?;
            digest.update((bytes.len() as u64).to_le_bytes());
            digest.update(&bytes);
        }
        Some(digest.finalize().into())
    }
}

/// Ticks at the pace files are looked at, skipping the ticks a slow look
/// missed.
pub(crate) fn every() -> tokio::time::Interval {
    let mut every = tokio::time::interval(EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    every
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_is_seen_once_and_a_missing_file_is_none() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::write(&a, "one").unwrap();
        std::fs::write(&b, "two").unwrap();
        let mut watched = Watched::new(vec![a.clone(), b.clone()]);
        assert!(!watched.changed(), "nothing changed yet");
        // The same bytes moved between the files are a change.
        std::fs::write(&a, "onet").unwrap();
        std::fs::write(&b, "wo").unwrap();
        assert!(watched.changed());
        assert!(!watched.changed(), "seen once");
        std::fs::remove_file(&b).unwrap();
        assert!(!watched.changed(), "a file being replaced is no change");
        std::fs::write(&b, "three").unwrap();
        assert!(watched.changed());
        watched.forget();
        assert!(watched.changed(), "forgotten, the same contents are a change");
    }
}
