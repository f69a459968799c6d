//! Prometheus metrics: every series hourglass exports, in one place.
//!
//! Names follow `hourglass_<subsystem>_<what>_<unit>`; histograms are in
//! seconds; labels are small fixed sets (method, code, kind, and the shard a
//! per-store series belongs to: at most `--shards` values), never an id or
//! a topic a client chose.

use std::sync::LazyLock;

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder, core::Collector,
};

pub static REGISTRY: LazyLock<Registry> = LazyLock::new(Registry::new);

fn register<C: Collector + Clone + 'static>(c: C) -> C {
    // Names are fixed at compile time; a clash is a bug caught by any test.
    REGISTRY.register(Box::new(c.clone())).expect("metric registered twice");
    c
}

fn counter(name: &str, help: &str) -> IntCounter {
    register(IntCounter::new(name, help).expect("valid metric"))
}

fn gauge(name: &str, help: &str) -> IntGauge {
    register(IntGauge::new(name, help).expect("valid metric"))
}

/// A gauge each shard of the node sets for itself.
fn shard_gauge(name: &str, help: &str) -> IntGaugeVec {
    register(IntGaugeVec::new(Opts::new(name, help), &["shard"]).expect("valid metric"))
}

/// The series of one shard: its store and its dispatcher.
#[derive(Clone)]
pub struct ShardMetrics {
    pub pending: IntGauge,
    pub in_flight: IntGauge,
    pub size: IntGauge,
    pub writable: IntGauge,
    pub max_pending: IntGauge,
    pub parked: IntGauge,
    /// Topics whose messages the shard's dispatcher holds back, by reason.
    pub held_stalled: IntGauge,
    pub held_refused: IntGauge,
    /// RocksDB's memory, by part: block cache, pinned, memtables, table
    /// readers.
    pub memory: [IntGauge; 4],
}

impl ShardMetrics {
    /// The series labelled `shard="<shard>"`.
    pub fn of(shard: u32) -> ShardMetrics {
        let label = shard.to_string();
        let of = |vec: &IntGaugeVec| vec.with_label_values(&[&label]);
        ShardMetrics {
            pending: of(&PENDING),
            in_flight: of(&IN_FLIGHT),
            size: of(&STORE_SIZE),
            writable: of(&STORE_WRITABLE),
            max_pending: of(&STORE_MAX_PENDING),
            parked: of(&STORE_PARKED),
            held_stalled: DISPATCH_HELD_TOPICS.with_label_values(&[&label, "stalled"]),
            held_refused: DISPATCH_HELD_TOPICS.with_label_values(&[&label, "refused"]),
            memory: ["block_cache", "pinned", "memtables", "table_readers"]
                .map(|part| STORE_MEMORY.with_label_values(&[&label, part])),
        }
    }
}

pub static SCHEDULED: LazyLock<IntCounter> =
    LazyLock::new(|| counter("hourglass_messages_scheduled_total", "Messages durably parked."));
pub static REPLACED: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "hourglass_messages_replaced_total",
        "Messages parked in place of a pending or failed one under the same id (on_conflict REPLACE); \
         counted in hourglass_messages_scheduled_total too.",
    )
});
pub static CANCELLED: LazyLock<IntCounter> =
    LazyLock::new(|| counter("hourglass_messages_cancelled_total", "Messages cancelled before delivery."));
pub static DELIVERED: LazyLock<IntCounter> = LazyLock::new(|| {
    counter("hourglass_messages_delivered_total", "Messages acknowledged by Kafka and recorded.")
});
pub static FAILED: LazyLock<IntCounter> =
    LazyLock::new(|| counter("hourglass_messages_failed_total", "Messages given up on after bounded tries."));
