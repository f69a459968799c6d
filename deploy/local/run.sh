#!/usr/bin/env bash
# Runs hourglass in front of a local Kafka-protocol broker, for trying it out:
#   - tansu (Apache-Kafka-compatible) on 127.0.0.1:9092, data in .local/
#   - topic "reminders" with 3 partitions (HOURGLASS_LOCAL_TOPIC to change)
#   - hourglass: gRPC on 127.0.0.1:50051, metrics on 127.0.0.1:9464
# Installs what is missing first. Ctrl-C stops both.
set -euo pipefail
tansu_pid=
trap '[ -z "$tansu_pid" ] || { kill "$tansu_pid" 2>/dev/null; wait "$tansu_pid" 2>/dev/null || true; }' EXIT
source "$(dirname "$0")/broker.sh"

echo "run.sh: hourglass on 127.0.0.1:50051 (metrics http://127.0.0.1:9464/metrics); Ctrl-C to stop"
"$hourglass" serve --kafka-brokers "$broker" --data-dir "$state/hourglass" "$@"
