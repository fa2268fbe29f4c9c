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
