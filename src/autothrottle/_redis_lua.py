"""The Lua scripts of :mod:`autothrottle.redis`: the fleet's rules, run atomically on the server.

Each script implements rules stated in :mod:`autothrottle._fleet` (cited by
number below); what the rule is lives there, how Redis keeps it lives here.

Times are microseconds on the Redis server's clock (``TIME``), so the clocks
of the processes sharing a slot do not matter: a time a process sends is
"seconds before now" (the clock contract, ``docs/architecture.md``), placed
on the server's clock by the script. Keys of one slot share a hash tag
(``{prefix:slot}``), so a Redis Cluster keeps them on one shard.

Hash ``{prefix:slot}:s`` fields: ``tat`` (the next free send time), ``last``
(``tat`` less the gap it was reserved with), ``delay`` (the fleet's delay, µs), ``pause``
(paused until), ``backoff_at`` (the fleet's last counted backoff), ``stated``
and ``stated_until`` (the pace a host stated in a process's answers, µs, and
its end), ``record``
(the last shared ``SlotState`` as JSON), ``version``, ``oks`` and
``ok_first`` (the fleet's successes since its last counted backoff, from when), and
``ok_latest`` and ``ok_before`` (when the latest two of them were merged). Sorted set
``{prefix:slot}:l``: the leases in flight, scored by their expiry;
``{prefix:slot}:p``: the processes that took a turn, by when.
"""

from __future__ import annotations

__all__ = ["GIVE_BACK", "LOOK", "MERGE", "TURN"]

_NOW = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local function us(value) return string.format('%.0f', value) end
"""

TURN = (
    _NOW
    + """
-- ARGV: gap, min gap, max gap (µs), cap, hold (µs), lease id, ttl (ms), process id,
--       max pause (µs), the end of the pause the asker already waited out ('' none),
--       the spacing margin (a factor >= 1), the asker's lateness (µs), the slot's
--       phase (a fraction of the gap, in [0, 1)), the turns the asker would take,
--       the room to leave after them (µs)
redis.call('ZADD', KEYS[3], now, ARGV[8])
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now - 60000000)
redis.call('PEXPIRE', KEYS[3], ARGV[7])
local processes = tostring(redis.call('ZCARD', KEYS[3]))
local state = redis.call('HMGET', KEYS[1], 'tat', 'last', 'delay', 'pause', 'stated',
  'stated_until')
local shown_delay = state[3] or ''
-- Rule 1: the gap, the fleet's (the asker's own while it has none) within the
-- asker's bounds, times the margin. A pace a host stated to any process (rule 5) is
-- a floor of those bounds while it holds, cut to what is left of it and to the
-- asker's max pause, as the asker's own gate keeps one. Every answer says the gap
-- (rule 6: the share a process keeps alone), the gap without that pace, and how
-- long that pace holds.
local low, high = tonumber(ARGV[2]), tonumber(ARGV[3])
local fleet_gap = tonumber(state[3]) or tonumber(ARGV[1])
local plain = math.min(math.max(fleet_gap, low), high) * tonumber(ARGV[11])
local stated, stated_left = 0, 0
local stated_until = tonumber(state[6]) or 0
if stated_until > now then
  stated = math.min(tonumber(state[5]) or 0, stated_until - now, tonumber(ARGV[9]))
  if stated > 0 then stated_left = math.min(stated_until - now, tonumber(ARGV[9])) end
  low, high = math.max(low, stated), math.max(high, stated)
end
local gap = math.min(math.max(fleet_gap, low), high) * tonumber(ARGV[11])
-- Rule 2: while a pause the asker has not waited out yet runs, no turn; the asker
-- waits for it at most its own max_pause, then names it as waited out.
local pause = tonumber(state[4]) or 0
if pause > now and pause > (tonumber(ARGV[10]) or 0) then
  local wait = math.min(pause, now + tonumber(ARGV[9])) - now
  return {us(wait), '', shown_delay, us(wait), processes, us(pause), us(now), '0', us(gap),
    '0', us(plain), us(stated_left)}
