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

Then 0, 1 or 2 keys of input- and output-token buckets (itpm, otpm), h = 0,
1, ...: the source's and / or the app's, each under its holder's hash tag,
after the app groups (so #KEYS = 5 + 4n + m, m < 4, says both n and m).
One key holds both buckets of its holder: one read and one write for two.
KEYS[6+4n+h]  {p:source:N}:io or {p:app:A}:io  HASH  in, out (levels), ts
ARGV[11+8n+4h]  label      '' (the source's: reasons itpm, otpm) or 'app'
                           (app_itpm, app_otpm)
ARGV[12+8n+4h]  itpm       capacity of the input bucket, 0 = unlimited
ARGV[13+8n+4h]  otpm       capacity of the output bucket, 0 = unlimited
ARGV[14+8n+4h]  window_ms  of both (60000)
ARGV[11+8n+4m]  est_out    (only when m > 0) the first attempt's output
                           tokens; its input ones are est_tokens - est_out
A limit that is not set sends no key and no argument: with no itpm / otpm
the layout is the one above, m = 0.

Then 0 or more further attempts on the same keys, f = 0, 1, ... (a sidecar
sends the admissions of one loop turn for one source and app in one call):
ARGV[11+8n+2f]  lease_id    (n = the number of app groups; m = 0)
ARGV[12+8n+2f]  est_tokens
or, with m > 0, three per attempt from ARGV[12+8n+4m]: lease_id, est_tokens,
est_out.
Each attempt, ARGV[1]'s first, is checked as if admitted alone, one after
the other at the same Redis time: an admitted one takes its lease, its
withdrawals and the half-open probe before the next is checked. The reply
is then one triple (below) per attempt, in that order.

Returns  {1, lease_id, probe}         admitted; probe = 1 when this attempt is
                                      the half-open breaker's single probe
         {0, reason, retry_at_ms}     refused; reason is the FIRST failing check
                                      in the order breaker, concurrency, rpm,
                                      tpm, daily, the app groups', then itpm,
                                      otpm, app_itpm, app_otpm. retry_at_ms (Redis clock) is
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
 script (once for all the attempts admitted). Key TTLs: a bucket key expires when it would be full again anyway
 (absent = full, identical); a leases key expires after its last lease.
 The source's and the app's keys have two hash tags: one Redis primary (a URL
 or Sentinel's) runs the script; Redis Cluster would need one slot.
]]

-- time_ms, num, int, limit_arg, bucket_level, bucket_store, io_level and
-- io_store come from lib.lua (prepended).
-- Written for Redis' time per call: every redis.call costs about as much as
-- a small command, and every object the script allocates (table, string,
-- closure) costs again in Lua's collector. So each key is read once and
-- written once per script whatever the batch; the attempts are read from
-- ARGV where they are; the per-limit state lives in flat arrays sized by
-- their constructors; strings are made only for a refusal's reason; and a
-- number goes to redis.call as a number (Redis formats it with 17 digits,
-- as num() does) unless many calls take the same one.
local now = time_ms(redis.call('TIME'))

local n_groups, n_io, io_at, first_extra, stride, n_att = layout(11, 8, 4, 1, 2, 3)
if not n_groups then
    return redis.error_reply('admit.lua: KEYS must be 5 + 4 per app group + 0 to 2 io keys, ' ..
                             'ARGV 10 + 8 per group + (4 per io key + 1) + 2 (3 with io keys) ' ..
                             'per further attempt')
end
local nk = #KEYS

-- Limit L = 1 (the source's), 2.. (the app groups'): leases key, its
-- max_concurrency and live count, and buckets 3L-2 (rpm), 3L-1 (tpm), 3L
-- (daily) with key, capacity, window and level (false = no limit). The
-- source's leases are always recorded (breaker probes are owned by a lease);
-- an app group's only when it limits concurrency.
-- A window stays ARGV's string until its bucket has a capacity.
local n_lim = 1 + n_groups
local label, lkey, conc, live = { false }, { KEYS[2] }, { limit_arg(ARGV[2]) }, { 0 }
local bkey, bcap, bwin, blvl = { KEYS[3], KEYS[4], KEYS[5] },
    { limit_arg(ARGV[4]), limit_arg(ARGV[6]), limit_arg(ARGV[8]) }, { ARGV[5], ARGV[7], ARGV[9] },
    { false, false, false }
for g = 0, n_groups - 1 do
    local L, a = 2 + g, 13 + 8 * g
    label[L] = ARGV[11 + 8 * g]
    conc[L] = limit_arg(ARGV[12 + 8 * g])
    lkey[L] = conc[L] > 0 and KEYS[6 + 4 * g] or false
    live[L] = 0
    for i = 0, 2 do
        local b = 3 * L - 2 + i
        bkey[b], bcap[b], bwin[b], blvl[b] = KEYS[7 + 4 * g + i], limit_arg(ARGV[a + 2 * i]),
            ARGV[a + 2 * i + 1], false
    end
end
-- The io keys h: key, label, input and output capacities (0: none), window,
-- levels (false: no limit); no table at all without io keys.
local iokey, iolabel, icap, ocap, iowin, ilvl, olvl
if n_io > 0 then
    iokey, iolabel, icap, ocap, iowin, ilvl, olvl = {}, {}, {}, {}, {}, {}, {}
end
for h = 1, n_io do
    local a = io_at + 4 * h - 4
    iokey[h], iolabel[h] = KEYS[nk - n_io + h], ARGV[a]
    icap[h], ocap[h], iowin[h] = limit_arg(ARGV[a + 1]), limit_arg(ARGV[a + 2]),
        tonumber(ARGV[a + 3]) or 0
    ilvl[h], olvl[h] = false, false
end
-- now and the leases' expiry as the calls take them: one string for many
-- calls (a batch, several limits), else the number itself
local expiry = now + (tonumber(ARGV[3]) or 0)
local now_a, expiry_a = now, expiry
if n_lim > 1 then now_a = num(now) end
if n_att > 1 then expiry_a = num(expiry) end

-- 1. expired leases
for L = 1, n_lim do
    if lkey[L] then
        redis.call('ZREMRANGEBYSCORE', lkey[L], '-inf', now_a)
    end
end

-- 2. breaker
local brk = redis.call('HMGET', KEYS[1], 'open_until', 'probe')
local open_until = tonumber(brk[1]) or 0
-- probe_busy: the half-open breaker's single probe is in flight
local probe_busy = open_until > 0 and now >= open_until and brk[2] and
    redis.call('ZSCORE', KEYS[2], brk[2]) and true or false

-- The state the checks of 3. and 4. read, once for the whole batch.
local any_bucket = false
for L = 1, n_lim do
    if conc[L] > 0 then live[L] = redis.call('ZCARD', lkey[L]) end
end
for b = 1, 3 * n_lim do
    if bcap[b] > 0 then
        bwin[b] = tonumber(bwin[b]) or 0
        if bwin[b] > 0 then
            blvl[b] = bucket_level(bkey[b], bcap[b], bwin[b], now)
            any_bucket = true
        end
    end
end
for h = 1, n_io do
    if iowin[h] > 0 and (icap[h] > 0 or ocap[h] > 0) then
        ilvl[h], olvl[h] = io_level(iokey[h], icap[h], ocap[h], iowin[h], now)
        any_bucket = true
    end
end

-- A bucket at level LVL of capacity CAP refilled over WIN, for COST: the
-- reason and retry time after it (a refusal's reason is the first failing
-- check's: LABEL_NAME, or NAME without a label; retry_at the latest time).
local function check(reason, retry_at, lvl, cap, cost, win, lbl, name)
    local missing = (cost < cap and cost or cap) - lvl
    if missing > 1e-9 then
        if not reason then reason = lbl and lbl .. '_' .. name or name end
        local at = now + missing * win / cap
        if at > retry_at then retry_at = at end
    end
    return reason, retry_at
end

-- Each attempt in turn, as if admitted alone one after the other at `now`:
-- an admitted one takes its lease, its probe and its withdrawals before the
-- next is checked. Attempt 1 is ARGV[1] and ARGV[10], attempt i > 1
-- ARGV[first_extra + 2i - 4] and the one after it. The reason is the first
-- failing check's; retry_at the latest known time among all of them.
local out, zargs, n_adm, probe_id = { 0, 0, 0 }, { false, false }, 0, nil
for i = 1, n_att do
    local id, est, est_out, est_in = ARGV[1], ARGV[10], 0, 0
    if i > 1 then
        local j = first_extra + stride * (i - 2)
        id, est, est_out = ARGV[j], ARGV[j + 1], ARGV[j + 2]
    elseif n_io > 0 then
        est_out = ARGV[first_extra - 1]
    end
    est = tonumber(est) or 0
    if est < 0 then est = 0 end
    -- input and output tokens apart, for the io keys
    if n_io > 0 then
        est_out = tonumber(est_out) or 0
        if est_out < 0 then est_out = 0 end
        est_in = est > est_out and est - est_out or 0
    end
    local reason, retry_at, probe = nil, 0, 0
    if open_until > 0 then
        if now < open_until then
            reason, retry_at = 'breaker', open_until
        elseif probe_busy then
            reason = 'breaker'
        else
            probe = 1
        end
    end
    for L = 1, n_lim do
        if not reason and conc[L] > 0 and live[L] >= conc[L] then
            reason = L == 1 and 'concurrency' or label[L] .. '_concurrency'
        end
        for b = 3 * L - 2, 3 * L do
            local lvl = blvl[b]
            if lvl then
                local kind = b % 3 -- 1 rpm, 2 tpm, 0 daily
                reason, retry_at = check(reason, retry_at, lvl, bcap[b], kind == 1 and 1 or est,
                    bwin[b], label[L], kind == 1 and 'rpm' or kind == 2 and 'tpm' or 'daily')
            end
        end
    end
    for h = 1, n_io do
        local lbl = iolabel[h] ~= '' and iolabel[h]
        if ilvl[h] then
            reason, retry_at = check(reason, retry_at, ilvl[h], icap[h], est_in, iowin[h], lbl,
                'itpm')
        end
        if olvl[h] then
            reason, retry_at = check(reason, retry_at, olvl[h], ocap[h], est_out, iowin[h], lbl,
                'otpm')
        end
    end
    local o = 3 * i - 3
    if reason then
        out[o + 1], out[o + 2], out[o + 3] = 0, reason, math.ceil(retry_at)
    else
        for L = 1, n_lim do
            if conc[L] > 0 then live[L] = live[L] + 1 end
            for b = 3 * L - 2, 3 * L do
                if blvl[b] then blvl[b] = blvl[b] - ((b % 3 == 1) and 1 or est) end
            end
        end
        for h = 1, n_io do
            if ilvl[h] then ilvl[h] = ilvl[h] - est_in end
            if olvl[h] then olvl[h] = olvl[h] - est_out end
        end
        if probe == 1 then
            probe_busy, probe_id = true, id
        end
        n_adm = n_adm + 1
        zargs[2 * n_adm - 1], zargs[2 * n_adm] = expiry_a, id
        out[o + 1], out[o + 2], out[o + 3] = 1, id, probe
    end
end
if n_adm == 0 then
    return out
end

-- admitted: leases, probe ownership and withdrawals together. A leases key
-- lives until its last lease's expiry + 1 s. Rather than read that lease
-- back: NX sets the TTL of a key this ZADD created (known from the live
-- count when there is one), GT extends an existing key's, and never
-- shortens it (a later lease, e.g. a renewed one, keeps its own).
local lease_until = int(math.ceil(expiry) + 1000)
for L = 1, n_lim do
    local k = lkey[L]
    if k then
        redis.call('ZADD', k, unpack(zargs))
        if conc[L] > 0 then
            -- live[L] counts this batch's admissions too
            redis.call('PEXPIREAT', k, lease_until, live[L] == n_adm and 'NX' or 'GT')
        elseif redis.call('PEXPIREAT', k, lease_until, 'NX') == 0 then
            redis.call('PEXPIREAT', k, lease_until, 'GT')
        end
    end
end
if any_bucket then
    local now_s = num(now)
    for b = 1, 3 * n_lim do
        if blvl[b] then
            bucket_store(bkey[b], bcap[b], bwin[b], blvl[b], now_s)
        end
    end
    for h = 1, n_io do
        if ilvl[h] or olvl[h] then
            io_store(iokey[h], icap[h], ocap[h], iowin[h], ilvl[h], olvl[h], now_s)
        end
    end
end

if probe_id then
    redis.call('HSET', KEYS[1], 'probe', probe_id)
end

return out
