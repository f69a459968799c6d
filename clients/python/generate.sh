#!/usr/bin/env bash
# Regenerates the stubs this package ships (src/hourglass_kafka/_proto) from
# ../../proto, with grpcio-tools 1.85.1 (pip install grpcio-tools==1.85.1;
# another version writes other stubs). Run it after the
# proto changes; the tests fail while the shipped stubs differ from what it
# makes. Installing the package needs none of this.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-$here/src/hourglass_kafka/_proto}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python3 -m grpc_tools.protoc -I"$here/../../proto" \
  --python_out="$work" --pyi_out="$work" --grpc_python_out="$work" \
  hourglass/v1/hourglass.proto
mkdir -p "$out"
cp "$work/hourglass/v1/hourglass_pb2.py" "$work/hourglass/v1/hourglass_pb2.pyi" "$out/"
# The service stubs import the messages as a package of their own; here
# they are this package's.
sed 's/^from hourglass\.v1 import hourglass_pb2 as /from . import hourglass_pb2 as /' \
  "$work/hourglass/v1/hourglass_pb2_grpc.py" >"$out/hourglass_pb2_grpc.py"
printf '"""Generated from proto/hourglass/v1/hourglass.proto by generate.sh."""\n' >"$out/__init__.py"