pub static EXPIRED: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "hourglass_messages_expired_total",
        "Messages not produced because their deadline (max_lateness) passed first.",
    )
});
pub static DEAD_LETTERED: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "hourglass_messages_dead_lettered_total",
        "Messages that failed or expired and were produced to their dead-letter topic instead.",
    )
});
pub static PURGED: LazyLock<IntCounter> = LazyLock::new(|| {
    counter("hourglass_messages_purged_total", "Settled messages forgotten after retention.")
});
pub static SERIES_OCCURRENCES: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register(
        IntCounterVec::new(
            Opts::new(
                "hourglass_series_occurrences_total",
                "Occurrences of series, by outcome: parked (an ordinary message from then on), skipped (missed \
                 while hourglass or Kafka was down, and left out by the series' policy), taken (its id was \
                 taken by another message), ungranted (not parked: the series was paused, its tenant no longer \
                 granted its topic).",
            ),
            &["outcome"],
        )
        .expect("valid metric"),
    )
});
pub static SERIES_PARK_LEAD: LazyLock<Histogram> = LazyLock::new(|| {
    register(
        Histogram::with_opts(
            HistogramOpts::new(
                "hourglass_series_park_lead_seconds",
                "How long before its due time each occurrence was parked (0: at or after it, when the series \
                 driver ran late).",
            )
            .buckets(vec![0.0, 0.05, 0.1, 0.25, 0.5, 1.0, 1.5, 2.0]),
        )
        .expect("valid metric"),
    )
});
pub static INGRESS_RECORDS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register(
        IntCounterVec::new(
            Opts::new(
                "hourglass_ingress_records_total",
                "Cluster mode: records of the ingress topics (Kafka-native schedules) read by the shards' owners, \
                 by topic and outcome (scheduled, duplicate, replaced, cancelled, refused).",
            ),
            &["topic", "outcome"],
        )
        .expect("valid metric"),
    )
});
pub static SHARDS_OWNED: LazyLock<IntGauge> = LazyLock::new(|| {
    gauge(
        "hourglass_cluster_shards_owned",
        "Cluster mode: shards (partitions of the schedule log) this node owns and dispatches.",
    )
});
pub static SHARD_MOVES: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register(
        IntCounterVec::new(
            Opts::new(
                "hourglass_cluster_shard_moves_total",
                "Cluster mode: shards taken and let go by this node.",
            ),
            &["move"],
        )
        .expect("valid metric"),
    )
});
pub static CLUSTER_RECLAIMS: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "hourglass_cluster_reclaims_total",
        "Cluster mode: shards this node claimed back after the schedule log named another owner for a \
         session timeout while the group still gave them to this node (an old claim appended again).",
    )
});
pub static STANDBYS: LazyLock<IntGauge> = LazyLock::new(|| {
    gauge(
        "hourglass_cluster_standbys",
        "Cluster mode: shards another node owns whose store this node keeps up to date (standby copies).",
    )
});
pub static PEERS_LISTENING: LazyLock<IntGauge> = LazyLock::new(|| {
    gauge(
        "hourglass_cluster_peers_listening",
        "Cluster mode: other nodes named in the routing topic whose address accepted this node's last \
         connection; should one stop listening, this node's standbys take over its shards at once.",
    )
});
pub static LOG_APPLIED_ON_ACK: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "hourglass_cluster_log_records_applied_on_ack_total",
        "Cluster mode: records an owner appended to the schedule log and applied from their acks, every \
         record before them applied, rather than once read back (also counted in \
         hourglass_cluster_log_records_applied_total).",
    )
});

pub static LOG_ACK_MISMATCHES: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "hourglass_cluster_log_ack_mismatches_total",
        "Cluster mode: records applied from their acks whose offset, read back, held another record: the \
         broker misreported where it appended. Should stay 0; the node's copy of the shard is suspect.",
    )
});

