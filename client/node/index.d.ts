// Type declarations of the polygw Node.js client (hand-written; the
// implementation is plain ESM JavaScript in index.js and lib/).

/** A decoded msgpack value as the client returns it. */
export type Value =
  | null
  | boolean
  | number
  | bigint // integers beyond Number.MAX_SAFE_INTEGER
  | string
  | Uint8Array // msgpack bin
  | { type: number; data: Uint8Array } // msgpack ext (never sent by the sidecar)
  | Value[]
  | { [key: string]: Value };

/** Anything @msgpack/msgpack can encode (plain objects, arrays, numbers, bigint, strings, Uint8Array, null). */
export type Body = { [key: string]: unknown };

export const VERSION: string;
export const DEFAULT_SOCKET: string;
export const DEFAULT_MAX_MESSAGE_BYTES: number;

export interface ClientOptions {
  /** Socket path; default $POLYGW_SOCKET, then /run/polygw/polygw.sock. */
  socketPath?: string;
  /** Bound on connecting, seconds (default 5). */
  connectTimeoutS?: number;
  /** Client-side wait for ping/stats/task methods, seconds (default 30). */
  requestTimeoutS?: number;
  /** Client-side safety net for calls, seconds (default 3600); the sidecar enforces the real deadlines. */
  callTimeoutS?: number;
  /** How long to wait for the sidecar's answer to a cancel, seconds (default 5). */
  cancelTimeoutS?: number;
  /** Largest message accepted from the sidecar, bytes (default 64 MiB). */
  maxMessageBytes?: number;
}

export interface RequestOptions {
  /** Client-side wait bound, seconds. */
  timeoutS?: number;
  /** Aborting sends `cancel` (for calls) and waits for the sidecar's answer. */
  signal?: AbortSignal;
}

export interface CallOptions extends RequestOptions {
  /** Relay the upstream's stream events (resolve to a CallStream). */
  stream?: boolean;
  /** The task this call belongs to (sent as `task_id`). */
  taskId?: string;
  /** Sidecar-side bound on the whole call, seconds (sent as `deadline_s`). */
  deadlineS?: number;
  /** Progress-tracking scope; default the capability's name. */
  scope?: string;
  /** The W3C trace context carrier (`{traceparent, tracestate}`, as
   * OpenTelemetry's `propagation.inject` fills it): polygw's call span
   * becomes its child (sent as `trace`). */
  trace?: { traceparent?: string; tracestate?: string; [key: string]: unknown };
}

export interface Usage {
  prompt_tokens?: number;
  completion_tokens?: number;
  total_tokens?: number;
  [key: string]: unknown;
}

/** The result of a call (PROTOCOL §4.3). Keys a newer sidecar adds are kept. */
export interface CallResult {
  /** The upstream's JSON answer; absent for streams. */
  body?: { [key: string]: Value };
  source: string;
  attempts: number;
  elapsed_s: number;
  stalled_s: number;
  usage?: Usage;
  [key: string]: unknown;
}

export interface PingResult {
  version: string;
  uptime_s: number;
  [key: string]: unknown;
}

export type Stats = { version: string; uptime_s: number; [key: string]: unknown };

export type TaskState = "running" | "succeeded" | "failed";

export interface TaskInfo {
  task_id: string;
  state: TaskState;
  reason_kind?: "stopped" | "watchdog" | "finished";
  reason?: string;
  node?: string;
  updated_at: number;
  [key: string]: unknown;
}

export class Client {
  constructor(socketPath?: string, options?: Omit<ClientOptions, "socketPath">);
  constructor(options?: ClientOptions);
  readonly socketPath: string;
  connectTimeoutS: number;
  requestTimeoutS: number;
  callTimeoutS: number;
  cancelTimeoutS: number;
  maxMessageBytes: number;
  /** True while a connection is open and usable. */
  readonly connected: boolean;
  /** Opens the connection now (it is opened on demand otherwise, and again after it was lost). */
  connect(): Promise<this>;
  /** Closes the connection; pending requests reject with ConnectionLostError. */
  close(): Promise<void>;
  /** Any method by name with named parameters (for methods without a helper). */
  request<T = Value>(method: string, params?: { [name: string]: unknown }, options?: RequestOptions): Promise<T>;
  ping(options?: RequestOptions): Promise<PingResult>;
  stats(options?: RequestOptions): Promise<Stats>;
  call(capability: string, body: Body, options: CallOptions & { stream: true }): Promise<CallStream>;
  call(capability: string, body: Body, options?: CallOptions & { stream?: false }): Promise<CallResult>;
  call(capability: string, body: Body, options?: CallOptions): Promise<CallResult | CallStream>;
  /** A Task handle (nothing is sent until it is used). */
  task(taskId: string): Task;
  /** `task.list`. */
  tasks(options?: { state?: TaskState }): Promise<TaskInfo[]>;
}

