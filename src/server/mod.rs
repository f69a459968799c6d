//! Wiring: builds the producer, the topic catalog, the node (its shards:
//! standalone opened here, in cluster mode the cluster's, which also routes
//! the calls) and the gRPC and metrics servers from a [`Config`]
//! ([`settings`] turns it into what each is built from), runs them until
//! `shutdown`, then drains in order. TLS ([`crate::tls`]) and the token check
//! ([`crate::auth`]) are put in front of the gRPC services here; health
//! stays outside the token check.
//!
//! Shutdown order: health turns NOT_SERVING; the gRPC server stops accepting
//! and finishes the requests in flight (their writes commit); the dispatcher
//! of each shard waits for in-flight produces and settles them; each store
//! commits what is queued, syncs the WAL and closes; the metrics endpoint
//! goes last.
//!
//! What a client can hold is bounded here and in `api`: connections
//! ([`limits::LimitedIncoming`]), calls per connection, health watches
//! ([`limits::BoundedWatch`]); HTTP/2 keepalive closes connections whose
//! peer is gone.

mod handshake;
mod limits;
pub mod settings;

use std::{sync::Arc, time::Duration};

use anyhow::Context as _;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::{service::interceptor::InterceptedService, transport::server::TcpIncoming};

use crate::{
    admin::PolicyService,
    api::{ApiConfig, Backups, Budget, Local, SchedulerApi, StreamLimits},
    auth::{self, Authenticator},
    clock::{Clock, SystemClock},
    cluster::{Cluster, ClusterConfig, Router, SeriesRouter, Shards, Voucher, kafka::IngressFeed},
    config::Config,
    console::{self, Console},
    ingress::{self, Ingress},
    kafka::{MetadataSource, Producer, TopicCatalog},
    metrics,
    node::{LocalShards, Node, NodeConfig, ShardSet},
    otel, proto,
    scheduler::{Scheduler, SeriesCalls},
    secret,
    series::{Series, spec::Limits as SeriesLimits},
    service::Service,
    store::StoreHealth,
    tls::LiveTls,
    web::WebLayer,
};

/// The sockets the server answers on, bound by the caller (port 0 in tests).
pub struct Listeners {
    pub grpc: TcpListener,
    pub metrics: TcpListener,
    /// The console's, if it is on (`--console-listen`).
    pub console: Option<TcpListener>,
}

impl Listeners {
    pub async fn bind(config: &Config) -> anyhow::Result<Listeners> {
        let grpc = TcpListener::bind(config.listen)
            .await
            .with_context(|| format!("cannot listen for gRPC on {} (--listen)", config.listen))?;
        let metrics = TcpListener::bind(config.metrics_listen).await.with_context(|| {
            format!("cannot listen for metrics on {} (--metrics-listen)", config.metrics_listen)
        })?;
        let console =
            match config.console_listen {
                Some(addr) => Some(TcpListener::bind(addr).await.with_context(|| {
                    format!("cannot listen for the console on {addr} (--console-listen)")
                })?),
                None => None,
            };
        Ok(Listeners { grpc, metrics, console })
    }
}

/// Runs hourglass until `shutdown` is cancelled, then drains and returns.
/// It also stops, and returns an error, when the Kafka producer fails
/// fatally (a restart brings a new one) or when the store is found damaged.
pub async fn run(config: Config, listeners: Listeners, shutdown: CancellationToken) -> anyhow::Result<()> {
    run_with_clock(config, listeners, Arc::new(SystemClock), shutdown).await
}

