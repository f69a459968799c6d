//! A node: the shards one process serves, and the routing of each request
//! to the shard of its message.
//!
//! Every id belongs to one shard, found without a lookup: the murmur2 hash
//! of the id's text (as Kafka's Java client hashes a record key), made
//! positive and taken modulo the shard count. The tenant is left out of the
//! hash, so an id and the same id in the shared space (which a tenant still
//! sees) live in one shard and are checked in one step there.
//!
//! What spans shards is assembled here: a batch is split by shard and
//! written as one atomic write per shard; `List` merges the shards' pages
//! in dispatch order; `Stats` is summed over them.
//!
//! Where the shards are is not the node's business: it reaches them
//! through a [`ShardSet`] (how many shards there are, which this process
//! serves now, a shard's store to read, where a shard's changes go, health,
//! damage, shutdown). Standalone that is [`LocalShards`]: every shard is
//! opened at start and kept, its changes go to its store, and health and
//! damage are the worst over the stores. In cluster mode the wiring gives
//! the node the cluster's shards instead, which move between nodes as the
//! consumer group says.
//!
//! On disk, one shard is the data dir itself (as every earlier release laid
//! it out); several are `shard-0`, `shard-1`, ... inside it. Each store
//! records which shard of how many it is when first opened, and a start
//! with another count is refused: ids would hash to other shards.

mod backup;
mod local;
mod picture;
mod shard_set;

pub(crate) use backup::Backup;
pub(crate) use local::LocalShards;
pub(crate) use picture::{Move, Picture, Role, ShardCopy};
pub(crate) use shard_set::ShardSet;

use std::{
    path::{Path, PathBuf},
    sync::Arc,
};

use futures_util::future;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::{
    command::{Answer, Counts, DispatchKey, Intent, NewMessage, Place, Row},
    message::{
        Forecast, ListQuery, MessageId, PageToken, PendingMessage, PendingPage, Scheduled, ScheduledMessage,
        Scope, UnixMillis, Window, merge_pages, shard_of,
    },
    shard::ShardConfig,
    store::{LIST_KEY_BYTES, ListFilter, Reader, StoreError, StoreHealth, StorePage},
};

/// What a node is built from.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    pub data_dir: PathBuf,
    /// How many shards the ids are spread over (in cluster mode, the
    /// schedule log's partitions).
    pub shards: u32,
    /// What each shard is built from; its store's path, shard and backlog
    /// cap are set per shard.
    pub shard: ShardConfig,
    /// The node's backlog cap, split evenly over its shards.
    pub max_pending: Option<u64>,
}

impl NodeConfig {
    /// Where each shard's store lives, by shard, after checking that the
    /// data dir holds no store of another layout.
    pub fn shard_paths(&self) -> Result<Vec<PathBuf>, NodeError> {
        shard_paths(&self.data_dir, self.shards)
    }

    /// Each shard's part of the backlog cap.
    pub fn max_pending_per_shard(&self) -> Option<u64> {
        self.max_pending.map(|cap| cap.div_ceil(u64::from(self.shards)))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error(
        "the data dir {} holds {found} shard(s) but hourglass was started with --shards {asked}: \
         each message id belongs to one shard by its hash, so the count is fixed once a data dir is \
         used. Start with --shards {found}, or move the data dir aside to start empty",
        dir.display()
    )]
    ShardCount { dir: PathBuf, found: u32, asked: u32 },
    #[error("reading the data dir {}: {source}", dir.display())]
    Unreadable { dir: PathBuf, source: std::io::Error },
    #[error("opening the store in {}: {source}", path.display())]
    Open { path: PathBuf, source: StoreError },
}

/// The shards of one process; requests reach each through [`Node`]'s
/// methods, which route by id.
pub struct Node {
    /// The shards this process serves.
    shards: Arc<dyn ShardSet>,
    max_pending: Option<u64>,
}

