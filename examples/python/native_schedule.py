#!/usr/bin/env python3
"""Scheduling through Kafka alone: a record produced to hourglass's ingress
topic (--ingress, standalone or in cluster mode) instead of a gRPC call.

  1. schedules a message due in --delay-ms, keyed by its id, with the
     target topic, key and due time in hourglass- headers,
  2. schedules a second one far in the future and cancels it with a
     tombstone,
  3. produces a record that misses its due time: hourglass refuses it
     (counted in hourglass_ingress_records_total{outcome="refused"} and
     logged with why), and it parks nothing.

Each step prints one JSON line once Kafka has the record. Needs:
pip install confluent-kafka

  python3 examples/python/native_schedule.py --brokers 127.0.0.1:9092 \\
      --ingress-topic hourglass-log-ingress --topic reminders --id reminder-42
"""

import argparse
import json

from confluent_kafka import Producer


def main():
    args = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    args.add_argument("--brokers", default="127.0.0.1:9092")
    args.add_argument("--ingress-topic", default="hourglass-log-ingress",
                      help="hourglass's ingress topic (--ingress; in cluster mode <log-topic>-ingress by default)")
    args.add_argument("--topic", required=True, help="the topic to deliver to")
    args.add_argument("--id", required=True, help="the message id (the record's key)")
    args.add_argument("--delay-ms", type=int, default=1000)
    opts = args.parse_args()

    # murmur2_random places a key where the Java client (and hourglass) do:
    # in the partition read by the owner of the id's shard, so that the
    # record needs no second hop.
    producer = Producer({
        "bootstrap.servers": opts.brokers,
        "partitioner": "murmur2_random",
        "enable.idempotence": True,
        "acks": "all",
    })

    def produce(step, key, value, headers):
        result = {}

        def done(err, msg):
            result["error"] = str(err) if err else None
            if not err:
                result["partition"], result["offset"] = msg.partition(), msg.offset()

        producer.produce(opts.ingress_topic, key=key, value=value, headers=headers, on_delivery=done)
        producer.flush(10)
        print(json.dumps({"step": step, "id": key, **result}), flush=True)

    produce("scheduled", opts.id, b"remind the teacher", [
        ("hourglass-topic", opts.topic),
        ("hourglass-delay", str(opts.delay_ms)),
        ("hourglass-key", b"teacher-7"),
        ("trace-id", b"abc123"),
    ])
    later = opts.id + "-later"
    produce("scheduled-later", later, b"not needed after all", [
        ("hourglass-topic", opts.topic),
        ("hourglass-delay", "1h"),
    ])
    produce("cancelled", later, None, [])
    produce("refused", opts.id + "-bad", b"no due time", [("hourglass-topic", opts.topic)])


if __name__ == "__main__":
    main()