pub async fn run_with_clock(
    config: Config,
    listeners: Listeners,
    clock: Arc<dyn Clock>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    // Before anything slow (opening the stores): a SIGHUP that comes
    // while the node starts is taken, not fatal.
    let hangups = auth::hangups();
    metrics::init();
    settings::check(&config)?;
    let tls = settings::tls(&config)?
        .map(|tls| LiveTls::load(tls, settings::GRPC_ALPN))
        .transpose()
        .context("setting up TLS (--tls-cert, --tls-key, --tls-client-ca)")?;
    let tokens_file = auth::watch(config.auth_tokens.as_deref());
    let auth = match &config.auth_tokens {
        Some(path) => Authenticator::load(path)?,
        None => Authenticator::disabled(),
    };
    let exporting = match &config.otlp_endpoint {
        Some(endpoint) => Some(otel::export_to(endpoint)?),
        None => None,
    };
    let mut kafka = settings::kafka(&config);
    secret::resolve(&mut kafka.properties)?;
    let producer = Arc::new(Producer::new(&kafka, settings::delivery(&config)).map_err(|e| {
        anyhow::anyhow!("creating the Kafka producer: {}", secret::redact(&e.to_string(), &kafka.properties))
    })?);
    producer.warm_up();
    let catalog = Arc::new(TopicCatalog::new(Arc::clone(&producer) as Arc<dyn MetadataSource>));
    let background = CancellationToken::new();
    // Whatever way this returns, the background tasks (the files followed
    // among them) stop.
    let _background = background.clone().drop_guard();
    let catalog_task = tokio::spawn(Arc::clone(&catalog).run(*config.metadata_refresh, background.clone()));

    let grpc_addr = listeners.grpc.local_addr()?;
    let node_config = settings::node(&config);
    let cluster_config = settings::cluster(&config, grpc_addr, tls.is_some())?;
    // Cluster mode: a call another node passes on is let in on its vouch.
    let auth = match &cluster_config {
        Some(cluster) => auth.vouched_by(Arc::new(Voucher::new(cluster.key.clone()))),
        None => auth,
    };
    // Before opening the shards (and joining the group): an ingress topic
    // whose grant the tokens file does not list is refused at once.
    let ingress_topics = settings::ingress(&config)?;
    for (topic, grant) in &ingress_topics {
        if let Err(why) = auth.named(grant.as_deref()) {
            anyhow::bail!("--ingress {}: {why}", topic.name);
        }
    }
    let (shards, cluster) = open_shards(&node_config, cluster_config.as_ref(), &producer, &clock).await?;
    let node = Arc::new(Node::new(Arc::clone(&shards), node_config.max_pending));
    let service = Arc::new(Service::new(
        Arc::clone(&node),
        Arc::clone(&catalog),
        settings::limits(&config),
        Arc::clone(&clock),
    ));
    // Series are driven where their shards are: standalone every shard,
    // in a cluster those this node owns now.
    let policies = Arc::new(PolicyService::new(
        Arc::clone(&node),
        Arc::clone(&catalog),
        Arc::clone(&clock),
        settings::policy_limits(&config),
    ));
    let series = Arc::new(Series::new(
        Arc::clone(&node),
        Arc::clone(&service),
        Arc::clone(&clock),
        SeriesLimits::of(&config),
        Arc::new(auth.clone()),
    ));
    let series_stop = CancellationToken::new();
    let series_task = series.start(series_stop.clone());

    let (health, health_service) = tonic_health::server::health_reporter();
    let health_service = limits::BoundedWatch::new(health_service, config.max_health_watches);
    // For liveness probes: SERVING for as long as the process answers gRPC,
    // whatever the store's state (readiness asks for "" instead).
    health.set_service_status(LIVENESS, tonic_health::ServingStatus::Serving).await;
    let health_task = tokio::spawn(report_health(node.health(), health.clone(), background.clone()));
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            // The error details errors carry (google.rpc.BadRequest), so that
            // grpcurl and other reflection clients can show them.
            .register_encoded_file_descriptor_set(tonic_types::pb::FILE_DESCRIPTOR_SET)
    };
    // Health answers everyone; reflection and the Scheduler need a token
    // when authentication is on.
    let reflection_v1 = InterceptedService::new(reflection().build_v1()?, auth.clone());
    let reflection_v1alpha = InterceptedService::new(reflection().build_v1alpha()?, auth.clone());
    let tokens_task =
        tokio::spawn(auth::keep_tokens_current(auth.clone(), tokens_file, hangups, background.clone()));

    let metrics_task = tokio::spawn(serve_metrics(listeners.metrics, background.clone()));
    tracing::info!(
        version = crate::VERSION,
        commit = crate::COMMIT,
        %grpc_addr,
        tls = tls.is_some(),
        mutual_tls = config.tls_client_ca.is_some(),
        auth = auth.is_enabled(),
        brokers = %config.kafka_brokers,
        data_dir = %config.data_dir.display(),
        shards = config.shards,
        delivery = %config.delivery,
        "hourglass is serving"
    );

    if !auth.is_enabled() && !grpc_addr.ip().is_loopback() {
        tracing::warn!(
            %grpc_addr,
            "gRPC is served beyond this machine WITHOUT tokens (--allow-unauthenticated): whoever reaches this \
             port may schedule to, read and cancel on every topic"
        );
    }
    let server = tonic::transport::Server::builder()
        .max_concurrent_streams(
            (config.max_streams_per_connection > 0).then_some(config.max_streams_per_connection),
        )
        // A peer that stops answering pings (gone without closing) is
        // dropped, with what it held.
        .http2_keepalive_interval(Some(KEEPALIVE_EVERY))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
        // A client whose deadlines are short resets streams the server has
        // not yet accepted; under load hundreds can queue on one busy
        // connection. h2's default (20) then closes that connection with
        // ENHANCE_YOUR_CALM, failing calls that were not abandoned. The
        // bound still stops a rapid-reset flood (CVE-2023-44487).
        .http2_max_pending_accept_reset_streams(Some(PENDING_RESETS_PER_CONNECTION))
        // JSON over HTTP/1.1 and gRPC-Web beside gRPC (see `web`).
        .accept_http1(true);
    let stop_accepting = CancellationToken::new();
    let api = ApiConfig {
        max_concurrent: config.max_concurrent_requests,
        stream: StreamLimits { window: config.stream_window, idle: *config.stream_idle_timeout },
        memory: Budget::new(config.max_request_memory),
    };
    // Cluster mode: a call is served here or on the node that owns its
    // shard.
    // Backups are of a standalone node's stores: a cluster's are copies of
    // its log.
    let backups = cluster
        .is_none()
        .then(|| Backups { service: Arc::clone(&service), data_dir: node_config.data_dir.clone() });
    let local: Arc<dyn Scheduler> = Arc::new(Local::new(service));
    let (scheduler, series_calls): (Arc<dyn Scheduler>, Arc<dyn SeriesCalls>) =
        match cluster.zip(cluster_config.as_ref()) {
            Some((cluster, cluster_config)) => {
                // A node that does not answer holds at most half of this
                // node's admission.
                let per_peer = config.max_concurrent_requests / 2;
                let tls = settings::peer_tls(&config, cluster_config)?;
                let router = Arc::new(Router::new(local, cluster, tls, per_peer));
                let series_router = Arc::new(SeriesRouter::new(series.clone(), Arc::clone(&router)));
                (router, series_router)
            }
            None => (local, series.clone()),
        };
    // Kafka-native schedules are calls of the scheduler's (in a cluster,
    // the router's), each with its topic's grant.
    let mut feeds = Vec::new();
    for (topic, grant) in ingress_topics {
        let feed = IngressFeed::new(&kafka, topic, INGRESS_TOPIC_TIMEOUT)?;
        feeds.push(ingress::Topic { feed: Arc::new(feed), grant });
    }
    let ingress =
        Ingress::start(feeds, shards, Arc::clone(&scheduler), auth.clone(), settings::limits(&config))
            .await?;
    let console_tls = match &listeners.console {
        Some(_) => settings::tls(&config)?.map(|files| LiveTls::load(files, &[b"http/1.1"])).transpose()?,
        None => None,
    };
    if let Some(tls) = &console_tls {
        tokio::spawn(tls.clone().follow(background.clone()));
    }
    let console_task = listeners.console.map(|listener| {
        let addr = listener.local_addr().ok();
        tracing::info!(?addr, tls = console_tls.is_some(), "the console is serving");
        if console_tls.is_none() && addr.is_some_and(|a| !a.ip().is_loopback()) {
            tracing::warn!(
                ?addr,
                "the console speaks plain HTTP beyond this machine: tokens and session cookies cross the network \
                 readable; give the server --tls-cert and --tls-key, or put a TLS proxy in front"
            );
        }
        let calls = console::Calls {
            scheduler: Arc::clone(&scheduler),
            series: Arc::clone(&series_calls),
            policies: Arc::clone(&policies),
        };
        let console = Arc::new(Console::new(
            calls,
            auth.clone(),
            Arc::clone(&clock),
            console_tls,
            console::Limits::of(&config),
        ));
        tokio::spawn(console.serve(listener, stop_accepting.clone()))
    });
    let web =
        WebLayer::new(settings::limits(&config).max_batch_request_bytes(), api.memory.clone(), auth.clone());
    let scheduler_api = SchedulerApi::new(scheduler, api);
    let series_api = scheduler_api.series(series_calls);
    let admin_api = scheduler_api.admin(policies, backups);
    let routes = server
        .layer(web)
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(InterceptedService::new(scheduler_api.into_server(), auth.clone()))
        .add_service(InterceptedService::new(series_api.into_server(), auth.clone()))
        .add_service(InterceptedService::new(admin_api.into_server(), auth.clone()));
    let incoming = limits::LimitedIncoming::new(
        // Without TCP_NODELAY, Nagle's algorithm and delayed ACKs hold back
        // small answers for up to 40 ms.
        TcpIncoming::from(listeners.grpc).with_nodelay(Some(true)).with_keepalive(Some(KEEPALIVE_EVERY)),
        config.max_connections,
    );
    let stopped = stop_accepting.clone().cancelled_owned();
    if let Some(tls) = &tls {
        tokio::spawn(tls.clone().follow(background.clone()));
    }
    let grpc = match tls {
        Some(tls) => tokio::spawn(
            routes.serve_with_incoming_shutdown(handshake::TlsIncoming::new(incoming, tls), stopped),
        ),
        None => tokio::spawn(routes.serve_with_incoming_shutdown(incoming, stopped)),
    };

    let failed = producer.failed();
    let damaged = node.damaged();
    tokio::select! {
        _ = shutdown.cancelled() => {}
        _ = failed.cancelled() => {}
        _ = damaged.cancelled() => {}
    }
    // Taken now: in cluster mode the damaged store is one the node owns,
    // and by the end of the shutdown it owns none.
    let damage_at_stop = node.damage();
    tracing::info!("shutting down: no longer serving");
    health_task.abort();
    let _ = health_task.await;
    for service in ["", SCHEDULER] {
        health.set_service_status(service, tonic_health::ServingStatus::NotServing).await;
    }
    // Where it read to is noted while the shards are still this node's,
    // and take changes.
    ingress.stop().await;
    // Said before the listener closes: a cluster's standbys then wait for
    // this node's releases rather than take its shards at its silence.
    node.stopping().await;
    stop_accepting.cancel();
    drain_within(*config.shutdown_grace, "gRPC requests", grpc).await;
    if let Some(console) = console_task {
        drain_within(*config.shutdown_grace, "console requests", console).await;
    }
    // No occurrence is parked once the shards begin to close.
    series_stop.cancel();
    let _ = series_task.await;
    node.shutdown().await;
    background.cancel();
    let _ = catalog_task.await;
    let _ = tokens_task.await;
    let _ = metrics_task.await;
    producer.flush(Duration::from_secs(1)).ok();
    if let Some(exporting) = exporting {
        exporting.shutdown().await;
    }
    if let Some(damage) = damage_at_stop.or_else(|| node.damage()) {
        anyhow::bail!(damage);
    }
    if failed.is_cancelled() {
        let reason = producer.fatal_error().unwrap_or_else(|| "no reason given".into());
        anyhow::bail!(
            "the Kafka producer failed fatally ({reason}); hourglass stopped with every undelivered message \
             still in its store: start it again to go on with a new producer"
        );
    }
    tracing::info!("shut down cleanly");
    Ok(())
}

