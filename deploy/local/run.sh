#!/usr/bin/env bash
# Runs hourglass in front of a local Kafka-protocol broker, for trying it out:
#   - tansu (Apache-Kafka-compatible) on 127.0.0.1:9092, data in .local/
#   - topic "reminders" with 3 partitions (HOURGLASS_LOCAL_TOPIC to change)
#   - hourglass: gRPC on 127.0.0.1:50051, metrics on 127.0.0.1:9464
# Installs what is missing first. Ctrl-C stops both.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash deploy/local/install-deps.sh
export PATH="$HOME/.cargo/bin:$PATH"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/hourglass/target}"

cargo build --release --locked --bin hourglass
state="$(realpath -m "${HOURGLASS_LOCAL_DIR:-.local}")"
topic="${HOURGLASS_LOCAL_TOPIC:-reminders}"
broker=127.0.0.1:9092
mkdir -p "$state"

if (exec 3<>"/dev/tcp/${broker%:*}/${broker#*:}") 2>/dev/null; then
  echo "run.sh: something already listens on $broker; using it as the broker"
else
  echo "run.sh: starting tansu on $broker (log: $state/tansu.log)"
  tansu broker --listener-url "tcp://$broker" --advertised-listener-url "tcp://$broker" \
    --storage-engine "sqlite:///$state/tansu.db" >"$state/tansu.log" 2>&1 &
  tansu_pid=$!
  trap 'kill "$tansu_pid" 2>/dev/null; wait "$tansu_pid" 2>/dev/null || true' EXIT
  up=
  for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/${broker%:*}/${broker#*:}") 2>/dev/null && { up=1; break; }
    kill -0 "$tansu_pid" 2>/dev/null || break
    sleep 0.1
  done
  if [ -z "$up" ]; then
    echo "run.sh: tansu did not start; its log ($state/tansu.log) says:" >&2
    tail -5 "$state/tansu.log" >&2
    exit 1
  fi
fi

if ! tansu topic list --broker "tcp://$broker" 2>/dev/null | grep -q "\"name\":\"$topic\""; then
  tansu topic create "$topic" --partitions 3 --broker "tcp://$broker" >/dev/null
  echo "run.sh: created topic $topic"
fi

echo "run.sh: hourglass on 127.0.0.1:50051 (metrics http://127.0.0.1:9464/metrics); Ctrl-C to stop"
"$CARGO_TARGET_DIR/release/hourglass" serve --kafka-brokers "$broker" --data-dir "$state/hourglass" "$@"
