--[[
admit.lua — one atomic admission of an attempt on a source (docs/DESIGN.md §3.2).

All KEYS share the source's hash tag {<prefix>:source:<NAME>} (one slot; works
unchanged on Redis Cluster). Time is Redis' own clock (TIME), never an
argument, so sidecars with skewed clocks agree. All times are milliseconds.

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

Returns  {1, lease_id, probe}         admitted; probe = 1 when this attempt is
                                      the half-open breaker's single probe
         {0, reason, retry_at_ms}     refused; reason is the FIRST failing check
                                      in the order breaker, concurrency, rpm,
                                      tpm, daily. retry_at_ms (Redis clock) is
                                      the max of the known availability times of
                                      all failing checks: a lower bound on when
                                      it could succeed; 0 when no failing check
                                      has a known time (concurrency, a busy probe).

Steps and why:
 1. Expired leases are removed first: a sidecar that died (even by SIGKILL)
    gives its permits back once its leases' TTL passes.
 2. Breaker (the memory breaker's semantics, src/breaker.h): open_until = 0 is
    CLOSED; now < open_until is OPEN (refused until open_until); otherwise
    HALF_OPEN: one probe. The probe is owned by a lease id, so a probe whose
    owner died (its lease expired) frees itself after the lease TTL.
 3. Concurrency: live leases < max_concurrency.
 4. Buckets (src/bucket.h): level refills at capacity / window, capped at
    capacity; a cost above capacity needs a full bucket; the level may be
    negative (debt from reconciliation) which delays admissions.
 Nothing is written on refusal except step 1. On success the lease, the probe
 ownership and all bucket withdrawals happen together, in this one script.
 Key TTLs: a bucket key expires when it would be full again anyway (absent =
 full, identical); the leases key expires after its last lease.
]]

-- time_ms, num, bucket_level and bucket_store come from lib.lua (prepended).
local now = time_ms(redis.call('TIME'))

local K_BRK, K_LEASES = KEYS[1], KEYS[2]
local lease_id = ARGV[1]
local max_conc = tonumber(ARGV[2]) or 0
local lease_ttl = tonumber(ARGV[3]) or 0
local est = tonumber(ARGV[10]) or 0
if est < 0 then est = 0 end

local buckets = {
    { name = 'rpm',   key = KEYS[3], cap = tonumber(ARGV[4]) or 0, win = tonumber(ARGV[5]) or 0, cost = 1 },
    { name = 'tpm',   key = KEYS[4], cap = tonumber(ARGV[6]) or 0, win = tonumber(ARGV[7]) or 0, cost = est },
    { name = 'daily', key = KEYS[5], cap = tonumber(ARGV[8]) or 0, win = tonumber(ARGV[9]) or 0, cost = est },
}

-- 1. expired leases
redis.call('ZREMRANGEBYSCORE', K_LEASES, '-inf', num(now))

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

-- 3. concurrency
if max_conc > 0 and redis.call('ZCARD', K_LEASES) >= max_conc then
    refuse('concurrency', nil)
end

-- 4. buckets
for _, bk in ipairs(buckets) do
    if bk.cap > 0 and bk.win > 0 then
        bk.level = bucket_level(bk.key, bk.cap, bk.win, now)
        local need = bk.cost < bk.cap and bk.cost or bk.cap
        local missing = need - bk.level
        if missing > 1e-9 then
            refuse(bk.name, now + missing * bk.win / bk.cap)
        end
    end
end

if reason then
    return { 0, reason, math.ceil(retry_at) }
end

-- admitted: lease, probe ownership and withdrawals together
local expiry = now + lease_ttl
redis.call('ZADD', K_LEASES, num(expiry), lease_id)
local last = redis.call('ZRANGE', K_LEASES, -1, -1, 'WITHSCORES')
redis.call('PEXPIREAT', K_LEASES, math.ceil(tonumber(last[2])) + 1000)

if probe == 1 then
    redis.call('HSET', K_BRK, 'probe', lease_id)
end

for _, bk in ipairs(buckets) do
    if bk.cap > 0 and bk.win > 0 then
        bucket_store(bk.key, bk.cap, bk.win, bk.level - bk.cost, now)
    end
end

return { 1, lease_id, probe }
