#!/usr/bin/env bash
# Runs a local 3-node hourglass cluster (docs/CLUSTER.md) in front of a
# local Kafka-protocol broker, for trying it out:
#   - tansu on 127.0.0.1:9092, data in .local/; topic "reminders"
#   - nodes 1, 2, 3: gRPC on 127.0.0.1:50051, :50052, :50053; metrics on
#     :9464, :9465, :9466; data in .local/node-N; logs in .local/node-N.log
# Any node answers any request. Kill one (kill -9 $(cat .local/node-2.pid))
# and its shards move to the others; start it again with this script's
# line for it, or run the script again. Installs what is missing first.
# Ctrl-C stops everything. HOURGLASS_LOCAL_NODES sets the count (default 3).
set -euo pipefail
tansu_pid=
pids=()
stop() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  [ -z "$tansu_pid" ] || { kill "$tansu_pid" 2>/dev/null; wait "$tansu_pid" 2>/dev/null || true; }
}
trap stop EXIT
source "$(dirname "$0")/broker.sh"

nodes="${HOURGLASS_LOCAL_NODES:-3}"
for i in $(seq "$nodes"); do
  grpc="127.0.0.1:$((50050 + i))"
  HOURGLASS_LOG="${HOURGLASS_LOG:-info,librdkafka=warn}" "$hourglass" serve --kafka-brokers "$broker" \
    --cluster true --data-dir "$state/node-$i" --listen "$grpc" --metrics-listen "127.0.0.1:$((9463 + i))" \
    "$@" >>"$state/node-$i.log" 2>&1 &
  pids+=("$!")
  echo "$!" >"$state/node-$i.pid"
  echo "cluster.sh: node $i on $grpc (log: $state/node-$i.log)"
done

# Whether the node whose metrics are on port $1 owns shards.
owns_shards() {
  (exec 3<>"/dev/tcp/127.0.0.1/$1" && printf 'GET /metrics HTTP/1.0\r\n\r\n' >&3 &&
    grep -q '^hourglass_cluster_shards_owned [1-9]' <&3) 2>/dev/null
}
# Ready once every node serves (has taken its first shards).
for i in $(seq "$nodes"); do
  for _ in $(seq 600); do
    owns_shards $((9463 + i)) && break
    kill -0 "${pids[$((i - 1))]}" 2>/dev/null || { echo "cluster.sh: node $i exited; see $state/node-$i.log" >&2; exit 1; }
    sleep 0.2
  done
done
echo "cluster.sh: $nodes nodes serving; try"
echo "  grpcurl -plaintext -d '{\"message\": {\"topic\": \"$topic\", \"value\": \"aGk=\"}, \"delay\": \"5s\"}' 127.0.0.1:50052 hourglass.v1.Scheduler/Schedule"
echo "cluster.sh: Ctrl-C to stop"
wait
