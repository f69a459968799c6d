"""The client against a real hourglass server (and its broker).

Set HOURGLASS_TEST_SERVER (http://host:port, or https://), HOURGLASS_TEST_TOPIC
(a topic that exists and the token may use), HOURGLASS_TEST_TOKEN (its token)
and HOURGLASS_TEST_OTHER_TOPIC (one that exists but the token may not use);
for TLS, HOURGLASS_TEST_CA and, for mutual TLS, HOURGLASS_TEST_CERT and
HOURGLASS_TEST_KEY (PEM files).
The Rust suite's `clients::` tests start a server and run these.

  python3 -m unittest discover -s clients/python/tests -v
"""

import asyncio
import datetime as dt
import os
import time
import unittest
import uuid
from concurrent import futures

import grpc

import hourglass_kafka as hg


def setting(name):
    value = os.environ.get(name)
    if not value:
        raise SystemExit(f"set {name} (see this file's docstring)")
    return value


SERVER = setting("HOURGLASS_TEST_SERVER")
TOPIC = setting("HOURGLASS_TEST_TOPIC")
TOKEN = setting("HOURGLASS_TEST_TOKEN")
OTHER_TOPIC = setting("HOURGLASS_TEST_OTHER_TOPIC")
TLS = {
    name: os.environ[variable]
    for name, variable in (("ca_cert", "HOURGLASS_TEST_CA"), ("client_cert", "HOURGLASS_TEST_CERT"),
                           ("client_key", "HOURGLASS_TEST_KEY"))
    if os.environ.get(variable)
}


def fresh(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def wait_for_state(client, id, state, within=20.0):
    deadline = time.monotonic() + within
    while True:
        got = client.get(id)
        if got.state == state or time.monotonic() > deadline:
            return got
        time.sleep(0.1)


class Blocking(unittest.TestCase):
    def setUp(self):
        self.hg = hg.Client(SERVER, token=TOKEN, **TLS)

    def tearDown(self):
        self.hg.close()

    def test_schedule_get_and_delivery(self):
        id = fresh("py")
        done = self.hg.schedule(TOPIC, "class starts in 10 minutes", delay=dt.timedelta(milliseconds=300), id=id,
                                key="teacher-7", headers={"source": "python"}, labels={"class": "7"})
        self.assertEqual((done.id, done.duplicate, done.outcome), (id, False, "created"))
        self.assertIsNotNone(done.deliver_at.tzinfo)
        again = self.hg.schedule(TOPIC, "class starts in 10 minutes", delay=dt.timedelta(milliseconds=300), id=id,
                                 key="teacher-7", headers={"source": "python"}, labels={"class": "7"})
        self.assertEqual((again.duplicate, again.outcome, again.deliver_at), (True, "duplicate", done.deliver_at))
        got = wait_for_state(self.hg, id, hg.pb.STATE_DELIVERED)
        self.assertEqual(got.state, hg.pb.STATE_DELIVERED, got)
        self.assertEqual((got.message.key, got.message.value), (b"teacher-7", b"class starts in 10 minutes"))
        self.assertGreaterEqual(got.delivered.offset, 0)
        self.assertEqual(dict(got.labels), {"class": "7"})

    def test_an_id_is_made_when_none_is_given(self):
        done = self.hg.schedule(TOPIC, b"x", delay=3600)
        self.assertTrue(done.id)
        self.assertEqual(self.hg.cancel(done.id), "cancelled")

    def test_cancel_reschedule_and_list(self):
        label = fresh("batch")
        ids = [self.hg.schedule(TOPIC, b"later", delay=3600 + i, labels={"batch": label}).id for i in range(3)]
        listed = [m.id for m in self.hg.list(topic=TOPIC, selector=f"batch={label}", page_size=2)]
        self.assertEqual(listed, ids, "every page, in dispatch order")
        at = dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=1)
        moved = self.hg.reschedule(ids[0], at=at)
        self.assertLess(abs((moved - at).total_seconds()), 0.002)
        self.assertEqual(self.hg.cancel(ids[0]), "cancelled")
        self.assertEqual(self.hg.cancel(ids[0]), "already_cancelled")
        self.assertEqual(self.hg.cancel(fresh("none")), "not_found")
        for id in ids[1:]:
            self.hg.cancel(id)

    def test_replace_and_conflict(self):
        id = fresh("upsert")
        self.hg.schedule(TOPIC, b"v1", delay=3600, id=id)
        with self.assertRaises(hg.AlreadyExists):
            self.hg.schedule(TOPIC, b"v2", delay=3600, id=id)
        self.assertEqual(self.hg.schedule(TOPIC, b"v2", delay=7200, id=id, replace=True).outcome, "replaced")
        self.assertEqual(self.hg.get(id).message.value, b"v2")
        self.hg.cancel(id)

    def test_errors_carry_the_fields_the_server_refused(self):
        with self.assertRaises(hg.InvalidArgument) as refused:
            self.hg.schedule(TOPIC, b"x", delay=60, id="has space")
        self.assertIn("id", [v.field for v in refused.exception.violations], refused.exception)
        with self.assertRaises(hg.NotFound):
            self.hg.get(fresh("missing"))
        with self.assertRaises(hg.PermissionDenied):
            self.hg.schedule(OTHER_TOPIC, b"x", delay=60)
        with self.assertRaises(ValueError):
            self.hg.schedule(TOPIC, b"x", at=dt.datetime.now())  # naive

    def test_a_token_is_needed_and_checked(self):
        for token in (None, "not-a-token"):
            with hg.Client(SERVER, token=token, retries=0, **TLS) as anonymous:
                with self.assertRaises(hg.Unauthenticated):
                    anonymous.schedule(TOPIC, b"x", delay=60)

    def test_series_and_policies(self):
        id = fresh("series")
        series = self.hg.create_series(id, TOPIC, b"tick", interval=dt.timedelta(hours=1))
        self.assertEqual(series.id, id)
        self.assertEqual(self.hg.get_series(id).state, hg.pb.SERIES_STATE_ACTIVE)
        self.hg.delete_series(id)
        with self.assertRaises(hg.NotFound):
            self.hg.get_series(id)
        self.assertTrue(self.hg.pause_topic(TOPIC).paused)
        self.assertEqual(self.hg.set_rate_limit(TOPIC, 100).rate_limit.per_second, 100)
        policy = self.hg.resume_topic(TOPIC)
        self.assertFalse(policy.paused)
        self.hg.set_rate_limit(TOPIC, 0)


