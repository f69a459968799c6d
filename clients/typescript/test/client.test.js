// The client against a real hourglass server (and its broker). Set
// HOURGLASS_TEST_SERVER (http://host:port, or https://), HOURGLASS_TEST_TOPIC
// (a topic that exists and the token may use), HOURGLASS_TEST_TOKEN and
// HOURGLASS_TEST_OTHER_TOPIC (one the token may not use); for TLS,
// HOURGLASS_TEST_CA and, for mutual TLS, HOURGLASS_TEST_CERT and
// HOURGLASS_TEST_KEY (PEM files). The Rust suite's
// `clients::` tests start a server, install this package into a project of
// their own and run this file there:  node --test
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { test } from "node:test";

import { Code, ConnectError, createRouterTransport } from "@connectrpc/connect";
import { HourglassClient, HourglassError, pb } from "hourglass-kafka";

function setting(name) {
  const value = process.env[name];
  if (!value) throw new Error(`set ${name} (see this file's head)`);
  return value;
}
const SERVER = setting("HOURGLASS_TEST_SERVER");
const TOPIC = setting("HOURGLASS_TEST_TOPIC");
const TOKEN = setting("HOURGLASS_TEST_TOKEN");
const OTHER_TOPIC = setting("HOURGLASS_TEST_OTHER_TOPIC");
const TLS = { ca: process.env.HOURGLASS_TEST_CA, cert: process.env.HOURGLASS_TEST_CERT, key: process.env.HOURGLASS_TEST_KEY };
const fresh = (prefix) => `${prefix}-${randomUUID().slice(0, 12)}`;
const client = () => new HourglassClient({ baseUrl: SERVER, token: TOKEN, ...TLS });

async function refused(promise, code) {
  try {
    await promise;
  } catch (e) {
    assert.ok(e instanceof HourglassError, String(e));
    assert.equal(e.code, code, e.message);
    return e;
  }
  assert.fail(`not refused (${code} expected)`);
}

