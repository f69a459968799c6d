#!/usr/bin/env bash
# Runs a local hourglass cluster (docs/CLUSTER.md) in front of a local
# Kafka-protocol broker, for trying it out:
#   - tansu on 127.0.0.1:9092, data in .local/; topics "reminders", "orders" and "dead-letters"
#   - nodes 1, 2, 3: gRPC on 127.0.0.1:50051, :50052, :50053; metrics on
#     :9464, :9465, :9466; data in .local/node-N; logs in .local/node-N.log;
#     pids in .local/node-N.pid
#   - the cluster key every node seals its records with: .local/cluster.key,
#     made on the first start (openssl rand -hex 32)
# Any node answers any request.
#
#   bash deploy/local/cluster.sh [FLAGS]     start the broker and the nodes (FLAGS go to
#                                            every node's hourglass serve); Ctrl-C stops them
#   bash deploy/local/cluster.sh restart N   (from another terminal) start node N again
#   bash deploy/local/cluster.sh stop        stop a cluster started elsewhere
#
# Kill a node (kill -9 $(cat .local/node-2.pid)) and its shards move to the
# others; this script says so, keeps the rest running, and `restart 2` brings
# it back with the binary and flags the cluster started with. Ctrl-C, SIGTERM
# or SIGHUP stops the nodes, then the broker, and exits 0.
# HOURGLASS_LOCAL_NODES sets the count (default 3). Installs what is missing
# and builds first.
set -euo pipefail
command="${1:-start}"
case "$command" in
  start | restart | stop) [ "$#" -eq 0 ] || shift ;;
  -*) command=start ;;
  *)
    echo "usage: $0 [start] [hourglass serve flags...] | restart N | stop" >&2
    exit 2
    ;;
esac
source "$(dirname "$0")/broker.sh"

supervisor="$state/cluster.pid"
# What a running cluster was started with, for `restart`.
started_with="$state/cluster.env"
grpc_of() { echo "127.0.0.1:$((50050 + $1))"; }
metrics_of() { echo "127.0.0.1:$((9463 + $1))"; }
pid_of() { cat "$state/node-$1.pid" 2>/dev/null || true; }
# Whether node $1's pid file names a live node.
node_alive() {
  local pid
  pid="$(pid_of "$1")"
  [ -n "$pid" ] && alive "$pid" "--data-dir $state/node-$1 "
}
running() { [ -f "$supervisor" ] && alive "$(cat "$supervisor")" cluster.sh; }

# Whether node $1 owns shards (its metrics say so).
owns_shards() {
  local metrics
  metrics="$(metrics_of "$1")"
  (exec 3<>"/dev/tcp/${metrics%:*}/${metrics#*:}" && printf 'GET /metrics HTTP/1.0\r\n\r\n' >&3 &&
    grep -q '^hourglass_cluster_shards_owned [1-9]' <&3) 2>/dev/null
}

# Starts node $1 in a session of its own (a Ctrl-C reaches this script
# alone, which stops the nodes before the broker), with the flags of
# $node_args. A quiet subshell waits for it and writes how it ended to
# exit-PID, so that whoever started it, its end is known, and no shell
# prints a job notice of its own.
start_node() {
  local i="$1"
  ports_free "$(grpc_of "$i")" "$(metrics_of "$i")"
  rm -f "$state/node-$i.pid"
  (
    HOURGLASS_LOG="${HOURGLASS_LOG:-info,librdkafka=warn}" setsid "$hourglass" serve \
      --kafka-brokers "$broker" --cluster --cluster-key-file "$state/cluster.key" --data-dir "$state/node-$i" \
      --listen "$(grpc_of "$i")" --metrics-listen "$(metrics_of "$i")" "${node_args[@]}" \
      >>"$state/node-$i.log" 2>&1 </dev/null &
    pid=$!
    echo "$pid" >"$state/node-$i.pid.new"
    mv "$state/node-$i.pid.new" "$state/node-$i.pid"
    status=0
    wait "$pid" || status=$?
    echo "$status" >"$state/exit-$pid"
  ) </dev/null >/dev/null 2>&1 &
  for _ in $(seq 100); do
    [ -s "$state/node-$i.pid" ] && break
    sleep 0.05
  done
  say "node $i on $(grpc_of "$i") (pid $(pid_of "$i"), log: $state/node-$i.log)"
}

# How the node of pid $1 ended, from its exit file (waiting up to 5 s for
# it: on a busy machine the subshell that writes it may be slow to run).
how_it_ended() {
  local status=""
  for _ in $(seq 100); do
    status="$(cat "$state/exit-$1" 2>/dev/null || true)"
    [ -n "$status" ] && break
    sleep 0.05
  done
  if [ -z "$status" ]; then
    echo "exited"
  elif [ "$status" -gt 128 ]; then
    echo "was killed by signal $((status - 128))"
  else
    echo "exited with status $status"
  fi
}

