--[[
task.lua — shared task states with TTL (docs/DESIGN.md §3.5; the memory semantics
of src/task.h, minus node watchdogs, which stay local to the sidecar that
armed them).

KEYS[1]  {p:task:ID}   HASH  state (running|succeeded|failed),
                             kind ('' | stopped | watchdog | error),
                             reason, runs, started_at, ended_at (ms, Redis clock),
                             owner (the app that started the task; absent: a record
                             written before owners were kept)
ARGV[1]  op        start | stop | watchdog | finish | guard | get
ARGV[2]  task_id   the ID (published by stop/watchdog)
ARGV[3]  ttl_s     key TTL (EXPIRE) set by every write; default 86400
ARGV[4]  reason    stop/watchdog/finish; truncated to 512 bytes at a UTF-8 boundary
ARGV[5]  ok        finish: 1 = succeeded, 0 = failed/error
ARGV[6]  channel   stop/watchdog/finish: pub/sub channel, "<prefix>:task-end"
ARGV[7]  app       the calling app; '' or absent = no ownership rule (a sidecar's
                   own reads and watchdog verdicts)
ARGV[8]  admin     '1': the calling app is an admin app, which may act on every task
ARGV[9]  budget    start: the new run's budget in currency ('0' or absent: none), kept
                   in the record's `budget` field for every sidecar of the fleet; the
                   run's spending is budget.lua's {p:task:ID}:budget:RUNS

Returns  {code, state, kind, reason, runs, started_at_ms, ended_at_ms, owner, budget}
         code: ok | not_found | running | stopped | watchdog | finished
         (src/task.h's TASK_E_* names). On an error nothing changes; the
         other fields describe the task when one exists, else {'not_found'}.

Transitions (as in task.h):
  start    absent / succeeded / failed by error -> running (a restart: runs + 1,
           reason cleared, started_at = now); running -> error 'running';
           stopped / watchdog -> error 'stopped' / 'watchdog' (final).
  stop     running -> failed/stopped (reason default "stopped"), PUBLISH the id
           on `channel` so every sidecar cancels the task's calls at once;
           already stopped -> error 'stopped' and the FIRST reason is kept;
           watchdog -> 'watchdog'; succeeded or failed/error -> 'finished'.
  watchdog like stop with kind watchdog (a node deadline passed on the sidecar
           that armed it; the others learn it through the same channel and
           read the kind with get).
  finish   running -> succeeded (ok=1, reason kept if given) or failed/error;
           PUBLISH the id on `channel` too (sidecars holding a copy update it).
  guard    running -> ok and the TTL restarts (activity); else the error code.
  get      a read: no TTL change.
Ownership (every op, with an app): a task belongs to the app that started it,
an admin app included, and no other app ever takes it; a record without an
owner is an admin's. Another app gets {'not_found'} and changes nothing,
exactly as for a task that does not exist, on every sidecar of the fleet: it
learns nothing about it. An admin app acts on every task and takes none.
TTL: every write re-arms EXPIRE ttl_s: a finished task is forgotten ttl_s
after it ended, a running one after ttl_s without activity (start, guard).
PUBLISH inside a script is allowed and replicated with it.
]]

local now = time_ms_floor(redis.call('TIME'))

local K = KEYS[1]
local op, id = ARGV[1], ARGV[2] or ''
local ttl = tonumber(ARGV[3]) or 86400
if ttl <= 0 then ttl = 86400 end
ttl = math.ceil(ttl)

local function trunc(s)
    s = s or ''
    if #s <= 512 then return s end
    local n = 512
    -- byte n+1 is the first one cut: if it continues a character, cut before it
    while n > 0 do
        local c = s:byte(n + 1)
        if c < 0x80 or c >= 0xC0 then break end
        n = n - 1
    end
    return s:sub(1, n)
end

local function reply(code)
    local v = redis.call('HMGET', K, 'state', 'kind', 'reason', 'runs', 'started_at', 'ended_at',
                         'owner', 'budget')
    if not v[1] then return { code } end
    return { code, v[1], v[2] or '', v[3] or '', tonumber(v[4]) or 0,
             tonumber(v[5]) or 0, tonumber(v[6]) or 0, v[7] or '', v[8] or '0' }
end

local known_ops = { start = true, stop = true, watchdog = true, finish = true, guard = true,
                    get = true }
if not known_ops[op] then -- before any write: an error does not roll back
    return redis.error_reply('task.lua: unknown op')
end

local app, admin = ARGV[7] or '', ARGV[8] == '1'
local cur = redis.call('HMGET', K, 'state', 'owner')
local state = cur[1]
if state and app ~= '' and not admin and cur[2] ~= app then
    return { 'not_found' } -- another app's (or an ownerless, admin's) task
end

local function not_running_code()
    if state == 'failed' then
        local kind = redis.call('HGET', K, 'kind')
        if kind == 'stopped' then return 'stopped' end
        if kind == 'watchdog' then return 'watchdog' end
    end
    return 'finished'
end

if op == 'get' then
    if not state then return { 'not_found' } end
    return reply('ok')
elseif op == 'start' then
    if state == 'running' then return reply('running') end
    -- A stop (or a watchdog verdict) is final: a worker that did not notice
    -- it must not undo it by starting the task again (the sidecar's wire rule).
    if state == 'failed' then
        local code = not_running_code()
        if code ~= 'finished' then return reply(code) end
    end
    redis.call('HSET', K, 'state', 'running', 'kind', '', 'reason', '',
               'started_at', now, 'ended_at', 0)
    if not state and app ~= '' then
        redis.call('HSET', K, 'owner', app)
    end
    redis.call('HINCRBY', K, 'runs', 1)
    -- a run never inherits an earlier run's budget
    local budget = tonumber(ARGV[9] or '0') or 0
    if budget > 0 then
        redis.call('HSET', K, 'budget', ARGV[9])
    else
        redis.call('HDEL', K, 'budget')
    end
    redis.call('EXPIRE', K, ttl)
    return reply('ok')
end

-- every other op needs an existing task
if not state then return { 'not_found' } end
if state ~= 'running' then return reply(not_running_code()) end

if op == 'guard' then
    redis.call('EXPIRE', K, ttl)
    return reply('ok')
elseif op == 'stop' or op == 'watchdog' then
    local kind = (op == 'stop') and 'stopped' or 'watchdog'
    local reason = trunc(ARGV[4])
    if reason == '' then reason = kind end
    redis.call('HSET', K, 'state', 'failed', 'kind', kind, 'reason', reason, 'ended_at', now)
    redis.call('EXPIRE', K, ttl)
    if ARGV[6] and ARGV[6] ~= '' then
        redis.call('PUBLISH', ARGV[6], id)
    end
    return reply('ok')
else -- finish
    local reason = trunc(ARGV[4])
    if ARGV[5] == '1' then
        redis.call('HSET', K, 'state', 'succeeded', 'kind', '', 'reason', reason, 'ended_at', now)
    else
        if reason == '' then reason = 'error' end
        redis.call('HSET', K, 'state', 'failed', 'kind', 'error', 'reason', reason, 'ended_at', now)
    end
    redis.call('EXPIRE', K, ttl)
    if ARGV[6] and ARGV[6] ~= '' then
        redis.call('PUBLISH', ARGV[6], id)   -- sidecars holding a copy update it
    end
    return reply('ok')
end
