// Google's native Gemini API through polygw (docs/HTTP.md, "Gemini"),
// driven by the official Google Gen AI SDK (@google/genai) pointed at
// polygw with httpOptions.baseUrl: generateContent, generateContentStream
// (SSE) and countTokens reach the mock's Gemini endpoints through a
// kind: gemini source, with polygw's key (x-goog-api-key) instead of the
// SDK's, and the usage of each generation is counted.
import assert from "node:assert/strict";
import { test } from "node:test";

import { GoogleGenAI } from "@google/genai";

import { SOURCE, configHead, metrics, withFront as front } from "./front.js";

const KEY = "gm-polygw-test-0123456789";

function configText(up, port) {
  const base = `http://127.0.0.1:${up.port}/v1beta`;
  const src = (name, cap) => `  - {name: ${name}, capability: ${cap}, kind: gemini, ` +
    `base_url: ${JSON.stringify(base)}, api_key_env: POLYGW_TEST_GEMINI_KEY, ${SOURCE}}`;
  return [
    ...configHead(port),
    "capabilities:", "  gemini: {path: /gemini}", "  count_tokens: {path: /messages/count_tokens}",
    "sources:", src("gem", "gemini"), src("gem-count", "count_tokens"),
    "",
  ].join("\n");
}

const withFront = (fn) => front(
  { dialect: "gemini", key: KEY, keyEnv: "POLYGW_TEST_GEMINI_KEY", config: configText },
  (f) => fn({
    ...f,
    ai: new GoogleGenAI({
      apiKey: "the-sdk-key-polygw-never-forwards",
      httpOptions: { baseUrl: `http://127.0.0.1:${f.port}` },
    }),
  }));

async function metric(port, name) {
  const line = (await metrics(port)).split("\n").find((l) => l.startsWith(name + " "));
  return line ? Number(line.split(" ").at(-1)) : 0;
}

const TOKENS = 'polygw_source_tokens_total{source="gem",capability="gemini"}';

test("generateContent through polygw", () => withFront(async (f) => {
  const r = await f.ai.models.generateContent({
    model: "gemini-test", contents: "hello gemini",
  });
  assert.equal(r.text, "hello gemini");
  assert.equal(r.candidates[0].finishReason, "STOP");
  assert.ok(r.usageMetadata.totalTokenCount > 0);
  const last = await f.up.last();
  assert.equal(last.path, "/v1beta/models/gemini-test:generateContent");
  assert.equal(last.headers["x-goog-api-key"], KEY);
  assert.equal(await metric(f.port, TOKENS), r.usageMetadata.totalTokenCount);
}));

test("generateContentStream through polygw (SSE)", () => withFront(async (f) => {
  const stream = await f.ai.models.generateContentStream({
    model: "gemini-test", contents: "streamed gemini words",
  });
  let text = "";
  let lastChunk;
  for await (const chunk of stream) {
    text += chunk.text ?? "";
    lastChunk = chunk;
  }
  assert.equal(text, "streamed gemini words");
  assert.equal(lastChunk.candidates[0].finishReason, "STOP");
  const last = await f.up.last();
  assert.equal(last.target, "/v1beta/models/gemini-test:streamGenerateContent?alt=sse");
  assert.equal(last.headers["x-goog-api-key"], KEY);
  assert.equal(await metric(f.port, TOKENS), lastChunk.usageMetadata.totalTokenCount);
}));

test("countTokens through polygw", () => withFront(async (f) => {
  const r = await f.ai.models.countTokens({ model: "gemini-test", contents: "count me please" });
  assert.ok(r.totalTokens > 0);
  const last = await f.up.last();
  assert.equal(last.path, "/v1beta/models/gemini-test:countTokens");
  assert.equal(last.headers["x-goog-api-key"], KEY);
  assert.equal(await metric(f.port, TOKENS), 0);
}));
