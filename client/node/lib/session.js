// Connection state without I/O: msgids, the requests in flight, and what each
// incoming message does to them. client.js adds the socket and the waiting.

import * as errors from "./errors.js";
import {
  FrameError, FrameReader, MSGID_MAX, NOTIFICATION, NotRpcError, RESPONSE,
  encodeNotification, encodeRequest, parseMessage,
} from "./protocol.js";

/** The named parameters of `call`: only what the caller set (PROTOCOL §2.2). */
export function callParams(capability, body, opts = {}) {
  const p = { capability, body };
  if (opts.stream) p.stream = true;
  if (opts.scope != null) p.scope = opts.scope;
  if (opts.taskId != null) p.task_id = opts.taskId;
  if (opts.deadlineS != null) p.deadline_s = opts.deadlineS;
  // The W3C trace context carrier, e.g. what OpenTelemetry's
  // propagation.inject(context.active(), carrier) fills.
  if (opts.trace != null) p.trace = opts.trace;
  return p;
}

export class PendingCall {
  constructor(msgid, method, stream) {
    this.msgid = msgid;
    this.method = method;
    this.stream = stream;
    this.events = [];
    this.done = false;
    this.error = null;
    this.result = undefined;
    this.cancelSent = false;
    this.cancelDeadline = null; // when to give up waiting for the cancel's answer
    this.waiter = null;
  }

  finish(error, result) {
    if (this.done) return;
    this.done = true;
    this.error = error;
    this.result = result;
  }

  wake() {
    const w = this.waiter;
    if (w) {
      this.waiter = null;
      w(true);
    }
  }

  /** Resolves true on the next change, false at `deadline` (ms since epoch, or null). */
  changed(deadline) {
    if (this.done || this.events.length > 0) return Promise.resolve(true);
    return new Promise((resolve) => {
      let timer = null;
      const settle = (ok) => {
        if (timer) clearTimeout(timer);
        this.waiter = null;
        resolve(ok);
      };
      this.waiter = settle;
      if (deadline != null) timer = setTimeout(() => settle(false), Math.max(0, deadline - Date.now()));
    });
  }
}

export class Session {
  constructor(maxMessageBytes) {
    this.reader = new FrameReader(maxMessageBytes);
    this.pending = new Map();
    this.nextId = 1;
    this.broken = null; // the Error that ended the connection
    this.fatal = null; // the map of a fatal `error` notification
  }

  /** Registers a request; returns [call, bytes to send]. */
  newCall(method, params, stream = false) {
    if (this.broken) throw errors.fresh(this.broken);
    let msgid = this.nextId;
    while (this.pending.has(msgid)) msgid = msgid < MSGID_MAX ? msgid + 1 : 0;
    this.nextId = msgid < MSGID_MAX ? msgid + 1 : 0;
    const data = encodeRequest(msgid, method, params); // throws before registering
    const call = new PendingCall(msgid, method, stream);
    this.pending.set(msgid, call);
    return [call, data];
  }

  forget(call) {
    if (this.pending.get(call.msgid) === call) this.pending.delete(call.msgid);
  }

  static cancelBytes(msgid) {
    return encodeNotification("cancel", [msgid]);
  }

  /** Feeds bytes; returns the calls that changed. Sets this.broken when the stream is unusable. */
  receive(data) {
    const changed = [];
    if (this.broken) return changed;
    this.reader.feed(data);
    try {
      for (;;) {
        const frame = this.reader.next();
        if (frame === null) break;
        const msg = parseMessage(frame);
        if (msg.type === RESPONSE) {
          const call = this.pending.get(msg.msgid);
          if (call) {
            this.pending.delete(msg.msgid);
            const err = msg.error == null ? null : errors.errorFromWire(msg.error, call.method);
            call.finish(err, err ? undefined : msg.result);
            changed.push(call);
          }
        } else if (msg.type === NOTIFICATION) {
          if (msg.method === "chunk") {
            const p = msg.params;
            if (Array.isArray(p) && p.length === 2 && Number.isInteger(p[0])) {
              const call = this.pending.get(p[0]);
              if (call && call.stream && !call.cancelSent) {
                call.events.push(p[1]);
                changed.push(call);
              }
            }
          } else if (msg.method === "error") {
            const p = msg.params;
            const err = Array.isArray(p) && p[0] && typeof p[0] === "object" ? p[0] : {};
            this.fatal = err;
            const code = typeof err.code === "string" ? err.code : "connection_lost";
            const text = typeof err.message === "string" && err.message ? err.message : code;
            this.broken = new errors.ConnectionLostError(
              `the sidecar closed the connection: ${text}`, { code, data: err });
            changed.push(...this.failAll(this.broken));
            return changed;
          }
        }
        // requests from the sidecar and unknown notifications: ignored
      }
    } catch (e) {
      if (!(e instanceof FrameError || e instanceof NotRpcError)) throw e;
      const code = e instanceof FrameError && e.kind === "too_large" ? "too_large" : "protocol_error";
      this.broken = new errors.ProtocolError(`the sidecar sent an unusable message: ${e.message}`, { code });
      changed.push(...this.failAll(this.broken));
    }
    return changed;
  }

  /** The socket ended: fails every pending call; returns them. */
  connectionLost(reason) {
    if (!this.broken) {
      this.broken = new errors.ConnectionLostError(
        `connection to the sidecar lost${reason ? `: ${reason}` : ""}`);
    }
    return this.failAll(this.broken);
  }

  failAll(err) {
    const calls = [...this.pending.values()];
    this.pending.clear();
    for (const c of calls) c.finish(err, undefined);
    return calls;
  }
}
