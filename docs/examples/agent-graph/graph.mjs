// Stopping and resuming an agent graph (docs/AGENT-GRAPHS.md). run.sh starts
// a mock upstream and a sidecar and runs this with POLYGW_SOCKET, MOCK_URL
// and POLYGWCTL set.
//
// A three-node LangGraph.js graph, plan -> build_skeleton -> write, with a
// MemorySaver checkpointer. build_skeleton's LLM call hangs (the mock is told
// to). The "stop button" -- `polygwctl task stop`, another process -- ends the
// task: the sidecar closes the hung upstream request at once, the graph
// exits at that node with GraphStoppedError, the checkpoint still holds
// plan's output, and a second run (a new task id, the same thread id)
// continues from build_skeleton to the end.
import { execFileSync } from "node:child_process";

import { Annotation, END, MemorySaver, START, StateGraph } from "@langchain/langgraph";
import { Client } from "polygw";
import { GraphStoppedError, governed, runGraph } from "polygw/langgraph";

const MOCK = process.env.MOCK_URL; // the mock's base URL, for its control endpoints
const POLYGWCTL = process.env.POLYGWCTL ?? "polygwctl";
const t0 = Date.now();
const say = (text) => console.log(`${((Date.now() - t0) / 1000).toFixed(3).padStart(7)}s  ${text}`);

async function mock(method, path, body) {
  const res = await fetch(`${MOCK}${path}`, {
    method, headers: { "Content-Type": "application/json" }, body: body && JSON.stringify(body),
  });
  return res.json();
}

const pgw = new Client(); // $POLYGW_SOCKET

const State = Annotation.Root({
  topic: Annotation(),
  outline: Annotation(),
  skeleton: Annotation(),
  text: Annotation(),
});

// Each node makes one chat call through polygw; node.call() names the task.
const step = (name, key, prompt) => governed(pgw, name, async (state, config, node) => {
  say(`[${name}] begins (task ${node.taskId}, watchdog ${node.watchdog.timeout_s}s ${node.watchdog.timeout_source}); calling the LLM`);
  const res = await node.call("chat", { model: "demo", messages: [{ role: "user", content: prompt(state) }] });
  const text = res.body.choices[0].message.content;
  say(`[${name}] done: "${text}"`);
  return { [key]: text };
});

const graph = new StateGraph(State)
  .addNode("plan", step("plan", "outline", (s) => `an outline about ${s.topic}`))
  .addNode("build_skeleton", step("build_skeleton", "skeleton", (s) => `a skeleton for ${s.outline}`))
  .addNode("write", step("write", "text", (s) => `the text of ${s.skeleton}`))
  .addEdge(START, "plan")
  .addEdge("plan", "build_skeleton")
  .addEdge("build_skeleton", "write")
  .addEdge("write", END)
  .compile({ checkpointer: new MemorySaver() });

const threadId = "essay-1";

// The upstream's script: the 2nd request (build_skeleton's) hangs for ever.
await mock("POST", "/_mock/script", [{}, { hang: "before_headers" }, {}, {}]);

say(`run 1: thread ${threadId}, task ${threadId}#1`);
const run1 = runGraph(pgw, graph, { topic: "polygw" }, { threadId, taskId: `${threadId}#1` });
run1.catch(() => {}); // awaited below

// Wait until build_skeleton's call hangs upstream, let it hang a moment, then press stop.
for (let i = 0; i < 500 && (await mock("GET", "/_mock/stats")).in_progress !== 1; i++) {
  await new Promise((r) => setTimeout(r, 10));
}
say("the mock holds build_skeleton's request and does not answer ...");
await new Promise((r) => setTimeout(r, 1500));
say(`stop button: ${POLYGWCTL} task stop ${threadId}#1 --reason "user pressed stop"`);
execFileSync(POLYGWCTL, ["task", "stop", `${threadId}#1`, "--reason", "user pressed stop"], { stdio: "ignore" });

try {
  await run1;
  throw new Error("run 1 was expected to stop");
} catch (e) {
  if (!(e instanceof GraphStoppedError)) throw e;
  say(`run 1 ended: GraphStoppedError kind=${e.kind} node=${e.node} reason="${e.reason}"`);
}
const st = await mock("GET", "/_mock/stats");
const info = await pgw.task(`${threadId}#1`).get();
say(`upstream: ${st.aborted_by_peer} request aborted by the sidecar, ${st.open_connections} connections open, ` +
  `closed ${(st.last_abort_at_ms - info.updated_at * 1000).toFixed(1)} ms after the stop`);
say(`task ${threadId}#1: ${info.state} (${info.reason_kind}: ${info.reason})`);

const saved = await graph.getState({ configurable: { thread_id: threadId } });
say(`checkpoint of ${threadId}: ${JSON.stringify(saved.values)}; next: ${JSON.stringify(saved.next)}`);

// A stop is final for its task id; the resume is a new task on the same thread.
say(`run 2: resume thread ${threadId} from its checkpoint, task ${threadId}#2`);
const done = await runGraph(pgw, graph, null, { threadId, taskId: `${threadId}#2` });
say(`run 2 finished: ${JSON.stringify(done)}`);
say(`task ${threadId}#2: ${(await pgw.task(`${threadId}#2`).get()).state}; upstream requests in all: ` +
  `${(await mock("GET", "/_mock/stats")).requests} (plan ran once)`);
await pgw.close();
