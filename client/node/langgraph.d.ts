// polygw/langgraph: LangGraph.js nodes governed by a polygw task (lib/langgraph.js).
import { CallOptions, CallResult, CallStream, Client, GraphStoppedError, NodeWatchdog, Task } from "./index.js";

export { GraphStoppedError };

/** The config.configurable key holding the run's task id. */
export const TASK_KEY: "polygw_task_id";
/** The HTTP header naming the task of a request sent through polygw's HTTP front. */
export const TASK_HEADER: "X-Polygw-Task";

/** The part of LangGraph's RunnableConfig the glue reads and writes. */
export interface GraphConfig {
  configurable?: { thread_id?: string; polygw_task_id?: string; [key: string]: unknown };
  signal?: AbortSignal;
  [key: string]: unknown;
}

/** A governed node's third argument. */
export class NodeContext {
  readonly task: Task;
  readonly taskId: string;
  readonly name: string;
  readonly threadId: string | null;
  readonly signal: AbortSignal | undefined;
  /** task.node_begin's answer. */
  readonly watchdog: NodeWatchdog;
  /** client.call with this task's id and the run's abort signal. */
  call(capability: string, body: { [key: string]: unknown }, options: CallOptions & { stream: true }): Promise<CallStream>;
  call(capability: string, body: { [key: string]: unknown }, options?: CallOptions & { stream?: false }): Promise<CallResult>;
  /** { "X-Polygw-Task": taskId }, for an SDK pointed at polygw's HTTP front. */
  readonly headers: { "X-Polygw-Task": string };
}

/**
 * fn as a LangGraph node governed by the run's task: guard, node_begin
 * (options.timeoutS, else the learned timeout), fn, node_end. A stopped or
 * watchdog-failed task surfaces as GraphStoppedError.
 */
export function governed<S, U>(
  client: Client,
  name: string,
  fn: (state: S, config: GraphConfig, node: NodeContext) => Promise<U> | U,
  options?: { timeoutS?: number },
): (state: S, config: GraphConfig) => Promise<U>;

/** A LangGraph retryOn that never retries a stopped or watchdog-failed task's node; `base` decides the rest. */
export function retryUnlessStopped(base?: (e: unknown) => boolean): (e: unknown) => boolean;

/** config with thread_id and polygw_task_id set. */
export function taskConfig<C extends GraphConfig>(
  config: C | undefined,
  ids: { threadId?: string; taskId: string },
): C & { configurable: NonNullable<GraphConfig["configurable"]> };

/**
 * task.start, graph.invoke(input) (null: continue the thread from its
 * checkpoint), task.finish. Rejects with GraphStoppedError on a stop or a
 * watchdog verdict.
 */
export function runGraph<T>(
  client: Client,
  graph: { invoke(input: unknown, config?: any): Promise<T> },
  input: unknown,
  options: { threadId: string; taskId: string; budget?: number; config?: GraphConfig },
): Promise<T>;