pub static LOG_APPLIED: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "hourglass_cluster_log_records_applied_total",
        "Cluster mode: records of the schedule log applied to this node's stores (owned shards and standby \
         copies).",
    )
});
pub static STALE_COPIES: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "hourglass_cluster_stale_copies_rebuilt_total",
        "Cluster mode: copies of a shard found further behind the schedule log than Kafka keeps \
         tombstones, and rebuilt from the log instead of brought up to date.",
    )
});
pub static STANDBYS_STOPPED: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "hourglass_cluster_standby_copies_stopped_total",
        "Cluster mode: standby copies whose store stopped (damage found, or its writer thread gone), \
         closed and opened again from the log offset they recorded.",
    )
});
pub static LOG_SKIPPED: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "hourglass_cluster_log_offsets_skipped_total",
        "Cluster mode: offsets of the schedule log that reading skipped (records compaction removed, \
         transaction markers).",
    )
});
pub static FORGED: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register(
        IntCounterVec::new(
            Opts::new(
                "hourglass_cluster_forged_records_total",
                "Cluster mode: records of the schedule log (read by the shard's owner) or of the routing topic \
                 (read by every node) without the cluster key's seal, refused, by topic (log, routing).",
            ),
            &["topic"],
        )
        .expect("valid metric"),
    )
});
pub static LOG_UNREADABLE: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "hourglass_cluster_log_unreadable_total",
        "Cluster mode: copies of a shard stopped at a sealed record of the schedule log this build cannot read \
         (a newer release's format, or damage). An owned copy stops the node; a standby copy is opened again \
         later, and stops at the same record.",
    )
});
pub static DELIVERED_BODIES_DROPPED: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "hourglass_delivered_bodies_dropped_total",
        "Delivered messages whose key, value and headers the store dropped once their delivery was on disk \
         (none with --keep-delivered-bodies).",
    )
});
pub static FORWARD_REFUSED: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "hourglass_cluster_forward_refused_total",
        "Cluster mode: calls not passed on to the node that owns their shard because as many calls to it as \
         a node may have unanswered (half of --max-concurrent-requests) were; answered UNAVAILABLE.",
    )
});
pub static FORWARDED: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register(
        IntCounterVec::new(
            Opts::new(
                "hourglass_cluster_forwarded_total",
                "Cluster mode: calls (or parts of batches and streams) this node sent on to the node that \
                 owns their shard, by method.",
            ),
            &["method"],
        )
        .expect("valid metric"),
    )
});
pub static PENDING: LazyLock<IntGaugeVec> =
    LazyLock::new(|| shard_gauge("hourglass_messages_pending", "Messages parked and waiting for delivery."));
pub static LATENESS: LazyLock<Histogram> = LazyLock::new(|| {
    register(
        Histogram::with_opts(
            HistogramOpts::new(
                "hourglass_dispatch_lateness_seconds",
                "Broker acknowledgement time minus due time, per delivered message.",
            )
            .buckets(vec![
                0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                300.0,
            ]),
        )
        .expect("valid metric"),
    )
});
/// Where a delivered message's lateness goes, stage by stage: `wait`,
/// from its dispatch time (its due time, or its retry's) until it was
/// handed to the producer (read, claimed, waiting for in-flight room or a
/// policy); `broker`, from then until the broker answered; `report`, from
/// the answer until the dispatcher took it in (not part of the lateness,
/// which ends at the answer, but what delays the settle). Each counts the
/// deliveries, nothing else.
pub static DISPATCH_STAGE: LazyLock<HistogramVec> = LazyLock::new(|| {
    register(
        HistogramVec::new(
            HistogramOpts::new(
                "hourglass_dispatch_stage_seconds",
                "Time a delivered message spent in each stage: wait (dispatch time to handed to the producer, \
                 in whole ms), broker (handed to answered), report (answered to taken in by the dispatcher).",
            )
            .buckets(vec![
                0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0,
            ]),
            &["stage"],
        )
        .expect("valid metric"),
    )
});
pub static STAGE_WAIT: LazyLock<Histogram> = LazyLock::new(|| DISPATCH_STAGE.with_label_values(&["wait"]));
pub static STAGE_BROKER: LazyLock<Histogram> =
    LazyLock::new(|| DISPATCH_STAGE.with_label_values(&["broker"]));
pub static STAGE_REPORT: LazyLock<Histogram> =
    LazyLock::new(|| DISPATCH_STAGE.with_label_values(&["report"]));