class FlakyFront(hg.rpc.SchedulerServicer):
    """Answers the first Schedule UNAVAILABLE, then passes calls on to the
    real server; notes the ids it saw."""

    def __init__(self):
        self.ids = []
        self.upstream = hg.Client(SERVER, token=TOKEN, **TLS)

    def Schedule(self, request, context):
        self.ids.append(request.id)
        if len(self.ids) == 1:
            context.abort(grpc.StatusCode.UNAVAILABLE, "restarting")
        return self.upstream._scheduler.Schedule(request, metadata=self.upstream._metadata, timeout=10)


class Retries(unittest.TestCase):
    def test_unavailable_is_retried_with_the_same_id(self):
        front = FlakyFront()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        hg.rpc.add_SchedulerServicer_to_server(front, server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        try:
            with hg.Client(f"127.0.0.1:{port}", token=TOKEN, retry_backoff=0.05) as client:
                done = client.schedule(TOPIC, b"x", delay=3600)
            self.assertEqual(len(front.ids), 2)
            self.assertEqual(front.ids[0], front.ids[1], "the retry names the same message")
            self.assertEqual((done.id, done.outcome), (front.ids[0], "created"))
            with hg.Client(f"127.0.0.1:{port}", token=TOKEN, retries=0) as client:
                front.ids.clear()
                with self.assertRaises(hg.Unavailable):
                    client.schedule(TOPIC, b"x", delay=3600)
        finally:
            server.stop(None)
            front.upstream.close()


class Asyncio(unittest.IsolatedAsyncioTestCase):
    async def test_the_same_verbs(self):
        async with hg.AsyncClient(SERVER, token=TOKEN, **TLS) as client:
            id = fresh("aio")
            done = await client.schedule(TOPIC, b"async", delay=3600, id=id)
            self.assertEqual(done.outcome, "created")
            self.assertTrue((await client.schedule(TOPIC, b"async", delay=3600, id=id)).duplicate)
            self.assertEqual((await client.get(id)).state, hg.pb.STATE_PENDING)
            self.assertIn(id, [m.id async for m in client.list(topic=TOPIC)])
            self.assertEqual(await client.cancel(id), "cancelled")
            with self.assertRaises(hg.NotFound):
                await client.get(fresh("missing"))
            with self.assertRaises(hg.InvalidArgument) as refused:
                await client.schedule(TOPIC, b"x", delay=60, id="has space")
            self.assertTrue(refused.exception.violations)
            results = await asyncio.gather(*(client.schedule(TOPIC, b"many", delay=3600) for _ in range(20)))
            self.assertEqual(len({r.id for r in results}), 20)
            for r in results:
                await client.cancel(r.id)


if __name__ == "__main__":
    unittest.main()