/** Stream events of one call: `for await (const event of stream)`. */
export class CallStream implements AsyncIterableIterator<{ [key: string]: Value }> {
  readonly msgid: number;
  /** The final response (without `body`) once the iteration ended; null before. */
  result: CallResult | null;
  [Symbol.asyncIterator](): this;
  next(): Promise<IteratorResult<{ [key: string]: Value }, undefined>>;
  /** Cancels the call (breaking out of `for await` does too). */
  return(): Promise<IteratorResult<{ [key: string]: Value }, undefined>>;
  /** Cancels the call if it still runs and waits for the sidecar's answer. */
  cancel(): Promise<void>;
}

/** task.node_begin's answer: the watchdog deadline armed for the node. */
export interface NodeWatchdog {
  timeout_s: number;
  timeout_source: "explicit" | "learned" | "default";
}

export class Task {
  constructor(client: Client, taskId: string);
  readonly client: Client;
  readonly taskId: string;
  /** A new run; `budget`: what its calls may cost, in the sidecar's currency; `trace`: the
   * caller's W3C carrier, the parent of the run's trace. */
  start(options?: { budget?: number; trace?: { traceparent?: string; tracestate?: string } }): Promise<TaskInfo>;
  stop(reason: string): Promise<TaskInfo>;
  /** Rejects with TaskStoppedError / WatchdogTimeoutError unless the task is running. */
  guard(): Promise<void>;
  nodeBegin(node: string, options?: { timeoutS?: number }): Promise<NodeWatchdog>;
  nodeEnd(node: string): Promise<{ elapsed_s: number }>;
  finish(ok?: boolean, reason?: string): Promise<TaskInfo>;
  get(): Promise<TaskInfo>;
  call(capability: string, body: Body, options: CallOptions & { stream: true }): Promise<CallStream>;
  call(capability: string, body: Body, options?: CallOptions & { stream?: false }): Promise<CallResult>;
  /** guard + node_begin, fn, node_end (also when fn throws). */
  node<T>(name: string, fn: (task: Task) => Promise<T> | T, options?: { timeoutS?: number }): Promise<T>;
  /** start, fn, finish(ok) -- or finish(false, reason) when fn throws. */
  run<T>(fn: (task: Task) => Promise<T> | T, options?: { budget?: number; trace?: { traceparent?: string; tracestate?: string } }): Promise<T>;
}

// ---------------------------------------------------------------- errors

export interface ErrorSource {
  name: string;
  reason: string;
  detail?: string;
  [key: string]: unknown;
}

/** Base class of every polygw error. */
export class PolygwError extends Error {
  constructor(message?: string, options?: { code?: string; data?: object; cause?: unknown });
  /** Stable machine name ("stalled", ...; local: "connection_lost", "connect_failed", "protocol_error", "timeout"). */
  code: string;
  /** Earliest sensible retry, seconds. */
  retryAfterS: number | null;
  /** Upstream attempts the call made. */
  attempts: number | null;
  /** Seconds charged to the stall budget. */
  stalledS: number | null;
  /** The upstream's HTTP status. */
  status: number | null;
  /** The upstream's error body (decoded JSON, or a string). */
  upstreamBody: Value | null;
  /** Per source, why it did not serve the call. */
  sources: ErrorSource[] | null;
  /** The whole error map as received ({} for local errors). */
  data: { [key: string]: Value };
  /** True for the "retry later" errors. */
  readonly retryLater: boolean;
}

