--[[
lib.lua — helpers shared by the scripts of sidecar/backend/lua/. Not a script itself:
it is prepended to each one, so every script is sent to Redis (SCRIPT LOAD,
EVAL) as the text of lib.lua followed by the script's own. The Makefile does
it when it embeds the scripts ($(BUILD)/gen/lua_scripts.c: rds_script_src[]
holds those full texts) and tests/redis/redis_support.py when it loads them;
anything else that sends a script must do the same. Everything here is local
to the script it is prepended to; a script that needs none of it is unaffected.
]]

-- The reply of redis.call('TIME') ({seconds, microseconds}) in milliseconds,
-- the microseconds kept as a fraction (leases, buckets, breaker times).
-- TIME's strings are always decimal: arithmetic converts them, at half the
-- cost of tonumber().
local function time_ms(t)
    return t[1] * 1000 + t[2] / 1000
end

-- The same in whole milliseconds, the microseconds floored (times a script
-- stores or returns as integers: progress marks, task timestamps).
local function time_ms_floor(t)
    return t[1] * 1000 + math.floor(t[2] / 1000)
end

-- A number as an argument to Redis: Lua's default number->string conversion
-- keeps only 14 digits.
local function num(x) return string.format('%.17g', x) end

-- A whole number as an argument to Redis: '%d' costs half of '%.17g',
-- which is how Redis formats a number given to redis.call. Beyond 2^53 the
-- number goes as it is (as Redis formats it, which it then refuses).
local function int(x)
    if x < 9e15 and x > -9e15 then return string.format('%d', x) end
    return x
end

-- A limit's argument (a capacity, a max_concurrency) as a number, 0 when
-- absent or not a number. '0', no limit, the common case, is recognised
-- without parsing it: tonumber() runs strtod twice.
local function limit_arg(s)
    if s == '0' then return 0 end
    return tonumber(s) or 0
end

-- The layout of admit.lua's and release.lua's KEYS and ARGV (their headers):
-- KEYS = the source's 5, 4 per app group, then 0 to 2 io keys (so #KEYS says
-- both counts); ARGV = the fixed ones up to AT - 1, PER_GROUP per group,
-- PER_IO per io key and FIRST_IO more with io keys, then STRIDE (IO_STRIDE
-- with io keys) per further attempt. Returns n_groups, n_io, the io keys'
-- first ARGV, the further attempts' first ARGV, their stride and the number
-- of attempts; nil when KEYS and ARGV do not fit it.
local function layout(at, per_group, per_io, first_io, stride, io_stride)
    local nk, na = #KEYS, #ARGV
    if nk < 5 then return nil end
    local n_io = (nk - 5) % 4
    local n_groups = (nk - 5 - n_io) / 4
    local io_at = at + per_group * n_groups
    local first = io_at
    if n_io > 0 then first, stride = io_at + per_io * n_io + first_io, io_stride end
    if n_io > 2 or na < first - 1 or (na - first + 1) % stride ~= 0 then return nil end
    return n_groups, n_io, io_at, first, stride, 1 + (na - first + 1) / stride
end

-- Token buckets (src/bucket.h): a HASH of level, ts (ms); absent = full. The
-- level refills at cap / win per ms, capped at cap; it may be negative (debt).

-- bucket_level: the level of the bucket at KEY at time NOW, refilled since
-- its ts (cap > 0 and win > 0).
local function bucket_level(key, cap, win, now)
    local v = redis.call('HMGET', key, 'level', 'ts')
    local lvl, ts = tonumber(v[1]), tonumber(v[2])
    if not lvl then
        lvl = cap
    elseif ts and now > ts then
        lvl = math.min(cap, lvl + (now - ts) * cap / win)
    end
    return lvl
end

-- bucket_store: records level LVL at time NOW_S (num(now), formatted once by
-- the caller for all its buckets); the key expires when the bucket would be
-- full again (absent = full, identical), plus 1 s.
local function bucket_store(key, cap, win, lvl, now_s)
    redis.call('HSET', key, 'level', num(lvl), 'ts', now_s)
    redis.call('PEXPIRE', key, math.ceil((cap - lvl) * win / cap) + 1000)
end

-- Input- and output-token buckets (itpm, otpm) of one holder in one HASH:
-- `in`, `out` (levels) and `ts` (ms), refilled like the buckets above; a
-- field absent = that bucket full. One read and one write for the pair.

-- io_refill: level LVL (a field's string, or false) at NOW, refilled since TS.
local function io_refill(lvl, cap, win, ts, now)
    lvl = tonumber(lvl)
    if not lvl then return cap end
    if ts and now > ts then
        return math.min(cap, lvl + (now - ts) * cap / win)
    end
    return lvl
end

-- io_level: the input and output levels at KEY at NOW, false for a bucket
-- without a capacity (icap, ocap >= 0, one of them > 0; win > 0).
local function io_level(key, icap, ocap, win, now)
    local v = redis.call('HMGET', key, 'in', 'out', 'ts')
    local ts = tonumber(v[3])
    return icap > 0 and io_refill(v[1], icap, win, ts, now),
        ocap > 0 and io_refill(v[2], ocap, win, ts, now)
end

-- io_store: records levels ILVL, OLVL (false: that bucket has no capacity,
-- its field is left as it is) at NOW_S; the key expires when both would be
-- full again, plus 1 s.
local function io_store(key, icap, ocap, win, ilvl, olvl, now_s)
    local full = 0
    if ilvl then full = (icap - ilvl) * win / icap end
    if olvl then
        local o = (ocap - olvl) * win / ocap
        if o > full then full = o end
    end
    if ilvl and olvl then
        redis.call('HSET', key, 'in', num(ilvl), 'out', num(olvl), 'ts', now_s)
    elseif ilvl then
        redis.call('HSET', key, 'in', num(ilvl), 'ts', now_s)
    else
        redis.call('HSET', key, 'out', num(olvl), 'ts', now_s)
    end
    redis.call('PEXPIRE', key, math.ceil(full) + 1000)
end
