--[[
admit.lua — one atomic admission of an attempt on a source (docs/DESIGN.md §3.2).

KEYS[1..5] share the source's hash tag {<prefix>:source:<NAME>}; the optional
groups of KEYS[6..] (the calling app's limits) share the app's hash tag
{<prefix>:app:<APP>}. Time is Redis' own clock (TIME), never an argument, so
sidecars with skewed clocks agree. All times are milliseconds.

KEYS[1]  {p:source:N}:breaker  HASH  consec, open_until (ms, 0 = closed),
                                     cooldown (current ms), probe (lease id), opened
KEYS[2]  {p:source:N}:leases   ZSET  lease_id -> expiry (ms)
KEYS[3]  {p:source:N}:rpm      HASH  level, ts   (token bucket; absent = full)
KEYS[4]  {p:source:N}:tpm      HASH  level, ts
KEYS[5]  {p:source:N}:daily    HASH  level, ts

ARGV[1]  lease_id          unique per attempt (e.g. "<sidecar-id>:<counter>")
ARGV[2]  max_concurrency   0 = unlimited (leases are recorded anyway)
ARGV[3]  lease_ttl_ms      lease expiry = now + lease_ttl_ms (renew.lua extends it)
ARGV[4]  rpm               capacity of the request bucket, 0 = unlimited
ARGV[5]  rpm_window_ms     refill window (60000 in production)
ARGV[6]  tpm               capacity of the per-minute token bucket, 0 = unlimited
ARGV[7]  tpm_window_ms     (60000)
ARGV[8]  daily             capacity of the daily token bucket, 0 = unlimited
ARGV[9]  daily_window_ms   (86400000)
ARGV[10] est_tokens        estimated cost, reserved now, reconciled by release.lua

Then 0, 1 or 2 groups of limits of the calling app, g = 0, 1, ...: the app's
own, then the app's on the source's capability. Each is checked like the
source's concurrency and buckets, and the lease and withdrawals are recorded
in each, so the app's figures hold across every source and sidecar.
KEYS[6+4g]   {p:app:A}:leases  (or {p:app:A}:cap:C:leases)  ZSET  lease_id -> expiry
KEYS[7+4g]   {p:app:A}:rpm     HASH  level, ts
KEYS[8+4g]   {p:app:A}:tpm     HASH  level, ts
KEYS[9+4g]   {p:app:A}:daily   HASH  level, ts
ARGV[11+8g]  label             refusal reasons of this group are LABEL_concurrency,
                               LABEL_rpm, LABEL_tpm, LABEL_daily ('app', 'app_cap')
ARGV[12+8g]  max_concurrency   0 = unlimited: then the group records no lease either
ARGV[13+8g]  rpm               ARGV[14+8g] rpm_window_ms
ARGV[15+8g]  tpm               ARGV[16+8g] tpm_window_ms
ARGV[17+8g]  daily             ARGV[18+8g] daily_window_ms

Returns  {1, lease_id, probe}         admitted; probe = 1 when this attempt is
                                      the half-open breaker's single probe
         {0, reason, retry_at_ms}     refused; reason is the FIRST failing check
                                      in the order breaker, concurrency, rpm,
                                      tpm, daily. retry_at_ms (Redis clock) is
                                      the max of the known availability times of
                                      all failing checks: a lower bound on when
                                      it could succeed; 0 when no failing check
                                      has a known time (concurrency, a busy probe).
                                      The app's checks come after the source's.

Steps and why:
 1. Expired leases are removed first: a sidecar that died (even by SIGKILL)
    gives its permits back once its leases' TTL passes.
 2. Breaker (the memory breaker's semantics, src/breaker.h): open_until = 0 is
    CLOSED; now < open_until is OPEN (refused until open_until); otherwise
    HALF_OPEN: one probe. The probe is owned by a lease id, so a probe whose
    owner died (its lease expired) frees itself after the lease TTL.
 3. Concurrency: live leases < max_concurrency (the source's, then each app
    group's: an app's leases expire like the source's, so a dead sidecar's
    slots come back to the app too).
 4. Buckets (src/bucket.h): level refills at capacity / window, capped at
    capacity; a cost above capacity needs a full bucket; the level may be
    negative (debt from reconciliation) which delays admissions.
 Nothing is written on refusal except step 1. On success the leases, the
 probe ownership and all bucket withdrawals happen together, in this one
 script. Key TTLs: a bucket key expires when it would be full again anyway
 (absent = full, identical); a leases key expires after its last lease.
 The source's and the app's keys have two hash tags: one Redis primary (a URL
 or Sentinel's) runs the script; Redis Cluster would need one slot.
]]

-- time_ms, num, bucket_level and bucket_store come from lib.lua (prepended).
local now = time_ms(redis.call('TIME'))

local K_BRK, K_LEASES = KEYS[1], KEYS[2]
local lease_id = ARGV[1]
local lease_ttl = tonumber(ARGV[3]) or 0
local est = tonumber(ARGV[10]) or 0
if est < 0 then est = 0 end

local n_groups = (#KEYS - 5) / 4
if #KEYS < 5 or n_groups ~= math.floor(n_groups) or #ARGV < 10 + 8 * n_groups then
    return redis.error_reply('admit.lua: KEYS must be 5 + 4 per app group, ARGV 10 + 8 per group')
end

-- One limit: the leases key KEYS[k] with max_concurrency ARGV[c], and the
-- buckets KEYS[k+1..k+3] with capacity, window pairs from ARGV[b]. The
-- source's leases are always recorded (breaker probes are owned by a lease);
-- an app group's only when it limits concurrency.
local limits = {}
local function bucket(name, key, cap, win, cost)
    return { name = name, key = key, cap = tonumber(cap) or 0, win = tonumber(win) or 0, cost = cost }
end
local function limit(prefix, k, c, b)
    local conc = tonumber(ARGV[c]) or 0
    limits[#limits + 1] = {
        prefix = prefix, leases = (prefix == '' or conc > 0) and KEYS[k] or nil, conc = conc,
        buckets = { bucket('rpm', KEYS[k + 1], ARGV[b], ARGV[b + 1], 1),
                    bucket('tpm', KEYS[k + 2], ARGV[b + 2], ARGV[b + 3], est),
                    bucket('daily', KEYS[k + 3], ARGV[b + 4], ARGV[b + 5], est) },
    }
end
limit('', 2, 2, 4) -- the source's (ARGV[3] is the lease TTL)
for g = 0, n_groups - 1 do
    limit(ARGV[11 + 8 * g] .. '_', 6 + 4 * g, 12 + 8 * g, 13 + 8 * g)
end

-- 1. expired leases
for _, lim in ipairs(limits) do
    if lim.leases then
        redis.call('ZREMRANGEBYSCORE', lim.leases, '-inf', num(now))
    end
end

local reason, retry_at = nil, 0
local function refuse(r, at)
    if not reason then reason = r end
    if at and at > retry_at then retry_at = at end
end

-- 2. breaker
local b = redis.call('HMGET', K_BRK, 'open_until', 'probe')
local open_until = tonumber(b[1]) or 0
local probe = 0
if open_until > 0 then
    if now < open_until then
        refuse('breaker', open_until)
    else
        local owner = b[2]
        if owner and redis.call('ZSCORE', K_LEASES, owner) then
            refuse('breaker', nil)          -- the single probe is in flight
        else
            probe = 1                       -- half-open and the probe is free
        end
    end
end

-- 3. and 4. concurrency, then buckets, of each limit in turn
for _, lim in ipairs(limits) do
    if lim.conc > 0 and redis.call('ZCARD', lim.leases) >= lim.conc then
        refuse(lim.prefix .. 'concurrency', nil)
    end
    for _, bk in ipairs(lim.buckets) do
        if bk.cap > 0 and bk.win > 0 then
            bk.level = bucket_level(bk.key, bk.cap, bk.win, now)
            local need = bk.cost < bk.cap and bk.cost or bk.cap
            local missing = need - bk.level
            if missing > 1e-9 then
                refuse(lim.prefix .. bk.name, now + missing * bk.win / bk.cap)
            end
        end
    end
end

if reason then
    return { 0, reason, math.ceil(retry_at) }
end

-- admitted: leases, probe ownership and withdrawals together
local expiry = now + lease_ttl
for _, lim in ipairs(limits) do
    if lim.leases then
        redis.call('ZADD', lim.leases, num(expiry), lease_id)
        local last = redis.call('ZRANGE', lim.leases, -1, -1, 'WITHSCORES')
        redis.call('PEXPIREAT', lim.leases, math.ceil(tonumber(last[2])) + 1000)
    end
    for _, bk in ipairs(lim.buckets) do
        if bk.cap > 0 and bk.win > 0 then
            bucket_store(bk.key, bk.cap, bk.win, bk.level - bk.cost, now)
        end
    end
end

if probe == 1 then
    redis.call('HSET', K_BRK, 'probe', lease_id)
end

return { 1, lease_id, probe }
