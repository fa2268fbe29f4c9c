--[[
budget.lua — budgets in currency shared by a fleet (docs/CONFIG.md §12a), the
same rules as src/budget.c: a daily and a monthly window whose midnight is at
a fixed offset from UTC, and a total; reservations in flight count against
every window. Time is Redis' own clock (TIME).

KEYS[1..n]  {p:app:A}:budget or {p:source:N}:budget   HASH
            spent_d, spent_m, spent_t   real costs charged in the current window
            reserved                    worst cases of attempts in flight
            end_d, end_m                the current windows' ends (Unix ms)

ARGV[1]  op        reserve | settle | peek
ARGV[2]  amount    reserve: the worst case to reserve on every key;
                   settle: what reserve took
ARGV[3]  actual    settle: the real cost charged in its place, or "nan": given
                   back (reserve: unused)
Then per key k = 0 .. n-1:
ARGV[4+4k] daily   ARGV[5+4k] monthly   ARGV[6+4k] total   (0 = no limit)
ARGV[7+4k] utc_offset_s

Returns  reserve: {1} reserved on every key; or {0, k (1-based), window,
         left, retry_after_ms} refused by key k's window (daily, monthly,
         total; retry_after_ms -1 for the total), nothing reserved.
         settle:  {1}.
         peek:    per key, its state now (windows rolled over, nothing
                  written): spent_d, spent_m, spent_t, reserved, end_d,
                  end_m (ms), 6 numbers a key in KEYS' order, as strings.
A key never outlives its last use by more than 40 days (a month's window and
then some); an absent key is a budget with nothing spent.
]]

local now = time_ms(redis.call('TIME'))
local op, amount = ARGV[1], tonumber(ARGV[2]) or 0
local n = #KEYS

-- Days since 1970-01-01 of a civil date and back (src/budget.c).
local function days_from_civil(y, m, d)
    if m <= 2 then y = y - 1 end
    local era = math.floor(y / 400)
    local yoe = y - era * 400
    local mp = m > 2 and m - 3 or m + 9
    local doy = math.floor((153 * mp + 2) / 5) + d - 1
    local doe = yoe * 365 + math.floor(yoe / 4) - math.floor(yoe / 100) + doy
    return era * 146097 + doe - 719468
end

local function civil_from_days(z)
    z = z + 719468
    local era = math.floor(z / 146097)
    local doe = z - era * 146097
    local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524) -
        math.floor(doe / 146096)) / 365)
    local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
    local mp = math.floor((5 * doy + 2) / 153)
    local m = mp < 10 and mp + 3 or mp - 9
    local y = yoe + era * 400
    if m <= 2 then y = y + 1 end
    return y, m
end

-- The Unix ms at which the day / month holding `now` ends, midnight at `off` s.
local function day_end(off)
    local day = math.floor((now / 1000 + off) / 86400)
    return ((day + 1) * 86400 - off) * 1000
end

local function month_end(off)
    local y, m = civil_from_days(math.floor((now / 1000 + off) / 86400))
    local nxt = m == 12 and days_from_civil(y + 1, 1, 1) or days_from_civil(y, m + 1, 1)
    return (nxt * 86400 - off) * 1000
end

-- Each key's state at `now`, its windows rolled over.
local st = {}
for k = 1, n do
    local h = redis.call('HMGET', KEYS[k], 'spent_d', 'spent_m', 'spent_t', 'reserved', 'end_d',
        'end_m')
    local off = tonumber(ARGV[7 + 4 * (k - 1)]) or 0
    local s = { spent = { tonumber(h[1]) or 0, tonumber(h[2]) or 0, tonumber(h[3]) or 0 },
                reserved = tonumber(h[4]) or 0, ends = { tonumber(h[5]) or 0, tonumber(h[6]) or 0 },
                limit = {}, off = off }
    for w = 1, 3 do s.limit[w] = tonumber(ARGV[3 + 4 * (k - 1) + w]) or 0 end
    local fresh = { day_end(off), month_end(off) }
    for w = 1, 2 do
        if s.ends[w] == 0 or now >= s.ends[w] then
            if s.ends[w] ~= 0 then s.spent[w] = 0 end
            s.ends[w] = fresh[w]
        end
    end
    st[k] = s
end

local function store(k)
    local s = st[k]
    redis.call('HSET', KEYS[k], 'spent_d', num(s.spent[1]), 'spent_m', num(s.spent[2]),
        'spent_t', num(s.spent[3]), 'reserved', num(s.reserved), 'end_d', num(s.ends[1]),
        'end_m', num(s.ends[2]))
    redis.call('PEXPIRE', KEYS[k], 40 * 86400000)
end

local names = { 'daily', 'monthly', 'total' }
if op == 'reserve' then
    for k = 1, n do
        local s = st[k]
        for w = 1, 3 do
            local lim = s.limit[w]
            if lim > 0 and s.spent[w] + s.reserved + amount > lim then
                local left = lim - s.spent[w] - s.reserved
                if left < 0 then left = 0 end
                local retry = -1
                if w < 3 then retry = s.ends[w] - now end
                return { 0, k, names[w], num(left), num(retry) }
            end
        end
    end
    for k = 1, n do
        st[k].reserved = st[k].reserved + amount
        store(k)
    end
    return { 1 }
end
if op == 'settle' then
    local actual = tonumber(ARGV[3])
    for k = 1, n do
        local s = st[k]
        s.reserved = s.reserved - amount
        if s.reserved < 0 then s.reserved = 0 end
        if actual and actual == actual then
            for w = 1, 3 do s.spent[w] = s.spent[w] + actual end
        end
        store(k)
    end
    return { 1 }
end
if op == 'peek' then
    local out = {}
    for k = 1, n do
        local s = st[k]
        for _, v in ipairs({ s.spent[1], s.spent[2], s.spent[3], s.reserved, s.ends[1],
                             s.ends[2] }) do
            out[#out + 1] = num(v)
        end
    end
    return out
end
return redis.error_reply('budget.lua: op must be reserve, settle or peek')
