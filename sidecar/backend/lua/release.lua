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

-- time_ms, num, limit_arg, bucket_level and bucket_store come from lib.lua
-- (prepended).
-- Written like admit.lua, for Redis' time per call (see there): the releases
-- are read from ARGV where they are, and Redis' clock is read only when
-- something needs it (a bucket to reconcile, a breaker that opens or is
-- not closed): a success on a closed breaker needs no time.
local K_BRK, K_LEASES = KEYS[1], KEYS[2]
local nk, na = #KEYS, #ARGV
local n_groups = (nk - 5) / 4
local first_extra = 12 + 4 * n_groups
if nk < 5 or n_groups ~= math.floor(n_groups) or na < first_extra - 1 or
    (na - first_extra + 1) % 4 ~= 0 then
    return redis.error_reply('release.lua: KEYS must be 5 + 4 per app group, ARGV 11 + 4 per group ' ..
                             '+ 4 per further release')
end
local n_rel = 1 + (na - first_extra + 1) / 4

-- Release i's lease id, verdict, estimate and usage are ARGV[a] and the
-- three after it: a = 1 for i = 1, first_extra + 4i - 8 after it.

-- Validated before any write: a script error does not roll back earlier writes.
local any_failure = false
for i = 1, n_rel do
    local v = ARGV[i == 1 and 2 or first_extra + 4 * i - 7]
    if v == 'failure' then
        any_failure = true
    elseif v ~= 'success' and v ~= 'neutral' then
        return redis.error_reply('release.lua: verdict must be success, failure or neutral')
    end
end

-- 1. leases (the source's, then the app groups'): out[3i - 2] = 1 when
-- release i's was still there
local out = { 0, 0, 0 }
if n_rel == 1 then
    out[1] = redis.call('ZREM', K_LEASES, ARGV[1])
    for g = 0, n_groups - 1 do
        redis.call('ZREM', KEYS[6 + 4 * g], ARGV[1])
    end
else
    local ids = {}
    for i = 1, n_rel do ids[i] = ARGV[i == 1 and 1 or first_extra + 4 * i - 8] end
    local sc = redis.call('ZMSCORE', K_LEASES, unpack(ids))
    for i = 1, n_rel do out[3 * i - 2] = sc[i] and 1 or 0 end
    redis.call('ZREM', K_LEASES, unpack(ids))
    for g = 0, n_groups - 1 do
        redis.call('ZREM', KEYS[6 + 4 * g], unpack(ids))
    end
end

-- 2. reconcile: the tpm and daily buckets of the source (KEYS[4], KEYS[5],
-- ARGV[5..8]), then of each group (KEYS[8+4g], KEYS[9+4g], ARGV[12+4g..]),
-- each release's delta (used - est, when the usage is known and differs)
-- in turn; a bucket no release has a delta for is left as it is
local now, now_s
-- (nothing to do when no bucket has a capacity: '0' is how one says none)
if n_groups > 0 or ARGV[5] ~= '0' or ARGV[7] ~= '0' then
    local function reconcile(key, cap, win)
        cap = limit_arg(cap)
        if cap <= 0 then return end
        win = tonumber(win) or 0
        if win <= 0 then return end
        local lvl
        for i = 1, n_rel do
            local a = i == 1 and 1 or first_extra + 4 * i - 8
            local used = ARGV[a + 3]
            if used ~= ARGV[a + 2] then
                local est
                used, est = tonumber(used) or -1, tonumber(ARGV[a + 2]) or 0
                if used >= 0 and used ~= est then
                    if not lvl then
                        if not now then
                            now = time_ms(redis.call('TIME'))
                            now_s = num(now)
                        end
                        lvl = bucket_level(key, cap, win, now)
                    end
                    lvl = math.min(cap, lvl - (used - est))
                end
            end
        end
        if lvl then bucket_store(key, cap, win, lvl, now_s) end
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
-- The breaker's arguments, parsed only when a verdict can change it: a
-- failure, a probe's verdict, a success that resets the failure count.
local failures, base_cd, cd = 0, 0, 0
if any_failure or probe or consec ~= 0 then
    failures, base_cd = tonumber(ARGV[9]) or 0, tonumber(ARGV[10]) or 0
    cd = tonumber(b[4]) or base_cd
end
local set_ou, set_cd, set_consec, probe_deleted, opened = false, false, false, false, 0

for i = 1, n_rel do
    local a = i == 1 and 1 or first_extra + 4 * i - 8
    local id, verdict = ARGV[a], ARGV[a + 1]
    local was_probe = (probe and probe == id) and 1 or 0
    local open_cd -- the breaker opens for this cool-down
    if verdict == 'success' then
        if was_probe == 1 then
            open_until, consec, cd = 0, 0, base_cd
            set_ou, set_consec, set_cd = true, true, true
            probe, probe_deleted = nil, true
        elseif consec ~= 0 then
            consec, set_consec = 0, true
        end
    elseif verdict == 'failure' then
        if failures > 0 then
            if open_until == 0 then
                consec = consec + 1
                if consec >= failures then
                    open_cd = cd
                else
                    set_consec = true
                end
            elseif was_probe == 1 then
                local max_cd = tonumber(ARGV[11]) or base_cd -- the cap, never below the base
                open_cd = math.min(cd * 2, max_cd < base_cd and base_cd or max_cd)
            end
            -- else: a straggler admitted before the breaker opened; already open
        end
    elseif was_probe == 1 then -- neutral
        probe, probe_deleted = nil, true
    end
    if open_cd or open_until > 0 then
        now = now or time_ms(redis.call('TIME'))
    end
    if open_cd then
        open_until, cd, consec = now + open_cd, open_cd, 0
        set_ou, set_cd, set_consec = true, true, true
        probe, probe_deleted = nil, true
        opened = opened + 1
    end
    local state = 'closed'
    if open_until > 0 then
        state = (now < open_until) and 'open' or 'half_open'
    end
    out[3 * i - 1], out[3 * i] = state, was_probe
end

if set_ou or set_cd or set_consec then
    local hset = {}
    if set_ou then
        hset[#hset + 1], hset[#hset + 2] = 'open_until', open_until == 0 and 0 or num(open_until)
    end
    if set_cd then
        hset[#hset + 1], hset[#hset + 2] = 'cooldown', num(cd)
    end
    if set_consec then
        hset[#hset + 1], hset[#hset + 2] = 'consec', consec
    end
    redis.call('HSET', K_BRK, unpack(hset))
end
if probe_deleted then
    redis.call('HDEL', K_BRK, 'probe')
end
if opened > 0 then
    redis.call('HINCRBY', K_BRK, 'opened', opened)
end
if set_ou or set_cd or set_consec or probe_deleted then
    local max_cd = tonumber(ARGV[11]) or base_cd
    local ttl = 2 * (max_cd < base_cd and base_cd or max_cd)
    if ttl < 86400000 then ttl = 86400000 end
    redis.call('PEXPIRE', K_BRK, math.ceil(ttl))
end

return out