pub static IN_FLIGHT: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    shard_gauge("hourglass_dispatch_in_flight", "Messages handed to the producer and not yet acknowledged.")
});
pub static DISPATCH_WAKEUPS: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "hourglass_dispatch_wakeups_total",
        "Times the dispatcher woke to look for due messages: its timer, an earlier message, or a \
         delivery report. Idle, it wakes about once per second; a fast climb while idle is a busy loop.",
    )
});
pub static TRANSACTIONS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register(
        IntCounterVec::new(
            Opts::new(
                "hourglass_transactions_total",
                "Transactional delivery (--delivery exactly-once): transactions committed, aborted (their \
                 records produced again in the next one, or failed on their own), and times a shard's \
                 transactional producer was fenced (another process took its transactional id).",
            ),
            &["outcome"],
        )
        .expect("valid metric"),
    )
});
pub static TRANSACTION_SECONDS: LazyLock<Histogram> = LazyLock::new(|| {
    register(
        Histogram::with_opts(
            HistogramOpts::new(
                "hourglass_transaction_commit_seconds",
                "Transactional delivery: how long a commit took, from asking to Kafka's answer; a \
                 record's delivery is recorded only after it.",
            )
            .buckets(vec![0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0]),
        )
        .expect("valid metric"),
    )
});
pub static TRANSACTION_RECORDS: LazyLock<Histogram> = LazyLock::new(|| {
    register(
        Histogram::with_opts(
            HistogramOpts::new(
                "hourglass_transaction_records",
                "Transactional delivery: records per committed transaction (they grow with the load).",
            )
            .buckets(vec![1.0, 10.0, 100.0, 1000.0, 5000.0, 10000.0]),
        )
        .expect("valid metric"),
    )
});
pub static RECONCILE_IN_DOUBT: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "hourglass_reconcile_in_doubt_total",
        "Messages that may have been produced without being recorded (an unclean stop, a shard \
         taken over) and were looked for on their topics before they were produced again.",
    )
});
pub static RECONCILE_UNSEARCHED: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "hourglass_reconcile_unsearched_total",
        "Messages in doubt whose topic could not be read back: produced again, and those already on \
         it delivered twice.",
    )
});
pub static RECONCILE_FOUND: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "hourglass_reconcile_found_total",
        "Messages in doubt after an unclean stop that were found on their topic, and recorded as \
         delivered instead of being produced again.",
    )
});
pub static RECONCILE_READ: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "hourglass_reconcile_records_read_total",
        "Records read back from target topics after an unclean stop, looking for messages in doubt \
         (other producers' records included): the cost of reconciliation.",
    )
});
pub static RECONCILE_BESIDE: LazyLock<IntGauge> = LazyLock::new(|| {
    gauge(
        "hourglass_reconcile_searching",
        "Searches for messages in doubt after an unclean stop under way beside the dispatcher (one \
         per shard): meanwhile what is not in doubt is produced, and what is waits.",
    )
});
pub static RECONCILE_MILLISECONDS: LazyLock<IntGauge> = LazyLock::new(|| {
    gauge(
        "hourglass_reconcile_last_milliseconds",
        "How long the last reconciliation after an unclean stop took, from reading the messages in \
         doubt to knowing which reached their topic; those messages wait meanwhile (in cluster mode, \
         the whole shard does). 0 until one ran.",
    )
});
pub static PRODUCE_ERRORS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register(
        IntCounterVec::new(
            Opts::new(
                "hourglass_kafka_produce_errors_total",
                "Failed produce tries; kind=outage (broker unreachable, retried without limit) \
                 or rejected (the broker refused the message; counts toward the attempt limit).",
            ),
            &["kind"],
        )
        .expect("valid metric"),
    )
});
pub static DISPATCH_HELD_TOPICS: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    register(
        IntGaugeVec::new(
            Opts::new(
                "hourglass_dispatch_held_topics",
                "Topics whose due messages a shard holds back: reason=stalled (Kafka has not answered a \
                 produce for --stall-after) or refused (the broker refuses the topic, or it does not \
                 exist; probed with backoff).",
            ),
            &["shard", "reason"],
        )
        .expect("valid metric"),
    )
});
pub static TOPIC_POLICIES: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    register(
        IntGaugeVec::new(
            Opts::new(
                "hourglass_topic_policies",
                "Dispatch policies in force: state=paused (a topic, for one tenant or every tenant, is \
                 paused) or rate_limited.",
            ),
            &["state"],
        )
        .expect("valid metric"),
    )
});
pub static TOPIC_PAUSED_SINCE: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    register(
        IntGaugeVec::new(
            Opts::new(
                "hourglass_topic_paused_since_seconds",
                "When a paused topic was paused (Unix seconds), per topic and tenant (\"\": every tenant); \
                 gone once it is resumed.",
            ),
            &["topic", "tenant"],
        )
        .expect("valid metric"),
    )
});
pub static POLICY_DELAY: LazyLock<HistogramVec> = LazyLock::new(|| {
    register(
        HistogramVec::new(
            HistogramOpts::new(
                "hourglass_dispatch_policy_delay_seconds",
                "How long a dispatch policy held a message back before it was produced, apart from any \
                 lateness of hourglass or Kafka: reason=paused or rate_limit.",
            )
            .buckets(vec![0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0, 3600.0]),
            &["reason"],
        )
        .expect("valid metric"),
    )
});
pub static METADATA_ERRORS: LazyLock<IntCounter> =
    LazyLock::new(|| counter("hourglass_kafka_metadata_errors_total", "Failed topic metadata refreshes."));
