# Sourced by run.sh and cluster.sh: where their state goes, how to start and
# stop a local tansu broker, wait for ports and stop processes, and (with
# build_hourglass) how to build hourglass and put it on the PATH.
# Sets $state, $topics and $broker; build_hourglass sets $hourglass.
#
# Environment:
#   HOURGLASS_LOCAL_DIR     where the broker's and the nodes' data and logs go (.local)
#   HOURGLASS_LOCAL_TOPICS  topics to create, 3 partitions each ("reminders orders dead-letters")
#   HOURGLASS_LOCAL_BIN     where to link the hourglass binary (~/.cargo/bin)
#   HOURGLASS_BIN           a hourglass binary to use instead of building one
#   CARGO_TARGET_DIR        where cargo builds (~/.cache/hourglass/target)
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
script="$(basename "$0")"
export PATH="$HOME/.cargo/bin:$PATH"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/hourglass/target}"

state="$(realpath -m "${HOURGLASS_LOCAL_DIR:-.local}")"
topics="${HOURGLASS_LOCAL_TOPICS:-reminders orders dead-letters}"
broker=127.0.0.1:9092
broker_pid=
mkdir -p "$state"

say() { echo "$script: $*" || true; }
fail() {
  echo "$script: $*" >&2 || true
  exit 1
}

# Whether process $1 runs (a child that exited and is not yet reaped does
# not), and, given $2, whether its command line holds $2: a pid from a file
# may have gone to another process since.
alive() {
  local stat
  stat="$(cat "/proc/$1/stat" 2>/dev/null)" || return 1
  stat="${stat##*) }"
  [ "${stat%% *}" != Z ] || return 1
  [ -z "${2:-}" ] || tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null | grep -qF -- "$2"
}

# Whether something accepts connections on host:port $1.
listening() { (exec 3<>"/dev/tcp/${1%:*}/${1#*:}") 2>/dev/null; }

# Refuses to go on if one of the addresses given is taken.
ports_free() {
  for addr in "$@"; do
    listening "$addr" && fail "$addr is already in use (another hourglass? run.sh or cluster.sh still running?); stop it first"
  done
  return 0
}

# Installs what is missing, builds hourglass (or takes HOURGLASS_BIN) and
# links it into HOURGLASS_LOCAL_BIN (default ~/.cargo/bin, which rustup puts
# on the PATH) so that the client subcommands work from any terminal.
build_hourglass() {
  bash deploy/local/install-deps.sh
  if [ -n "${HOURGLASS_BIN:-}" ]; then
    hourglass="$(realpath "$HOURGLASS_BIN")"
    [ -x "$hourglass" ] || fail "HOURGLASS_BIN=$HOURGLASS_BIN is not an executable"
  else
    cargo build --release --locked --bin hourglass
    hourglass="$CARGO_TARGET_DIR/release/hourglass"
  fi
  local bin_dir="${HOURGLASS_LOCAL_BIN:-$HOME/.cargo/bin}"
  mkdir -p "$bin_dir"
  if [ -e "$bin_dir/hourglass" ] && [ ! -L "$bin_dir/hourglass" ]; then
    say "$bin_dir/hourglass is not a link this script made; leaving it (this build is $hourglass)"
    return 0
  fi
  ln -sfn "$hourglass" "$bin_dir/hourglass"
  case ":$PATH:" in
    *":$bin_dir:"*) say "the hourglass command is $bin_dir/hourglass (-> $hourglass)" ;;
    *) say "linked $bin_dir/hourglass -> $hourglass; add $bin_dir to your PATH to run it as hourglass" ;;
  esac
}

# Starts tansu on $broker unless something listens there already, in a
# session of its own: a Ctrl-C at the terminal reaches the script alone,
# which stops hourglass before the broker. Creates the topics.
start_broker() {
  if listening "$broker"; then
    say "something already listens on $broker; using it as the broker"
  else
    say "starting tansu on $broker (log: $state/tansu.log)"
    setsid tansu broker --listener-url "tcp://$broker" --advertised-listener-url "tcp://$broker" \
      --storage-engine "sqlite:///$state/tansu.db" >"$state/tansu.log" 2>&1 </dev/null &
    broker_pid=$!
    for _ in $(seq 100); do
      listening "$broker" && break
      alive "$broker_pid" || break
      sleep 0.1
    done
    if ! listening "$broker"; then
      echo "$script: tansu did not start; its log ($state/tansu.log) says:" >&2
      tail -5 "$state/tansu.log" >&2
      exit 1
    fi
  fi
  local listed
  listed="$(tansu topic list --broker "tcp://$broker" 2>/dev/null || true)"
  for topic in $topics; do
    if ! grep -q "\"name\":\"$topic\"" <<<"$listed"; then
      tansu topic create "$topic" --partitions 3 --broker "tcp://$broker" >/dev/null
      say "created topic $topic"
    fi
  done
}

# Stops the broker this script started, if it did.
stop_broker() {
  [ -n "$broker_pid" ] || return 0
  stop_pid "$broker_pid" tansu || true
  broker_pid=
}

# Sends SIGTERM to pid $1 (named $2) and waits for it to exit, at most 30 s,
# then SIGKILL. Returns its exit status when it is a child of this shell.
stop_pid() {
  local pid="$1" name="$2" status=0
  if alive "$pid"; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 300); do
      alive "$pid" || break
      sleep 0.1
    done
    if alive "$pid"; then
      say "$name (pid $pid) did not stop within 30 s of SIGTERM; killing it"
      kill -KILL "$pid" 2>/dev/null || true
    fi
  fi
  wait "$pid" 2>/dev/null || status=$?
  # 127: not a child of this shell, so its status is not ours to know.
  [ "$status" -eq 127 ] && status=0
  return "$status"
}
