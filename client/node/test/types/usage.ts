// Compiled (not run) by test/types.test.js: the declarations in index.d.ts
// must type-check the way the README uses the client.
import { Client, RetryLaterError, UpstreamRejectedError, CallStream, TaskStoppedError, PolygwError } from "../../index.js";

async function main(): Promise<void> {
  const c = new Client({ socketPath: "/tmp/x.sock", callTimeoutS: 60 });
  const c2 = new Client("/tmp/x.sock", { requestTimeoutS: 5 });
  const pong = await c.ping();
  const v: string = pong.version;
  const res = await c.call("chat", { messages: [{ role: "user", content: "hi" }] }, { deadlineS: 30, scope: "s" });
  const src: string = res.source;
  const n: number = res.attempts;
  const stream: CallStream = await c.call("chat", { messages: [] }, { stream: true, signal: AbortSignal.timeout(1000) });
  for await (const ev of stream) {
    console.log(ev["choices"]);
  }
  console.log(stream.result?.usage?.total_tokens);
  try {
    await c.call("chat", {});
  } catch (e) {
    if (e instanceof RetryLaterError) console.log(e.retryAfterS, e.code, e.retryLater);
    if (e instanceof UpstreamRejectedError) console.log(e.status, e.upstreamBody, e.sources?.[0].reason);
    if (e instanceof PolygwError && e.attempts !== null) console.log(e.attempts);
  }
  const task = c.task("run-1");
  const out: number = await task.run(async (t) => t.node("plan", async () => { await t.call("chat", {}); return 3; }, { timeoutS: 5 }));
  await task.guard().catch((e) => { if (e instanceof TaskStoppedError) return; throw e; });
  const list = await c.tasks({ state: "running" });
  console.log(v, src, n, out, list[0]?.state, await c2.stats());
  await c.close();
}
void main();

// polygw/langgraph (self-reference through the package's exports)
import { GraphStoppedError, governed, runGraph, taskConfig, TASK_HEADER } from "polygw/langgraph";

async function graphs(c: Client): Promise<void> {
  type S = { topic: string; outline?: string };
  const plan = governed(c, "plan", async (state: S, config, node) => {
    const r = await node.call("chat", { messages: [{ role: "user", content: state.topic }] }, { deadlineS: 30 });
    const h: string = node.headers[TASK_HEADER];
    console.log(node.watchdog.timeout_source, node.threadId, config.configurable?.thread_id, h);
    return { outline: String(r.body) };
  }, { timeoutS: 120 });
  const graph = { invoke: async (input: unknown, config?: unknown) => ({ input, config, plan }) };
  try {
    await runGraph(c, graph, { topic: "t" }, { threadId: "doc", taskId: "doc#1" });
  } catch (e) {
    if (e instanceof GraphStoppedError) {
      const k: "stopped" | "watchdog" | "budget" = e.kind;
      console.log(k, e.node, e.reason, e.taskId, e.threadId);
    }
  }
  console.log(taskConfig({ recursionLimit: 5 }, { threadId: "doc", taskId: "doc#2" }).configurable?.polygw_task_id);
}
void graphs;
