// hourglass-kafka: the Node.js client of hourglass, delayed delivery for
// Apache Kafka, over gRPC (connect-es), typed from the proto (protobuf-es).
// See README.md; the types are in index.d.ts.

import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";

import { create } from "@bufbuild/protobuf";
import { durationFromMs, timestampDate, timestampFromDate } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport, createGrpcWebTransport } from "@connectrpc/connect-node";

import * as pb from "./gen/hourglass/v1/hourglass_pb.js";

export { pb };

/** A call the server refused or could not answer. */
export class HourglassError extends Error {
  constructor(code, message, violations) {
    super(violations.length ? `${code}: ${message} (${violations.map((v) => `${v.field}: ${v.description}`).join("; ")})` : `${code}: ${message}`);
    this.name = "HourglassError";
    /** The gRPC status, as its name: "INVALID_ARGUMENT", "NOT_FOUND"... */
    this.code = code;
    this.rawMessage = message;
    /** The fields the server refused, and why. */
    this.violations = violations;
  }
}

// gRPC's names for its codes (connect's enum spells code 1 "Canceled").
const CODE_NAMES = Object.fromEntries(
  Object.entries(Code)
    .filter(([, v]) => typeof v === "number")
    .map(([name, v]) => [v, v === Code.Canceled ? "CANCELLED" : name.replace(/([a-z])([A-Z])/g, "$1_$2").toUpperCase()]),
);

// Answered by a server restarting or unreachable: made again. The server
// never answers ABORTED itself; connect-node reports a connection reset
// mid-call (the server killed) as that.
const RETRIED = new Set([Code.Unavailable, Code.Aborted]);

// google.rpc.BadRequest, read by hand: field_violations (1) of messages
// whose field (1) and description (2) are strings.
function fields(bytes) {
  const out = [];
  let at = 0;
  const varint = () => {
    let value = 0, shift = 0, byte;
    do {
      byte = bytes[at++];
      value += (byte & 0x7f) * 2 ** shift;
      shift += 7;
    } while (byte & 0x80 && at < bytes.length);
    return value;
  };
  while (at < bytes.length) {
    const tag = varint();
    const wire = tag & 7;
    if (wire === 2) {
      const len = varint();
      out.push([tag >>> 3, bytes.subarray(at, at + len)]);
      at += len;
    } else if (wire === 0) {
      varint();
    } else {
      break;
    }
  }
  return out;
}

function violationsOf(error) {
  const text = new TextDecoder();
  const found = [];
  for (const detail of error.details ?? []) {
    if (!("type" in detail) || detail.type !== "google.rpc.BadRequest") continue;
    for (const [number, violation] of fields(detail.value)) {
      if (number !== 1) continue;
      const v = { field: "", description: "" };
      for (const [n, value] of fields(violation)) {
        if (n === 1) v.field = text.decode(value);
        if (n === 2) v.description = text.decode(value);
      }
      found.push(v);
    }
  }
  return found;
}

function toError(error) {
  const e = ConnectError.from(error);
  return new HourglassError(CODE_NAMES[e.code] ?? "UNKNOWN", e.rawMessage, violationsOf(e));
}

const bytes = (value) => (typeof value === "string" ? new TextEncoder().encode(value) : value);

function whole(n, what) {
  if (!Number.isSafeInteger(n) || n < 0) throw new TypeError(`${what}: give a whole number, 0 or more`);
  return n;
}

function timestamp(at) {
  const date = at instanceof Date ? at : new Date(at);
  if (Number.isNaN(date.getTime())) throw new TypeError(`at: ${at} is no time (give a Date or Unix milliseconds)`);
  return timestampFromDate(date);
}

function duration(ms, what) {
  if (typeof ms !== "number" || !Number.isFinite(ms) || ms < 0) throw new TypeError(`${what}: give milliseconds, 0 or more`);
  return durationFromMs(Math.round(ms));
}

function message(topic, value, { key, headers, partition } = {}) {
  const pairs = headers instanceof Map ? [...headers] : Object.entries(headers ?? {});
  return create(pb.MessageSchema, {
    topic,
    value: bytes(value),
    key: key === undefined ? undefined : bytes(key),
    headers: pairs.map(([k, v]) => ({ key: k, value: bytes(v) })),
    partition,
  });
}