/// The shards this node serves. Standalone, every shard, opened here. In
/// cluster mode, the cluster: the log topic is created or checked, the node
/// joins the consumer group and takes (in the background) the shards the
/// group gives it, each applying its partition to its end before its
/// dispatcher starts; the cluster is handed back as well, for the router.
async fn open_shards(
    node: &NodeConfig,
    cluster: Option<&ClusterConfig>,
    producer: &Arc<Producer>,
    clock: &Arc<dyn Clock>,
) -> anyhow::Result<(Arc<dyn ShardSet>, Option<Arc<Cluster>>)> {
    let Some(cluster) = cluster else {
        let local = LocalShards::open(node, Arc::clone(producer), Arc::clone(clock)).await?;
        return Ok((Arc::new(local), None));
    };
    let shards = Shards {
        config: node.shard.clone(),
        paths: node.shard_paths()?,
        max_pending: node.max_pending_per_shard(),
        producer: Arc::clone(producer),
        clock: Arc::clone(clock),
    };
    let cluster = Arc::new(Cluster::start(cluster, shards).await?);
    Ok((Arc::clone(&cluster) as Arc<dyn ShardSet>, Some(cluster)))
}

/// Mirrors the node's health in gRPC health, for the whole server and for
/// the Scheduler service: NOT_SERVING while a store cannot take new
/// messages (disk full, backlog cap reached), so that load balancers and
/// readiness probes send traffic elsewhere. Reads keep being answered.
async fn report_health(
    mut store: tokio::sync::watch::Receiver<StoreHealth>,
    health: tonic_health::server::HealthReporter,
    stop: CancellationToken,
) {
    use tonic_health::ServingStatus;
    loop {
        let now = store.borrow_and_update().clone();
        let status = match &now {
            StoreHealth::Ok => {
                tracing::info!("the store takes new messages: serving");
                ServingStatus::Serving
            }
            StoreHealth::AtCapacity => {
                tracing::warn!(
                    "the backlog cap (--max-pending) is reached: not serving until deliveries make room"
                );
                ServingStatus::NotServing
            }
            StoreHealth::Failing(reason) => {
                tracing::error!(%reason, "the store refuses writes: not serving until a write succeeds again");
                ServingStatus::NotServing
            }
            StoreHealth::Joining(reason) => {
                tracing::info!(%reason, "not serving until the node has taken its shards");
                ServingStatus::NotServing
            }
        };
        for service in ["", SCHEDULER] {
            health.set_service_status(service, status).await;
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            changed = store.changed() => if changed.is_err() { return },
        }
    }
}