pub static KAFKA_REACHABLE: LazyLock<IntGauge> = LazyLock::new(|| {
    gauge(
        "hourglass_kafka_reachable",
        "1 while Kafka answers; 0 from the moment librdkafka finds every broker down until one answers again.",
    )
});
pub static SCHEDULE_ITEMS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register(
        IntCounterVec::new(
            Opts::new(
                "hourglass_grpc_schedule_items_total",
                "Items of ScheduleBatch and ScheduleStream calls by method and status code.",
            ),
            &["method", "code"],
        )
        .expect("valid metric"),
    )
});
pub static GRPC_REQUESTS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register(
        IntCounterVec::new(
            Opts::new("hourglass_grpc_requests_total", "gRPC requests by method and status code."),
            &["method", "code"],
        )
        .expect("valid metric"),
    )
});
pub static GRPC_SECONDS: LazyLock<HistogramVec> = LazyLock::new(|| {
    register(
        HistogramVec::new(
            HistogramOpts::new("hourglass_grpc_request_duration_seconds", "gRPC request latency.")
                .buckets(vec![0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0]),
            &["method"],
        )
        .expect("valid metric"),
    )
});
/// Calls refused for their token before they were read (`--auth-tokens`).
pub static AUTH_REFUSED: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register(
        IntCounterVec::new(
            Opts::new(
                "hourglass_grpc_unauthenticated_total",
                "Calls refused without a valid bearer token (missing, invalid), or, in cluster mode, passed on \
                 by another node without its vouch (unvouched).",
            ),
            &["reason"],
        )
        .expect("valid metric"),
    )
});
pub static STORE_SIZE: LazyLock<IntGaugeVec> =
    LazyLock::new(|| shard_gauge("hourglass_store_size_bytes", "RocksDB SST files plus memtables."));
pub static STORE_MEMORY: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    register(
        IntGaugeVec::new(
            Opts::new(
                "hourglass_store_memory_bytes",
                "What RocksDB holds in memory for a shard's store, by part: block_cache (its content, \
                 32 MiB at most), pinned (the part of it that stays: top levels of indexes and \
                 filters), memtables (unflushed writes, 64 MiB at most), table_readers \
                 (open files, outside the cache). Updated every 10 s.",
            ),
            &["shard", "part"],
        )
        .expect("valid metric"),
    )
});
pub static STORE_WRITABLE: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    shard_gauge(
        "hourglass_store_writable",
        "1 while the store takes new messages; 0 while its writes fail or the backlog cap is reached.",
    )
});
pub static STORE_MAX_PENDING: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    shard_gauge(
        "hourglass_store_max_pending",
        "The backlog cap of the shard (its part of --max-pending); 0 when there is none.",
    )
});
pub static LOG_APPEND_SECONDS: LazyLock<Histogram> = LazyLock::new(|| {
    register(
        Histogram::with_opts(
            HistogramOpts::new(
                "hourglass_cluster_log_append_seconds",
                "Cluster mode: a change of a caller's from its record queued for the schedule log to the \
                 broker's acknowledgement (acks=all).",
            )
            .buckets(LOG_BUCKETS.to_vec()),
        )
        .expect("valid metric"),
    )
});
pub static LOG_APPLY_WAIT_SECONDS: LazyLock<Histogram> = LazyLock::new(|| {
    register(
        Histogram::with_opts(
            HistogramOpts::new(
                "hourglass_cluster_log_apply_wait_seconds",
                "Cluster mode: a change of a caller's from the broker's acknowledgement of its record to the \
                 owner's store having applied it (the owner's read of the log and the apply).",
            )
            .buckets(LOG_BUCKETS.to_vec()),
        )
        .expect("valid metric"),
    )
});
/// Buckets of the schedule log's latencies.
const LOG_BUCKETS: [f64; 12] = [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0];
pub static STORE_PARKED: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    shard_gauge(
        "hourglass_store_parked_requests",
        "Cancels and reschedules waiting for the produce of the message they touch; each waits 5 s at most.",
    )
});
pub static STORE_COMMIT_SECONDS: LazyLock<Histogram> = LazyLock::new(|| {
    register(
        Histogram::with_opts(
            HistogramOpts::new(
                "hourglass_store_commit_duration_seconds",
                "One group commit: the batch write and, when durability is sync, the fsync.",
            )
            .buckets(vec![0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5]),
        )
        .expect("valid metric"),
    )
});

