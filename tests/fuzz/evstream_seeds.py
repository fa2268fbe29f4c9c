#!/usr/bin/env python3
"""Writes the seed corpus of the evstream fuzz target (tests/fuzz/fuzz_evstream.c)
into the folder named on the command line: AWS event-stream messages as
Bedrock's ConverseStream and InvokeModelWithResponseStream send them, with
CRCs from zlib (the same CRC-32 src/evstream.c checks), and a few broken
ones. Each file starts with the byte the target takes as its chunk-size seed.

    /usr/bin/python3 tests/fuzz/evstream_seeds.py tests/fuzz/corpus/evstream
"""
import os
import struct
import sys
import zlib


def header(name, type_, value=b""):
    name = name.encode()
    if type_ in (6, 7):
        value = struct.pack(">H", len(value)) + value
    return bytes([len(name)]) + name + bytes([type_]) + value


def message(headers, payload=b""):
    block = b"".join(headers)
    prelude = struct.pack(">II", 16 + len(block) + len(payload), len(block))
    body = prelude + struct.pack(">I", zlib.crc32(prelude)) + block + payload
    return body + struct.pack(">I", zlib.crc32(body))


def event(event_type, payload):
    return message([header(":event-type", 7, event_type.encode()),
                    header(":content-type", 7, b"application/json"),
                    header(":message-type", 7, b"event")], payload)


def main():
    out = sys.argv[1]
    converse = (event("messageStart", b'{"role":"assistant"}')
                + event("contentBlockDelta", b'{"contentBlockIndex":0,"delta":{"text":"Hello"}}')
                + event("contentBlockStop", b'{"contentBlockIndex":0}')
                + event("messageStop", b'{"stopReason":"end_turn"}')
                + event("metadata", b'{"usage":{"inputTokens":9,"outputTokens":2}}'))
    exception = message([header(":exception-type", 7, b"throttlingException"),
                         header(":content-type", 7, b"application/json"),
                         header(":message-type", 7, b"exception")],
                        b'{"message":"Too many requests, please wait before trying again."}')
    error = message([header(":message-type", 7, b"error"),
                     header(":error-code", 7, b"InternalFailure"),
                     header(":error-message", 7, b"try again")])
    every_type = message([header("t", 0), header("f", 1), header("b", 2, b"\x7f"),
                          header("s", 3, b"\x00\x01"), header("i", 4, b"\x00\x00\x00\x20"),
                          header("l", 5, bytes(8)), header("a", 6, b"\x00\xff"),
                          header(":event-type", 7, b"chunk"), header(":date", 8, bytes(8)),
                          header("u", 9, bytes(range(16)))], b'{"bytes":"eyJ9"}')
    bad_crc = bytearray(event("chunk", b'{"bytes":"e30="}'))
    bad_crc[-1] ^= 1
    seeds = {
        "seed-converse": b"\x00" + converse,
        "seed-converse-split": b"\x5a" + converse,
        "seed-exception": b"\x01" + event("chunk", b'{"bytes":"e30="}') + exception,
        "seed-error": b"\x02" + error,
        "seed-every-type": b"\x03" + every_type,
        "seed-abort": b"\x04" + event("abort", b"{}") + event("chunk", b"{}"),
        "seed-bad-crc": b"\x05" + bytes(bad_crc),
        "seed-cut": b"\x06" + converse[:-7],
        "seed-empty": b"\x07" + message([]),
    }
    for name, data in seeds.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
