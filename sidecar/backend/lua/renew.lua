--[[
renew.lua — a live sidecar extends its leases on one source (or one app's
leases key, {p:app:A}:leases or {p:app:A}:cap:C:leases: admit.lua records an
attempt's lease there too).

KEYS[1]  {p:source:N}:leases   ZSET  lease_id -> expiry (ms, Redis clock)
ARGV[1]  lease_ttl_ms          new expiry = now + lease_ttl_ms
ARGV[2..] lease ids            the sidecar's live attempts on this source

Returns  {renewed_count, {lost lease ids}}
         A lost lease had already expired (or was released): it is NOT
         re-created, because its permit may already be held by another
         sidecar; the caller should treat that attempt as running without a
         permit (log it, count it) — the fleet-wide limit stays exact.

Why: leases expire so that a dead sidecar (even SIGKILLed) gives its permits
back after lease_ttl_ms; live sidecars call this every ttl/3 or so per source
with attempts in flight. Expired leases are removed first so they cannot be
renewed. One source per call keeps the script on one hash slot.
]]

-- time_ms and num come from lib.lua (prepended).
local now = time_ms(redis.call('TIME'))

local K = KEYS[1]
local ttl = tonumber(ARGV[1]) or 0
redis.call('ZREMRANGEBYSCORE', K, '-inf', num(now))

local expiry = num(now + ttl)
local renewed, lost = 0, {}
for i = 2, #ARGV do
    if redis.call('ZSCORE', K, ARGV[i]) then
        redis.call('ZADD', K, 'XX', expiry, ARGV[i])
        renewed = renewed + 1
    else
        lost[#lost + 1] = ARGV[i]
    end
end

if renewed > 0 then
    local last = redis.call('ZRANGE', K, -1, -1, 'WITHSCORES')
    redis.call('PEXPIREAT', K, math.ceil(tonumber(last[2])) + 1000)
end
return { renewed, lost }
