#!/usr/bin/env python3
"""hourglass from Python, over gRPC with grpcio.

Generates the client from proto/hourglass/v1/hourglass.proto at start (with
grpcio-tools, so it always matches the server), then:

  1. schedules a message due in --delay-ms, with an idempotency id,
  2. sends the same request again (a retry): the answer says duplicate,
  3. schedules a second message far in the future and cancels it,
  4. waits until the first is delivered and prints where it landed.

Each step prints one JSON line. Needs: pip install grpcio grpcio-tools

  python3 examples/python/hourglass_client.py --topic reminders
"""

import argparse
import importlib
import json
import pathlib
import sys
import tempfile
import time

import grpc
from grpc_tools import protoc

REPO = pathlib.Path(__file__).resolve().parents[2]


def load_stubs():
    """Compiles the proto into a temporary package and imports it."""
    out = tempfile.mkdtemp(prefix="hourglass-stubs-")
    include = str(pathlib.Path(protoc.__file__).parent / "_proto")
    code = protoc.main([
        "protoc",
        f"-I{REPO / 'proto'}",
        f"-I{include}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        "hourglass/v1/hourglass.proto",
    ])
    if code != 0:
        sys.exit("compiling hourglass.proto failed")
    sys.path.insert(0, out)
    pb = importlib.import_module("hourglass.v1.hourglass_pb2")
    rpc = importlib.import_module("hourglass.v1.hourglass_pb2_grpc")
    return pb, rpc


def say(step, **fields):
    print(json.dumps({"step": step, **fields}), flush=True)


def main():
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--server", default="127.0.0.1:50051")
    args.add_argument("--topic", required=True)
    args.add_argument("--delay-ms", type=int, default=1000)
    args.add_argument("--id", default=f"python-example-{int(time.time() * 1000)}")
    opts = args.parse_args()

    pb, rpc = load_stubs()
    scheduler = rpc.SchedulerStub(grpc.insecure_channel(opts.server))

    request = pb.ScheduleRequest(
        message=pb.Message(
            topic=opts.topic,
            key=b"teacher-7",
            value=b"class starts in 10 minutes",
            headers=[pb.Header(key="source", value=b"python")],
        ),
        id=opts.id,
    )
    request.delay.FromMilliseconds(opts.delay_ms)
    first = scheduler.Schedule(request, timeout=10)
    say("scheduled", id=first.id, deliver_at=first.deliver_at.ToJsonString(), duplicate=first.duplicate)

    again = scheduler.Schedule(request, timeout=10)
    say("retried", id=again.id, deliver_at=again.deliver_at.ToJsonString(), duplicate=again.duplicate)

    later = pb.ScheduleRequest(message=pb.Message(topic=opts.topic, value=b"never sent"), id=opts.id + "-undo")
    later.delay.FromSeconds(3600)
    scheduler.Schedule(later, timeout=10)
    outcome = scheduler.Cancel(pb.CancelRequest(id=later.id), timeout=10).outcome
    say("cancelled", id=later.id, outcome=pb.CancelOutcome.Name(outcome))

    deadline = time.monotonic() + 60
    while True:
        got = scheduler.Get(pb.GetRequest(id=first.id), timeout=10)
        if got.state != pb.STATE_PENDING or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    delivered = got.delivered if got.WhichOneof("settlement") == "delivered" else None
    say(
        "settled",
        id=got.id,
        state=pb.State.Name(got.state),
        partition=delivered.partition if delivered else None,
        offset=delivered.offset if delivered else None,
    )
    return 0 if got.state == pb.STATE_DELIVERED else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except grpc.RpcError as e:
        sys.exit(f"hourglass answered {e.code().name}: {e.details()}")
