// Wire format of the polygw protocol (proto/PROTOCOL.md): framing, limits,
// decoding, message classification and encoding. No I/O here, so the test
// vectors of proto/vectors/ replay through exactly the code the client uses.
//
// Encoding is @msgpack/msgpack's. Decoding is ours (a small, strict reader):
// the protocol needs size claims judged from headers before the payload
// arrives (§7.1), nesting counted with empty containers (§7.2), msgids that
// are integers and not floats (§2), and exact 64-bit integers (a Number when
// safe, a BigInt beyond 2^53) -- none of which a general decoder gives.

import { Encoder, ExtData } from "@msgpack/msgpack";

export const DEFAULT_SOCKET = "/run/polygw/polygw.sock";
// Largest frame accepted from the sidecar (its msgpack may exceed the
// sidecar's own 16 MiB JSON limit, PROTOCOL §7.1); libpolygw uses 64 MiB too.
export const DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024;
export const MAX_DEPTH = 32;
export const MSGID_MAX = 0xffffffff;
export const REQUEST = 0;
export const RESPONSE = 1;
export const NOTIFICATION = 2;

/** The caller's path, else $POLYGW_SOCKET, else the default (PROTOCOL §1). */
export function socketPath(path) {
  return path || process.env.POLYGW_SOCKET || DEFAULT_SOCKET;
}

/** The byte stream is not acceptable msgpack; kind: malformed | too_large | too_deep. */
export class FrameError extends Error {
  constructor(kind, message) {
    super(message);
    this.name = "FrameError";
    this.kind = kind;
  }
}

/** A msgpack value that is not a msgpack-RPC message (PROTOCOL §2). */
export class NotRpcError extends Error {
  constructor(message) {
    super(message);
    this.name = "NotRpcError";
  }
}

// Header layout per first byte, as [kind, n]:
//   's' n: scalar of n bytes in all
//   'p' n: str/bin whose length is in the n bytes after the type byte
//   'e' n: ext, likewise, plus one type byte
//   'a'/'m' n: array/map whose count is in the n bytes after the type byte
//   'P'/'A'/'M' n: fixstr/fixarray/fixmap of length/count n
//   'x': 0xc1, never used
const HEADERS = (() => {
  const t = new Array(256);
  for (let b = 0x00; b < 0x80; b++) t[b] = ["s", 1];
  for (let b = 0xe0; b < 0x100; b++) t[b] = ["s", 1];
  for (let b = 0x80; b < 0x90; b++) t[b] = ["M", b & 0x0f];
  for (let b = 0x90; b < 0xa0; b++) t[b] = ["A", b & 0x0f];
  for (let b = 0xa0; b < 0xc0; b++) t[b] = ["P", b & 0x1f];
  const fixed = { 0xc0: 1, 0xc2: 1, 0xc3: 1, 0xca: 5, 0xcb: 9, 0xcc: 2, 0xcd: 3, 0xce: 5,
    0xcf: 9, 0xd0: 2, 0xd1: 3, 0xd2: 5, 0xd3: 9, 0xd4: 3, 0xd5: 4, 0xd6: 6, 0xd7: 10, 0xd8: 18 };
  for (const [b, n] of Object.entries(fixed)) t[b] = ["s", n];
  for (const [b, n] of [[0xc4, 1], [0xc5, 2], [0xc6, 4], [0xd9, 1], [0xda, 2], [0xdb, 4]]) t[b] = ["p", n];
  for (const [b, n] of [[0xc7, 1], [0xc8, 2], [0xc9, 4]]) t[b] = ["e", n];
  t[0xdc] = ["a", 2]; t[0xdd] = ["a", 4]; t[0xde] = ["m", 2]; t[0xdf] = ["m", 4];
  t[0xc1] = ["x", 0];
  return t;
})();

function readBE(buf, pos, n) {
  let v = 0;
  for (let i = 0; i < n; i++) v = v * 256 + buf[pos + i];
  return v;
}

/**
 * Incremental frame reader: feed() bytes as they arrive, then next() returns
 * each complete message's bytes (a view valid until the next feed()), or
 * null when more are needed. Over-limit claims, too deep nesting and bytes
 * that are not msgpack throw a FrameError, and keep throwing it: msgpack
 * cannot be resynchronised.
 */
