--[[
progress.lua — per-scope progress for the stall verdict (docs/DESIGN.md §3.1).

KEYS[1]  {p:scope:NAME}:progress   STRING  Redis time (ms) of the scope's last success
ARGV[1]  op        mark | age
ARGV[2]  ttl_ms    mark only; default 3600000 (1 h)
ARGV[3]  channel   mark only, optional: PUBLISH ARGV[4] (the scope's name) there,
                   so every sidecar's progress cache learns the mark at once
ARGV[4]  scope     mark only, with ARGV[3]

Returns  mark: the time recorded (ms, Redis clock)
         age:  ms since the last mark (>= 0), or -1 when the key is absent
               (never marked, or expired): the caller reads -1 as +infinity,
               the conservative default of src/progress.h (no evidence the
               scope is alive).

Why: the timestamp comes from Redis' clock so a mark by sidecar A and an age
read by sidecar B agree whatever their clocks; the age is computed here, on
the same clock, for the same reason. The TTL bounds memory (clients name
scopes) and means "no progress for an hour" == "never", as in memory when a
scope is evicted.
]]

-- time_ms_floor comes from lib.lua (prepended): whole ms, as stored.
local now = time_ms_floor(redis.call('TIME'))
local op = ARGV[1]

if op == 'mark' then
    local ttl = tonumber(ARGV[2]) or 3600000
    if ttl <= 0 then ttl = 3600000 end
    redis.call('SET', KEYS[1], string.format('%d', now), 'PX', math.floor(ttl))
    if ARGV[3] and ARGV[3] ~= '' then
        redis.call('PUBLISH', ARGV[3], ARGV[4] or '')
    end
    return now
elseif op == 'age' then
    local v = tonumber(redis.call('GET', KEYS[1]) or '')
    if not v then return -1 end
    local age = now - v
    if age < 0 then age = 0 end
    return age
end
return redis.error_reply('progress.lua: op must be mark or age')