test("schedule, a retry, get and the delivery", async () => {
  const hg = client();
  const id = fresh("node");
  const ask = () => hg.schedule(TOPIC, "class starts in 10 minutes", { delayMs: 300, id, key: "teacher-7", headers: { source: "node" }, labels: { class: "7" } });
  const done = await ask();
  assert.deepEqual([done.id, done.duplicate, done.outcome], [id, false, "created"]);
  assert.ok(done.deliverAt instanceof Date);
  const again = await ask();
  assert.deepEqual([again.duplicate, again.outcome, again.deliverAt.getTime()], [true, "duplicate", done.deliverAt.getTime()]);
  let got;
  for (let i = 0; i < 200; i++) {
    got = await hg.get(id);
    if (got.state === pb.State.DELIVERED) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  assert.equal(got.state, pb.State.DELIVERED);
  assert.equal(new TextDecoder().decode(got.message.value), "class starts in 10 minutes");
  assert.equal(got.settlement.case, "delivered");
  assert.deepEqual(got.labels, { class: "7" });
});

test("cancel, reschedule, list every page, replace", async () => {
  const hg = client();
  const batch = fresh("batch");
  const ids = [];
  for (let i = 0; i < 3; i++) ids.push((await hg.schedule(TOPIC, "later", { delayMs: 3_600_000 + i, labels: { batch } })).id);
  const listed = [];
  for await (const m of hg.list({ topic: TOPIC, selector: `batch=${batch}`, pageSize: 2 })) listed.push(m.id);
  assert.deepEqual(listed, ids);
  const at = new Date(Date.now() + 86_400_000);
  assert.equal((await hg.reschedule(ids[0], { at })).getTime(), at.getTime());
  assert.equal(await hg.cancel(ids[0]), "cancelled");
  assert.equal(await hg.cancel(ids[0]), "already_cancelled");
  assert.equal(await hg.cancel(fresh("none")), "not_found");
  for (const id of ids.slice(1)) await hg.cancel(id);
  const id = fresh("upsert");
  await hg.schedule(TOPIC, "v1", { delayMs: 3_600_000, id });
  await refused(hg.schedule(TOPIC, "v2", { delayMs: 3_600_000, id }), "ALREADY_EXISTS");
  assert.equal((await hg.schedule(TOPIC, "v2", { delayMs: 7_200_000, id, replace: true })).outcome, "replaced");
  await hg.cancel(id);
});

test("errors carry the fields the server refused, and the grant holds", async () => {
  const hg = client();
  const bad = await refused(hg.schedule(TOPIC, "x", { delayMs: 60_000, id: "has space" }), "INVALID_ARGUMENT");
  assert.ok(bad.violations.some((v) => v.field === "id"), JSON.stringify(bad.violations));
  await refused(hg.get(fresh("missing")), "NOT_FOUND");
  await refused(hg.schedule(OTHER_TOPIC, "x", { delayMs: 60_000 }), "PERMISSION_DENIED");
  for (const token of [undefined, "not-a-token"]) {
    await refused(new HourglassClient({ baseUrl: SERVER, token, retries: 0, ...TLS }).schedule(TOPIC, "x", { delayMs: 60_000 }), "UNAUTHENTICATED");
  }
});

test("the same calls over gRPC-Web and over JSON (the Connect protocol), HTTP/1.1", async () => {
  for (const protocol of ["grpc-web", "connect"]) {
    const hg = new HourglassClient({ baseUrl: SERVER, token: TOKEN, protocol, ...TLS });
    const id = fresh(protocol);
    const done = await hg.schedule(TOPIC, `over ${protocol}`, { delayMs: 3_600_000, id, labels: { over: protocol } });
    assert.deepEqual([done.id, done.outcome], [id, "created"], protocol);
    const got = await hg.get(id);
    assert.equal(got.state, pb.State.PENDING, protocol);
    assert.equal(new TextDecoder().decode(got.message.value), `over ${protocol}`);
    assert.equal(await hg.cancel(id), "cancelled", protocol);
    const bad = await refused(hg.schedule(TOPIC, "x", { delayMs: 60_000, id: "has space" }), "INVALID_ARGUMENT");
    assert.ok(bad.violations.some((v) => v.field === "id"), `${protocol}: ${JSON.stringify(bad.violations)}`);
    await refused(hg.schedule(OTHER_TOPIC, "x", { delayMs: 60_000 }), "PERMISSION_DENIED");
    await refused(new HourglassClient({ baseUrl: SERVER, protocol, retries: 0, ...TLS }).get(id), "UNAUTHENTICATED");
  }
  assert.throws(() => new HourglassClient({ protocol: "carrier-pigeon" }), /protocol/);
});

test("series and policies", async () => {
  const hg = client();
  const id = fresh("series");
  const series = await hg.createSeries(id, TOPIC, "tick", { intervalMs: 3_600_000 });
  assert.equal(series.id, id);
  assert.equal((await hg.getSeries(id)).state, pb.SeriesState.ACTIVE);
  await hg.deleteSeries(id);
  await refused(hg.getSeries(id), "NOT_FOUND");
  assert.equal((await hg.pauseTopic(TOPIC)).paused, true);
  assert.equal((await hg.setRateLimit(TOPIC, 100)).rateLimit.perSecond, 100);
  assert.equal((await hg.resumeTopic(TOPIC)).paused, false);
  await hg.setRateLimit(TOPIC, 0);
});

test("UNAVAILABLE is retried under the same id", async () => {
  // A transport that answers the first Schedule UNAVAILABLE, then passes
  // the calls on to the real server.
  const real = client();
  const ids = [];
  const transport = createRouterTransport(({ service }) => {
    service(pb.Scheduler, {
      async schedule(request) {
        ids.push(request.id);
        if (ids.length === 1) throw new ConnectError("restarting", Code.Unavailable);
        return real.scheduler.schedule(request);
      },
    });
  });
  const hg = new HourglassClient({ transport, retryBackoffMs: 20 });
  const done = await hg.schedule(TOPIC, "x", { delayMs: 3_600_000 });
  assert.equal(ids.length, 2);
  assert.equal(ids[0], ids[1], "the retry names the same message");
  assert.deepEqual([done.id, done.outcome], [ids[0], "created"]);
  await real.cancel(done.id);
  const once = new HourglassClient({ transport, retries: 0 });
  ids.length = 0;
  await refused(once.schedule(TOPIC, "x", { delayMs: 3_600_000 }), "UNAVAILABLE");
});