/// The build that runs: always 1, its labels say which (a dashboard shows
/// the version each node runs during an upgrade).
pub static BUILD_INFO: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    let info = register(
        IntGaugeVec::new(
            Opts::new("hourglass_build_info", "The running build: version and commit (always 1)."),
            &["version", "commit"],
        )
        .expect("valid metric"),
    );
    info.with_label_values(&[env!("CARGO_PKG_VERSION"), env!("HOURGLASS_COMMIT")]).set(1);
    info
});

/// Touches every metric so that each series is exported from the start,
/// even before its first event (a shard's series, once it opens).
pub fn init() {
    LazyLock::force(&SCHEDULED);
    LazyLock::force(&REPLACED);
    LazyLock::force(&CANCELLED);
    LazyLock::force(&DELIVERED);
    LazyLock::force(&FAILED);
    LazyLock::force(&EXPIRED);
    LazyLock::force(&DEAD_LETTERED);
    LazyLock::force(&PURGED);
    LazyLock::force(&PENDING);
    LazyLock::force(&LATENESS);
    for stage in [&STAGE_WAIT, &STAGE_BROKER, &STAGE_REPORT] {
        LazyLock::force(stage);
    }
    LazyLock::force(&IN_FLIGHT);
    LazyLock::force(&DISPATCH_WAKEUPS);
    for kind in ["outage", "rejected"] {
        PRODUCE_ERRORS.with_label_values(&[kind]);
    }
    LazyLock::force(&METADATA_ERRORS);
    for state in ["paused", "rate_limited"] {
        TOPIC_POLICIES.with_label_values(&[state]);
    }
    for reason in ["paused", "rate_limit"] {
        POLICY_DELAY.with_label_values(&[reason]);
    }
    LazyLock::force(&TOPIC_PAUSED_SINCE);
    LazyLock::force(&RECONCILE_FOUND);
    for outcome in ["committed", "aborted", "fenced"] {
        TRANSACTIONS.with_label_values(&[outcome]);
    }
    LazyLock::force(&TRANSACTION_SECONDS);
    LazyLock::force(&TRANSACTION_RECORDS);
    LazyLock::force(&RECONCILE_IN_DOUBT);
    LazyLock::force(&RECONCILE_UNSEARCHED);
    LazyLock::force(&RECONCILE_READ);
    LazyLock::force(&RECONCILE_MILLISECONDS);
    LazyLock::force(&RECONCILE_BESIDE);
    KAFKA_REACHABLE.set(1);
    LazyLock::force(&SCHEDULE_ITEMS);
    LazyLock::force(&GRPC_REQUESTS);
    LazyLock::force(&GRPC_SECONDS);
    LazyLock::force(&AUTH_REFUSED);
    LazyLock::force(&STORE_SIZE);
    LazyLock::force(&STORE_COMMIT_SECONDS);
    LazyLock::force(&STORE_WRITABLE);
    LazyLock::force(&STORE_MAX_PENDING);
    LazyLock::force(&STORE_PARKED);
    LazyLock::force(&LOG_APPLIED);
    LazyLock::force(&LOG_APPLIED_ON_ACK);
    LazyLock::force(&LOG_ACK_MISMATCHES);
    LazyLock::force(&LOG_SKIPPED);
    LazyLock::force(&FORWARD_REFUSED);
    LazyLock::force(&LOG_APPEND_SECONDS);
    LazyLock::force(&LOG_APPLY_WAIT_SECONDS);
    LazyLock::force(&STALE_COPIES);
    LazyLock::force(&STANDBYS_STOPPED);
    LazyLock::force(&LOG_UNREADABLE);
    LazyLock::force(&DELIVERED_BODIES_DROPPED);
    LazyLock::force(&BUILD_INFO);
}

/// The Prometheus text exposition of every metric.
pub fn render() -> String {
    let mut out = Vec::new();
    // Encoding into a Vec cannot fail for well-formed metrics.
    let _ = TextEncoder::new().encode(&REGISTRY.gather(), &mut out);
    String::from_utf8(out).unwrap_or_default()
}
