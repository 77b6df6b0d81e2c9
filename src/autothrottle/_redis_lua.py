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
(paused until), ``backoff_at`` (the fleet's last counted backoff), ``record``
(the last shared ``SlotState`` as JSON) and ``version``. Sorted set
``{prefix:slot}:l``: the leases in flight, scored by their expiry;
``{prefix:slot}:p``: the processes that took a turn, by when.
"""

from __future__ import annotations

__all__ = ["MERGE", "TURN"]

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
--       phase (a fraction of the gap, in [0, 1))
redis.call('ZADD', KEYS[3], now, ARGV[8])
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now - 60000000)
redis.call('PEXPIRE', KEYS[3], ARGV[7])
local processes = tostring(redis.call('ZCARD', KEYS[3]))
local state = redis.call('HMGET', KEYS[1], 'tat', 'last', 'delay', 'pause')
local shown_delay = state[3] or ''
-- Rule 2: while a pause the asker has not waited out yet runs, no turn; the asker
-- waits for it at most its own max_pause, then names it as waited out.
local pause = tonumber(state[4]) or 0
if pause > now and pause > (tonumber(ARGV[10]) or 0) then
  local wait = math.min(pause, now + tonumber(ARGV[9])) - now
  return {us(wait), '', shown_delay, us(wait), processes, us(pause), us(now)}
end
-- Rule 1: the cap, counting live leases only.
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[4]) then
  local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
  local wait = math.max(1000, math.min(tonumber(first[2]) - now, 50000))
  return {us(wait), '', shown_delay, '0', processes, '', us(now)}
end
-- Rule 1: the next send, one gap (the fleet's, within the asker's bounds) after the
-- latest, and never later than the asker's own gap after the next free time less
-- the gap it was reserved with ('last'). After this send the next is free one gap
-- plus the asker's lateness later. A new slot starts at its phase point.
local gap = tonumber(state[3]) or tonumber(ARGV[1])
gap = math.min(math.max(gap, tonumber(ARGV[2])), tonumber(ARGV[3])) * tonumber(ARGV[11])
local at = tonumber(state[1]) or 0
local last = tonumber(state[2])
if last then at = math.min(at, last + gap) end
if at < now - 60000000 and gap > 0 then
  -- a new slot, or one idle for a minute, starts at its own phase: within a gap
  -- (at most a second)
  local spread = math.min(gap, 1000000)
  at = now + (tonumber(ARGV[13]) * spread - now) % spread
end
at = math.max(at, now)
local free = at + gap + tonumber(ARGV[12])
redis.call('HSET', KEYS[1], 'tat', us(free), 'last', us(free - gap))
local hold = tonumber(ARGV[5])
redis.call('ZADD', KEYS[2], at + hold, ARGV[6])
redis.call('PEXPIRE', KEYS[1], ARGV[7])
redis.call('PEXPIRE', KEYS[2], math.max(tonumber(ARGV[7]), math.ceil((at - now + hold) / 1000)))
return {us(at - now), ARGV[6], shown_delay, '0', processes, '', us(now)}
"""
)
"""Reserve the slot's next send: returns wait (µs), lease id ('' when not
reserved: ask again after the wait), the fleet's delay (µs, '' if none), the
pause to wait (µs), how many processes took a turn on the slot in the last
minute, the end of the pause being waited for ('' none) and the server's
clock (µs)."""

MERGE = (
    _NOW
    + """
-- ARGV: delay (µs), backed off (1/0), sent (µs before now; '' unknown), pause (µs from
--       now; 0: none), record, ttl (ms)
local delay = tonumber(ARGV[1])
local state = redis.call('HMGET', KEYS[1], 'delay', 'backoff_at', 'pause')
local stored = tonumber(state[1])
local backoff_at = tonumber(state[2])
-- Rule 5: a request sent before the fleet's last backoff is the lag of that backoff
-- ("One backoff per burst", docs/recovery.md): its backoff changes nothing, its
-- response never lowers the delay. A counted backoff never lowers it either.
local lag = false
if backoff_at and ARGV[3] ~= '' then lag = now - tonumber(ARGV[3]) < backoff_at end
if ARGV[2] == '1' and lag then
  delay = stored or delay
elseif ARGV[2] == '1' then
  if stored and stored > delay then delay = stored end
  redis.call('HSET', KEYS[1], 'backoff_at', us(now))
elseif lag and stored and delay < stored then
  delay = stored
end
redis.call('HSET', KEYS[1], 'delay', us(delay))
local pause_for = tonumber(ARGV[4])
if pause_for > 0 and now + pause_for > (tonumber(state[3]) or 0) then
  redis.call('HSET', KEYS[1], 'pause', us(now + pause_for))
end
if ARGV[5] ~= '' then redis.call('HSET', KEYS[1], 'record', ARGV[5]) end
redis.call('HINCRBY', KEYS[1], 'version', 1)
redis.call('PEXPIRE', KEYS[1], ARGV[6])
return 1
"""
)
"""Merge one process's learned state into the fleet's (rule 5)."""