export class FrameReader {
  constructor(maxBytes = DEFAULT_MAX_MESSAGE_BYTES, maxDepth = MAX_DEPTH) {
    this.maxBytes = maxBytes;
    this.maxDepth = maxDepth;
    this.buf = Buffer.alloc(0);
    this.start = 0; // pending frame's offset
    this.end = 0; // bytes used in buf
    this.scanned = 0; // validated bytes of the pending frame
    this.skip = 0; // payload bytes still to pass over
    this.left = []; // items still expected per open container
    this.error = null;
  }

  /** Bytes held for a frame not complete yet. */
  get pending() {
    return this.end - this.start;
  }

  feed(data) {
    if (this.error || data.length === 0) return;
    if (this.start > 0 && this.start === this.end) {
      this.start = this.end = 0;
    }
    if (this.end + data.length > this.buf.length) {
      const live = this.end - this.start;
      const need = live + data.length;
      if (need <= this.buf.length && this.start >= live) {
        this.buf.copy(this.buf, 0, this.start, this.end);
      } else {
        const grown = Buffer.allocUnsafe(Math.max(need, this.buf.length * 2, 4096));
        this.buf.copy(grown, 0, this.start, this.end);
        this.buf = grown;
      }
      this.start = 0;
      this.end = live;
    }
    (data instanceof Uint8Array ? Buffer.from(data.buffer, data.byteOffset, data.length) : data)
      .copy(this.buf, this.end);
    this.end += data.length;
  }

  /** The next complete frame (a Buffer view), or null. */
  next() {
    if (this.error) throw this.error;
    let done;
    try {
      done = this.scan();
    } catch (e) {
      this.error = e;
      this.buf = Buffer.alloc(0);
      this.start = this.end = 0;
      throw e;
    }
    if (!done) return null;
    const frame = this.buf.subarray(this.start, this.start + this.scanned);
    this.start += this.scanned;
    this.scanned = 0;
    return frame;
  }

  *frames() {
    for (;;) {
      const f = this.next();
      if (f === null) return;
      yield f;
    }
  }

  scan() {
    const buf = this.buf;
    const base = this.start;
    const end = this.end;
    const limit = base + this.maxBytes;
    const left = this.left;
    let pos = base + this.scanned;
    const tooLarge = () => new FrameError("too_large", "message exceeds max_message_bytes");
    try {
      for (;;) {
        if (this.skip > 0) {
          const n = Math.min(this.skip, end - pos);
          pos += n;
          this.skip -= n;
          if (this.skip > 0) return false;
        } else {
          if (pos >= end) return false;
          const [kind, n] = HEADERS[buf[pos]];
          if (kind === "s") {
            if (pos + n > limit) throw tooLarge();
            if (pos + n > end) return false;
            pos += n;
          } else if (kind === "P") {
            if (pos + 1 + n > limit) throw tooLarge();
            pos += 1;
            this.skip = n;
            if (n > 0) continue;
          } else if (kind === "p" || kind === "e") {
            if (pos + 1 + n > end) return false;
            const size = readBE(buf, pos + 1, n);
            const hl = 1 + n + (kind === "e" ? 1 : 0);
            if (pos + hl + size > limit) throw tooLarge();
            if (pos + hl > end) return false;
            pos += hl;
            this.skip = size;
            if (size > 0) continue;
          } else if (kind === "x") {
            throw new FrameError("malformed", "malformed msgpack (reserved byte 0xc1)");
          } else {
            let hl;
            let count;
            if (kind === "A" || kind === "M") {
              hl = 1;
              count = n;
            } else {
              if (pos + 1 + n > end) return false;
              hl = 1 + n;
              count = readBE(buf, pos + 1, n);
            }
            if (kind === "M" || kind === "m") count *= 2;
            if (pos + hl + count > limit) throw tooLarge(); // each item takes >= 1 byte
            if (left.length >= this.maxDepth) {
              throw new FrameError("too_deep", `message nests more than ${this.maxDepth} containers`);
            }
            pos += hl;
            if (count > 0) {
              left.push(count);
              continue;
            }
          }
        }
        // one item ended: count it against the open containers
        for (;;) {
          if (left.length === 0) return true;
          if (--left[left.length - 1] > 0) break;
          left.pop();
        }
      }
    } finally {
      this.scanned = pos - base;
    }
  }
}

const SAFE = BigInt(Number.MAX_SAFE_INTEGER);

function exactInt(big) {
  return big <= SAFE && big >= -SAFE ? Number(big) : big;
}