/// How long creating or reading the metadata of an ingress topic may take.
const INGRESS_TOPIC_TIMEOUT: Duration = Duration::from_secs(30);

/// The gRPC health service name a liveness probe asks for.
pub const LIVENESS: &str = "liveness";

/// How often an idle connection is pinged, and how long a ping may go
/// unanswered before the connection is closed.
const KEEPALIVE_EVERY: Duration = Duration::from_secs(30);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);
/// Streams a client may reset before the server accepted them, per
/// connection, before the server closes it as a rapid-reset attack.
const PENDING_RESETS_PER_CONNECTION: usize = 1024;

/// The Scheduler service's name in gRPC health.
const SCHEDULER: &str =
    <proto::scheduler_server::SchedulerServer<SchedulerApi> as tonic::server::NamedService>::NAME;

async fn drain_within<T>(grace: Duration, what: &str, task: tokio::task::JoinHandle<T>) {
    let abort = task.abort_handle();
    if tokio::time::timeout(grace, task).await.is_err() {
        tracing::warn!("{what} still running after the shutdown grace; closing them");
        abort.abort();
    }
}

async fn serve_metrics(listener: TcpListener, stop: CancellationToken) {
    let app = axum::Router::new().route("/metrics", axum::routing::get(|| async { metrics::render() }));
    if let Err(e) = axum::serve(listener, app).with_graceful_shutdown(stop.cancelled_owned()).await {
        tracing::error!(error = %e, "metrics endpoint failed");
    }
}