/// Counts and the oldest overdue message, over every shard.
#[derive(Clone, Debug, Default)]
pub struct NodeStats {
    pub counts: Counts,
    pub oldest_overdue: Option<crate::message::PendingMessage>,
    /// What dispatch policies hold back, over the shards.
    pub held_back: Vec<crate::message::HeldBack>,
}

impl Node {
    /// The node over `shards` (standalone, [`LocalShards`]), which share
    /// the backlog cap `max_pending`.
    pub fn new(shards: Arc<dyn ShardSet>, max_pending: Option<u64>) -> Node {
        Node { shards, max_pending }
    }

    /// The shard `id` belongs to.
    pub fn shard_of(&self, id: &MessageId) -> usize {
        shard_of(id, self.shard_count() as u32) as usize
    }

    /// How many shards the ids are spread over (in a cluster, over every
    /// node).
    pub fn shard_count(&self) -> usize {
        self.shards.count()
    }

    /// Whether this node serves `shard` now.
    pub fn owns(&self, shard: usize) -> bool {
        self.shards.serves(shard)
    }

    /// The reader of `id`'s shard, once this node serves it (waiting a
    /// bounded time while it moves).
    pub(crate) async fn reader_of(&self, id: &MessageId) -> Result<Reader, StoreError> {
        self.shards.reader(self.shard_of(id)).await
    }

    /// The readers of the shards on this node, with their shard numbers,
    /// in shard order.
    pub(crate) fn readers(&self) -> Vec<(u32, Reader)> {
        self.shards.readers()
    }

    /// Writes rows of tables to one shard or every shard
    /// ([`ShardSet::write_rows`]).
    pub(crate) async fn write_rows(&self, to: Place, rows: Vec<Row>) -> Result<(), StoreError> {
        self.shards.write_rows(to, rows).await
    }

    /// The dispatch policies in force, as the shard served here that has
    /// applied the latest change has them (every shard comes to the same;
    /// in a cluster one may lag its log by a moment). None when no shard
    /// is served here.
    pub fn policies(&self) -> Option<std::sync::Arc<crate::policy::Table>> {
        self.shards
            .readers()
            .iter()
            .map(|(_, store)| std::sync::Arc::clone(&store.policies().borrow()))
            .max_by_key(|table| table.latest_change())
    }

    /// Makes a change in the message's shard: parks it (once durable),
    /// cancels or moves it.
    pub async fn change(&self, intent: Intent) -> Result<Answer, StoreError> {
        self.shards.change(self.shard_of(intent.id()), intent).await
    }

    /// Parks many messages: each shard's part in one call to it
    /// ([`ShardSet::schedule_batch`]; standalone one atomic, durable write),
    /// the shards at once. Each message gets its own answer, in order. A
    /// shard whose write fails answers its messages with the error; the call
    /// fails as a whole when every write failed (then nothing of it was
    /// stored).
    pub async fn schedule_batch(
        &self,
        msgs: Vec<NewMessage>,
    ) -> Result<Vec<Result<Scheduled, StoreError>>, StoreError> {
        // One shard: its answers are the batch's.
        if self.shard_count() == 1 && !msgs.is_empty() {
            return self.shards.schedule_batch(0, msgs).await;
        }
        let (groups, total) = self.by_shard(msgs);
        let writes = groups.into_iter().enumerate().filter(|(_, (slots, _))| !slots.is_empty()).map(
            |(shard, (slots, msgs))| async move { (slots, self.shards.schedule_batch(shard, msgs).await) },
        );
        let (mut failed, mut written) = (None, false);
        let mut parts = Vec::new();
        for (slots, outcome) in future::join_all(writes).await {
            let answers = match outcome {
                Ok(answers) => {
                    written = true;
                    answers
                }
                Err(e) => {
                    let answers = slots.iter().map(|_| Err(e.clone())).collect();
                    failed = Some(e);
                    answers
                }
            };
            parts.push((slots, answers));
        }
        match failed {
            Some(e) if !written => Err(e),
            _ => Ok(in_order(total, parts)),
        }
    }

