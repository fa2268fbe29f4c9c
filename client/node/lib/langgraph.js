// polygw/langgraph: LangGraph.js nodes governed by a polygw task.
//
// Glue around the task methods of PROTOCOL §4.4, nothing more: each governed
// node checks the task at its start (task.guard: a stopped task raises at the
// boundary, before the node's body runs), arms the watchdog for itself
// (task.node_begin, with the node's own timeout or the sidecar's learned
// one), runs the body with the task id on every call it makes, and disarms
// (task.node_end). The stop itself comes from anywhere (task.stop from a UI,
// `polygwctl task stop ID`): the sidecar ends the task's calls in flight at
// once, so the node fails, the graph run ends, and LangGraph's checkpointer
// keeps the state of the last completed step. A new task resumes the same
// thread from there.
//
// It does not import @langchain/langgraph: a node is a function
// (state, config) => update, and the task id travels in
// config.configurable[TASK_KEY] next to thread_id.

import { BadRequestError, GraphStoppedError, TaskNotRunningError } from "./errors.js";

/** The config.configurable key holding the run's task id. */
export const TASK_KEY = "polygw_task_id";

/** The HTTP header that names the task of a request sent through polygw's HTTP front. */
export const TASK_HEADER = "X-Polygw-Task";

/**
 * What a governed node's body gets as its third argument: its task, and
 * call() / headers that carry the task id into every LLM call it makes.
 */
export class NodeContext {
  constructor(task, name, config, watchdog) {
    this.task = task;
    this.taskId = task.taskId;
    this.name = name;
    this.threadId = config?.configurable?.thread_id ?? null;
    /** LangGraph's signal for this run (aborting the run cancels the call). */
    this.signal = config?.signal;
    /** task.node_begin's answer: {timeout_s, timeout_source}. */
    this.watchdog = watchdog;
  }

  /** client.call with this task's id and the run's abort signal. */
  call(capability, body, opts = {}) {
    return this.task.call(capability, body, { signal: this.signal, ...opts });
  }

  /** Headers naming the task, for an SDK pointed at polygw's HTTP front. */
  get headers() {
    return { [TASK_HEADER]: this.taskId };
  }
}

/**
 * `e` (what a node or a run threw) as the task's verdict when the task is no
 * longer running, else `e` unchanged. A node may see the stop as anything:
 * TaskStoppedError from the client, an SDK's own HTTP error, its own wrapper
 * error; the guard asks the sidecar which it was. When the sidecar cannot
 * answer, `e` is kept.
 */
async function verdict(task, e, where) {
  const direct = GraphStoppedError.from(e, where);
  if (direct) return direct;
  if (e instanceof TaskNotRunningError) return e;
  try {
    await task.guard();
  } catch (g) {
    const v = GraphStoppedError.from(g, where);
    if (v) {
      Object.defineProperty(v, "cause", { value: e, configurable: true, writable: true });
      return v;
    }
  }
  return e;
}

function taskIdOf(config, name) {
  const id = config?.configurable?.[TASK_KEY];
  if (typeof id !== "string" || id === "") {
    throw new TypeError(`governed node ${name}: no task id in config.configurable.${TASK_KEY} ` +
      "(run the graph with runGraph(), or put the task id there with taskConfig())");
  }
  return id;
}

/**
 * Turns `fn(state, config, node)` into a LangGraph node `(state, config)`
 * governed by the run's task (config.configurable[TASK_KEY]):
 *
 *   task.guard          a stopped task raises GraphStoppedError here
 *   task.node_begin     watchdog armed: opts.timeoutS, else the learned one
 *   fn(state, config, node)   node.call() carries the task id
 *   task.node_end
 *
 * Any error while the task is stopped or failed by the watchdog surfaces as
 * GraphStoppedError (kind "stopped" | "watchdog"); other errors are the
 * node's own. A body that completed keeps its output even if the stop came
 * just before node_end: the node is done, the next boundary raises.
 *
 * @param {import("./client.js").Client} client
 * @param {string} name the node's name for the watchdog's history (1-128 bytes)
 * @param {Function} fn async (state, config, node) => update
 * @param {{timeoutS?: number}} [opts]
 */
export function governed(client, name, fn, { timeoutS } = {}) {
  return async (state, config) => {
    const task = client.task(taskIdOf(config, name));
    const where = { taskId: task.taskId, threadId: config?.configurable?.thread_id ?? null, node: name };
    let value;
    try {
      await task.guard();
      const watchdog = await task.nodeBegin(name, { timeoutS });
      value = await fn(state, config, new NodeContext(task, name, config, watchdog));
    } catch (e) {
      await task.nodeEnd(name).catch(() => {});
      throw await verdict(task, e, where);
    }
    try {
      await task.nodeEnd(name);
    } catch (e) {
      // Stopped just now: the next boundary raises. bad_request: a parallel
      // branch's node_begin replaced this node (one watchdog slot per task).
      if (!(e instanceof TaskNotRunningError || e instanceof BadRequestError)) throw e;
    }
    return value;
  };
}

/**
 * A `retryOn` for LangGraph retry policies that never retries a node of a
 * stopped or watchdog-failed task (it would only raise again, after the
 * policy's backoff); `base` decides for every other error.
 *
 *   .addNode("plan", governed(...), { retryPolicy: { maxAttempts: 3, retryOn: retryUnlessStopped() } })
 */
export function retryUnlessStopped(base = () => true) {
  return (e) => !(e instanceof TaskNotRunningError) && base(e);
}

/** `config` with the thread id and the task id where governed nodes look for them. */
export function taskConfig(config = {}, { threadId, taskId }) {
  const configurable = { ...config.configurable, [TASK_KEY]: taskId };
  if (threadId != null) configurable.thread_id = threadId;
  return { ...config, configurable };
}

/**
 * One run of `graph` as task `taskId`: task.start, graph.invoke(input), then
 * task.finish (ok, or failed with the error's text). `input` null continues
 * thread `threadId` from its checkpoint. Rejects with GraphStoppedError when
 * the task was stopped or failed by the watchdog (also when it is refused at
 * start because a stop is final for a task id: resume under a new one);
 * other errors are the graph's own.
 *
 * @param {import("./client.js").Client} client
 * @param {{invoke: Function}} graph a compiled graph (with a checkpointer to resume)
 * @param {unknown} input
 * @param {{threadId: string, taskId: string, budget?: number, config?: object}} opts
 *   budget: what the run's calls may cost (task.start's budget); when it runs
 *   out the sidecar stops the task and this rejects with kind "budget"
 */
export async function runGraph(client, graph, input, { threadId, taskId, budget, config = {} }) {
  const task = client.task(taskId);
  try {
    return await task.run(() => graph.invoke(input, taskConfig(config, { threadId, taskId })),
      { budget });
  } catch (e) {
    throw await verdict(task, e, { taskId, threadId: threadId ?? null, node: null });
  }
}

export { GraphStoppedError };