/**
 * Decodes one complete, already scanned frame. Values: nil -> null, ints ->
 * Number (BigInt beyond 2^53), floats -> Number, str -> string, bin ->
 * Uint8Array, ext -> ExtData, arrays -> Array, maps -> plain objects.
 * `hooks` (for tests and tools) may replace how ints, floats, bins, exts and
 * maps are represented: {int(v), float(v, bits), bin(bytes), ext(type, data),
 * map(pairs)}.
 */
export class Decoder {
  constructor(buf, hooks = null) {
    this.buf = Buffer.isBuffer(buf) ? buf : Buffer.from(buf.buffer, buf.byteOffset, buf.byteLength);
    this.pos = 0;
    this.hooks = hooks;
  }

  byte() {
    return this.buf[this.pos++];
  }

  uint(n) {
    const v = readBE(this.buf, this.pos, n);
    this.pos += n;
    return v;
  }

  str(len) {
    const s = this.buf.toString("utf8", this.pos, this.pos + len);
    this.pos += len;
    return s;
  }

  bytes(len) {
    const b = new Uint8Array(this.buf.subarray(this.pos, this.pos + len)); // a copy
    this.pos += len;
    return b;
  }

  int(v) {
    return this.hooks?.int ? this.hooks.int(v) : v;
  }

  float(v, bits) {
    return this.hooks?.float ? this.hooks.float(v, bits) : v;
  }

  array(n) {
    const a = new Array(n);
    for (let i = 0; i < n; i++) a[i] = this.value();
    return a;
  }

  map(n) {
    if (this.hooks?.map) {
      const pairs = new Array(n);
      for (let i = 0; i < n; i++) pairs[i] = [this.value(), this.value()];
      return this.hooks.map(pairs);
    }
    const o = {};
    for (let i = 0; i < n; i++) {
      const k = this.value();
      const key = typeof k === "string" ? k : String(k);
      const v = this.value();
      if (key === "__proto__") {
        Object.defineProperty(o, key, { value: v, enumerable: true, writable: true, configurable: true });
      } else {
        o[key] = v;
      }
    }
    return o;
  }

  ext(len) {
    const type = this.buf.readInt8(this.pos++);
    const data = this.bytes(len);
    return this.hooks?.ext ? this.hooks.ext(type, data) : new ExtData(type, data);
  }

  bin(len) {
    const b = this.bytes(len);
    return this.hooks?.bin ? this.hooks.bin(b) : b;
  }

  value() {
    const b = this.byte();
    if (b < 0x80) return this.int(b);
    if (b >= 0xe0) return this.int(b - 0x100);
    if (b < 0x90) return this.map(b & 0x0f);
    if (b < 0xa0) return this.array(b & 0x0f);
    if (b < 0xc0) return this.str(b & 0x1f);
    const buf = this.buf;
    let v;
    switch (b) {
      case 0xc0: return null;
      case 0xc2: return false;
      case 0xc3: return true;
      case 0xc4: return this.bin(this.uint(1));
      case 0xc5: return this.bin(this.uint(2));
      case 0xc6: return this.bin(this.uint(4));
      case 0xc7: return this.ext(this.uint(1));
      case 0xc8: return this.ext(this.uint(2));
      case 0xc9: return this.ext(this.uint(4));
      case 0xca: v = buf.readFloatBE(this.pos); this.pos += 4; return this.float(v, 32);
      case 0xcb: v = buf.readDoubleBE(this.pos); this.pos += 8; return this.float(v, 64);
      case 0xcc: return this.int(this.uint(1));
      case 0xcd: return this.int(this.uint(2));
      case 0xce: return this.int(this.uint(4));
      case 0xcf: v = buf.readBigUInt64BE(this.pos); this.pos += 8; return this.int(exactInt(v));
      case 0xd0: v = buf.readInt8(this.pos); this.pos += 1; return this.int(v);
      case 0xd1: v = buf.readInt16BE(this.pos); this.pos += 2; return this.int(v);
      case 0xd2: v = buf.readInt32BE(this.pos); this.pos += 4; return this.int(v);
      case 0xd3: v = buf.readBigInt64BE(this.pos); this.pos += 8; return this.int(exactInt(v));
      case 0xd4: return this.ext(1);
      case 0xd5: return this.ext(2);
      case 0xd6: return this.ext(4);
      case 0xd7: return this.ext(8);
      case 0xd8: return this.ext(16);
      case 0xd9: return this.str(this.uint(1));
      case 0xda: return this.str(this.uint(2));
      case 0xdb: return this.str(this.uint(4));
      case 0xdc: return this.array(this.uint(2));
      case 0xdd: return this.array(this.uint(4));
      case 0xde: return this.map(this.uint(2));
      case 0xdf: return this.map(this.uint(4));
      default: throw new FrameError("malformed", `malformed msgpack (byte 0x${b.toString(16)})`);
    }
  }

