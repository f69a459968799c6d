// hourglass from Node.js, over gRPC with @grpc/grpc-js. The service is
// loaded from proto/hourglass/v1/hourglass.proto at start (no generated
// code), then:
//
//   1. schedules a message due in --delay-ms, with an idempotency id,
//   2. sends the same request again (a retry): the answer says duplicate,
//   3. schedules a second message far in the future and cancels it,
//   4. waits until the first is delivered and prints where it landed.
//
// Each step prints one JSON line.
//
//   npm ci --prefix examples/node
//   node examples/node/client.js --topic reminders

"use strict";

const path = require("node:path");
const { parseArgs } = require("node:util");
const grpc = require("@grpc/grpc-js");
const protoLoader = require("@grpc/proto-loader");

const { values: opts } = parseArgs({
  options: {
    server: { type: "string", default: "127.0.0.1:50051" },
    topic: { type: "string" },
    "delay-ms": { type: "string", default: "1000" },
    id: { type: "string", default: `node-example-${Date.now()}` },
  },
});
if (!opts.topic) {
  console.error("usage: node client.js --topic TOPIC [--server HOST:PORT] [--delay-ms N] [--id ID]");
  process.exit(2);
}

const definition = protoLoader.loadSync("hourglass/v1/hourglass.proto", {
  includeDirs: [path.join(__dirname, "..", "..", "proto")],
  keepCase: true,
  longs: String,
  enums: String,
  defaults: true,
  oneofs: true,
});
const { Scheduler } = grpc.loadPackageDefinition(definition).hourglass.v1;
const scheduler = new Scheduler(opts.server, grpc.credentials.createInsecure());

// The callback API as promises, each call with a 10 s deadline.
const call = (method, request) =>
  new Promise((resolve, reject) =>
    scheduler[method](request, { deadline: Date.now() + 10_000 }, (err, reply) =>
      err ? reject(err) : resolve(reply),
    ),
  );

const say = (step, fields) => console.log(JSON.stringify({ step, ...fields }));
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const iso = (t) => new Date(Number(t.seconds) * 1000 + t.nanos / 1e6).toISOString();
const delay = (ms) => ({ seconds: String(Math.floor(ms / 1000)), nanos: (ms % 1000) * 1e6 });

async function main() {
  const request = {
    message: {
      topic: opts.topic,
      key: Buffer.from("teacher-7"),
      value: Buffer.from("class starts in 10 minutes"),
      headers: [{ key: "source", value: Buffer.from("node") }],
    },
    delay: delay(Number(opts["delay-ms"])),
    id: opts.id,
  };
  const first = await call("Schedule", request);
  say("scheduled", { id: first.id, deliver_at: iso(first.deliver_at), duplicate: first.duplicate });

  const again = await call("Schedule", request);
  say("retried", { id: again.id, deliver_at: iso(again.deliver_at), duplicate: again.duplicate });

  const undo = `${opts.id}-undo`;
  await call("Schedule", { message: { topic: opts.topic, value: Buffer.from("never sent") }, delay: delay(3_600_000), id: undo });
  const { outcome } = await call("Cancel", { id: undo });
  say("cancelled", { id: undo, outcome });

  const deadline = Date.now() + 60_000;
  let got;
  do {
    got = await call("Get", { id: first.id });
    if (got.state !== "STATE_PENDING") break;
    await sleep(100);
  } while (Date.now() < deadline);
  const delivered = got.settlement === "delivered" ? got.delivered : null;
  say("settled", {
    id: got.id,
    state: got.state,
    partition: delivered ? delivered.partition : null,
    offset: delivered ? Number(delivered.offset) : null,
  });
  return got.state === "STATE_DELIVERED" ? 0 : 1;
}

main().then(
  (code) => process.exit(code),
  (err) => {
    console.error(`hourglass answered ${grpc.status[err.code] ?? err.code}: ${err.details ?? err.message}`);
    process.exit(1);
  },
);
