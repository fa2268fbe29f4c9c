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

Then 0 or more further releases on the same keys, f = 0, 1, ... (a sidecar
sends the releases of one loop turn for one source and app in one call):
ARGV[12+4n+4f] lease_id   ARGV[13+4n+4f] verdict   ARGV[14+4n+4f] est_tokens
ARGV[15+4n+4f] used_tokens                          (n = the number of app groups)
Each release, ARGV[1]'s first, applies as if it ran alone, one after the
other at the same Redis time; each key is written once for them all.

Returns  {lease_removed (0/1), breaker_state, was_probe (0/1)} per release,
         in that order; breaker_state: closed | open | half_open (after it)

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
local failures = tonumber(ARGV[9]) or 0
local base_cd = tonumber(ARGV[10]) or 0
local max_cd = tonumber(ARGV[11]) or base_cd
if max_cd < base_cd then max_cd = base_cd end
local n_groups = (#KEYS - 5) / 4
local first_extra = 12 + 4 * n_groups
if #KEYS < 5 or n_groups ~= math.floor(n_groups) or #ARGV < first_extra - 1 or
    (#ARGV - first_extra + 1) % 4 ~= 0 then
    return redis.error_reply('release.lua: KEYS must be 5 + 4 per app group, ARGV 11 + 4 per group ' ..
                             '+ 4 per further release')
end
local ids, verdicts, deltas = { ARGV[1] }, { ARGV[2] }, {}
for j = first_extra, #ARGV, 4 do
    ids[#ids + 1], verdicts[#verdicts + 1] = ARGV[j], ARGV[j + 1]
end
local any_delta = false
for i = 1, #ids do
    local a = i == 1 and 3 or first_extra + 4 * (i - 2) + 2
    local est, used = tonumber(ARGV[a]) or 0, tonumber(ARGV[a + 1]) or -1
    -- Validated before any write: a script error does not roll back earlier writes.
    local v = verdicts[i]
    if v ~= 'success' and v ~= 'failure' and v ~= 'neutral' then
        return redis.error_reply('release.lua: verdict must be success, failure or neutral')
    end
    if used >= 0 and used ~= est then
        deltas[i] = used - est
        any_delta = true
    end
end

-- 1. leases (the source's, then the app groups'); which were still there
local removed = {}
if #ids == 1 then
    removed[1] = redis.call('ZREM', K_LEASES, ids[1])
else
    local sc = redis.call('ZMSCORE', K_LEASES, unpack(ids))
    for i = 1, #ids do removed[i] = sc[i] and 1 or 0 end
    redis.call('ZREM', K_LEASES, unpack(ids))
end
for g = 0, n_groups - 1 do
    redis.call('ZREM', KEYS[6 + 4 * g], unpack(ids))
end

-- 2. reconcile: the tpm and daily buckets of the source (KEYS[4], KEYS[5],
-- ARGV[5..8]), then of each group (KEYS[8+4g], KEYS[9+4g], ARGV[12+4g..]),
-- each release's delta in turn
if any_delta then
    local now_s = num(now)
    local function reconcile(key, cap, win)
        cap, win = tonumber(cap) or 0, tonumber(win) or 0
        if cap > 0 and win > 0 then
            local lvl = bucket_level(key, cap, win, now)
            for i = 1, #ids do
                if deltas[i] then lvl = math.min(cap, lvl - deltas[i]) end
            end
            bucket_store(key, cap, win, lvl, now_s)
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

-- 3. breaker: each verdict in turn on the state read once; the fields it
-- changed are written once at the end (their last values)
local b = redis.call('HMGET', K_BRK, 'open_until', 'probe', 'consec', 'cooldown')
local open_until = tonumber(b[1]) or 0
local probe = b[2]
local consec = tonumber(b[3]) or 0
local cd = tonumber(b[4]) or base_cd
local set, probe_deleted, opened = {}, false, 0

local function open_for(c)
    open_until, cd, consec = now + c, c, 0
    set.open_until, set.cooldown, set.consec = true, true, true
    probe, probe_deleted = nil, true
    opened = opened + 1
end

local out = {}
for i = 1, #ids do
    local verdict = verdicts[i]
    local was_probe = (probe and probe == ids[i]) and 1 or 0
    if verdict == 'success' then
        if was_probe == 1 then
            open_until, consec, cd = 0, 0, base_cd
            set.open_until, set.consec, set.cooldown = true, true, true
            probe, probe_deleted = nil, true
        elseif consec ~= 0 then
            consec, set.consec = 0, true
        end
    elseif verdict == 'failure' then
        if failures > 0 then
            if open_until == 0 then
                consec = consec + 1
                if consec >= failures then
                    open_for(cd)
                else
                    set.consec = true
                end
            elseif was_probe == 1 then
                open_for(math.min(cd * 2, max_cd))
            end
            -- else: a straggler admitted before the breaker opened; already open
        end
    elseif verdict == 'neutral' then
        if was_probe == 1 then
            probe, probe_deleted = nil, true
        end
    end
    local state = 'closed'
    if open_until > 0 then
        state = (now < open_until) and 'open' or 'half_open'
    end
    local o = #out
    out[o + 1], out[o + 2], out[o + 3] = removed[i], state, was_probe
end

local hset = {}
if set.open_until then
    hset[#hset + 1], hset[#hset + 2] = 'open_until', open_until == 0 and 0 or num(open_until)
end
if set.cooldown then
    hset[#hset + 1], hset[#hset + 2] = 'cooldown', num(cd)
end
if set.consec then
    hset[#hset + 1], hset[#hset + 2] = 'consec', consec
end
if #hset > 0 then
    redis.call('HSET', K_BRK, unpack(hset))
end
if probe_deleted then
    redis.call('HDEL', K_BRK, 'probe')
end
if opened > 0 then
    redis.call('HINCRBY', K_BRK, 'opened', opened)
end
if #hset > 0 or probe_deleted then
    local ttl = 86400000
    if 2 * max_cd > ttl then ttl = 2 * max_cd end
    redis.call('PEXPIRE', K_BRK, math.ceil(ttl))
end

return out
