// Type-checked by the test suite (tsc --strict): what a TypeScript caller
// writes compiles against the package's declarations.
import { HourglassClient, HourglassError, pb, type Scheduled } from "hourglass-kafka";

export async function use(client: HourglassClient): Promise<string> {
  const done: Scheduled = await client.schedule("reminders", "hello", { delayMs: 10_000, key: "teacher-7", labels: { class: "7" } });
  const got: pb.GetResponse = await client.get(done.id);
  const state: pb.State = got.state;
  const stats: pb.StatsResponse = await client.scheduler.stats({});
  void stats;
  for await (const pending of client.list({ topic: "reminders" })) {
    const id: string = pending.id;
    void id;
  }
  try {
    await client.cancel(done.id);
  } catch (e) {
    if (e instanceof HourglassError) return e.violations.map((v) => v.field).join(",");
  }
  return `${done.outcome} ${state === pb.State.PENDING}`;
}