// An enum value's name, lower case; `unknown_N` for one a newer server
// answers that this client does not know.
const outcomeName = (names, prefix, value) => (names[value] ?? `UNKNOWN_${value}`).replace(prefix, "").toLowerCase();

// How each protocol the server's port speaks is reached: gRPC over
// HTTP/2; gRPC-Web and the Connect protocol (JSON) over HTTP/1.1, as
// through proxies that speak nothing else.
const PROTOCOLS = {
  grpc: (options) => createGrpcTransport(options),
  "grpc-web": (options) => createGrpcWebTransport({ ...options, httpVersion: "1.1" }),
  connect: (options) => createConnectTransport({ ...options, httpVersion: "1.1", useBinaryFormat: false }),
};

/**
 * A client of one hourglass server. `baseUrl`: http://host:port, or
 * https:// for TLS (`ca`, `cert`, `key`: PEM file paths, for a private CA
 * and mutual TLS). `token`: the bearer token of a server with tokens.
 * `protocol`: "grpc" (the default), "grpc-web" or "connect" (JSON over
 * HTTP/1.1); streaming calls need "grpc" or "grpc-web".
 */
export class HourglassClient {
  constructor({
    baseUrl = "http://127.0.0.1:50051",
    token,
    ca,
    cert,
    key,
    timeoutMs = 10_000,
    retries = 6,
    retryBackoffMs = 200,
    protocol = "grpc",
    transport,
  } = {}) {
    const auth = (next) => async (req) => {
      if (token) req.header.set("authorization", `Bearer ${token}`);
      return next(req);
    };
    const read = (path) => (path ? readFileSync(path) : undefined);
    const tls = /^https:/i.test(baseUrl);
    if (!tls && (ca || cert || key)) throw new TypeError("ca, cert and key are for TLS: give an https:// baseUrl");
    if (Boolean(cert) !== Boolean(key)) throw new TypeError("cert and key go together (mutual TLS)");
    if (transport && token) throw new TypeError("a transport of your own carries its own interceptors: give the token there");
    const make = PROTOCOLS[protocol];
    if (!make) throw new TypeError(`protocol: "${protocol}" is none of ${Object.keys(PROTOCOLS).join(", ")}`);
    /** The transport the calls go over. */
    this.transport =
      transport ??
      make({
        baseUrl,
        interceptors: [auth],
        nodeOptions: tls ? { ca: read(ca), cert: read(cert), key: read(key) } : undefined,
      });
    this.scheduler = createClient(pb.Scheduler, this.transport);
    this.series = createClient(pb.Series, this.transport);
    this.admin = createClient(pb.Admin, this.transport);
    this.timeoutMs = timeoutMs;
    this.retries = whole(retries, "retries");
    this.retryBackoffMs = whole(retryBackoffMs, "retryBackoffMs");
  }

  // A call, made again while it is answered UNAVAILABLE (about 11 s in
  // all by default: a restart, a shard moving). `goneIsDone`: a retry
  // answered NOT_FOUND was done by the try before.
  async call(method, request, goneIsDone = false) {
    for (let attempt = 0; ; attempt++) {
      try {
        return await method(request, { timeoutMs: this.timeoutMs });
      } catch (error) {
        const e = ConnectError.from(error);
        if (goneIsDone && attempt > 0 && e.code === Code.NotFound) return undefined;
        if (!RETRIED.has(e.code) || attempt >= this.retries) throw toError(e);
      }
      await new Promise((r) => setTimeout(r, Math.min(this.retryBackoffMs * 2 ** attempt, 5000)));
    }
  }

  /**
   * Parks a record for `topic`, due `at` (a Date or Unix ms) or after
   * `delayMs` (now if neither). `id`: your idempotency key; one is made
   * before the first try when none is given, so a retry names the same
   * message.
   */
  async schedule(topic, value, options = {}) {
    const { at, delayMs, id, labels, maxLatenessMs, deadLetterTopic, replace } = options;
    if (at != null && delayMs != null) throw new TypeError("give at or delayMs, not both");
    const request = create(pb.ScheduleRequestSchema, {
      message: message(topic, value, options),
      due: at != null ? { case: "deliverAt", value: timestamp(at) } : { case: "delay", value: duration(delayMs ?? 0, "delayMs") },
      id: id ?? randomUUID(),
      labels: labels ?? {},
      maxLateness: maxLatenessMs == null ? undefined : duration(maxLatenessMs, "maxLatenessMs"),
      deadLetterTopic: deadLetterTopic ?? "",
      onConflict: replace ? pb.OnConflict.REPLACE : pb.OnConflict.REJECT,
    });
    const done = await this.call((r, o) => this.scheduler.schedule(r, o), request);
    return {
      id: done.id,
      deliverAt: timestampDate(done.deliverAt),
      duplicate: done.duplicate,
      outcome: outcomeName(pb.ScheduleOutcome, "SCHEDULE_OUTCOME_", done.outcome),
    };
  }

