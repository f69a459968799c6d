# Sourced by run.sh and cluster.sh: builds hourglass, starts a local tansu
# broker on $broker (unless something already listens there), and creates
# the topic $topic. Sets $state, $topic, $broker and $hourglass.
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
bash deploy/local/install-deps.sh
export PATH="$HOME/.cargo/bin:$PATH"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/hourglass/target}"

cargo build --release --locked --bin hourglass
hourglass="$CARGO_TARGET_DIR/release/hourglass"
state="$(realpath -m "${HOURGLASS_LOCAL_DIR:-.local}")"
topic="${HOURGLASS_LOCAL_TOPIC:-reminders}"
broker=127.0.0.1:9092
mkdir -p "$state"

if (exec 3<>"/dev/tcp/${broker%:*}/${broker#*:}") 2>/dev/null; then
  echo "$(basename "$0"): something already listens on $broker; using it as the broker"
else
  echo "$(basename "$0"): starting tansu on $broker (log: $state/tansu.log)"
  tansu broker --listener-url "tcp://$broker" --advertised-listener-url "tcp://$broker" \
    --storage-engine "sqlite:///$state/tansu.db" >"$state/tansu.log" 2>&1 &
  tansu_pid=$!
  up=
  for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/${broker%:*}/${broker#*:}") 2>/dev/null && { up=1; break; }
    kill -0 "$tansu_pid" 2>/dev/null || break
    sleep 0.1
  done
  if [ -z "$up" ]; then
    echo "$(basename "$0"): tansu did not start; its log ($state/tansu.log) says:" >&2
    tail -5 "$state/tansu.log" >&2
    exit 1
  fi
fi

if ! tansu topic list --broker "tcp://$broker" 2>/dev/null | grep -q "\"name\":\"$topic\""; then
  tansu topic create "$topic" --partitions 3 --broker "tcp://$broker" >/dev/null
  echo "$(basename "$0"): created topic $topic"
fi
