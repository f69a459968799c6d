#!/usr/bin/env python3
"""Retry with backoff through Kafka alone: a consumer that fails on a record
produces it to hourglass's ingress topic with a delay, and gets it back on
its own topic when the delay is over. After the last attempt it goes to a
dead-letter topic. No gRPC call, no cluster: hourglass standalone reads the
ingress topic when started with --ingress.

  hourglass serve --ingress orders-retry ...      (or HOURGLASS_INGRESS)
  python3 examples/python/retry_with_backoff.py --brokers 127.0.0.1:9092 \\
      --topic orders --ingress-topic orders-retry --dead-letter-topic orders-dead

The pattern, per record that fails:
  - the attempt count travels in a header of the record (retry-attempt),
    and where the record first came from (retry-origin: topic/partition/
    offset);
  - the consumer computes the backoff: --base-delay-ms * 2^attempt, at most
    --max-delay-ms, with up to 10% jitter (so that a burst of failures does
    not come back at once), from the failed record's own timestamp;
  - the retry is one produce to the ingress topic: the record's value and
    headers, with hourglass-topic (back to this topic), hourglass-deliver-at
    (its timestamp plus the backoff) and hourglass-key (the record's key).
    Its key, the hourglass message id, is its origin and attempt. All of it
    follows from the failed record alone (the jitter is seeded by the same),
    so a consumer that crashes before committing and takes the record again
    produces the same retry: hourglass answers it as a duplicate and
    delivers it once;
  - after --max-attempts tries, the record goes to the dead-letter topic,
    with the tries (retry-attempts) and the last error in headers;
  - the consumer commits the record's offset only once the retry or the
    dead letter is acknowledged by Kafka (acks=all), so a crash loses none.
    (A retry hourglass refuses, say a topic the ingress topic's grant does
    not cover, is counted and logged by hourglass, and lost to this
    consumer: watch hourglass_ingress_records_total{outcome="refused"}.)

The work here is a stand-in: a record whose value is `fail:N` fails its
first N tries, `poison` fails every time, anything else succeeds. Each
event prints one JSON line. --exit-when-idle ends the run once no retry is
on its way and nothing came for two seconds.

Needs: pip install confluent-kafka
"""

import argparse
import hashlib
import json
import random
import sys
import time

from confluent_kafka import Consumer, KafkaException, Producer

ATTEMPT = "retry-attempt"
ORIGIN = "retry-origin"
DUE = "retry-due-ms"
LAST_ERROR = "retry-last-error"
ATTEMPTS = "retry-attempts"
OURS = {ATTEMPT, ORIGIN, DUE, LAST_ERROR, ATTEMPTS}


def header(headers, name):
    for key, value in headers or []:
        if key == name:
            return value.decode() if value is not None else None
    return None


def kept(headers):
    """The record's own headers: none of this pattern's, none of hourglass's."""
    return [(k, v) for k, v in headers or [] if k not in OURS and not k.startswith("hourglass-")]


def work(value, attempt):
    """The stand-in for real work: raises on failure."""
    text = value.decode(errors="replace") if value else ""
    if text == "poison":
        raise RuntimeError("poison: this record never succeeds")
    if text.startswith("fail:") and attempt < int(text[5:]):
        raise RuntimeError(f"failed on try {attempt + 1} of {text}")


def backoff_ms(origin, attempt, base, cap):
    """The wait before try `attempt + 2`, with jitter seeded by the record
    and the attempt: the same every time it is computed."""
    delay = min(cap, base * (2 ** attempt))
    jitter = random.Random(f"{origin}/{attempt}").uniform(0, delay / 10)
    return int(delay + jitter)


def retry_id(origin, attempt):
    """The hourglass message id of a retry: readable when it fits in an
    id (printable ASCII, 128 bytes), a digest of the origin otherwise."""
    id = f"{origin}.attempt-{attempt}"
    if len(id) <= 128 and all(33 <= ord(c) < 127 for c in id):
        return id
    return f"retry-{hashlib.sha256(origin.encode()).hexdigest()[:40]}.attempt-{attempt}"


