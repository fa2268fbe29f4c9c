// The client: one Unix-socket connection, requests pipelined on it, responses
// and stream chunks routed by msgid. Promises, async iterators, AbortSignal.

import net from "node:net";

import * as errors from "./errors.js";
import { DEFAULT_MAX_MESSAGE_BYTES, socketPath } from "./protocol.js";
import { Session, callParams } from "./session.js";

class Connection {
  constructor(socket, maxMessageBytes) {
    this.socket = socket;
    this.session = new Session(maxMessageBytes);
    this.ended = false; // the sidecar closed its side: no new requests here
  }

  get usable() {
    return !this.ended && !this.session.broken && !this.socket.destroyed;
  }

  write(data) {
    if (this.usable) this.socket.write(data);
  }

  /** Keeps the process alive only while something is pending. */
  updateRef() {
    if (this.session.pending.size > 0) this.socket.ref();
    else this.socket.unref();
  }
}

const now = () => Date.now();

export class Client {
  /**
   * @param {string | object} [socketPathOrOptions] the socket path, or the options
   * @param {object} [options] connectTimeoutS (5), requestTimeoutS (30),
   *   callTimeoutS (3600), cancelTimeoutS (5), maxMessageBytes (64 MiB)
   */
  constructor(socketPathOrOptions, options = {}) {
    let opts = options;
    let path = socketPathOrOptions;
    if (socketPathOrOptions && typeof socketPathOrOptions === "object") {
      opts = socketPathOrOptions;
      path = opts.socketPath;
    }
    this.socketPath = socketPath(path);
    this.connectTimeoutS = opts.connectTimeoutS ?? 5;
    this.requestTimeoutS = opts.requestTimeoutS ?? 30;
    this.callTimeoutS = opts.callTimeoutS ?? 3600;
    this.cancelTimeoutS = opts.cancelTimeoutS ?? 5;
    this.maxMessageBytes = opts.maxMessageBytes ?? DEFAULT_MAX_MESSAGE_BYTES;
    this._conn = null;
    this._connecting = null;
    this._closed = false;
  }

  // ------------------------------------------------------------ lifecycle
  /** Opens the connection now (it is opened on demand otherwise). */
  async connect() {
    await this._connection();
    return this;
  }

  /** Closes the connection; pending requests fail with ConnectionLostError. */
  async close() {
    this._closed = true;
    const conn = this._conn;
    this._conn = null;
    if (conn && !conn.socket.destroyed) {
      await new Promise((resolve) => {
        conn.socket.once("close", resolve);
        conn.socket.destroy();
      });
    }
  }

  get connected() {
    return this._conn !== null && this._conn.usable;
  }

  async _connection() {
    if (this._closed) throw new errors.ConnectionLostError("client closed");
    if (this._conn && this._conn.usable) return this._conn;
    if (!this._connecting) {
      this._connecting = this._open().finally(() => { this._connecting = null; });
    }
    return this._connecting;
  }

  _open() {
    return new Promise((resolve, reject) => {
      const socket = net.createConnection({ path: this.socketPath });
      const timer = setTimeout(() => {
        socket.destroy();
        reject(new errors.ConnectFailedError(`cannot connect to ${this.socketPath}: timeout`));
      }, this.connectTimeoutS * 1000);
      const onError = (e) => {
        clearTimeout(timer);
        reject(new errors.ConnectFailedError(`cannot connect to ${this.socketPath}: ${e.message}`,
          { cause: e }));
      };
      socket.once("error", onError);
      socket.once("connect", () => {
        clearTimeout(timer);
        socket.off("error", onError);
        const conn = new Connection(socket, this.maxMessageBytes);
        let reason = null;
        socket.on("data", (data) => {
          for (const call of conn.session.receive(data)) call.wake();
          if (conn.session.broken) socket.destroy();
          conn.updateRef();
        });
        socket.on("end", () => {
          conn.ended = true;
          reason = reason ?? "closed by the sidecar";
        });
        socket.on("error", (e) => { reason = e.message; });
        socket.on("close", () => {
          conn.ended = true;
          for (const call of conn.session.connectionLost(reason)) call.wake();
          if (this._conn === conn) this._conn = null;
        });
        if (this._closed) {
          socket.destroy();
          reject(new errors.ConnectionLostError("client closed"));
          return;
        }
        this._conn = conn;
        conn.updateRef();
        resolve(conn);
      });
    });
  }

  // ------------------------------------------------------------ requests
  async _start(method, params, stream, signal) {
    if (signal?.aborted) {
      throw new errors.CancelledError("aborted before the request was sent", { cause: signal.reason });
    }
    const conn = await this._connection();
    const [call, data] = conn.session.newCall(method, params, stream);
    conn.updateRef();
    conn.socket.write(data);
    return [conn, call];
  }

