#!/usr/bin/env python3
"""Prints each record of a Kafka topic as it arrives: partition, offset, key,
value, headers, and how long after its due time the broker stamped it.

    python3 deploy/local/watch.py reminders [--brokers 127.0.0.1:9092]
"""
import argparse
import time
import uuid

from confluent_kafka import Consumer, KafkaException


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("topic")
    ap.add_argument("--brokers", default="127.0.0.1:9092")
    ap.add_argument("--from-beginning", action="store_true", help="also show records already on the topic")
    args = ap.parse_args()
    consumer = Consumer({
        "bootstrap.servers": args.brokers,
        "group.id": f"hourglass-watch-{uuid.uuid4()}",
        "auto.offset.reset": "earliest" if args.from_beginning else "latest",
        "enable.auto.commit": False,
    })
    consumer.subscribe([args.topic])
    print(f"watching {args.topic} on {args.brokers}; Ctrl-C to stop", flush=True)
    try:
        while True:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                raise KafkaException(msg.error())
            headers = {k: (v or b"").decode(errors="replace") for k, v in (msg.headers() or [])}
            _, stamped_ms = msg.timestamp()
            due = headers.get("hourglass-due-ms")
            late = f"  {stamped_ms - int(due)} ms after due" if due else ""
            key = msg.key().decode(errors="replace") if msg.key() is not None else None
            value = msg.value().decode(errors="replace") if msg.value() is not None else None
            print(f"{time.strftime('%H:%M:%S')} partition {msg.partition()} offset {msg.offset()}"
                  f" key={key!r} value={value!r} headers={headers}{late}", flush=True)
    except KeyboardInterrupt:
        pass
    finally:
        consumer.close()


if __name__ == "__main__":
    main()