    /// `msgs` by shard, each with its places in `msgs`; and how many.
    #[allow(clippy::type_complexity)]
    fn by_shard(&self, msgs: Vec<NewMessage>) -> (Vec<(Vec<usize>, Vec<NewMessage>)>, usize) {
        let total = msgs.len();
        let mut groups: Vec<(Vec<usize>, Vec<NewMessage>)> =
            (0..self.shard_count()).map(|_| Default::default()).collect();
        for (slot, msg) in msgs.into_iter().enumerate() {
            let group = &mut groups[self.shard_of(msg.id.id())];
            group.0.push(slot);
            group.1.push(msg);
        }
        (groups, total)
    }

    pub async fn get(&self, scope: Scope, id: MessageId) -> Result<Option<ScheduledMessage>, StoreError> {
        self.reader_of(&id).await?.get(scope, id).await
    }

    /// A page of the pending messages `scope` sees, in dispatch order
    /// across shards (ties in dispatch time go by shard, then acceptance).
    /// Each shard looks at no more than its part of `examine` entries.
    pub async fn list_pending(
        &self,
        scope: Scope,
        query: ListQuery,
        limit: usize,
        examine: usize,
    ) -> Result<PendingPage, StoreError> {
        let stores = self.readers();
        let examine = (examine / stores.len().max(1)).max(1);
        let from = DispatchKey { at: query.from.unwrap_or_default(), seq: 0 };
        let reads = stores.iter().map(|(shard, store)| {
            let filter = ListFilter {
                topic: query.topic.clone(),
                selector: query.selector.clone(),
                from: query.page_token.map_or(from, |token| start_in(*shard, token).max(from)),
                to: query.to,
                limit,
                examine,
            };
            store.list_pending(scope.clone(), filter)
        });
        let pages = future::try_join_all(reads).await?;
        let shards = stores.iter().map(|(shard, _)| *shard);
        Ok(merge_shard_pages(shards.zip(pages).collect(), limit))
    }

    /// The forecast of what `scope` sees, over the shards (each walks at
    /// most `examine` due entries).
    pub async fn forecast(
        &self,
        scope: Scope,
        window: Window,
        topic: Option<String>,
        examine: usize,
    ) -> Result<Forecast, StoreError> {
        let stores = self.readers();
        let reads = stores.iter().map(|(_, s)| s.forecast(scope.clone(), window, topic.clone(), examine));
        let mut forecast = Forecast::new(window);
        for shard in future::try_join_all(reads).await? {
            forecast.merge(shard);
        }
        Ok(forecast)
    }

    /// The copies of shards this node keeps, and its latest moves.
    pub async fn picture(&self) -> Picture {
        self.shards.picture().await
    }

    /// Counts `scope` sees and its oldest overdue message, over the shards.
    pub async fn stats(&self, scope: Scope, now: UnixMillis) -> Result<NodeStats, StoreError> {
        let stores = self.readers();
        let all = future::try_join_all(stores.iter().map(|(_, s)| s.stats(scope.clone(), now))).await?;
        let mut stats = NodeStats::default();
        for (_, store) in &stores {
            crate::message::HeldBack::merge(&mut stats.held_back, store.held_back());
        }
        for shard in all {
            stats.counts.add(&shard.counts);
            if let Some(m) = shard.oldest_overdue
                && stats.oldest_overdue.as_ref().is_none_or(|o| m.dispatch_at < o.dispatch_at)
            {
                stats.oldest_overdue = Some(m);
            }
        }
        Ok(stats)
    }

    /// Messages the dispatchers hold for producing right now.
    pub fn dispatching(&self) -> usize {
        self.readers().iter().map(|(_, s)| s.dispatching()).sum()
    }

    /// Bytes the stores take on disk and in memtables.
    pub async fn size_bytes(&self) -> Result<u64, StoreError> {
        let stores = self.readers();
        Ok(future::try_join_all(stores.iter().map(|(_, s)| s.size_bytes())).await?.into_iter().sum())
    }

