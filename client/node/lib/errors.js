// Typed errors: one Error subclass per error code of PROTOCOL §6.2, plus the
// few the client finds on its own.
//
//   PolygwError
//   ├── RetryLaterError            the scope cannot serve now: retry later
//   │   ├── StalledError, RetryExhaustedError, BackendUnavailableError
//   │   └── OverloadedError, ShuttingDownError
//   ├── TaskNotRunningError        the call's task is not running
//   │   ├── TaskStoppedError, WatchdogTimeoutError
//   │   └── GraphStoppedError      a graph's task ended at a node (polygw/langgraph)
//   ├── UpstreamRejectedError, DeadlineExceededError, CancelledError,
//   │   StreamInterruptedError, BadRequestError, UnknownCapabilityError,
//   │   TooLargeError, InternalError (also any code this client does not know)
//   ├── UnknownMethodError
//   │   └── TasksNotSupportedError  a task method on a sidecar without tasks
//   └── ConnectionLostError, ConnectFailedError, ProtocolError, ClientTimeoutError

const num = (v) => (typeof v === "number" ? v : typeof v === "bigint" ? Number(v) : null);

export class PolygwError extends Error {
  /**
   * @param {string} message
   * @param {{code?: string, data?: object, cause?: unknown}} [opts]
   */
  constructor(message = "", { code, data, cause } = {}) {
    super(message, cause === undefined ? undefined : { cause });
    this.name = new.target.name;
    this.code = code ?? new.target.code ?? "internal";
    const d = data && typeof data === "object" ? data : {};
    this.data = d;
    this.retryAfterS = num(d.retry_after_s);
    this.stalledS = num(d.stalled_s);
    this.attempts = Number.isInteger(d.attempts) ? d.attempts : null;
    this.status = Number.isInteger(d.status) ? d.status : null;
    this.upstreamBody = d.upstream_body === undefined ? null : d.upstream_body;
    this.sources = Array.isArray(d.sources) ? d.sources : null;
  }

  /** True for the "retry later" codes (same as instanceof RetryLaterError). */
  get retryLater() {
    return this instanceof RetryLaterError;
  }
}

export class RetryLaterError extends PolygwError {}
export class TaskNotRunningError extends PolygwError {}

export class StalledError extends RetryLaterError { static code = "stalled"; }
export class RetryExhaustedError extends RetryLaterError { static code = "retry_exhausted"; }
export class BackendUnavailableError extends RetryLaterError { static code = "backend_unavailable"; }
export class OverloadedError extends RetryLaterError { static code = "overloaded"; }
export class ShuttingDownError extends RetryLaterError { static code = "shutting_down"; }
export class UpstreamRejectedError extends PolygwError { static code = "upstream_rejected"; }
export class DeadlineExceededError extends PolygwError { static code = "deadline_exceeded"; }
/** The sidecar's `cancelled` answer (also: aborted before it was sent). */
export class CancelledError extends PolygwError { static code = "cancelled"; }
export class TaskStoppedError extends TaskNotRunningError { static code = "task_stopped"; }
export class WatchdogTimeoutError extends TaskNotRunningError { static code = "watchdog_timeout"; }
/** A budget in currency cannot cover the call: `data.budget` says which,
 * `data.left` what it has left; a window's reset is in `retryAfterS`. */
export class BudgetExhaustedError extends PolygwError { static code = "budget_exhausted"; }

/**
 * A graph run ended because its task was stopped (`kind` "stopped": task.stop,
 * an ordinary exit; `kind` "budget": the task's budget ran out, the sidecar
 * stopped it) or failed by the watchdog (`kind` "watchdog": a node ran
 * past its deadline), whatever error the node itself saw. Not a failure of
 * the graph: its checkpoint holds every node that completed, and a new task
 * can resume it. `node` is the node it ended in (null when it ended after
 * the last node), `reason` the sidecar's reason, `cause` the error seen.
 */
