--[[
release.lua — ends an attempt admitted by admit.lua: frees its lease,
reconciles the token buckets with the real usage, records the breaker verdict.

Same keys as admit.lua (the source's, then the app groups admit.lua was given);
time from Redis' TIME. Milliseconds throughout.

KEYS[1]  {p:source:N}:breaker  HASH  consec, open_until, cooldown, probe, opened
KEYS[2]  {p:source:N}:leases   ZSET  lease_id -> expiry
KEYS[3]  {p:source:N}:rpm      HASH  (unused: a request is one request; kept so
                                     admit and release take the same KEYS)
KEYS[4]  {p:source:N}:tpm      HASH  level, ts
KEYS[5]  {p:source:N}:daily    HASH  level, ts

ARGV[1]  lease_id
ARGV[2]  verdict           success | failure | neutral
                           failure = a transient failure (counts for the breaker);
                           neutral = 429 / cancel / fail-fast: no verdict
ARGV[3]  est_tokens        what admit.lua reserved
ARGV[4]  used_tokens       real usage; negative = unknown (the estimate stands)
ARGV[5]  tpm               capacity, 0 = unlimited   (as given to admit.lua)
ARGV[6]  tpm_window_ms
ARGV[7]  daily             capacity, 0 = unlimited
ARGV[8]  daily_window_ms
ARGV[9]  failures          consecutive transient failures that open the breaker
                           (0 = breaker disabled)
ARGV[10] cooldown_ms       base cool-down
ARGV[11] max_cooldown_ms   cap of the doubling

Then, per app group g of admit.lua (KEYS[6+4g..9+4g]: leases, rpm, tpm, daily):
ARGV[12+4g] tpm    ARGV[13+4g] tpm_window_ms    ARGV[14+4g] daily    ARGV[15+4g] daily_window_ms
The lease leaves the group's leases too (the app's slot is free at once) and
its buckets are reconciled like the source's.

Returns  {lease_removed (0/1), breaker_state, was_probe (0/1)}
         breaker_state: closed | open | half_open (after this release)

Steps and why:
 1. ZREM the lease: the permit is free for every sidecar at once. 0 means the
    lease had already expired (the sidecar was too slow to renew); the rest
    still applies, since the tokens were taken.
 2. Reconcile (src/bucket.h bucket_adjust): delta = used - est. delta < 0
    gives tokens back, never above capacity; delta > 0 takes more, possibly
    into debt (negative level), which delays later admissions so the limit
    holds over time even when estimates are low.
 3. Breaker (src/breaker.h): was_probe = this lease owns the half-open probe.
    success: consecutive failures reset; a probe's success closes the breaker
             and resets the cool-down to the base.
    failure: closed -> consec + 1, at `failures` the breaker opens for the
             current cool-down; a failed probe doubles the cool-down (up to
             max) and reopens; a straggler's failure while open/half-open
             (not the probe) changes nothing.
    neutral: a probe frees its slot without a verdict.
 The breaker key gets a long TTL (max(24 h, 2 x max cool-down)) refreshed on
 each write so forgotten sources do not leak keys.
]]

-- time_ms, num, bucket_level and bucket_store come from lib.lua (prepended).
local now = time_ms(redis.call('TIME'))

local K_BRK, K_LEASES = KEYS[1], KEYS[2]
local lease_id = ARGV[1]
local verdict = ARGV[2]
local est = tonumber(ARGV[3]) or 0
local used = tonumber(ARGV[4]) or -1
local failures = tonumber(ARGV[9]) or 0
local base_cd = tonumber(ARGV[10]) or 0
local max_cd = tonumber(ARGV[11]) or base_cd
if max_cd < base_cd then max_cd = base_cd end
-- Validated before any write: a script error does not roll back earlier writes.
if verdict ~= 'success' and verdict ~= 'failure' and verdict ~= 'neutral' then
    return redis.error_reply('release.lua: verdict must be success, failure or neutral')
end
local n_groups = (#KEYS - 5) / 4
if #KEYS < 5 or n_groups ~= math.floor(n_groups) or #ARGV < 11 + 4 * n_groups then
    return redis.error_reply('release.lua: KEYS must be 5 + 4 per app group, ARGV 11 + 4 per group')
end

-- 1. lease (the source's, then the app groups')
local removed = redis.call('ZREM', K_LEASES, lease_id)
for g = 0, n_groups - 1 do
    redis.call('ZREM', KEYS[6 + 4 * g], lease_id)
end

-- 2. reconcile: the tpm and daily buckets of the source (KEYS[4], KEYS[5],
-- ARGV[5..8]), then of each group (KEYS[8+4g], KEYS[9+4g], ARGV[12+4g..])
if used >= 0 and used ~= est then
    local delta = used - est
    local now_s = num(now)
    local function reconcile(key, cap, win)
        cap, win = tonumber(cap) or 0, tonumber(win) or 0
        if cap > 0 and win > 0 then
            local lvl = bucket_level(key, cap, win, now)
            bucket_store(key, cap, win, math.min(cap, lvl - delta), now_s)
        end
    end
    reconcile(KEYS[4], ARGV[5], ARGV[6])
    reconcile(KEYS[5], ARGV[7], ARGV[8])
    for g = 0, n_groups - 1 do
        local k, a = 8 + 4 * g, 12 + 4 * g
        reconcile(KEYS[k], ARGV[a], ARGV[a + 1])
        reconcile(KEYS[k + 1], ARGV[a + 2], ARGV[a + 3])
    end
end

-- 3. breaker
local b = redis.call('HMGET', K_BRK, 'open_until', 'probe', 'consec', 'cooldown')
local open_until = tonumber(b[1]) or 0
local was_probe = (b[2] and b[2] == lease_id) and 1 or 0
local consec = tonumber(b[3]) or 0
local cd = tonumber(b[4]) or base_cd
local wrote = false

local function open_for(c)
    open_until = now + c
    redis.call('HSET', K_BRK, 'open_until', num(open_until), 'cooldown', num(c), 'consec', 0)
    redis.call('HDEL', K_BRK, 'probe')
    redis.call('HINCRBY', K_BRK, 'opened', 1)
    wrote = true
end

if verdict == 'success' then
    if was_probe == 1 then
        open_until = 0
        redis.call('HSET', K_BRK, 'open_until', 0, 'consec', 0, 'cooldown', num(base_cd))
        redis.call('HDEL', K_BRK, 'probe')
        wrote = true
    elseif consec ~= 0 then
        redis.call('HSET', K_BRK, 'consec', 0)
        wrote = true
    end
elseif verdict == 'failure' then
    if failures > 0 then
        if open_until == 0 then
            consec = consec + 1
            if consec >= failures then
                open_for(cd)
            else
                redis.call('HSET', K_BRK, 'consec', consec)
                wrote = true
            end
        elseif was_probe == 1 then
            open_for(math.min(cd * 2, max_cd))
        end
        -- else: a straggler admitted before the breaker opened; already open
    end
elseif verdict == 'neutral' then
    if was_probe == 1 then
        redis.call('HDEL', K_BRK, 'probe')
        wrote = true
    end
end

if wrote then
    local ttl = 86400000
    if 2 * max_cd > ttl then ttl = 2 * max_cd end
    redis.call('PEXPIRE', K_BRK, math.ceil(ttl))
end

local state = 'closed'
if open_until > 0 then
    state = (now < open_until) and 'open' or 'half_open'
end
return { removed, state, was_probe }
