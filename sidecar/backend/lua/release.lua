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

Then, per io key h of admit.lua (KEYS[6+4n+h], m of them, n = the number
of app groups: the input- and output-token buckets of the source or app):
ARGV[12+4n+3h] itpm    ARGV[13+4n+3h] otpm    ARGV[14+4n+3h] window_ms
and, when m > 0, the first release's
ARGV[12+4n+3m] est_out     what admit.lua reserved as output (its input:
                           est_tokens - est_out)
ARGV[13+4n+3m] used_in     real input tokens as the source counts them
                           (cache reads left out where they do not count);
                           negative = unknown (the estimate stands)
ARGV[14+4n+3m] used_out    real output tokens; negative = unknown
Each io key's buckets are reconciled like the token buckets.

Then 0 or more further releases on the same keys, f = 0, 1, ... (a sidecar
sends the releases of one loop turn for one source and app in one call):
ARGV[12+4n+4f] lease_id   ARGV[13+4n+4f] verdict   ARGV[14+4n+4f] est_tokens
ARGV[15+4n+4f] used_tokens                          (m = 0)
or, with m > 0, seven per release from ARGV[15+4n+3m]: lease_id, verdict,
est_tokens, used_tokens, est_out, used_in, used_out.
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

-- time_ms, num, limit_arg, bucket_level, bucket_store, io_level and io_store
-- come from lib.lua (prepended).
-- Written like admit.lua, for Redis' time per call (see there): the releases
-- are read from ARGV where they are, and Redis' clock is read only when
-- something needs it (a bucket to reconcile, a breaker that opens or is
-- not closed): a success on a closed breaker needs no time.
local K_BRK, K_LEASES = KEYS[1], KEYS[2]
local n_groups, n_io, io_at, first_extra, stride, n_rel = layout(12, 4, 3, 3, 4, 7)
if not n_groups then
    return redis.error_reply('release.lua: KEYS must be 5 + 4 per app group + 0 to 2 io keys, ' ..
                             'ARGV 11 + 4 per group + (3 per io key + 3) + 4 (7 with io keys) ' ..
                             'per further release')
end
local nk = #KEYS

-- Release i's lease id, verdict, estimate and usage are ARGV[a] and the
-- three after it: a = 1 for i = 1, first_extra + stride (i - 2) after it;
-- with io keys, its est_out, used_in and used_out are ARGV[first_extra - 3]
-- and the two after it for i = 1, ARGV[a + 4] and after for the others.

-- Validated before any write: a script error does not roll back earlier writes.
local any_failure = false
for i = 1, n_rel do
    local v = ARGV[i == 1 and 2 or first_extra + stride * (i - 2) + 1]
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
    for i = 1, n_rel do ids[i] = ARGV[i == 1 and 1 or first_extra + stride * (i - 2)] end
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
if n_groups > 0 or n_io > 0 or ARGV[5] ~= '0' or ARGV[7] ~= '0' then
    local function reconcile(key, cap, win)
        cap = limit_arg(cap)
        if cap <= 0 then return end
        win = tonumber(win) or 0
        if win <= 0 then return end
        local lvl
        for i = 1, n_rel do
            local a = i == 1 and 1 or first_extra + stride * (i - 2)
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
    -- the io keys: input and output apart, each release's real counts
    -- replacing its estimates (est_in = est_tokens - est_out, as admit.lua)
    for h = 1, n_io do
        local a = io_at + 3 * h - 3
        local icap, ocap, win = limit_arg(ARGV[a]), limit_arg(ARGV[a + 1]), tonumber(ARGV[a + 2]) or 0
        if win > 0 and (icap > 0 or ocap > 0) then
            local ilvl, olvl
            for i = 1, n_rel do
                local e = i == 1 and 1 or first_extra + stride * (i - 2)
                local x = i == 1 and first_extra - 3 or e + 4
                local used_in, used_out = tonumber(ARGV[x + 1]) or -1, tonumber(ARGV[x + 2]) or -1
                if used_in >= 0 or used_out >= 0 then
                    local est, est_out = tonumber(ARGV[e + 2]) or 0, tonumber(ARGV[x]) or 0
                    if est < 0 then est = 0 end
                    if est_out < 0 then est_out = 0 end
                    local est_in = est > est_out and est - est_out or 0
                    if ilvl == nil then
                        if not now then
                            now = time_ms(redis.call('TIME'))
                            now_s = num(now)
                        end
                        ilvl, olvl = io_level(KEYS[nk - n_io + h], icap, ocap, win, now)
                    end
                    if ilvl and used_in >= 0 then ilvl = math.min(icap, ilvl - (used_in - est_in)) end
                    if olvl and used_out >= 0 then
                        olvl = math.min(ocap, olvl - (used_out - est_out))
                    end
                end
            end
            if ilvl ~= nil then io_store(KEYS[nk - n_io + h], icap, ocap, win, ilvl, olvl, now_s) end
        end
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
    local a = i == 1 and 1 or first_extra + stride * (i - 2)
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