/** The scope cannot serve now: retry later (after retryAfterS when given). */
export class RetryLaterError extends PolygwError {}
/** The call's task is not running any more. */
export class TaskNotRunningError extends PolygwError {}
export class StalledError extends RetryLaterError {}
export class RetryExhaustedError extends RetryLaterError {}
export class BackendUnavailableError extends RetryLaterError {}
export class OverloadedError extends RetryLaterError {}
export class ShuttingDownError extends RetryLaterError {}
export class UpstreamRejectedError extends PolygwError {}
export class DeadlineExceededError extends PolygwError {}
/** The sidecar's `cancelled` answer (or an abort before anything was sent). */
export class CancelledError extends PolygwError {}
export class TaskStoppedError extends TaskNotRunningError {}
export class WatchdogTimeoutError extends TaskNotRunningError {}
/** A budget in currency cannot cover the call (data.budget, data.left; retryAfterS for a window). */
export class BudgetExhaustedError extends PolygwError {}
/**
 * A graph run ended because its task was stopped (kind "stopped"; "budget": its
 * budget ran out) or failed by the watchdog (kind "watchdog"), whatever error the
 * node saw (polygw/langgraph).
 */
export class GraphStoppedError extends TaskNotRunningError {
  constructor(message?: string, options?: {
    code?: string; data?: object; cause?: unknown; taskId?: string | null; threadId?: string | null; node?: string | null;
  });
  readonly kind: "stopped" | "watchdog" | "budget";
  readonly taskId: string | null;
  readonly threadId: string | null;
  /** The node it ended in; null when it ended after the last node (or at task.start). */
  readonly node: string | null;
  /** The sidecar's reason (the stop's reason, or "node X exceeded Ys"). */
  readonly reason: string | null;
  /** `e` as a GraphStoppedError when it is a TaskStoppedError / WatchdogTimeoutError, else null. */
  static from(e: unknown, where?: { taskId?: string | null; threadId?: string | null; node?: string | null }): GraphStoppedError | null;
}
export class StreamInterruptedError extends PolygwError {}
export class BadRequestError extends PolygwError {}
export class UnknownMethodError extends PolygwError {}
export class UnknownCapabilityError extends PolygwError {}
export class TooLargeError extends PolygwError {}
/** A sidecar bug -- and any error code this client does not know (its name stays in `code`). */
export class InternalError extends PolygwError {}
/** A task method on a sidecar without tasks. */
export class TasksNotSupportedError extends UnknownMethodError {}
/** The connection ended while the request was pending; `code` is the fatal notification's when one came. */
export class ConnectionLostError extends PolygwError {}
export class ConnectFailedError extends PolygwError {}
/** The sidecar sent something that is not msgpack-RPC. */
export class ProtocolError extends PolygwError {}
/** The client's own wait bound passed (the call was cancelled first). */
export class ClientTimeoutError extends PolygwError {}

export const ERROR_CLASSES: { readonly [code: string]: typeof PolygwError };
export function errorFromWire(error: { [key: string]: Value }, method?: string): PolygwError;

// ---------------------------------------------------------------- wire level

export function socketPath(path?: string): string;

export class FrameError extends Error {
  kind: "malformed" | "too_large" | "too_deep";
}
export class NotRpcError extends Error {}

/** Incremental reader of msgpack frames with the protocol's limits. */
export class FrameReader {
  constructor(maxBytes?: number, maxDepth?: number);
  readonly pending: number;
  feed(data: Uint8Array): void;
  /** The next complete frame (valid until the next feed), or null. Throws FrameError (sticky). */
  next(): Uint8Array | null;
  frames(): Generator<Uint8Array, void, void>;
}

export interface DecodeHooks {
  int?(v: number | bigint): unknown;
  float?(v: number, bits: 32 | 64): unknown;
  bin?(data: Uint8Array): unknown;
  ext?(type: number, data: Uint8Array): unknown;
  map?(pairs: [unknown, unknown][]): unknown;
}

export class Decoder {
  constructor(buf: Uint8Array, hooks?: DecodeHooks | null);
  value(): unknown;
}
export function decode(frame: Uint8Array, hooks?: DecodeHooks | null): unknown;

export type Message =
  | { type: 0; msgid: number; method: string; params: unknown }
  | { type: 1; msgid: number; error: unknown; result: unknown }
  | { type: 2; method: string; params: unknown };
export function parseMessage(frame: Uint8Array, hooks?: DecodeHooks | null): Message;
export function encodeRequest(msgid: number, method: string, params?: object | null): Uint8Array;
export function encodeNotification(method: string, params: unknown[]): Uint8Array;
