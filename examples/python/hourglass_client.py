#!/usr/bin/env python3
"""hourglass from Python, with its client package (clients/python):

  1. schedules a message due in --delay-ms, with an idempotency id,
  2. sends the same request again (a retry): the answer says duplicate,
  3. schedules a second message far in the future and cancels it,
  4. waits until the first is delivered and prints where it landed.

Each step prints one JSON line. Needs the package:

  pip install ./clients/python
  python3 examples/python/hourglass_client.py --topic reminders
"""

import argparse
import datetime as dt
import json
import sys
import time

import hourglass_kafka as hg


def say(step, **fields):
    print(json.dumps({"step": step, **fields}), flush=True)


def main():
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--server", default="127.0.0.1:50051", help="host:port, or https://host:port")
    args.add_argument("--token", default=None, help="a bearer token, for a server with --auth-tokens")
    args.add_argument("--topic", required=True)
    args.add_argument("--delay-ms", type=int, default=1000)
    args.add_argument("--id", default=f"python-example-{int(time.time() * 1000)}")
    opts = args.parse_args()

    with hg.Client(opts.server, token=opts.token) as client:
        def schedule():
            return client.schedule(
                opts.topic,
                "class starts in 10 minutes",
                key="teacher-7",
                headers={"source": "python"},
                delay=dt.timedelta(milliseconds=opts.delay_ms),
                id=opts.id,
            )

        first = schedule()
        say("scheduled", id=first.id, deliver_at=first.deliver_at.isoformat(), duplicate=first.duplicate)
        again = schedule()
        say("retried", id=again.id, deliver_at=again.deliver_at.isoformat(), duplicate=again.duplicate)

        later = client.schedule(opts.topic, "never sent", delay=3600, id=opts.id + "-undo")
        say("cancelled", id=later.id, outcome=client.cancel(later.id))

        deadline = time.monotonic() + 60
        while True:
            got = client.get(first.id)
            if got.state != hg.pb.STATE_PENDING or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        delivered = got.delivered if got.WhichOneof("settlement") == "delivered" else None
        say(
            "settled",
            id=got.id,
            state=hg.pb.State.Name(got.state),
            partition=delivered.partition if delivered else None,
            offset=delivered.offset if delivered else None,
        )
        return 0 if got.state == hg.pb.STATE_DELIVERED else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except hg.HourglassError as e:
        sys.exit(f"hourglass answered {e}")
