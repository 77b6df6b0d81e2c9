"""The Lua scripts of :mod:`autothrottle.redis`: each runs atomically on the server.

Times are microseconds on the Redis server's clock (``TIME``), so the clocks of
the processes sharing a slot do not matter. Keys of one slot share a hash tag
(``{prefix:slot}``), so a cluster keeps them on one shard.

Hash ``{prefix:slot}:s`` fields: ``tat`` (the next free send time), ``delay``
(the fleet's delay, µs), ``pause`` (paused until), ``backoff_at`` (the last
backoff), ``record`` (the last shared ``SlotState`` as JSON) and ``version``.
Sorted set ``{prefix:slot}:l``: the leases in flight, scored by their expiry;
``{prefix:slot}:p``: the processes that took a turn, by when.
"""

from __future__ import annotations

__all__ = ["MERGE", "TURN"]

_NOW = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
"""

TURN = (
    _NOW
    + """
-- ARGV: gap_us, cap, hold_us, lease id, ttl_ms, process id
redis.call('ZADD', KEYS[3], now, ARGV[6])
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now - 60000000)
redis.call('PEXPIRE', KEYS[3], ARGV[5])
local processes = tostring(redis.call('ZCARD', KEYS[3]))
local state = redis.call('HMGET', KEYS[1], 'tat', 'delay', 'pause')
local tat = tonumber(state[1]) or 0
local delay = tonumber(state[2])
local pause = tonumber(state[3]) or 0
local shown_delay = state[2] or ''
local paused = math.max(0, pause - now)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[2]) then
  local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
  local wait = math.max(1000, math.min(tonumber(first[2]) - now, 50000))
  return {string.format('%.0f', wait), '', shown_delay, string.format('%.0f', paused), processes}
end
local gap = delay or tonumber(ARGV[1])
local at = math.max(now, tat, pause)
redis.call('HSET', KEYS[1], 'tat', string.format('%.0f', at + gap))
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[3]), ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[5])
redis.call('PEXPIRE', KEYS[2], math.max(tonumber(ARGV[5]), math.ceil(tonumber(ARGV[3]) / 1000)))
return {string.format('%.0f', at - now), ARGV[4], shown_delay, string.format('%.0f', paused),
        processes}
"""
)
"""Reserve the slot's next send: returns wait (µs), lease id ('' at the cap),
the fleet's delay (µs, '' if none), the pause still to run (µs) and how many
processes took a turn on the slot in the last minute."""

MERGE = (
    _NOW
    + """
-- ARGV: delay_us, backed_off (1/0), pause_us (from now; 0: none), record, ttl_ms, protect_us
local delay = tonumber(ARGV[1])
local stored = tonumber(redis.call('HGET', KEYS[1], 'delay'))
local backoff_at = tonumber(redis.call('HGET', KEYS[1], 'backoff_at')) or 0
if ARGV[2] == '1' then
  if stored and stored > delay then delay = stored end
  redis.call('HSET', KEYS[1], 'backoff_at', string.format('%.0f', now))
elseif stored and delay < stored and now - backoff_at < tonumber(ARGV[6]) then
  delay = stored  -- a backoff is never undone by a concurrent latency update
end
redis.call('HSET', KEYS[1], 'delay', string.format('%.0f', delay))
local pause_for = tonumber(ARGV[3])
if pause_for > 0 then
  local pause = tonumber(redis.call('HGET', KEYS[1], 'pause')) or 0
  if now + pause_for > pause then
    redis.call('HSET', KEYS[1], 'pause', string.format('%.0f', now + pause_for))
  end
end
redis.call('HSET', KEYS[1], 'record', ARGV[4])
redis.call('HINCRBY', KEYS[1], 'version', 1)
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return 1
"""
)
"""Merge one process's learned state into the fleet's."""
