// Replays proto/vectors/ (see its README) through the client's own frame
// reader, decoder and message classification: whole, byte by byte, and split
// in two at every offset. The parameter tables of PROTOCOL §4 are bound here
// (the client never validates what it sends: a newer sidecar may accept
// more), so `bad_params` vectors are refused and all others accepted.
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { test } from "node:test";

import {
  FrameError, FrameReader, NotRpcError, decode, encodeNotification, encodeRequest, parseMessage,
} from "../index.js";
import { VECTORS } from "./helpers.js";

const MANIFEST = JSON.parse(fs.readFileSync(path.join(VECTORS, "vectors.json"), "utf8"));
const DEFAULT_LIMIT = MANIFEST.defaults.max_message_bytes;
const PING = Buffer.from("940001a470696e6790", "hex");
const KINDS = ["request", "response", "notification"];
const hex = (u8) => Buffer.from(u8).toString("hex");

// ---------------------------------------------------------------- rendering
const SAFE = 2 ** 53 - 1;
const RENDER = {
  int: (v) => (typeof v === "bigint" || Math.abs(v) > SAFE ? { $int: String(v) } : v),
  float: (v, bits) => ({ [bits === 32 ? "$f32" : "$f64"]: v }),
  bin: (b) => ({ $bin: hex(b) }),
  ext: (type, data) => ({ $ext: [type, hex(data)] }),
  map: (pairs) => {
    const keys = pairs.map(([k]) => k);
    if (keys.every((k) => typeof k === "string" && !k.startsWith("$")) && new Set(keys).size === keys.length) {
      const o = {};
      for (const [k, v] of pairs) Object.defineProperty(o, k, { value: v, enumerable: true });
      return o;
    }
    return { $map: pairs };
  },
};

const floatOf = (x) => (typeof x === "string" ? { nan: NaN, inf: Infinity, "-inf": -Infinity }[x] : x);

function same(actual, expected) {
  if (expected === null || typeof expected !== "object") return Object.is(actual, expected) || actual === expected;
  if (Array.isArray(expected)) {
    return Array.isArray(actual) && actual.length === expected.length && expected.every((e, i) => same(actual[i], e));
  }
  if (actual === null || typeof actual !== "object" || Array.isArray(actual)) return false;
  const keys = Object.keys(expected);
  if (keys.length === 1 && (keys[0] === "$f32" || keys[0] === "$f64")) {
    const a = actual[keys[0]];
    if (Object.keys(actual).length !== 1 || typeof a !== "number") return false;
    const e = floatOf(expected[keys[0]]);
    return (Number.isNaN(a) && Number.isNaN(e)) || a === e;
  }
  const akeys = Object.keys(actual);
  return akeys.length === keys.length && keys.every((k) => Object.hasOwn(actual, k) && same(actual[k], expected[k]));
}

// ---------------------------------------------------------------- binding
class Pairs { constructor(p) { this.pairs = p; } }
class Bin {}
class Ext {}
class Float {}
const BIND = { map: (p) => new Pairs(p), bin: () => new Bin(), ext: () => new Ext(), float: () => new Float() };

const SPECS = {
  ping: {},
  stats: {},
  call: { capability: ["str", true], body: ["map", true], stream: ["bool", false], scope: ["str", false],
    task_id: ["str", false], deadline_s: ["number", false] },
  "task.start": { task_id: ["str", true] },
  "task.stop": { task_id: ["str", true], reason: ["str", true] },
  "task.guard": { task_id: ["str", true] },
  "task.node_begin": { task_id: ["str", true], node: ["str", true], timeout_s: ["number", false] },
  "task.node_end": { task_id: ["str", true], node: ["str", true] },
  "task.finish": { task_id: ["str", true], ok: ["bool", true], reason: ["str", false] },
  "task.get": { task_id: ["str", true] },
  "task.list": { state: ["str", false] },
};

function isType(v, t) {
  switch (t) {
    case "number": return typeof v === "number" || typeof v === "bigint" || v instanceof Float;
    case "str": return typeof v === "string";
    case "map": return v instanceof Pairs;
    default: return typeof v === "boolean";
  }
}

/** PROTOCOL §2.2 over bind-decoded params; throws on bad params. */
function bind(params, spec) {
  if (!Array.isArray(params) || params.length > 1) throw new Error("params must be an array holding one map");
  let m = params.length ? params[0] : null;
  if (m === null) m = new Pairs([]);
  if (!(m instanceof Pairs)) throw new Error("params[0] must be a map");
  const seen = new Map();
  for (const [k, v] of m.pairs) {
    if (typeof k !== "string") throw new Error("parameter names must be strings");
    if (!Object.hasOwn(spec, k)) throw new Error(`unknown parameter ${k}`);
    if (seen.has(k)) throw new Error(`parameter ${k} given twice`);
    if (v !== null && !isType(v, spec[k][0])) throw new Error(`parameter ${k}: wrong type`);
    seen.set(k, v);
  }
  for (const [k, [, required]] of Object.entries(spec)) {
    if (required && (seen.get(k) ?? null) === null) throw new Error(`missing required parameter ${k}`);
  }
}