end
-- Rule 1: the cap, counting live leases only.
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local live = redis.call('ZCARD', KEYS[2])
local cap = tonumber(ARGV[4])
if live >= cap then
  local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
  local wait = math.max(1000, math.min(tonumber(first[2]) - now, 50000))
  return {us(wait), '', shown_delay, '0', processes, '', us(now), '0', us(gap), '0', us(plain),
    us(stated_left)}
end
-- Rule 1: the next send, one gap after the latest, and never later than the
-- asker's own gap after the next free time less the gap it was reserved with
-- ('last'). A stated pace spaces the next send from the latest reserved at once,
-- not one turn on. A new slot starts at its phase point.
local at = tonumber(state[1]) or 0
local last = tonumber(state[2])
if last then at = math.max(math.min(at, last + gap), last + stated * tonumber(ARGV[11])) end
if at < now - 60000000 and gap > 0 then
  -- a new slot, or one idle for a minute, starts at its own phase: within a gap
  -- (at most a second)
  local spread = math.min(gap, 1000000)
  at = now + (tonumber(ARGV[13]) * spread - now) % spread
end
at = math.max(at, now)
-- Rule 8: a run of turns one gap apart, at most half the free leases (at least
-- one). After it the next is free one gap plus the asker's lateness for each
-- turn of the run, and the room the asker asked for, later.
local turns = math.max(1, math.min(tonumber(ARGV[14]) or 1, math.floor((cap - live) / 2)))
local hold = tonumber(ARGV[5])
for i = 1, turns do
  local lease = ARGV[6]
  if i > 1 then lease = lease .. ':' .. i end
  redis.call('ZADD', KEYS[2], at + (i - 1) * gap + hold, lease)
end
local final = at + (turns - 1) * gap
local free = final + gap + tonumber(ARGV[12]) * turns + (tonumber(ARGV[15]) or 0)
local final_lease = ARGV[6]
if turns > 1 then final_lease = final_lease .. ':' .. turns end
redis.call('HSET', KEYS[1], 'tat', us(free), 'last', us(free - gap), 'final', final_lease)
redis.call('PEXPIRE', KEYS[1], ARGV[7])
redis.call('PEXPIRE', KEYS[2], math.max(tonumber(ARGV[7]), math.ceil((final - now + hold) / 1000)))
return {us(at - now), ARGV[6], shown_delay, '0', processes, '', us(now), tostring(turns), us(gap),
  tostring(cap - live - turns), us(plain), us(stated_left)}
"""
)
"""Reserve the slot's next send, or a run of them: returns wait (µs), lease id
('' when not reserved: ask again after the wait), the fleet's delay (µs, '' if
none), the pause to wait (µs), how many processes took a turn on the slot in
the last minute, the end of the pause being waited for ('' none), the
server's clock (µs), and for a reserved run its turns, the gap between them
(µs) and the leases left free under the cap (a pause's or the cap's answer: 0,
the gap it would reserve with, 0), then the gap without a stated pace (µs) and
how long that pace holds (µs; 0 none); the lease of turn ``i > 1`` is
``lease:i``."""

LOOK = (
    _NOW
    + """
-- ARGV: the lease of the turn, hold (µs), cap, ttl (ms), max pause (µs), the end of the
--       pause the asker already waited out ('' none)
-- Rule 1: a turn reached later than its slack a second time goes, off its turn, but
-- not through a pause (rule 2) nor past the cap: its request stood still, and another
-- process may have paused the slot meanwhile. Nothing is reserved.
local processes = tostring(redis.call('ZCARD', KEYS[3]))
local state = redis.call('HMGET', KEYS[1], 'delay', 'pause')
local shown_delay = state[1] or ''
local pause = tonumber(state[2]) or 0
if pause > now and pause > (tonumber(ARGV[6]) or 0) then
  local wait = math.min(pause, now + tonumber(ARGV[5])) - now
  return {us(wait), '', shown_delay, us(wait), processes, us(pause), us(now)}
