#!/usr/bin/python3
"""Megabyte seeds for the large-input pass of `make fuzz`.

    tests/fuzz/large_seeds.py OUT_DIR [MAX_LEN]

Writes OUT_DIR/<target>/seed-large-* for every target in tests/fuzz: inputs
of the sizes the sidecar meets in practice (multi-megabyte frames, replies,
streams and configs), each at most MAX_LEN bytes (default 4 MiB), in the
input format of its target (see the header of tests/fuzz/fuzz_<target>.c).
libFuzzer, even with -len_control=0, grows inputs only a little per
mutation, so without these a run explores the big sizes barely at all.
Deterministic: the same files every time.
"""
import json
import os
import sys

import msgpack

import evstream_seeds

MIB = 1 << 20


def call_frame(content):
    return msgpack.packb([0, 1, "call", [{"capability": "chat", "body": {
        "model": "m", "messages": [{"role": "user", "content": content}]}}]], use_bin_type=True)


def seeds(max_len):
    big = max_len * 3 // 4
    out = {}

    # frame: byte 0 picks the split point, then the client's byte stream.
    out["frame"] = {
        "one-huge-call": b"\x80" + call_frame("x" * big),
        "many-pings": b"\x40" + msgpack.packb([0, 7, "ping", []]) * (big // 12),
        "huge-array-header": b"\x10" + b"\xdd\xff\xff\xff\xff" + b"\xc0" * (big // 2),
    }

    # transcode: the same bytes are tried as upstream JSON and as msgpack.
    n_items = big // 40
    out["transcode"] = {
        "json-long-string": json.dumps({"choices": [{"message": {
            "content": "\u00e9a\\" * (big // 12)}}]}).encode(),
        "json-wide-array": json.dumps({"data": [{"i": i, "f": i / 7.0} for i in range(n_items)]},
                                      separators=(",", ":")).encode()[:max_len],
        "msgpack-huge-call": call_frame("y" * big),
    }

    # sse: byte 0 seeds the chunk sizes, then the stream.
    event = b'data: {"choices":[{"delta":{"content":"tok"}}]}\n\n'
    out["sse"] = {
        "many-events": b"\x05" + event * (big // len(event)) + b"data: [DONE]\n\n",
        "one-huge-line": b"\x09" + b"data: " + b"z" * big + b"\n\n",
        "huge-comment-run": b"\x11" + b": keep-alive\n" * (big // 13) + event,
    }

    # evstream: byte 0 seeds the chunk sizes, then the stream; the target's
    # limit is 512 bytes a message, so a long stream is many messages.
    chunk = evstream_seeds.event("contentBlockDelta",
                                 b'{"contentBlockIndex":0,"delta":{"text":"tok"}}')
    out["evstream"] = {
        "many-messages": b"\x05" + chunk * (big // len(chunk)),
        "one-huge-message": b"\x09" + evstream_seeds.message([], b"z" * big),
    }

    # h1_answer: flags, first answer's length (2 bytes), seed, then an
    # upstream's answer as the own HTTP client reads it.
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
    reply = b'{"choices":[{"message":{"content":"' + b"w" * big + b'"}}]}'
    piece = b"x" * 4000
    out["h1_answer"] = {
        "huge-content-length": b"\x00\x00\x00\x21" + head
        + b"Content-Length: %d\r\n\r\n" % len(reply) + reply,
        "many-chunks": b"\x01\x00\x00\x37" + head + b"Transfer-Encoding: chunked\r\n\r\n"
        + (b"fa0\r\n" + piece + b"\r\n") * (big // 4008) + b"0\r\n\r\n",
        "huge-close-delimited": b"\x00\x00\x00\x4b" + head + b"\r\n" + reply,
    }

    # h1_tls: flags, first answer's length, seed, what the upstream does
    # (tests/fuzz/fuzz_h1_tls.c), then the answer, through TLS records.
    out["h1_tls"] = {
        "huge-content-length": b"\x00\x00\x00\x21\x01" + head
        + b"Content-Length: %d\r\n\r\n" % len(reply) + reply,
        "many-chunks-renegotiated": b"\x06\x00\x00\x37\x08" + head
        + b"Transfer-Encoding: chunked\r\n\r\n"
        + (b"fa0\r\n" + piece + b"\r\n") * (big // 4008) + b"0\r\n\r\n",
        "huge-close-delimited-bare-close": b"\x04\x00\x00\x4b\x12" + head + b"\r\n" + reply,
    }

    # retry_after: one header value.
    out["retry_after"] = {
        "long-digits": b"9" * big,
        "padded-delta": b" " * big + b"120",
    }

    # config: a YAML document.
    lines = ["capabilities:"]
    n = 1
    while True:
        lines.append("  c%d: { path: /c%d, max_attempts: 2 }" % (n, n))
        lines.append("  - { name: s%d, capability: c%d, base_url: \"http://127.0.0.1:1\" }"
                     % (n, n))
        if sum(len(s) + 1 for s in lines) > big:
            break
        n += 1
    caps = [l for l in lines[1:] if not l.startswith("  -")]
    srcs = [l for l in lines[1:] if l.startswith("  -")]
    doc = "\n".join(["capabilities:"] + caps + ["sources:"] + srcs) + "\n"
    out["config"] = {
        "many-sources": doc.encode(),
        "long-scalar": ("listen: { socket: \"%s\" }\n" % ("s" * big)).encode(),
    }
    # convert: an OpenAI chat body, a Messages reply, or a list of events.
    turns = big // 60
    out["convert"] = {
        "many-turns": json.dumps({"messages": [
            {"role": ("user", "assistant")[i % 2], "content": [{"type": "text", "text": "t%d" % i}]}
            for i in range(turns)]}, separators=(",", ":")).encode()[:max_len],
        "huge-reply": json.dumps({"content": [{"type": "text", "text": "w" * big}],
                                  "usage": {"input_tokens": 1, "output_tokens": 2}}).encode(),
        "many-events": json.dumps([{"type": "content_block_delta", "index": 0,
                                    "delta": {"type": "text_delta", "text": "x"}}] * (big // 70),
                                  separators=(",", ":")).encode()[:max_len],
    }

    # jscan: one JSON text, a request body or a reply as the HTTP front sees it.
    request = {"model": "m", "stream": True,
               "messages": [{"role": "user", "content": "x\u00e9" * (big // 16)}],
               "logit_bias": {str(i): i % 7 for i in range(big // 32)}}
    out["jscan"] = {
        "huge-request": json.dumps(request).encode()[:big],
        "many-members": ("{" + ",".join('"k%d":[%d]' % (i, i) for i in range(big // 16))
                         + "}").encode(),
    }
    # json_msgpack_diff: one JSON text, transcoded both ways; wide objects
    # and duplicated keys in bulk exercise the key index and the rebuild.
    out["json_msgpack_diff"] = {
        "long-string": out["transcode"]["json-long-string"],
        "wide-array": out["transcode"]["json-wide-array"],
        "many-duplicates": ("{" + ",".join('"k%d":{"a":%d,"a":[%d]}' % (i % 97, i, i)
                                           for i in range(big // 24)) + "}").encode()[:max_len],
    }
    # followup: byte 0 picks the method, then a request target after /v1.
    out["followup"] = {
        "many-parameters": b"\x00/responses/resp_a?" + b"k=v&" * (big // 4) + b"stream=true",
        "huge-id": b"\x00/responses/" + b"r" * big + b"?stream=true",
    }
    return out


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    root = sys.argv[1]
    max_len = int(sys.argv[2]) if len(sys.argv) == 3 else 4 * MIB
    for target, files in seeds(max_len).items():
        d = os.path.join(root, target)
        os.makedirs(d, exist_ok=True)
        for name, data in files.items():
            with open(os.path.join(d, "seed-large-" + name), "wb") as f:
                f.write(data[:max_len])


if __name__ == "__main__":
    main()