// ---------------------------------------------------------------- replay
function checkFrame(vec, frame, index) {
  const decoded = vec.frames === 1 ? vec.decoded : vec.decoded[index];
  const kind = vec.frames === 1 ? vec.kind : vec.kind[index];
  const rendered = decode(frame, RENDER);
  assert.ok(same(rendered, decoded), `${vec.name}: frame ${index} decodes to ${JSON.stringify(rendered, (k, v) => (typeof v === "bigint" ? String(v) : v))}`);
  let msg;
  try {
    msg = parseMessage(frame, BIND);
  } catch (e) {
    if (!(e instanceof NotRpcError)) throw e;
    assert.equal(kind, null, `${vec.name}: refused as not msgpack-RPC (${e.message})`);
    assert.equal(vec.error, "not_rpc");
    return "not_rpc";
  }
  assert.equal(KINDS[msg.type], kind, `${vec.name}: classified as ${KINDS[msg.type]}`);
  if (msg.type === 0 && Object.hasOwn(SPECS, msg.method)) {
    try {
      bind(msg.params, SPECS[msg.method]);
    } catch (e) {
      assert.equal(vec.error, "bad_params", `${vec.name}: params refused: ${e.message}`);
      return "bad_params";
    }
    assert.notEqual(vec.error, "bad_params", `${vec.name}: bad params accepted`);
  }
  return null;
}

function replay(vec, pieces) {
  const reader = new FrameReader(vec.max_message_bytes ?? DEFAULT_LIMIT);
  let count = 0;
  let outcome = null;
  try {
    for (const piece of pieces) {
      reader.feed(piece);
      for (const frame of reader.frames()) {
        assert.ok(count < vec.frames, `${vec.name}: more frames than expected`);
        outcome = checkFrame(vec, frame, count) ?? outcome;
        count += 1;
      }
    }
  } catch (e) {
    if (!(e instanceof FrameError)) throw e;
    outcome = e.kind;
  }
  assert.equal(count, vec.frames, `${vec.name}: ${count} frames, expected ${vec.frames}`);
  if (["malformed", "too_large", "too_deep"].includes(outcome)) {
    reader.feed(PING); // sticky: a valid ping after the error changes nothing
    assert.throws(() => reader.next(), (e) => e instanceof FrameError && e.kind === outcome);
  } else if (outcome === null && reader.pending > 0) {
    outcome = "incomplete";
  }
  assert.equal(outcome, vec.error, `${vec.name}: outcome ${outcome}, expected ${vec.error}`);
}

const data = (vec) => fs.readFileSync(path.join(VECTORS, vec.file));

for (const vec of MANIFEST.vectors) {
  test(`vector ${vec.name}`, () => {
    const bytes = data(vec);
    replay(vec, [bytes]);
    replay(vec, [...bytes].map((b) => Buffer.from([b])));
    if (bytes.length <= 4096) {
      for (let cut = 1; cut < bytes.length; cut++) replay(vec, [bytes.subarray(0, cut), bytes.subarray(cut)]);
    }
  });
}

test("the manifest covers every outcome", () => {
  const outcomes = new Set(MANIFEST.vectors.map((v) => v.error));
  assert.deepEqual([...outcomes].sort(), [null, "bad_params", "incomplete", "malformed", "not_rpc", "too_deep", "too_large"].sort());
  assert.ok(MANIFEST.vectors.length >= 80);
});

test("the writers produce the vectors' bytes", () => {
  const byName = Object.fromEntries(MANIFEST.vectors.map((v) => [v.name, data(v)]));
  assert.equal(hex(encodeRequest(1, "ping")), hex(byName.request_ping));
  assert.equal(hex(encodeRequest(7, "call", {
    capability: "chat", body: { model: "gpt-4o-mini", messages: [{ role: "user", content: "Say hi" }] },
  })), hex(byName.request_call));
  assert.equal(hex(encodeNotification("cancel", [7])), hex(byName.notification_cancel));
});

test("plain decoding: exact integers, __proto__ keys, bin", () => {
  const frame = Buffer.from(byNameHex("request_big_ints"), "hex");
  const msg = parseMessage(frame);
  const body = msg.params[0].body;
  assert.equal(body.seed, 18446744073709551615n);
  assert.equal(body.min, -9223372036854775808n);
  assert.equal(body.safe_max, 9007199254740991);
  assert.equal(body.unsafe, 9007199254740992n);
  // a "__proto__" key from an upstream's JSON is an ordinary own property
  const o = decode(Buffer.from("81a95f5f70726f746f5f5f01", "hex"));
  assert.ok(Object.hasOwn(o, "__proto__"));
  assert.equal(Object.getPrototypeOf(o), Object.prototype);
  assert.deepEqual(decode(Buffer.from("c40200ff", "hex")), new Uint8Array([0, 255]));
  // a wide msgid is a Number
  assert.equal(parseMessage(Buffer.from(byNameHex("request_wide_encodings"), "hex")).msgid, 5);
});

function byNameHex(name) {
  return hex(data(MANIFEST.vectors.find((v) => v.name === name)));
}
