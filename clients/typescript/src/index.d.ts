// The types of hourglass-kafka's client (index.js). The messages' types are
// the generated ones (./gen/hourglass/v1/hourglass_pb.d.ts), exported as `pb`.

import type { Client, Transport } from "@connectrpc/connect";
import type * as pb from "./gen/hourglass/v1/hourglass_pb.js";

export * as pb from "./gen/hourglass/v1/hourglass_pb.js";

/** A field of the request and what is wrong with it, as the server says. */
export interface FieldViolation {
  field: string;
  description: string;
}

/** A call the server refused or could not answer. */
export declare class HourglassError extends Error {
  constructor(code: string, message: string, violations: FieldViolation[]);
  /** The gRPC status, as its name: "INVALID_ARGUMENT", "NOT_FOUND", "UNAVAILABLE"... */
  readonly code: string;
  /** The server's message. */
  readonly rawMessage: string;
  /** The fields the server refused, and why (google.rpc.BadRequest). */
  readonly violations: FieldViolation[];
}

export interface ClientOptions {
  /** http://host:port, or https://host:port for TLS. Default http://127.0.0.1:50051. */
  baseUrl?: string;
  /** The bearer token of a server with --auth-tokens. */
  token?: string;
  /** PEM file paths: the CA to trust, and a certificate and key for mutual TLS. */
  ca?: string;
  cert?: string;
  key?: string;
  /** Per call. Default 10 s. */
  timeoutMs?: number;
  /** How many times a call answered UNAVAILABLE (or cut by a connection
   * reset) is made again. Default 6 (about 11 s in all). */
  retries?: number;
  /** The first wait before a retry, doubled each time. Default 200 ms. */
  retryBackoffMs?: number;
  /** What the calls speak: gRPC over HTTP/2 (the default), gRPC-Web or
   * the Connect protocol's JSON, both over HTTP/1.1. Streaming calls need
   * "grpc" or "grpc-web". */
  protocol?: "grpc" | "grpc-web" | "connect";
  /** Another connect-es transport instead of gRPC over HTTP/2 (one with
   * interceptors of its own: `token` is refused beside it). */
  transport?: Transport;
}

export type Bytes = string | Uint8Array;

export interface RecordOptions {
  key?: Bytes;
  headers?: Record<string, Bytes> | Map<string, Bytes>;
  partition?: number;
}

export interface ScheduleOptions extends RecordOptions {
  /** When: a Date or Unix milliseconds. */
  at?: Date | number;
  /** Or how long from now, in milliseconds (0 if neither). */
  delayMs?: number;
  /** Your idempotency key; one is made when none is given. */
  id?: string;
  labels?: Record<string, string>;
  /** A deadline past the due time: later, the message expires unproduced. */
  maxLatenessMs?: number;
  deadLetterTopic?: string;
  /** Replace a pending message under the same id. */
  replace?: boolean;
}

export interface Scheduled {
  id: string;
  deliverAt: Date;
  /** The server had the same request already: a retry. */
  duplicate: boolean;
  /** Or `unknown_N` for an outcome a newer server answers. */
  outcome: "created" | "duplicate" | "replaced" | "unspecified" | `unknown_${number}`;
}

export type CancelOutcome =
  | "cancelled"
  | "already_delivered"
  | "already_cancelled"
  | "not_found"
  | "already_failed"
  | "already_expired"
  | "already_dead_lettered"
  | "unspecified"
  | `unknown_${number}`;

export interface SeriesOptions extends RecordOptions {
  cron?: string;
  intervalMs?: number;
  timeZone?: string;
  labels?: Record<string, string>;
  start?: Date | number;
  end?: Date | number;
  count?: number;
}

export declare class HourglassClient {
  constructor(options?: ClientOptions);
  /** The transport the calls go over. */
  readonly transport: Transport;
  /** connect-es clients of the three services, for what the verbs below leave out. */
  readonly scheduler: Client<typeof pb.Scheduler>;
  readonly series: Client<typeof pb.Series>;
  readonly admin: Client<typeof pb.Admin>;
  schedule(topic: string, value: Bytes, options?: ScheduleOptions): Promise<Scheduled>;
  cancel(id: string): Promise<CancelOutcome>;
  reschedule(id: string, due: { at?: Date | number; delayMs?: number }): Promise<Date>;
  get(id: string): Promise<pb.GetResponse>;
  list(filter?: { topic?: string; selector?: string; pageSize?: number }): AsyncIterable<pb.PendingMessage>;
  createSeries(id: string, topic: string, value: Bytes, options: SeriesOptions): Promise<pb.SeriesInfo | undefined>;
  getSeries(id: string): Promise<pb.SeriesInfo>;
  deleteSeries(id: string): Promise<void>;
  pauseTopic(topic: string): Promise<pb.TopicPolicy>;
  resumeTopic(topic: string): Promise<pb.TopicPolicy>;
  setRateLimit(topic: string, perSecond: number, burst?: number): Promise<pb.TopicPolicy>;
  topicPolicy(topic: string): Promise<pb.TopicPolicy>;
}
