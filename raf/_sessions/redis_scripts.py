"""The Lua scripts the Redis session store runs: each one atomic on the server.

Kept apart from :mod:`raf._sessions.redis`, which says when each runs and with
which keys; a script says what it does to them, all or nothing.
"""

from __future__ import annotations

from typing import Final

__all__ = ["APPEND", "CLAIM", "ONCE", "READ", "RECORD", "TOUCH"]

# Both scripts write nothing before they know every write will succeed: the first
# command that writes fails on a key of another type before it changes anything
# (WRONGTYPE), and the other key, which gets only the ttl, is checked first, so a
# key that is not ours never gets one. A script runs atomically: no other client's
# command runs between its commands.
_CHECK_OTHER_KEY: Final = """
local ttl = tonumber(ARGV[1])
if ttl > 0 then
  local kind = redis.call('TYPE', KEYS[2])['ok']
  if kind ~= 'none' and kind ~= '%s' then
    return redis.error_reply(
      'WRONGTYPE ' .. KEYS[2] .. ' holds a ' .. kind .. ', not a %s')
  end
end
"""

# Lua: KEYS[1] the message list, KEYS[2] the request-hash record;
# ARGV[1] the ttl in seconds ("0": none), ARGV[2..] the messages as raf's JSON.
# RPUSH takes the batch in slices because Lua's unpack() is limited to a few
# thousand values; the script is atomic, so the slices are contiguous anyway.
APPEND: Final = (
    _CHECK_OTHER_KEY % ("zset", "zset")
    + """
local length = 0
for first = 2, #ARGV, 1000 do
  length = redis.call('RPUSH', KEYS[1], unpack(ARGV, first, math.min(first + 999, #ARGV)))
end
if ttl > 0 then
  redis.call('EXPIRE', KEYS[1], ttl)
  redis.call('EXPIRE', KEYS[2], ttl)
end
return length
"""
)

# Lua: KEYS[1] the request-hash record, KEYS[2] the message list, KEYS[3] the spilled results;
# ARGV[1] the ttl, ARGV[2] the digest, ARGV[3] the time, ARGV[4] how many digests to keep.
# Returns 1 when the digest was already recorded (a repeated request), else 0.
TOUCH: Final = (
    _CHECK_OTHER_KEY % ("list", "list")
    + """
local seen = redis.call('ZSCORE', KEYS[1], ARGV[2])
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[2])
redis.call('ZREMRANGEBYRANK', KEYS[1], 0, -(tonumber(ARGV[4]) + 1))
if ttl > 0 then
  for i = 1, #KEYS do redis.call('EXPIRE', KEYS[i], ttl) end
end
if seen then return 1 end
return 0
"""
)


# Lua: KEYS[1] the message list; ARGV[1] how many entries the reader's cache covers (from
# the list's start; 0: none), ARGV[2] the SHA1 of the last of them, ARGV[3] how many of the
# newest entries to read when the cache cannot be extended (-1: all).
# Returns {length, first index read, entries}: the entries after the cache when its last
# entry is still where it was (the list only grew since), else the newest ARGV[3] entries.
READ: Final = """
local length = redis.call('LLEN', KEYS[1])
local cached = tonumber(ARGV[1])
if cached > 0 and cached <= length then
  -- Counted from the end: LINDEX walks the list from the end its index counts from.
  local last = redis.call('LINDEX', KEYS[1], cached - length - 1)
  if last and redis.sha1hex(last) == ARGV[2] then
    return {length, cached, redis.call('LRANGE', KEYS[1], cached, -1)}
  end
end
local first = 0
if tonumber(ARGV[3]) >= 0 then first = math.max(0, length - tonumber(ARGV[3])) end
return {length, first, redis.call('LRANGE', KEYS[1], first, -1)}
"""

# Every key is checked before anything is written, so a key of another type
# fails the script with WRONGTYPE and nothing changes.
_CHECK: Final = """
local expected = {'list', 'hash', 'zset'}
for i = 1, 3 do
  local kind = redis.call('TYPE', KEYS[i])['ok']
  if kind ~= 'none' and kind ~= expected[i] then
    return redis.error_reply(
      'WRONGTYPE ' .. KEYS[i] .. ' holds a ' .. kind .. ', not a ' .. expected[i])
  end
end
local ttl = tonumber(ARGV[1])
"""

_EXPIRE: Final = """
if ttl > 0 then
  for i = 1, 3 do redis.call('EXPIRE', KEYS[i], ttl) end
end
"""

# KEYS: messages, pending, requests. ARGV[1] ttl, ARGV[2] n, ARGV[3..n+2] the messages,
# then token and JSON pairs.
RECORD: Final = (
    _CHECK
    + """
local n = tonumber(ARGV[2])
for first = 3, n + 2, 1000 do
  redis.call('RPUSH', KEYS[1], unpack(ARGV, first, math.min(first + 999, n + 2)))
end
for i = n + 3, #ARGV, 2 do
  redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
end
"""
    + _EXPIRE
)

# KEYS: messages, pending, requests. ARGV[1] ttl, ARGV[2] 'all', 'some' or 'look',
# ARGV[3..] the tokens ('some'). Returns {claimed, still pending}, or nil when a token
# is not pending (nothing claimed).
CLAIM: Final = (
    _CHECK
    + """
local claimed = {}
if ARGV[2] == 'all' then
  claimed = redis.call('HVALS', KEYS[2])
  redis.call('DEL', KEYS[2])
elseif ARGV[2] == 'some' then
  for i = 3, #ARGV do
    if redis.call('HEXISTS', KEYS[2], ARGV[i]) == 0 then return false end
  end
  for i = 3, #ARGV do
    claimed[#claimed + 1] = redis.call('HGET', KEYS[2], ARGV[i])
    redis.call('HDEL', KEYS[2], ARGV[i])
  end
end
local left = redis.call('HVALS', KEYS[2])
if ARGV[2] ~= 'look' then
"""
    + _EXPIRE
    + """
end
return {claimed, left}
"""
)


# Lua: KEYS[1] the message list, KEYS[2] the session's set of keys written once, KEYS[3]
# the pending calls' hash; ARGV[1] the ttl ("0": none), ARGV[2] the key, ARGV[3] n, ARGV[4..n+3]
# the messages as raf's JSON, then token and JSON pairs of pending calls.
# Returns 0 (and writes nothing) when the key was written before, else 1.
ONCE: Final = """
if redis.call('SADD', KEYS[2], ARGV[2]) == 0 then return 0 end
local n = tonumber(ARGV[3])
for first = 4, n + 3, 1000 do
  redis.call('RPUSH', KEYS[1], unpack(ARGV, first, math.min(first + 999, n + 3)))
end
for i = n + 4, #ARGV, 2 do
  redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1])
end
local ttl = tonumber(ARGV[1])
if ttl > 0 then
  for i = 1, 3 do redis.call('EXPIRE', KEYS[i], ttl) end
end
return 1
"""
