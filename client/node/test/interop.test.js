// Interoperability: msgpack5rpc (a generic msgpack-RPC session from the npm
// registry, by Neovim's author, on top of msgpack5 -- nothing of ours) calls
// the real sidecar. If it can ping, call, stream and cancel, the protocol is
// plain msgpack-RPC: any language's msgpack-RPC library can use polygw.
import assert from "node:assert/strict";
import { once } from "node:events";
import net from "node:net";
import { test } from "node:test";

import Session from "msgpack5rpc";

import { chat, withSidecar } from "./helpers.js";

async function connect(sock) {
  const socket = net.createConnection({ path: sock });
  await once(socket, "connect");
  const session = new Session();
  session.attach(socket, socket);
  const notifications = [];
  session.on("notification", (method, args) => notifications.push([method, args]));
  const request = (method, args) => new Promise((resolve, reject) => {
    session.request(method, args, (err, res) => (err ? reject(Object.assign(new Error(err.message), err)) : resolve(res)));
  });
  const close = async () => {
    session.detach();
    socket.end();
    await once(socket, "close");
  };
  // msgpack5rpc numbers its requests 1, 2, ... and does not expose them
  const lastMsgid = () => session._next_request_id - 1;
  return { session, request, notifications, close, lastMsgid };
}

test("msgpack5rpc: ping, call, errors, stream and cancel against the sidecar", () => withSidecar({}, async (sc, up) => {
  const rpc = await connect(sc.sock);
  try {
    const pong = await rpc.request("ping", []);
    assert.equal(typeof pong.version, "string");
    assert.equal(typeof pong.uptime_s, "number");

    // named parameters: params is [map]
    const res = await rpc.request("call", [{ capability: "chat", body: chat("from msgpack5rpc") }]);
    assert.equal(res.body.choices[0].message.content, "from msgpack5rpc");
    assert.equal(res.source, "a");

    // an error is a plain map {code, message, ...}
    await assert.rejects(rpc.request("call", [{ capability: "nope", body: {} }]), (e) => e.code === "unknown_capability");
    await assert.rejects(rpc.request("echo", []), (e) => e.code === "unknown_method");

    // streaming: `chunk` notifications carry [msgid, event] before the response
    const streamed = rpc.request("call", [{ capability: "chat", stream: true, body: chat("abcdefgh", { stream_events: 4 }) }]);
    const msgid = rpc.lastMsgid();
    const final = await streamed;
    const chunks = rpc.notifications.filter(([m, a]) => m === "chunk" && a[0] === msgid);
    assert.ok(chunks.length >= 4);
    assert.equal(chunks.map(([, a]) => a[1].choices?.[0]?.delta?.content ?? "").join(""), "abcdefgh");
    assert.equal(final.body, undefined);

    // cancel is a plain notification too
    const hanging = rpc.request("call", [{ capability: "chat", body: chat("x", { hang: "before_headers" }) }]);
    const hangId = rpc.lastMsgid();
    await up.waitStats((s) => s.in_progress === 1, 5000);
    rpc.session.notify("cancel", [hangId]);
    await assert.rejects(hanging, (e) => e.code === "cancelled");
    await up.waitStats((s) => s.open_connections === 0 && s.aborted_by_peer === 1);
  } finally {
    await rpc.close();
  }
}));
