#!/usr/bin/env bash
# Runs hourglass in front of a local Kafka-protocol broker, for trying it out:
#   - tansu (Apache-Kafka-compatible) on 127.0.0.1:9092, data in .local/
#   - topics "reminders", "orders" and "dead-letters", 3 partitions each
#   - hourglass: gRPC on 127.0.0.1:50051, metrics on 127.0.0.1:9464, the
#     console on http://127.0.0.1:9470, store in .local/hourglass, pid in
#     .local/hourglass.pid; the hourglass command linked into ~/.cargo/bin;
#     Kafka-native schedules read from the topic "hourglass-ingress"
#     (unless --ingress, a --config file or tokens say otherwise)
# Installs what is missing and builds first. Arguments go to `hourglass
# serve`. Ctrl-C (or SIGTERM or SIGHUP to this script) stops hourglass, then
# the broker, and exits 0; if hourglass stops by itself, so does the script,
# with its exit status. See broker.sh for the environment it reads.
set -euo pipefail
source "$(dirname "$0")/broker.sh"

listen=127.0.0.1:50051
metrics=127.0.0.1:9464
console=127.0.0.1:9470
console_given=
# An ingress topic to try Kafka-native schedules with, unless the
# arguments, a config file or the environment say otherwise (or tokens are
# on: an ingress topic then needs a grant).
ingress=hourglass-ingress
[ -z "${HOURGLASS_AUTH_TOKENS:-}${HOURGLASS_INGRESS:-}${HOURGLASS_CONFIG:-}" ] || ingress=
args=("$@")
for i in "${!args[@]}"; do
  case "${args[$i]}" in
    --listen) listen="${args[$((i + 1))]:-$listen}" ;;
    --listen=*) listen="${args[$i]#--listen=}" ;;
    --metrics-listen) metrics="${args[$((i + 1))]:-$metrics}" ;;
    --metrics-listen=*) metrics="${args[$i]#--metrics-listen=}" ;;
    --console-listen) console="${args[$((i + 1))]:-$console}" console_given=1 ;;
    --console-listen=*) console="${args[$i]#--console-listen=}" console_given=1 ;;
    --auth-tokens | --auth-tokens=* | --ingress | --ingress=* | --config | --config=*) ingress= ;;
  esac
done

server_pid=
# Stops hourglass, then the broker; exits with hourglass's status (0 for a
# clean stop). Runs once, whatever ends the script.
stopped=
stop() {
  [ -z "$stopped" ] || return 0
  stopped=1
  trap '' INT TERM HUP
  local status=0
  if [ -n "$server_pid" ]; then
    say "stopping hourglass"
    stop_pid "$server_pid" hourglass || status=$?
    # SIGTERM before hourglass took its signals in hand: it had not started.
    [ "$status" -ne 143 ] || status=0
  fi
  stop_broker
  if [ "$status" -eq 0 ]; then say "stopped"; else say "hourglass exited with status $status while stopping"; fi
  exit "$status"
}
trap stop INT TERM HUP
# Any other end (an error while starting) still stops what was started.
trap 'status=$?; stop_pid "${server_pid:-0}" hourglass || true; stop_broker; exit $status' EXIT

build_hourglass
ports_free "$listen" "$metrics" "$console"
# The console on loopback, unless the arguments say where.
defaults=()
[ -n "$console_given" ] || defaults=(--console-listen "$console")
[ -z "$ingress" ] || defaults+=(--ingress "$ingress")
start_broker
# Its own session, so that Ctrl-C reaches this script, which stops it in order.
HOURGLASS_LOG="${HOURGLASS_LOG:-info,librdkafka=warn}" setsid "$hourglass" serve \
  --kafka-brokers "$broker" --data-dir "$state/hourglass" "${defaults[@]}" "$@" </dev/null &
server_pid=$!
echo "$server_pid" >"$state/hourglass.pid"
for _ in $(seq 300); do
  listening "$listen" && break
  alive "$server_pid" || break
  sleep 0.1
done
if listening "$listen" && alive "$server_pid"; then
  say "ready: hourglass on $listen (console http://$console, metrics http://$metrics/metrics), broker on $broker; Ctrl-C to stop"
fi

status=0
wait "$server_pid" || status=$?
# A signal to this script interrupts the wait and runs stop, which exits;
# here hourglass stopped by itself.
server_pid=
say "hourglass exited with status $status; see its log above"
trap - EXIT
stop_broker
exit "$status"