def main():
    args = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    args.add_argument("--brokers", default="127.0.0.1:9092")
    args.add_argument("--topic", required=True, help="the topic the work comes from (and retries come back to)")
    args.add_argument("--ingress-topic", required=True, help="hourglass's ingress topic (its --ingress)")
    args.add_argument("--dead-letter-topic", required=True)
    args.add_argument("--group", default=None, help="the consumer group [default: retry-example-<topic>]")
    args.add_argument("--max-attempts", type=int, default=4, help="tries in all, the first included")
    args.add_argument("--base-delay-ms", type=int, default=1000)
    args.add_argument("--max-delay-ms", type=int, default=60_000)
    args.add_argument("--exit-when-idle", action="store_true")
    opts = args.parse_args()
    if opts.max_attempts < 1:
        sys.exit("--max-attempts must be at least 1")

    consumer = Consumer({
        "bootstrap.servers": opts.brokers,
        "group.id": opts.group or f"retry-example-{opts.topic}",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    })
    producer = Producer({"bootstrap.servers": opts.brokers, "enable.idempotence": True, "acks": "all"})
    consumer.subscribe([opts.topic])

    def emit(**event):
        print(json.dumps(event), flush=True)

    def send(topic, key, value, headers):
        """Produces and waits for Kafka's acknowledgement; raises if it fails."""
        failed = []
        producer.produce(topic, key=key, value=value, headers=headers,
                         on_delivery=lambda err, _msg: err and failed.append(err))
        if producer.flush(30) > 0 or failed:
            raise KafkaException(failed[0] if failed else "not acknowledged within 30 s")

    waiting = set()  # retries on their way back, by id
    idle_since = time.monotonic()
    while True:
        msg = consumer.poll(0.2)
        if msg is None:
            if opts.exit_when_idle and not waiting and time.monotonic() - idle_since > 2:
                break
            continue
        if msg.error():
            raise KafkaException(msg.error())
        idle_since = time.monotonic()
        headers = msg.headers() or []
        origin = header(headers, ORIGIN) or f"{msg.topic()}/{msg.partition()}/{msg.offset()}"
        attempt = int(header(headers, ATTEMPT) or 0)
        key = msg.key().decode(errors="replace") if msg.key() is not None else None
        event = {"key": key, "origin": origin, "attempt": attempt}
        if attempt > 0:
            waiting.discard(retry_id(origin, attempt))
            # How long after its due time the retry came back: never before.
            event["late_ms"] = int(time.time() * 1000) - int(header(headers, DUE))
        try:
            work(msg.value(), attempt)
            emit(step="processed", **event)
        except Exception as error:
            reason = str(error)[:200]
            if attempt + 1 >= opts.max_attempts:
                send(opts.dead_letter_topic, msg.key(), msg.value(), kept(headers) + [
                    (ORIGIN, origin), (ATTEMPTS, str(attempt + 1)), (LAST_ERROR, reason)])
                emit(step="dead-letter", error=reason, **event)
            else:
                delay = backoff_ms(origin, attempt, opts.base_delay_ms, opts.max_delay_ms)
                due = msg.timestamp()[1] + delay
                id = retry_id(origin, attempt + 1)
                ask = [("hourglass-topic", msg.topic()), ("hourglass-deliver-at", str(due))]
                if msg.key() is not None:
                    ask.append(("hourglass-key", msg.key()))
                send(opts.ingress_topic, id, msg.value(), kept(headers) + ask + [
                    (ORIGIN, origin), (ATTEMPT, str(attempt + 1)), (DUE, str(due)), (LAST_ERROR, reason)])
                waiting.add(id)
                emit(step="retry", id=id, delay_ms=delay, error=reason, **event)
        consumer.commit(message=msg, asynchronous=False)
    consumer.close()


if __name__ == "__main__":
    main()