  _cancel(conn, call) {
    if (call.done || call.cancelSent) return;
    call.cancelSent = true;
    call.events.length = 0;
    call.cancelDeadline = now() + this.cancelTimeoutS * 1000;
    conn.write(Session.cancelBytes(call.msgid));
    call.wake();
  }

  /**
   * Waits until the call has an event or is done. Handles the client-side
   * timeout and the abort signal (both send `cancel`, then wait at most
   * cancelTimeoutS for the sidecar's answer). Returns nothing; afterwards
   * either call.events is non-empty or call.done.
   */
  async _next(conn, call, state) {
    while (!call.done && call.events.length === 0) {
      const deadline = call.cancelDeadline ?? state.deadline;
      if (await call.changed(deadline)) continue;
      if (call.cancelDeadline !== null) { // the cancel was not answered in time
        conn.session.forget(call);
        conn.updateRef();
        call.finish(new errors.CancelledError("cancelled (the sidecar did not answer the cancel in time)"),
          undefined);
      } else { // the client-side timeout
        state.timedOut = true;
        this._cancel(conn, call);
      }
    }
  }

  _outcome(call, state) {
    if (!call.error) return call.result;
    if (state.timedOut && call.error.code === "cancelled") {
      return Promise.reject(new errors.ClientTimeoutError(
        `no answer to ${call.method} within ${state.timeoutS}s (cancelled)`, { cause: call.error }));
    }
    const e = errors.fresh(call.error);
    if (state.signal?.aborted && e.cause === undefined) {
      Object.defineProperty(e, "cause", { value: state.signal.reason, configurable: true, writable: true });
    }
    return Promise.reject(e);
  }

  async _finish(conn, call, timeoutS, signal) {
    const state = { deadline: timeoutS == null ? null : now() + timeoutS * 1000, timeoutS, signal, timedOut: false };
    const onAbort = () => this._cancel(conn, call);
    signal?.addEventListener("abort", onAbort, { once: true });
    if (signal?.aborted) onAbort(); // aborted while connecting
    try {
      while (!call.done) {
        await this._next(conn, call, state);
        call.events.length = 0; // chunks of a call nobody streams
      }
    } finally {
      signal?.removeEventListener("abort", onAbort);
    }
    return this._outcome(call, state);
  }

  /**
   * Any method by name with an object of named parameters; resolves to its
   * result. For methods this stub has no helper for (PROTOCOL §8).
   */
  async request(method, params, { timeoutS, signal } = {}) {
    const [conn, call] = await this._start(method, params, false, signal);
    const t = timeoutS ?? (method === "call" ? this.callTimeoutS : this.requestTimeoutS);
    return this._finish(conn, call, t, signal);
  }

  /** `ping`: {version, uptime_s}. */
  ping(opts) {
    return this.request("ping", undefined, opts);
  }

  /** `stats`: the sidecar's counters. */
  stats(opts) {
    return this.request("stats", undefined, opts);
  }

  /**
   * One governed upstream call. Resolves to {body, source, attempts,
   * elapsed_s, stalled_s, usage?}; with {stream: true} to a CallStream to
   * iterate with `for await`. Aborting `signal` sends `cancel` and waits for
   * the sidecar's answer (the promise then rejects with CancelledError whose
   * `cause` is the signal's reason -- or resolves, if the call won the race).
   */
  async call(capability, body, opts = {}) {
    const params = callParams(capability, body, opts);
    const [conn, call] = await this._start("call", params, Boolean(opts.stream), opts.signal);
    const timeoutS = opts.timeoutS ?? this.callTimeoutS;
    if (opts.stream) return new CallStream(this, conn, call, timeoutS, opts.signal);
    return this._finish(conn, call, timeoutS, opts.signal);
  }

  // ------------------------------------------------------------ tasks
  /** A Task handle (nothing is sent until it is used). */
  task(taskId) {
    return new Task(this, taskId);
  }

  /** `task.list`: the tasks, optionally only those in `state`. */
  async tasks({ state } = {}) {
    const res = await this.request("task.list", state != null ? { state } : undefined);
    return res && Array.isArray(res.tasks) ? res.tasks : [];
  }
}

// A CallStream dropped unfinished (never iterated to its end nor cancelled)
// has its call cancelled once the garbage collector notices.
const abandoned = new FinalizationRegistry(({ client, conn, call }) => client._cancel(conn, call));

