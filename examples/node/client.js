// hourglass from Node.js, with its client package (clients/typescript):
//
//   1. schedules a message due in --delay-ms, with an idempotency id,
//   2. sends the same request again (a retry): the answer says duplicate,
//   3. schedules a second message far in the future and cancels it,
//   4. waits until the first is delivered and prints where it landed.
//
// Each step prints one JSON line.
//
//   npm ci --prefix examples/node        (installs ../../clients/typescript)
//   node examples/node/client.js --topic reminders

import { parseArgs } from "node:util";

import { HourglassClient, pb } from "hourglass-kafka";

const { values: opts } = parseArgs({
  options: {
    server: { type: "string", default: "127.0.0.1:50051" },
    token: { type: "string" },
    topic: { type: "string" },
    "delay-ms": { type: "string", default: "1000" },
    id: { type: "string", default: `node-example-${Date.now()}` },
  },
});
if (!opts.topic) {
  console.error("usage: node client.js --topic TOPIC [--server HOST:PORT] [--token T] [--delay-ms N] [--id ID]");
  process.exit(2);
}

const baseUrl = /^https?:\/\//.test(opts.server) ? opts.server : `http://${opts.server}`;
const hg = new HourglassClient({ baseUrl, token: opts.token });
const say = (step, fields) => console.log(JSON.stringify({ step, ...fields }));
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function main() {
  const schedule = () =>
    hg.schedule(opts.topic, "class starts in 10 minutes", {
      key: "teacher-7",
      headers: { source: "node" },
      delayMs: Number(opts["delay-ms"]),
      id: opts.id,
    });
  const first = await schedule();
  say("scheduled", { id: first.id, deliver_at: first.deliverAt.toISOString(), duplicate: first.duplicate });
  const again = await schedule();
  say("retried", { id: again.id, deliver_at: again.deliverAt.toISOString(), duplicate: again.duplicate });

  const undo = await hg.schedule(opts.topic, "never sent", { delayMs: 3_600_000, id: `${opts.id}-undo` });
  say("cancelled", { id: undo.id, outcome: await hg.cancel(undo.id) });

  const deadline = Date.now() + 60_000;
  let got;
  do {
    got = await hg.get(first.id);
    if (got.state !== pb.State.PENDING) break;
    await sleep(100);
  } while (Date.now() < deadline);
  const delivered = got.settlement.case === "delivered" ? got.settlement.value : null;
  say("settled", {
    id: got.id,
    state: `STATE_${pb.State[got.state]}`,
    partition: delivered ? delivered.partition : null,
    offset: delivered ? Number(delivered.offset) : null,
  });
  return got.state === pb.State.DELIVERED ? 0 : 1;
}

main().then(
  (code) => process.exit(code),
  (err) => {
    console.error(`hourglass answered ${err.message}`);
    process.exit(1);
  },
);
