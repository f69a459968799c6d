//! Forecasts counted lately, shown again while fresh. The overview's
//! forecast walks the due index over its window: the next week with
//! millions parked is most of a second of a core per shard. Reloaded every
//! second, or opened by several people, that walk would take a core the
//! dispatcher shares. A count that took long is shown again for a multiple
//! of what it took, so that looking costs at most a small share of a core
//! however often anyone looks; a quick count (the next hour, a small store)
//! is made afresh each time.

use std::{future::Future, sync::Mutex, time::Duration};

use tokio::time::Instant;

use crate::{
    Error,
    message::{Scope, UnixMillis},
    proto,
};

/// Counts quicker than this are made afresh each time.
const KEEP_FROM: Duration = Duration::from_millis(50);
/// A count is shown again for this many times what it took...
const KEEP_TIMES: u32 = 20;
/// ...and at most this long.
const KEEP_AT_MOST: Duration = Duration::from_secs(30);
/// Counts kept at once, for every caller together.
const KEPT: usize = 32;

/// A forecast, and when it was counted if it is shown again.
pub(super) struct Counted {
    pub forecast: proto::ForecastResponse,
    pub again: Option<UnixMillis>,
}

#[derive(Default)]
pub(super) struct Recent {
    kept: Mutex<Vec<Kept>>,
}

struct Kept {
    /// Whose count it is: a caller sees only what its grant covers.
    scope: Scope,
    request: proto::ForecastRequest,
    counted: UnixMillis,
    until: Instant,
    forecast: proto::ForecastResponse,
}

impl Recent {
    /// The forecast `request` asks for, as a caller of `scope` sees it:
    /// counted now by `count`, or a count of the same window for the same
    /// scope made lately. Windows start on a whole bar (see
    /// `Span::request`), so a new bar is a new window, counted afresh.
    pub(super) async fn forecast(
        &self,
        scope: Scope,
        request: proto::ForecastRequest,
        now: UnixMillis,
        count: impl Future<Output = Result<proto::ForecastResponse, Error>>,
    ) -> Result<Counted, Error> {
        let started = Instant::now();
        if let Some(kept) =
            self.kept().iter().find(|k| k.until > started && k.scope == scope && k.request == request)
        {
            return Ok(Counted { forecast: kept.forecast.clone(), again: Some(kept.counted) });
        }
        let forecast = count.await?;
        let took = started.elapsed();
        if took >= KEEP_FROM {
            let until = Instant::now() + (took * KEEP_TIMES).min(KEEP_AT_MOST);
            let mut kept = self.kept();
            let at = Instant::now();
            kept.retain(|k| k.until > at && !(k.scope == scope && k.request == request));
            if kept.len() >= KEPT
                && let Some(first) = kept.iter().enumerate().min_by_key(|(_, k)| k.until).map(|(i, _)| i)
            {
                kept.swap_remove(first);
            }
            kept.push(Kept { scope, request, counted: now, until, forecast: forecast.clone() });
        }
        Ok(Counted { forecast, again: None })
    }

    fn kept(&self) -> std::sync::MutexGuard<'_, Vec<Kept>> {
        // Every change is a whole push or removal: a panic elsewhere leaves
        // the list usable.
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;
    use crate::message::{Tenant, TopicPattern};

    /// A count that takes `takes`, numbered.
    struct Counter {
        takes: Duration,
        calls: AtomicU64,
    }

    impl Counter {
        fn new(takes_ms: u64) -> Counter {
            Counter { takes: Duration::from_millis(takes_ms), calls: AtomicU64::new(0) }
        }

        async fn count(&self) -> Result<proto::ForecastResponse, Error> {
            tokio::time::sleep(self.takes).await;
            let n = self.calls.fetch_add(1, Ordering::Relaxed) + 1;
            Ok(proto::ForecastResponse { totals: vec![n], ..Default::default() })
        }
    }

    fn request(topic: &str) -> proto::ForecastRequest {
        proto::ForecastRequest { topic: topic.to_owned(), ..Default::default() }
    }

    fn tenant(name: &str) -> Scope {
        Scope::tenant(name, Tenant::parse(name).unwrap(), vec![TopicPattern::Any])
    }

    #[tokio::test]
    async fn a_slow_count_is_shown_again_for_a_while_to_the_same_scope_only() {
        let slow = Counter::new(60);
        let recent = Recent::default();
        let now = UnixMillis(1_000);
        let look = |scope, topic, at| recent.forecast(scope, request(topic), at, slow.count());
        let first = look(tenant("a"), "", now).await.unwrap();
        assert_eq!((first.forecast.totals, first.again), (vec![1], None));
        // Shown again to the same scope, for the same window...
        let again = look(tenant("a"), "", UnixMillis(2_000)).await.unwrap();
        assert_eq!((again.forecast.totals, again.again), (vec![1], Some(now)));
        // ...not to another tenant, nor for another topic.
        let other = look(tenant("b"), "", now).await.unwrap();
        assert_eq!((other.forecast.totals, other.again), (vec![2], None));
        assert_eq!(look(Scope::everything(), "", now).await.unwrap().again, None);
        assert_eq!(look(tenant("a"), "t", now).await.unwrap().again, None);
        // 20 times what it took later, counted afresh.
        tokio::time::sleep(Duration::from_millis(60) * KEEP_TIMES).await;
        assert_eq!(look(tenant("a"), "", now).await.unwrap().again, None);
        assert_eq!(slow.calls.load(Ordering::Relaxed), 5);
    }

    #[tokio::test]
    async fn a_quick_count_is_made_afresh_each_time_and_few_are_kept() {
        let quick = Counter::new(10);
        let recent = Recent::default();
        for _ in 0..3 {
            let counted = recent.forecast(tenant("a"), request(""), UnixMillis(0), quick.count()).await;
            assert_eq!(counted.unwrap().again, None);
        }
        assert!(recent.kept().is_empty());
        // Counted side by side, so that none is out of date yet.
        let slow = Counter::new(60);
        let looks = (0..KEPT + 5)
            .map(|i| recent.forecast(tenant("a"), request(&format!("t{i}")), UnixMillis(0), slow.count()));
        for counted in futures_util::future::join_all(looks).await {
            counted.unwrap();
        }
        assert_eq!(recent.kept().len(), KEPT);
    }
}