export class GraphStoppedError extends TaskNotRunningError {
  constructor(message = "", { code, data, cause, taskId = null, threadId = null, node = null } = {}) {
    super(message, { code, data, cause });
    this.taskId = taskId;
    this.threadId = threadId;
    this.node = node;
    this.reason = typeof this.data.reason === "string" ? this.data.reason : null;
    // A task the sidecar stopped because its budget ran out is stopped with
    // reason "budget": neither a failure nor a hang.
    this.kind = this.code === "watchdog_timeout" ? "watchdog"
      : this.reason === "budget" ? "budget" : "stopped";
  }

  /**
   * `e` as a GraphStoppedError when it is the task's own verdict
   * (TaskStoppedError / WatchdogTimeoutError); null otherwise.
   */
  static from(e, where = {}) {
    if (e instanceof GraphStoppedError) return e;
    if (!(e instanceof TaskStoppedError || e instanceof WatchdogTimeoutError)) return null;
    const at = where.node == null ? "after its last node" : `at node ${where.node}`;
    const what = e.code === "watchdog_timeout" ? "failed by the watchdog" : "stopped";
    const why = typeof e.data.reason === "string" && e.data.reason ? `: ${e.data.reason}` : "";
    return new GraphStoppedError(`task ${where.taskId ?? "?"} ${what} ${at}${why}`,
      { code: e.code, data: e.data, cause: e, ...where });
  }
}
export class StreamInterruptedError extends PolygwError { static code = "stream_interrupted"; }
export class BadRequestError extends PolygwError { static code = "bad_request"; }
export class UnknownMethodError extends PolygwError { static code = "unknown_method"; }
export class UnknownCapabilityError extends PolygwError { static code = "unknown_capability"; }
export class TooLargeError extends PolygwError { static code = "too_large"; }
export class InternalError extends PolygwError { static code = "internal"; }
export class TasksNotSupportedError extends UnknownMethodError { static code = "unknown_method"; }

/**
 * The connection ended while the request was pending. `code` is the code of
 * the sidecar's fatal `error` notification when one came, else
 * "connection_lost". Whether the call reached the upstream is unknown.
 */
export class ConnectionLostError extends PolygwError {
  static code = "connection_lost";

  get retryLater() {
    return ["connection_lost", "overloaded", "shutting_down"].includes(this.code);
  }
}
export class ConnectFailedError extends PolygwError { static code = "connect_failed"; }
export class ProtocolError extends PolygwError { static code = "protocol_error"; }
export class ClientTimeoutError extends PolygwError { static code = "timeout"; }

export const ERROR_CLASSES = Object.freeze(Object.fromEntries([
  StalledError, RetryExhaustedError, UpstreamRejectedError, DeadlineExceededError,
  CancelledError, TaskStoppedError, WatchdogTimeoutError, StreamInterruptedError,
  BackendUnavailableError, BudgetExhaustedError, BadRequestError, UnknownMethodError,
  UnknownCapabilityError, TooLargeError, OverloadedError, ShuttingDownError, InternalError,
].map((cls) => [cls.code, cls])));

/**
 * The Error for an error map {code, message, ...} of a response. Unknown
 * codes become InternalError keeping their name (PROTOCOL §6.1).
 */
export function errorFromWire(err, method) {
  if (!err || typeof err !== "object" || Array.isArray(err)) {
    return new ProtocolError(`error is not a map: ${String(err)}`);
  }
  const code = typeof err.code === "string" ? err.code : "internal";
  let message = typeof err.message === "string" ? err.message : "";
  let cls = Object.hasOwn(ERROR_CLASSES, code) ? ERROR_CLASSES[code] : InternalError;
  if (cls === UnknownMethodError && typeof method === "string" && method.startsWith("task.")) {
    cls = TasksNotSupportedError;
    message = `tasks not supported by this sidecar (${message})`;
  }
  return new cls(message, { code, data: err });
}

/** A new Error equal to `e` (one stored failure may reach several awaiters). */
export function fresh(e) {
  if (!(e instanceof PolygwError)) return e;
  return new e.constructor(e.message, { code: e.code, data: e.data, cause: e.cause });
}