/**
 * A streaming call: `for await (const event of stream)` yields each upstream
 * event as it arrives; afterwards `stream.result` holds the final response
 * (without `body`). Failures throw from the iteration. `break` (or an
 * exception in the loop), `stream.cancel()` or the call's AbortSignal
 * cancel the call and wait for the sidecar's answer.
 */
export class CallStream {
  constructor(client, conn, call, timeoutS, signal) {
    this._client = client;
    this._conn = conn;
    this._call = call;
    this._state = { deadline: timeoutS == null ? null : now() + timeoutS * 1000, timeoutS, signal, timedOut: false };
    this._onAbort = () => client._cancel(conn, call);
    signal?.addEventListener("abort", this._onAbort, { once: true });
    if (signal?.aborted) this._onAbort();
    this.result = null;
    abandoned.register(this, { client, conn, call }, this);
  }

  get msgid() {
    return this._call.msgid;
  }

  [Symbol.asyncIterator]() {
    return this;
  }

  async next() {
    const call = this._call;
    await this._client._next(this._conn, call, this._state);
    if (call.events.length > 0) return { value: call.events.shift(), done: false };
    this._state.signal?.removeEventListener("abort", this._onAbort);
    abandoned.unregister(this);
    this.result = await this._client._outcome(call, this._state);
    return { value: undefined, done: true };
  }

  /** Cancels the call (if still running) and waits for the sidecar's answer. */
  async cancel() {
    const call = this._call;
    this._client._cancel(this._conn, call);
    while (!call.done) await this._client._next(this._conn, call, this._state);
    this._state.signal?.removeEventListener("abort", this._onAbort);
    abandoned.unregister(this);
  }

  async return() {
    await this.cancel();
    return { value: undefined, done: true };
  }
}

const NOT_RUNNING = [errors.TaskNotRunningError, errors.ConnectionLostError, errors.ConnectFailedError];

/**
 * A task (PROTOCOL §4.4, docs/DESIGN.md §3.5) seen from the client:
 *
 *   await client.task("run-42").run(async (task) => {
 *     await task.node("build_skeleton", async () => {     // guard + node_begin ... node_end
 *       await task.call("chat", body);                    // call with task_id
 *     });
 *   });                                                   // start ... finish
 *
 * Every method rejects with TasksNotSupportedError on a sidecar without tasks.
 */
export class Task {
  constructor(client, taskId) {
    this.client = client;
    this.taskId = taskId;
  }

  _req(method, params = {}) {
    const p = { task_id: this.taskId };
    for (const [k, v] of Object.entries(params)) if (v != null) p[k] = v;
    return this.client.request(method, p);
  }

  /**
   * A new run; `budget`: what its calls may cost, in the sidecar's currency;
   * `trace`: the caller's W3C carrier ({traceparent, tracestate}), the parent
   * of the run's trace (its calls without their own join it).
   */
  start({ budget, trace } = {}) { return this._req("task.start", { budget, trace }); }
  stop(reason) { return this._req("task.stop", { reason }); }
  /** Rejects with TaskStoppedError / WatchdogTimeoutError unless running. */
  async guard() { await this._req("task.guard"); }
  nodeBegin(node, { timeoutS } = {}) { return this._req("task.node_begin", { node, timeout_s: timeoutS }); }
  nodeEnd(node) { return this._req("task.node_end", { node }); }
  finish(ok = true, reason) { return this._req("task.finish", { ok: Boolean(ok), reason }); }
  get() { return this._req("task.get"); }

  /** client.call with this task's id. */
  call(capability, body, opts = {}) {
    return this.client.call(capability, body, { ...opts, taskId: this.taskId });
  }

  /** Runs fn as node `name`: guard and node_begin before, node_end after (also on failure). */
  async node(name, fn, { timeoutS } = {}) {
    await this.guard();
    await this.nodeBegin(name, { timeoutS });
    let value;
    try {
      value = await fn(this);
    } catch (e) {
      await this.nodeEnd(name).catch(() => {});
      throw e;
    }
    await this.nodeEnd(name);
    return value;
  }

  /**
   * start, fn(task), then finish: ok when fn resolves, failed with the
   * error's text when it rejects (a task already stopped or failed by the
   * watchdog is left as the sidecar has it).
   */
  async run(fn, { budget, trace } = {}) {
    await this.start({ budget, trace });
    let value;
    try {
      value = await fn(this);
    } catch (e) {
      if (!NOT_RUNNING.some((cls) => e instanceof cls)) {
        const reason = `${e?.name ?? "Error"}: ${e?.message ?? String(e)}`.slice(0, 200);
        await this.finish(false, reason).catch(() => {});
      }
      throw e;
    }
    await this.finish(true);
    return value;
  }
}
