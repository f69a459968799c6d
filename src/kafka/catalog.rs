//! The topic catalog: which topics exist and how many partitions each has,
//! from cached broker metadata, so validating a request costs no broker call.
//!
//! The cache is refreshed in the background. A topic missing from it
//! triggers one refresh (shared by concurrent requests, at most one per
//! `min_refresh_gap`) before the request is refused, so a topic created a
//! moment ago is found. When the broker cannot be reached, topics already
//! known stay usable: scheduling keeps working through a Kafka outage.

use std::{
    collections::BTreeMap,
    sync::{Arc, RwLock},
    time::{Duration, Instant},
};

use tokio_util::sync::CancellationToken;

use crate::metrics;

/// Where topic metadata comes from: the broker, or a fake in tests.
pub trait MetadataSource: Send + Sync + 'static {
    /// Every topic with its partition count. Blocking.
    fn topics(&self, timeout: Duration) -> Result<BTreeMap<String, i32>, MetadataError>;
}

/// Why the brokers' topic metadata could not be read: what the client
/// said.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct MetadataError(pub String);

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CatalogError {
    #[error("topic {0:?} does not exist on the Kafka cluster")]
    Unknown(String),
    #[error("cannot check topic {topic:?}: Kafka metadata is unavailable ({reason})")]
    Unreachable { topic: String, reason: String },
}

pub struct TopicCatalog {
    source: Arc<dyn MetadataSource>,
    topics: RwLock<Option<BTreeMap<String, i32>>>,
    /// Serialises refreshes; holds when the last one finished.
    refresh: tokio::sync::Mutex<Option<(Instant, Result<(), MetadataError>)>>,
    min_refresh_gap: Duration,
    timeout: Duration,
}

impl TopicCatalog {
    pub fn new(source: Arc<dyn MetadataSource>) -> Self {
        TopicCatalog {
            source,
            topics: RwLock::new(None),
            refresh: tokio::sync::Mutex::new(None),
            min_refresh_gap: Duration::from_secs(1),
            timeout: Duration::from_secs(5),
        }
    }

    fn cached(&self, topic: &str) -> Option<i32> {
        self.topics.read().unwrap_or_else(|e| e.into_inner()).as_ref().and_then(|t| t.get(topic).copied())
    }

    /// The partition count of `topic`.
    pub async fn partitions(&self, topic: &str) -> Result<i32, CatalogError> {
        if let Some(n) = self.cached(topic) {
            return Ok(n);
        }
        let refreshed = self.refresh_at_most_every(self.min_refresh_gap).await;
        match (self.cached(topic), refreshed) {
            (Some(n), _) => Ok(n),
            (None, Ok(())) => Err(CatalogError::Unknown(topic.to_owned())),
            (None, Err(reason)) => {
                Err(CatalogError::Unreachable { topic: topic.to_owned(), reason: reason.0 })
            }
        }
    }

    /// Refreshes unless a refresh finished less than `gap` ago, in which case
    /// that refresh's result stands. Concurrent callers share one refresh.
    async fn refresh_at_most_every(&self, gap: Duration) -> Result<(), MetadataError> {
        let mut last = self.refresh.lock().await;
        if let Some((at, result)) = last.as_ref()
            && at.elapsed() < gap
        {
            return result.clone();
        }
        let source = Arc::clone(&self.source);
        let timeout = self.timeout;
        let fetched = tokio::task::spawn_blocking(move || source.topics(timeout))
            .await
            .unwrap_or_else(|e| Err(MetadataError(format!("metadata task: {e}"))));
        let result = match fetched {
            Ok(topics) => {
                *self.topics.write().unwrap_or_else(|e| e.into_inner()) = Some(topics);
                Ok(())
            }
            Err(reason) => {
                metrics::METADATA_ERRORS.inc();
                tracing::warn!(%reason, "refreshing Kafka topic metadata failed");
                Err(reason)
            }
        };
        *last = Some((Instant::now(), result.clone()));
        result
    }

    /// Refreshes every `every` until `stop`.
    pub async fn run(self: Arc<Self>, every: Duration, stop: CancellationToken) {
        loop {
            let _ = self.refresh_at_most_every(Duration::ZERO).await;
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(every) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{
        Mutex,
        atomic::{AtomicUsize, Ordering},
    };

    use super::*;

    struct Fake {
        topics: Mutex<Result<BTreeMap<String, i32>, MetadataError>>,
        calls: AtomicUsize,
    }

    impl Default for Fake {
        fn default() -> Self {
            Fake { topics: Mutex::new(Ok(BTreeMap::new())), calls: AtomicUsize::new(0) }
        }
    }

    impl Fake {
        fn set(&self, topics: Result<&[(&str, i32)], &str>) {
            *self.topics.lock().unwrap() = topics
                .map(|t| t.iter().map(|(n, p)| (n.to_string(), *p)).collect())
                .map_err(|e| MetadataError(e.to_owned()));
        }
    }

    impl MetadataSource for Fake {
        fn topics(&self, _: Duration) -> Result<BTreeMap<String, i32>, MetadataError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            self.topics.lock().unwrap().clone()
        }
    }

    fn catalog(fake: &Arc<Fake>) -> TopicCatalog {
        let mut c = TopicCatalog::new(Arc::clone(fake) as Arc<dyn MetadataSource>);
        c.min_refresh_gap = Duration::from_millis(50);
        c
    }

    #[tokio::test]
    async fn known_topics_cost_no_broker_call() {
        let fake = Arc::new(Fake::default());
        fake.set(Ok(&[("orders", 3)]));
        let c = catalog(&fake);
        assert_eq!(c.partitions("orders").await, Ok(3));
        for _ in 0..100 {
            assert_eq!(c.partitions("orders").await, Ok(3));
        }
        assert_eq!(fake.calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_miss_refreshes_at_most_once_per_gap() {
        let fake = Arc::new(Fake::default());
        fake.set(Ok(&[("orders", 3)]));
        let c = catalog(&fake);
        assert_eq!(c.partitions("nope").await, Err(CatalogError::Unknown("nope".into())));
        assert_eq!(c.partitions("nope").await, Err(CatalogError::Unknown("nope".into())));
        assert_eq!(fake.calls.load(Ordering::SeqCst), 1);
        fake.set(Ok(&[("orders", 3), ("new", 1)]));
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert_eq!(c.partitions("new").await, Ok(1), "a new topic is found after the gap");
    }

    #[tokio::test]
    async fn outage_keeps_known_topics_and_reports_unknown_as_unreachable() {
        let fake = Arc::new(Fake::default());
        fake.set(Ok(&[("orders", 3)]));
        let c = catalog(&fake);
        assert_eq!(c.partitions("orders").await, Ok(3));
        fake.set(Err("all brokers down"));
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert!(matches!(c.partitions("other").await, Err(CatalogError::Unreachable { .. })));
        assert_eq!(c.partitions("orders").await, Ok(3));
    }
}