end
-- The turn's lease holds its place under the cap until it expires; one that expired
-- while its request stood still needs a free place again.
local expires = tonumber(redis.call('ZSCORE', KEYS[2], ARGV[1]))
if not expires or expires <= now then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[3]) then
    local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
    local wait = math.max(1000, math.min(tonumber(first[2]) - now, 50000))
    return {us(wait), '', shown_delay, '0', processes, '', us(now)}
  end
end
-- The lease expires its hold after this send, not after the turn it was reserved for.
local hold = tonumber(ARGV[2])
redis.call('ZADD', KEYS[2], now + hold, ARGV[1])
redis.call('PEXPIRE', KEYS[2], math.max(tonumber(ARGV[4]), math.ceil(hold / 1000)))
return {'0', ARGV[1], shown_delay, '0', processes, '', us(now)}
"""
)
"""Look whether a turn reached late may go now (rules 1 and 2): the answer has
:data:`TURN`'s shape, the turn's own lease when it may go, else '' and the wait
(a pause, the cap); nothing is reserved."""

MERGE = (
    _NOW
    + """
-- ARGV: delay (µs), backed off (1/0), sent (µs before now; '' unknown), pause (µs from
--       now; 0: none), record, ttl (ms), successes since the last change, strict (1/0),
--       the prefix's pause channel ('' or none: nobody is told), the process id, the slot,
--       the pace the host stated in this process's answers (µs; '' none) and how long
--       it holds (µs from now)
local delay = tonumber(ARGV[1])
local state = redis.call('HMGET', KEYS[1], 'delay', 'backoff_at', 'pause', 'oks', 'ok_first',
  'ok_latest', 'ok_before', 'stated', 'stated_until')
