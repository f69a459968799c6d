#!/usr/bin/env python3
"""Prints each record of a Kafka topic as it arrives: partition, offset, key,
value, headers, and how long after its due time the broker stamped it.

    python3 deploy/local/watch.py reminders [--brokers 127.0.0.1:9092]
"""
import argparse
import logging
import time
import uuid

from confluent_kafka import Consumer, KafkaError, KafkaException

# librdkafka's own log lines (one per failed connection attempt) are left out:
# the broker's comings and goings are reported once each, below.
QUIET = logging.getLogger("librdkafka")
QUIET.addHandler(logging.NullHandler())
QUIET.propagate = False


class Broker:
    """Whether the broker answers, said once per change."""

    def __init__(self, brokers: str) -> None:
        self.brokers = brokers
        self.away = False

    def error(self, err: KafkaError) -> None:
        if err.code() in (KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT):
            if not self.away:
                self.away = True
                print(f"{time.strftime('%H:%M:%S')} the broker at {self.brokers} is unreachable; waiting for it",
                      flush=True)
        elif err.fatal():
            raise KafkaException(err)
        else:
            print(f"{time.strftime('%H:%M:%S')} {err.str()}", flush=True)

    def check(self, consumer: Consumer) -> None:
        """While away, asks the broker for metadata to see it come back."""
        if not self.away:
            return
        try:
            consumer.list_topics(timeout=1)
        except KafkaException:
            return
        self.away = False
        print(f"{time.strftime('%H:%M:%S')} the broker is back", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("topic")
    ap.add_argument("--brokers", default="127.0.0.1:9092")
    ap.add_argument("--from-beginning", action="store_true", help="also show records already on the topic")
    args = ap.parse_args()
    broker = Broker(args.brokers)
    consumer = Consumer({
        "bootstrap.servers": args.brokers,
        "group.id": f"hourglass-watch-{uuid.uuid4()}",
        "auto.offset.reset": "earliest" if args.from_beginning else "latest",
        "enable.auto.commit": False,
        # Back within a second of the broker's return.
        "reconnect.backoff.max.ms": 1000,
        "error_cb": broker.error,
        "logger": QUIET,
    })
    consumer.subscribe([args.topic])
    print(f"watching {args.topic} on {args.brokers}; Ctrl-C to stop", flush=True)
    try:
        while True:
            msg = consumer.poll(0.5)
            if msg is None:
                broker.check(consumer)
                continue
            if msg.error():
                broker.error(msg.error())
                continue
            broker.check(consumer)
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
