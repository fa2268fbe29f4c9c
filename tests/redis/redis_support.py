"""Support for the Lua-script tests: a private redis-server on a free
127.0.0.1 port, and a minimal RESP2 client (standard library only).

Scripts are loaded once (SCRIPT LOAD) and called by SHA, reloaded on
NOSCRIPT — the same protocol the C wiring will use. Each is loaded as the
sidecar embeds it (Makefile, $(BUILD)/gen/lua_scripts.c): sidecar/backend/lua/lib.lua,
the shared prelude, followed by the script (script_source()).
"""
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LUA_DIR = os.path.join(ROOT, "sidecar", "backend", "lua")
SCRIPTS = ("admit", "release", "renew", "progress", "task")
LUA_LIB = os.path.join(LUA_DIR, "lib.lua")
PREFIX = "pgw"


class RedisError(Exception):
    pass


class Resp:
    """One connection; call() sends a command and reads one reply."""

    def __init__(self, port, timeout=5.0):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buf = b""

    def close(self):
        self.sock.close()

    def send(self, *args):
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            if not isinstance(a, bytes):
                a = str(a).encode()
            out.append(b"$%d\r\n%s\r\n" % (len(a), a))
        self.sock.sendall(b"".join(out))

    def _line(self):
        while b"\r\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("redis closed the connection")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _exact(self, n):
        while len(self.buf) < n + 2:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("redis closed the connection")
            self.buf += chunk
        data, self.buf = self.buf[:n], self.buf[n + 2:]
        return data

    def read(self):
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise RedisError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else self._exact(n).decode()
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self.read() for _ in range(n)]
        raise RedisError("bad reply %r" % line)

    def call(self, *args):
        self.send(*args)
        return self.read()


def script_source(name):
    """The full text of script NAME as Redis runs it: the prelude then the
    script, concatenated as the Makefile does."""
    with open(LUA_LIB) as f:
        lib = f.read()
    with open(os.path.join(LUA_DIR, name + ".lua")) as f:
        return lib + f.read()


def hash_tag(key):
    """The part of a key Redis Cluster hashes (the {...} tag when non-empty)."""
    s = key.find("{")
    if s >= 0:
        e = key.find("}", s + 1)
        if e > s + 1:
            return key[s + 1:e]
    return key


def crc16(data):
    crc = 0
    for b in data:
        crc ^= b << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


def key_slot(key):
    return crc16(hash_tag(key).encode()) % 16384


class Scripts:
    """Calls the sidecar/backend/lua scripts by SHA on one connection. Every call
    asserts that all its KEYS hash to one slot (one hash tag)."""

    def __init__(self, conn):
        self.conn = conn
        self.src = {}
        self.sha = {}
        self.calls = []   # (script, keys) for the one-slot test
        for name in SCRIPTS:
            self.src[name] = script_source(name)

    def run(self, name, keys, args):
        tags = {hash_tag(k) for k in keys}
        # admit and release may add the calling app's keys: the app's tag
        # (one tag again when the prefix carries its own, "{pgw}")
        spans = 2 if name in ("admit", "release") and ":app:" in " ".join(keys) else 1
        assert len(tags) <= spans, "%s: KEYS span several hash tags: %r" % (name, keys)
        assert all("{" in k for k in keys), keys
        self.calls.append((name, list(keys)))
        if name not in self.sha:
            self.sha[name] = self.conn.call("SCRIPT", "LOAD", self.src[name])
        try:
            return self.conn.call("EVALSHA", self.sha[name], len(keys), *keys, *args)
        except RedisError as e:
            if not str(e).startswith("NOSCRIPT"):
                raise
            self.sha[name] = self.conn.call("SCRIPT", "LOAD", self.src[name])
            return self.conn.call("EVALSHA", self.sha[name], len(keys), *keys, *args)


def source_keys(name, prefix=PREFIX):
    tag = "{%s:source:%s}" % (prefix, name)
    return [tag + ":breaker", tag + ":leases", tag + ":rpm", tag + ":tpm", tag + ":daily"]


def app_keys(app, cap=None, prefix=PREFIX):
    """An app's limit group: leases, rpm, tpm, daily (its own, or on `cap`)."""
    tag = "{%s:app:%s}" % (prefix, app) + (":cap:%s" % cap if cap else "")
    return [tag + ":leases", tag + ":rpm", tag + ":tpm", tag + ":daily"]


def io_key(holder, prefix=PREFIX):
    """The input- and output-token buckets of a source ("source:N") or an
    app ("app:A"): one HASH under the holder's hash tag."""
    return "{%s:%s}:io" % (prefix, holder)


def scope_key(name, prefix=PREFIX):
    return "{%s:scope:%s}:progress" % (prefix, name)


def task_key(tid, prefix=PREFIX):
    return "{%s:task:%s}" % (prefix, tid)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    def __init__(self, extra=()):
        self.dir = tempfile.mkdtemp(prefix="pgw-redis-")
        self.extra = list(extra)
        self.proc = None
        self.port = None

    def start(self):
        exe = shutil.which("redis-server")
        if not exe:
            pytest.skip("redis-server not installed (make deps installs it)")
        for _ in range(5):
            self.port = free_port()
            self.proc = subprocess.Popen(
                [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                 "--appendonly", "no", "--daemonize", "no", "--dir", self.dir] + self.extra,
                stdout=open(os.path.join(self.dir, "redis.log"), "w"),
                stderr=subprocess.STDOUT)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    c = Resp(self.port, timeout=1)
                    if c.call("PING") == "PONG":
                        c.close()
                        return self
                    c.close()
                except (OSError, RedisError):
                    pass
                time.sleep(0.02)
            self.stop()   # port race or slow start: try another port
        raise RuntimeError("redis-server did not start; see %s/redis.log" % self.dir)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def cleanup(self):
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