# Waits until node $1 owns shards; fails, with its log's tail, if it exits.
await_node() {
  local i="$1"
  for _ in $(seq 600); do
    owns_shards "$i" && return 0
    # Alive at all, not "alive as hourglass": between its fork and its
    # exec the process still runs this script's command line.
    pid="$(pid_of "$i")"
    if [ -z "$pid" ] || ! alive "$pid"; then
      echo "$script: node $i (pid $pid) $(how_it_ended "$pid") while starting; the end of $state/node-$i.log:" >&2
      tail -5 "$state/node-$i.log" >&2
      return 1
    fi
    sleep 0.2
  done
  echo "$script: node $i took no shard within 2 minutes; see $state/node-$i.log" >&2
  return 1
}

case "$command" in
  stop)
    running || fail "no cluster is running (no live $supervisor)"
    pid="$(cat "$supervisor")"
    say "stopping the cluster (pid $pid)"
    kill -TERM "$pid"
    while alive "$pid"; do sleep 0.2; done
    exit 0
    ;;
  restart)
    running || fail "no cluster is running; start one with: bash deploy/local/cluster.sh"
    # The binary, node count and flags the cluster started with.
    source "$started_with"
    i="${1:-}"
    [[ "$i" =~ ^[0-9]+$ ]] && [ "$i" -ge 1 ] && [ "$i" -le "$nodes" ] ||
      fail "usage: $0 restart N, N a node from 1 to $nodes"
    node_alive "$i" && fail "node $i is running (pid $(pid_of "$i")); stop it first (kill $(pid_of "$i"))"
    start_node "$i"
    await_node "$i" || exit 1
    say "node $i serves again"
    exit 0
    ;;
esac

# start
running && fail "a cluster is already running (pid $(cat "$supervisor")); stop it with Ctrl-C in its terminal, or: bash deploy/local/cluster.sh stop"
build_hourglass
nodes="${HOURGLASS_LOCAL_NODES:-3}"
node_args=("$@")
for i in $(seq "$nodes"); do ports_free "$(grpc_of "$i")" "$(metrics_of "$i")"; done
# The key the nodes share: made once, readable by this user alone.
if [ ! -s "$state/cluster.key" ]; then
  mkdir -p "$state"
  (umask 077 && openssl rand -hex 32 >"$state/cluster.key")
fi
# Pid files of an earlier run name processes long gone, or others since.
rm -f "$state"/node-*.pid "$state"/exit-*
{
  printf 'hourglass=%q\nnodes=%q\nnode_args=(' "$hourglass" "$nodes"
  [ "${#node_args[@]}" -eq 0 ] || printf '%q ' "${node_args[@]}"
  printf ')\n'
} >"$started_with"

# Stops the nodes, then the broker; exits with $1 (0 by default). Runs
# once, whatever ends the script.
stopped=
stop() {
  [ -z "$stopped" ] || return 0
  stopped=1
  trap '' INT TERM HUP
  # The watch loop's pause, if a signal came during it.
  [ -z "${pause:-}" ] || kill "$pause" 2>/dev/null || true
  say "stopping the nodes"
  for i in $(seq "$nodes"); do
    ! node_alive "$i" || kill -TERM "$(pid_of "$i")" 2>/dev/null || true
  done
  for i in $(seq "$nodes"); do
    ! node_alive "$i" || stop_pid "$(pid_of "$i")" "node $i" || true
  done
  stop_broker
  rm -f "$supervisor"
  say "stopped"
  exit "${1:-0}"
}
trap stop INT TERM HUP
trap 'stop 1' EXIT
echo "$$" >"$supervisor"

start_broker
for i in $(seq "$nodes"); do start_node "$i"; done
for i in $(seq "$nodes"); do
  await_node "$i" || stop 1
done
say "ready: $nodes nodes serving; try"
say "  grpcurl -plaintext -d '{\"message\": {\"topic\": \"reminders\", \"value\": \"aGk=\"}, \"delay\": \"5s\"}' 127.0.0.1:50052 hourglass.v1.Scheduler/Schedule"
say "Ctrl-C to stop"

# Watches the nodes: a node that exits is reported once, with how to start
# it again; the others go on. A node started again by `restart` is watched
# from its new pid on.
declare -A reported=()
while true; do
  for i in $(seq "$nodes"); do
    pid="$(pid_of "$i")"
    [ -n "$pid" ] && [ -z "${reported[$pid]:-}" ] || continue
    alive "$pid" && continue
    reported[$pid]=1
    echo "$script: NODE $i (pid $pid) $(how_it_ended "$pid"); the others go on. Its log: $state/node-$i.log." >&2
    echo "$script: start it again with: bash deploy/local/cluster.sh restart $i" >&2
  done
  sleep 1 &
  pause=$!
  wait "$pause" || true
done