    /// The node's backlog cap, if one is set.
    pub fn max_pending(&self) -> Option<u64> {
        self.max_pending
    }

    /// Whether every shard takes new messages: the worst of their healths.
    pub fn health(&self) -> watch::Receiver<StoreHealth> {
        self.shards.health()
    }

    /// Cancelled once damage is found in any shard's store.
    pub fn damaged(&self) -> CancellationToken {
        self.shards.damaged()
    }

    /// What damage was found, and what to do about it.
    pub fn damage(&self) -> Option<String> {
        self.readers().iter().find_map(|(_, s)| s.damage())
    }

    /// Says the process is about to stop answering (see
    /// [`ShardSet::stopping`]).
    pub async fn stopping(&self) {
        self.shards.stopping().await;
    }

    /// Stops every shard: dispatchers settle what is in flight, stores
    /// commit what is queued and close.
    pub async fn shutdown(&self) {
        self.shards.shutdown().await;
    }
}

/// Where each shard's store lives, after checking the data dir holds no
/// store of another layout.
fn shard_paths(dir: &Path, shards: u32) -> Result<Vec<PathBuf>, NodeError> {
    let is_store = |path: &Path| path.join("CURRENT").exists();
    let mut found = Vec::new();
    match std::fs::read_dir(dir) {
        Ok(entries) => {
            for entry in entries {
                let entry = entry.map_err(|source| NodeError::Unreadable { dir: dir.to_owned(), source })?;
                let name = entry.file_name();
                if let Some(n) =
                    name.to_str().and_then(|n| n.strip_prefix("shard-")).and_then(|n| n.parse::<u32>().ok())
                    && is_store(&entry.path())
                {
                    found.push(n);
                }
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => return Err(NodeError::Unreadable { dir: dir.to_owned(), source }),
    }
    let refuse = |found| Err(NodeError::ShardCount { dir: dir.to_owned(), found, asked: shards });
    let most = found.iter().max().map(|n| n + 1);
    if shards == 1 {
        return match most {
            Some(n) => refuse(n),
            None => Ok(vec![dir.to_owned()]),
        };
    }
    if is_store(dir) {
        return refuse(1);
    }
    if let Some(n) = most.filter(|n| *n > shards) {
        return refuse(n);
    }
    Ok((0..shards).map(|i| shard_dir(dir, i)).collect())
}

/// Where the store of `shard` lies in the data dir `dir` of more than one
/// shard.
fn shard_dir(dir: &Path, shard: u32) -> PathBuf {
    dir.join(format!("shard-{shard}"))
}

/// Where `shard` goes on after `token`, in the order (dispatch time, shard,
/// acceptance) that pages follow.
fn start_in(shard: u32, token: PageToken) -> DispatchKey {
    match shard.cmp(&token.shard) {
        std::cmp::Ordering::Equal => DispatchKey { at: token.dispatch_at, seq: token.seq },
        std::cmp::Ordering::Greater => DispatchKey { at: token.dispatch_at, seq: 0 },
        std::cmp::Ordering::Less => DispatchKey::after(token.dispatch_at),
    }
}

/// The shards' pages as one, in (dispatch time, shard, acceptance) order
/// (see [`merge_pages`]): at most `limit` messages and about
/// [`LIST_KEY_BYTES`] of keys.
fn merge_shard_pages(pages: Vec<(u32, StorePage)>, limit: usize) -> PendingPage {
    let position = |shard: u32, key: DispatchKey| PageToken { dispatch_at: key.at, shard, seq: key.seq };
    let pages = pages
        .into_iter()
        .map(|(shard, page)| {
            let messages = page.messages.into_iter().map(|(key, m)| (position(shard, key), m)).collect();
            (messages, page.next.map(|key| position(shard, key)))
        })
        .collect();
    let (messages, next) =
        merge_pages(pages, limit, LIST_KEY_BYTES, |m: &PendingMessage| m.key.as_ref().map_or(0, Vec::len));
    let (positions, messages) = messages.into_iter().unzip();
    PendingPage { messages, positions, next }
}

/// The answers of each shard's part put back at their messages' places.
#[allow(clippy::type_complexity)]
fn in_order(
    total: usize,
    parts: Vec<(Vec<usize>, Vec<Result<Scheduled, StoreError>>)>,
) -> Vec<Result<Scheduled, StoreError>> {
    let mut results: Vec<Option<Result<Scheduled, StoreError>>> = (0..total).map(|_| None).collect();
    for (slots, answers) in parts {
        for (slot, answer) in slots.into_iter().zip(answers) {
            results[slot] = Some(answer);
        }
    }
    results.into_iter().map(|r| r.expect("every message is answered by its shard")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{PendingMessage, Tenant, murmur2};

    /// Kafka's `UtilsTest.testMurmur2`: the Java client's hash of a key.
    #[test]
    fn murmur2_is_the_java_clients() {
        let cases: [(&[u8], i32); 7] = [
            (b"21", -973_932_308),
            (b"foobar", -790_332_482),
            (b"a-little-bit-long-string", -985_981_536),
            (b"a-little-bit-longer-string", -1_486_304_829),
            (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58_897_971),
            (b"abc", 479_470_107),
            (b"", 275_646_681),
        ];
        for (key, hash) in cases {
            assert_eq!(murmur2(key), hash, "{}", String::from_utf8_lossy(key));
        }
    }

    #[test]
    fn ids_route_by_their_text_whatever_their_tenant() {
        let shared = MessageId::parse("order-42").unwrap();
        let tenant = MessageId::parse_in(Some(&Tenant::parse("acme").unwrap()), "order-42").unwrap();
        assert_ne!(shared, tenant);
        for shards in [1, 2, 3, 8, 256] {
            let expected = (murmur2(b"order-42") as u32 & 0x7fff_ffff) % shards;
            assert_eq!(shard_of(&shared, shards), expected);
            assert_eq!(shard_of(&tenant, shards), expected, "a tenant's id lives beside the shared one");
        }
        assert_eq!(shard_of(&shared, 1), 0);
    }

    #[test]
    fn ids_spread_over_the_shards() {
        let mut counts = [0u32; 4];
        for i in 0..4_000 {
            counts[shard_of(&MessageId::parse(&format!("m{i}")).unwrap(), 4) as usize] += 1;
        }
        assert!(counts.iter().all(|c| (800..1_200).contains(c)), "{counts:?}");
    }

    fn pending(id: &str, at: u64, key: Option<usize>) -> PendingMessage {
        PendingMessage {
            id: MessageId::parse(id).unwrap(),
            topic: "t".into(),
            key: key.map(|n| vec![b'k'; n]),
            partition: None,
            value_bytes: 1,
            due: UnixMillis(at),
            dispatch_at: UnixMillis(at),
            scheduled_at: UnixMillis(0),
            attempts: 0,
            last_error: None,
            labels: Default::default(),
            deadline: None,
            dead_letter_topic: None,
        }
    }

    fn page(entries: &[(&str, u64, u64)], next: Option<(u64, u64)>) -> StorePage {
        StorePage {
            messages: entries
                .iter()
                .map(|(id, at, seq)| (DispatchKey { at: UnixMillis(*at), seq: *seq }, pending(id, *at, None)))
                .collect(),
            next: next.map(|(at, seq)| DispatchKey { at: UnixMillis(at), seq }),
        }
    }

    fn ids(page: &PendingPage) -> Vec<&str> {
        page.messages.iter().map(|m| m.id.as_str()).collect()
    }

    #[test]
    fn pages_merge_in_dispatch_order_then_shard() {
        let merged = merge_shard_pages(
            vec![
                (0, page(&[("a", 10, 0), ("c", 30, 1)], None)),
                (1, page(&[("b", 10, 5), ("d", 40, 0)], None)),
            ],
            10,
        );
        assert_eq!(ids(&merged), ["a", "b", "c", "d"], "a tie in time goes by shard");
        assert_eq!(merged.next, None, "every shard read to its end");

        let merged = merge_shard_pages(
            vec![
                (0, page(&[("a", 10, 0), ("c", 30, 1)], None)),
                (1, page(&[("b", 10, 5), ("d", 40, 0)], None)),
            ],
            3,
        );
        assert_eq!(ids(&merged), ["a", "b", "c"]);
        assert_eq!(merged.next, Some(PageToken { dispatch_at: UnixMillis(40), shard: 1, seq: 0 }), "at d");
    }

    #[test]
    fn a_merged_page_stops_where_the_first_shard_stopped() {
        // Shard 0 looked at its limit of entries and stopped before 25: what
        // shard 1 has from 25 on may come after shard 0's next entries.
        let merged = merge_shard_pages(
            vec![(0, page(&[("a", 10, 0)], Some((25, 3)))), (1, page(&[("b", 20, 0), ("z", 90, 0)], None))],
            10,
        );
        assert_eq!(ids(&merged), ["a", "b"]);
        assert_eq!(merged.next, Some(PageToken { dispatch_at: UnixMillis(25), shard: 0, seq: 3 }));
    }

    #[test]
    fn a_merged_page_holds_about_a_page_of_keys() {
        let big = LIST_KEY_BYTES / 2 + 1;
        let mut shard0 = page(&[], None);
        let mut shard1 = page(&[], None);
        for (i, (shard, at)) in [(&mut shard0, 10), (&mut shard1, 20)].into_iter().enumerate() {
            shard
                .messages
                .push((DispatchKey { at: UnixMillis(at), seq: 0 }, pending(&format!("k{i}"), at, Some(big))));
        }
        shard1.messages.push((DispatchKey { at: UnixMillis(30), seq: 0 }, pending("k2", 30, Some(big))));
        let merged = merge_shard_pages(vec![(0, shard0), (1, shard1)], 100);
        assert_eq!(ids(&merged), ["k0", "k1"]);
        assert_eq!(merged.next, Some(PageToken { dispatch_at: UnixMillis(30), shard: 1, seq: 0 }));
    }

    #[test]
    fn each_shard_goes_on_after_the_token() {
        let token = PageToken { dispatch_at: UnixMillis(50), shard: 1, seq: 7 };
        assert_eq!(start_in(0, token), DispatchKey { at: UnixMillis(51), seq: 0 }, "shard 0 listed its 50s");
        assert_eq!(start_in(1, token), DispatchKey { at: UnixMillis(50), seq: 7 });
        assert_eq!(start_in(2, token), DispatchKey { at: UnixMillis(50), seq: 0 }, "shard 2 not yet at 50");
    }

    #[test]
    fn a_data_dir_of_another_shard_count_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        assert_eq!(shard_paths(root, 1).unwrap(), [root.to_owned()], "one shard: the data dir itself");
        assert_eq!(
            shard_paths(&root.join("new"), 2).unwrap(),
            [root.join("new/shard-0"), root.join("new/shard-1")]
        );
        // A single store, as every earlier release made it.
        std::fs::write(root.join("CURRENT"), "MANIFEST-000001\n").unwrap();
        let err = shard_paths(root, 4).unwrap_err();
        assert!(matches!(err, NodeError::ShardCount { found: 1, asked: 4, .. }), "{err}");
        assert!(err.to_string().contains("--shards 1"), "{err}");
        // Four shards.
        let four = root.join("four");
        for i in 0..4 {
            std::fs::create_dir_all(four.join(format!("shard-{i}"))).unwrap();
            std::fs::write(four.join(format!("shard-{i}/CURRENT")), "MANIFEST-000001\n").unwrap();
        }
        assert!(matches!(shard_paths(&four, 1), Err(NodeError::ShardCount { found: 4, asked: 1, .. })));
        assert!(matches!(shard_paths(&four, 2), Err(NodeError::ShardCount { found: 4, asked: 2, .. })));
        assert_eq!(shard_paths(&four, 4).unwrap().len(), 4);
    }
}