  /** Cancels a pending message: "cancelled", "already_delivered", "not_found"... */
  async cancel(id) {
    const done = await this.call((r, o) => this.scheduler.cancel(r, o), create(pb.CancelRequestSchema, { id }));
    return outcomeName(pb.CancelOutcome, "CANCEL_OUTCOME_", done.outcome);
  }

  /** Moves a pending message to `at` or `delayMs` from now; its new due time. */
  async reschedule(id, { at, delayMs } = {}) {
    if ((at == null) === (delayMs == null)) throw new TypeError("give at or delayMs (one of them)");
    const due = at != null ? { case: "deliverAt", value: timestamp(at) } : { case: "delay", value: duration(delayMs, "delayMs") };
    const done = await this.call((r, o) => this.scheduler.reschedule(r, o), create(pb.RescheduleRequestSchema, { id, due }));
    return timestampDate(done.deliverAt);
  }

  /** A message, pending or settled (`state`, `delivered.partition`...). */
  async get(id) {
    return this.call((r, o) => this.scheduler.get(r, o), create(pb.GetRequestSchema, { id }));
  }

  /** Pending messages in dispatch order, every page. */
  async *list({ topic = "", selector = "", pageSize = 100 } = {}) {
    let pageToken = "";
    do {
      const request = create(pb.ListRequestSchema, { topic, selector, pageSize, pageToken });
      const page = await this.call((r, o) => this.scheduler.list(r, o), request);
      yield* page.messages;
      pageToken = page.nextPageToken;
    } while (pageToken);
  }

  /** A recurring record, by `cron` (in `timeZone`) or every `intervalMs`. */
  async createSeries(id, topic, value, options = {}) {
    const { cron, intervalMs, timeZone = "", labels, start, end, count = 0 } = options;
    if ((cron == null) === (intervalMs == null)) throw new TypeError("give cron or intervalMs (one of them)");
    const spec = create(pb.SeriesSpecSchema, {
      template: message(topic, value, options),
      every: cron != null ? { case: "cron", value: cron } : { case: "interval", value: duration(intervalMs, "intervalMs") },
      timeZone,
      labels: labels ?? {},
      start: start == null ? undefined : timestamp(start),
      end: end == null ? undefined : timestamp(end),
      count: BigInt(whole(count, "count")),
    });
    const done = await this.call((r, o) => this.series.createSeries(r, o), create(pb.CreateSeriesRequestSchema, { id, spec }));
    return done.series;
  }

  async getSeries(id) {
    return this.call((r, o) => this.series.getSeries(r, o), create(pb.GetSeriesRequestSchema, { id }));
  }

  /** Deletes a series and cancels its parked occurrences. */
  async deleteSeries(id) {
    await this.call((r, o) => this.series.deleteSeries(r, o), create(pb.DeleteSeriesRequestSchema, { id }), true);
  }

  async pauseTopic(topic) {
    return this.call((r, o) => this.admin.pauseTopic(r, o), create(pb.TopicPolicyRequestSchema, { topic }));
  }

  async resumeTopic(topic) {
    return this.call((r, o) => this.admin.resumeTopic(r, o), create(pb.TopicPolicyRequestSchema, { topic }));
  }

  /** Limits how fast the topic's messages go out (0: no limit). */
  async setRateLimit(topic, perSecond, burst = 0) {
    const request = create(pb.SetRateLimitRequestSchema, {
      topic,
      perSecond: whole(perSecond, "perSecond"),
      burst: whole(burst, "burst"),
    });
    return this.call((r, o) => this.admin.setRateLimit(r, o), request);
  }

  async topicPolicy(topic) {
    return this.call((r, o) => this.admin.getTopicPolicy(r, o), create(pb.TopicPolicyRequestSchema, { topic }));
  }
}