  /**
   * If the next value is an integer >= 0 (any width), consumes it and
   * returns it; otherwise consumes it and returns undefined. (Classifying a
   * message needs the wire type: a float 1.0 is not the msgid 1.)
   */
  uintOrUndefined() {
    const b = this.buf[this.pos];
    const isInt = b < 0x80 || (b >= 0xcc && b <= 0xcf) || (b >= 0xd0 && b <= 0xd3);
    const hooks = this.hooks;
    this.hooks = null;
    let v;
    try {
      v = this.value();
    } finally {
      this.hooks = hooks;
    }
    if (!isInt) return undefined;
    if (typeof v === "bigint") return v >= 0n ? v : undefined;
    return v >= 0 ? v : undefined;
  }
}

/** Decodes a whole frame to one value (see Decoder). */
export function decode(frame, hooks = null) {
  return new Decoder(frame, hooks).value();
}

const isStrByte = (b) => (b >= 0xa0 && b <= 0xbf) || (b >= 0xd9 && b <= 0xdb);
const isMapByte = (b) => (b >= 0x80 && b <= 0x8f) || b === 0xde || b === 0xdf;

/**
 * Decodes and classifies one frame (PROTOCOL §2). Returns
 * {type: 0, msgid, method, params} | {type: 1, msgid, error, result} |
 * {type: 2, method, params}; throws NotRpcError.
 */
export function parseMessage(frame, hooks = null) {
  const d = new Decoder(frame, hooks);
  frame = d.buf;
  const b = frame[0];
  let n;
  if (b >= 0x90 && b <= 0x9f) {
    n = b & 0x0f;
    d.pos = 1;
  } else if (b === 0xdc || b === 0xdd) {
    d.pos = 1;
    n = d.uint(b === 0xdc ? 2 : 4);
  } else {
    d.value(); // decodes (and so checks) it anyway
    throw new NotRpcError("message is not an array");
  }
  if (n < 3 || n > 4) throw new NotRpcError("message is not [type, ...] with type 0, 1 or 2");
  const type = d.uintOrUndefined();
  if (type === undefined || type > 2) {
    throw new NotRpcError("message is not [type, ...] with type 0, 1 or 2");
  }
  if (type === NOTIFICATION) {
    if (n !== 3) throw new NotRpcError("notification must be [2, method, params]");
    if (!isStrByte(frame[d.pos])) throw new NotRpcError("notification method must be a string");
    const method = d.value();
    return { type, method, params: d.value() };
  }
  if (n !== 4) {
    throw new NotRpcError(type === REQUEST ? "request must be [0, msgid, method, params]"
      : "response must be [1, msgid, error, result]");
  }
  let msgid = d.uintOrUndefined();
  if (msgid === undefined || msgid > MSGID_MAX) {
    throw new NotRpcError("msgid must be an unsigned 32-bit integer");
  }
  msgid = Number(msgid);
  if (type === REQUEST) {
    if (!isStrByte(frame[d.pos])) throw new NotRpcError("request method must be a string");
    const method = d.value();
    return { type, msgid, method, params: d.value() };
  }
  if (frame[d.pos] !== 0xc0 && !isMapByte(frame[d.pos])) {
    throw new NotRpcError("response error must be nil or a map");
  }
  const error = d.value();
  return { type, msgid, error, result: d.value() };
}

// ignoreUndefined: an optional field left undefined is absent, as in JSON.
const encoder = new Encoder({ useBigInt64: true, ignoreUndefined: true });

/** [0, msgid, method, [params]] ([] when params is null/undefined). */
export function encodeRequest(msgid, method, params) {
  return encoder.encode([REQUEST, msgid, method, params ? [params] : []]);
}

/** [2, method, params] (positional params). */
export function encodeNotification(method, params) {
  return encoder.encode([NOTIFICATION, method, params]);
}