local stored = tonumber(state[1])
local backoff_at = tonumber(state[2])
local oks = tonumber(state[4]) or 0
local ok_first = tonumber(state[5])
local ok_latest = tonumber(state[6])
local ok_before = tonumber(state[7])
local pause_for = tonumber(ARGV[4])
local strict = ARGV[8] == '1'
-- Rule 5: a request sent before the fleet's last backoff is the lag of that backoff
-- ("One backoff per burst", docs/recovery.md): its backoff changes nothing, its
-- response never lowers the delay. A counted backoff never lowers it either.
local lag = false
if backoff_at and ARGV[3] ~= '' then lag = now - tonumber(ARGV[3]) < backoff_at end
-- Rule 5: a backoff at a strict pace the fleet kept (its successes since its last
-- counted backoff came at that pace, or the latest two did: docs/recovery.md, "At
-- the stated pace", judged on the fleet's successes) is the host's jitter: the pace
-- stays, and a pause it asks for lasts at most one gap. The latest two will do: the
-- fleet never sends faster than a strict pace, so wider gaps before them were its
-- own slowness (a start, a delay coming back down after a backoff).
local kept = strict and stored and ok_first and oks >= 2 and (
  oks * 1.25 * stored >= now - ok_first or (ok_before and now - ok_before <= 2.5 * stored))
if ARGV[2] == '1' and lag then
  delay = stored or delay
elseif ARGV[2] == '1' and kept then
  delay = stored
  pause_for = math.min(pause_for, stored)
  redis.call('HSET', KEYS[1], 'backoff_at', us(now))
elseif ARGV[2] == '1' then
  if stored and stored > delay then delay = stored end
  redis.call('HSET', KEYS[1], 'backoff_at', us(now), 'oks', '0')
  redis.call('HDEL', KEYS[1], 'ok_latest', 'ok_before')
  oks = 0
  ok_latest, ok_before = nil, nil
elseif lag and stored and delay < stored then
  delay = stored
elseif strict and stored and delay > stored then
  delay = stored  -- a strict pace rises only by a counted backoff
end
local new_oks = tonumber(ARGV[7]) or 0
if new_oks > 0 then
  if oks == 0 or not ok_first then ok_first = now end
  oks = oks + new_oks
  if oks > 16 then  -- the latest 8 to 16 count, at the rate they came
    ok_first = now - (now - ok_first) * 8 / oks
    oks = 8
  end
  if new_oks >= 2 then ok_before = now else ok_before = ok_latest end
  ok_latest = now
  redis.call('HSET', KEYS[1], 'oks', tostring(oks), 'ok_first', us(ok_first),
    'ok_latest', us(ok_latest), 'ok_before', us(ok_before or now))
end
redis.call('HSET', KEYS[1], 'delay', us(delay))
if pause_for > 0 and now + pause_for > (tonumber(state[3]) or 0) then
  redis.call('HSET', KEYS[1], 'pause', us(now + pause_for))
  -- Rule 2: the processes holding turns of the slot reserved before the pause hear of
  -- it (their next answer would come too late): its end and now on this clock, who set
  -- it, the slot.
  if ARGV[9] and ARGV[9] ~= '' then
    redis.call('PUBLISH', ARGV[9], us(now + pause_for) .. ' ' .. us(now) .. ' ' .. ARGV[10]
      .. ' ' .. ARGV[11])
  end
end
-- Rule 5: a pace the host stated is the fleet's until it ends; of two, the one that
-- keeps a send longer now wins (each gap cut to what is left of it, as a turn reads
-- it), and of two that keep it as long, the later end (the host's latest word: each
-- answer that states it renews it). Only a process that heard it writes it, so
-- nobody else renews it.
local stated = tonumber(ARGV[12])
if stated and stated > 0 then
  local stated_until = now + tonumber(ARGV[13])
  local held_until = tonumber(state[9]) or 0
  local held = tonumber(state[8]) or 0
  local held_left = 0
  if held_until > now then held_left = math.min(held, held_until - now) end
  local left = math.min(stated, stated_until - now)
  if left > held_left or (left == held_left and stated_until > held_until) then
    redis.call('HSET', KEYS[1], 'stated', us(stated), 'stated_until', us(stated_until))
    -- Rule 8: a pace that begins, or widens by more than a quarter, voids the runs
    -- reserved before it, narrower: the processes holding them hear it (gap until
    -- now process slot). A budget's gap that creeps up as it is spent is not news.
    if (held_until <= now or stated > 1.25 * held) and ARGV[9] and ARGV[9] ~= '' then
      redis.call('PUBLISH', ARGV[9], 'stated ' .. us(stated) .. ' ' .. us(stated_until) .. ' '
        .. us(now) .. ' ' .. ARGV[10] .. ' ' .. ARGV[11])
    end
  end
end
if ARGV[5] ~= '' then redis.call('HSET', KEYS[1], 'record', ARGV[5]) end
redis.call('HINCRBY', KEYS[1], 'version', 1)
redis.call('PEXPIRE', KEYS[1], ARGV[6])
return 1
"""
)
"""Merge one process's learned state into the fleet's (rule 5); a pause it sets or
extends is published on the prefix's channel (rule 2): ``end now process slot``;
a stated pace that begins or widens too (rule 8): ``stated gap until now process
slot``."""

GIVE_BACK = (
    _NOW
    + """
-- ARGV: the gap between the turns of the run (µs), then the leases of turns of one
--       run that no request took, the latest first
-- Rule 8: an unused turn is handed back; when it is the latest turn reserved
-- ('final': no process reserved after it), its time comes back to the fleet: the
-- next free time moves one gap earlier, and the turn before it is the latest.
local gap = tonumber(ARGV[1])
local state = redis.call('HMGET', KEYS[1], 'tat', 'last', 'final')
local tat, last, final = tonumber(state[1]), tonumber(state[2]), state[3]
local freed = 0
for i = 2, #ARGV do
  local lease = ARGV[i]
  redis.call('ZREM', KEYS[2], lease)
  if tat and last and final and lease == final then
    tat, last, freed = tat - gap, last - gap, freed + 1
    local base, n = string.match(lease, '^(.*):(%d+)$')
    if not base then final = false
    elseif tonumber(n) == 2 then final = base
    else final = base .. ':' .. (tonumber(n) - 1) end
  end
end
if freed > 0 then
  redis.call('HSET', KEYS[1], 'tat', us(tat), 'last', us(last), 'final', final or '')
end
return freed
"""
)
"""Hand back a run's unused turns (rule 8); returns how many turns' time came back."""
