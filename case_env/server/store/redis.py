"""The shared episode store: Redis, for replicas on several hosts (`CASE_ENV_STORE=redis://host:port/db`).

Every operation on an episode is one Lua script, so Redis runs it atomically: two replicas binding the same
new episode get one binding (the first writer's), and a call is appended only while its episode is bound to
its case and not ended. An episode is a hash and a list of its calls (JSON), each expiring after `idle_s`
without a call (a TTL, refreshed by every call); two sorted sets order the live and the ended ones by last
use, for the cap. What Redis persists (RDB or AOF, the operator's choice) keeps every binding across its
restart; while it is down the servers answer 503 and bind nothing. The scripts touch the keys of episodes
they evict without naming them beforehand: one Redis, not Redis Cluster.
"""

from __future__ import annotations

import json
from typing import Any

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from case_env.core.calls import Call
from case_env.server.store import Binding, Episode, EpisodeStore, StoreUnavailableError

PREFIX = "case-env:episode:"
POOL = 64  # connections per worker: a Lua script takes tens of microseconds, so 64 keep up with any burst
LIVE, ENDED = "case-env:live", "case-env:ended"

# Both scripts first create the episode unless it exists (its hash, its TTL, its place among the live), then
# evict past the cap: the least recently used, ended ones first. KEYS: the episode, its calls, the live and
# ended sets. ARGV: id, case, env, context, row, now, idle (ms), cap, the key prefix, then the script's own.
_CREATE = """
local held = redis.call('HMGET', KEYS[1], 'case', 'env', 'context', 'row', 'reward')
if not held[1] then
  redis.call('HSET', KEYS[1], 'case', ARGV[2], 'env', ARGV[3], 'created', ARGV[6], 'last_seen', ARGV[6],
    'calls', 0)
  if ARGV[4] ~= '' then redis.call('HSET', KEYS[1], 'context', ARGV[4]) end
  if ARGV[5] ~= '' then redis.call('HSET', KEYS[1], 'row', ARGV[5]) end
  redis.call('PEXPIRE', KEYS[1], ARGV[7])
  redis.call('ZADD', KEYS[3], ARGV[6], ARGV[1])
  local idle = tonumber(ARGV[6]) - tonumber(ARGV[7]) / 1000
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', idle)
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', idle)
  local over = redis.call('ZCARD', KEYS[3]) + redis.call('ZCARD', KEYS[4]) - tonumber(ARGV[8])
  while over > 0 do
    local gone = redis.call('ZPOPMIN', KEYS[4])
    if #gone == 0 then gone = redis.call('ZPOPMIN', KEYS[3]) end
    redis.call('DEL', ARGV[9] .. gone[1], ARGV[9] .. gone[1] .. ':calls')
    over = over - 1
  end
  held = {ARGV[2], ARGV[3], ARGV[4], ARGV[5], false}
end
"""

# Returns case, env, context, row, ended.
_BIND = (
    _CREATE
    + """
return {held[1], held[2], held[3] or '', held[4] or '', held[5] and 1 or 0}
"""
)

# ARGV[10]: the call (JSON); ARGV[11]: calls kept. Appends the call when the episode is bound to this case and
# settings and not ended; returns case, env, context, row, ended, as the episode has them.
_APPEND = (
    _CREATE
    + """
local context = held[3] or ''
if held[1] == ARGV[2] and context == ARGV[4] and not held[5] then
  redis.call('HINCRBY', KEYS[1], 'calls', 1)
  redis.call('HSET', KEYS[1], 'last_seen', ARGV[6])
  redis.call('RPUSH', KEYS[2], ARGV[10])
  redis.call('LTRIM', KEYS[2], -tonumber(ARGV[11]), -1)
  redis.call('PEXPIRE', KEYS[1], ARGV[7])
  redis.call('PEXPIRE', KEYS[2], ARGV[7])
  redis.call('ZADD', KEYS[3], ARGV[6], ARGV[1])
end
return {held[1], held[2], context, held[4] or '', held[5] and 1 or 0}
"""
)

# KEYS: the episode, its calls, the live and ended sets. ARGV: id, the reward (JSON), now, idle (ms).
# Returns the reward kept, or false for an unknown episode.
_END = """
local held = redis.call('HMGET', KEYS[1], 'case', 'reward')
if not held[1] then return false end
if held[2] then return held[2] end
redis.call('HSET', KEYS[1], 'reward', ARGV[2], 'last_seen', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
redis.call('PEXPIRE', KEYS[2], ARGV[4])
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('ZADD', KEYS[4], ARGV[3], ARGV[1])
return ARGV[2]
"""


class RedisStore(EpisodeStore):
    name = "redis"

    def __init__(self, url: str, idle_s: float, max_episodes: int, max_calls: int):
        super().__init__(idle_s, max_episodes, max_calls)
        # a bounded pool that calls wait on (redis-py's default refuses the call past its size); one quick
        # retry, then 503: a Redis that is down must not hold calls for redis-py's default backoff
        pool = BlockingConnectionPool.from_url(
            url,
            max_connections=POOL,
            timeout=10.0,
            socket_connect_timeout=2.0,
            socket_timeout=10.0,
            retry=Retry(NoBackoff(), 1),
        )
        self.pool = pool
        self.redis = Redis(connection_pool=pool)
        self._scripts = {
            "bind": self.redis.register_script(_BIND),
            "append": self.redis.register_script(_APPEND),
            "end": self.redis.register_script(_END),
        }
        self._idle_ms = str(int(idle_s * 1000))

    @staticmethod
    def _keys(episode_id: str) -> list[str]:
        return [PREFIX + episode_id, PREFIX + episode_id + ":calls"]

    async def _lookup(self, episode_id: str, with_calls: bool) -> tuple[Binding | None, list[Call]]:
        key, calls_key = self._keys(episode_id)
        try:
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.hmget(key, "case", "env", "context", "row", "reward")
                if with_calls:
                    pipe.lrange(calls_key, 0, -1)
                held, *stored = await pipe.execute()
        except RedisError as exc:
            raise _unavailable(exc) from None
        if held[0] is None:
            return None, []
        case_id, env, context, row, reward = (v.decode() if v is not None else None for v in held)
        calls = [Call.model_validate_json(c) for c in stored[0]] if stored else []
        return Binding(case_id, env, context, row, reward is not None), calls

    def _args(self, episode_id: str, binding: Binding, now: float) -> tuple:
        return (
            *(episode_id, binding.case_id, binding.env, binding.context or "", binding.row or ""),
            *(repr(now), self._idle_ms, self.max_episodes, PREFIX),
        )

    async def _run(self, script: str, episode_id: str, args: tuple) -> Binding:
        try:
            found = await self._scripts[script](keys=[*self._keys(episode_id), LIVE, ENDED], args=args)
        except RedisError as exc:
            raise _unavailable(exc) from None
        case_id, env, context, row, ended = found
        return Binding(
            case_id.decode(), env.decode(), context.decode() or None, row.decode() or None, ended == 1
        )

    async def _bind(self, episode_id: str, binding: Binding, now: float) -> Binding:
        return await self._run("bind", episode_id, self._args(episode_id, binding, now))

    async def _append(self, episode_id: str, binding: Binding, call: Call, now: float) -> Binding:
        record = call.model_copy(update={"time": now}).model_dump_json(exclude_none=True)
        args = (*self._args(episode_id, binding, now), record, self.max_calls)
        return await self._run("append", episode_id, args)

    async def _end(self, episode_id: str, reward: dict[str, Any], now: float) -> dict[str, Any] | None:
        args = (episode_id, json.dumps(reward, default=str), repr(now), self._idle_ms)
        try:
            kept = await self._scripts["end"](keys=[*self._keys(episode_id), LIVE, ENDED], args=args)
        except RedisError as exc:
            raise _unavailable(exc) from None
        return json.loads(kept) if kept else None

    async def get(self, episode_id: str) -> Episode | None:
        key, calls_key = self._keys(episode_id)
        try:
            async with self.redis.pipeline(transaction=True) as pipe:
                held, stored = await pipe.hgetall(key).lrange(calls_key, 0, -1).execute()
        except RedisError as exc:
            raise _unavailable(exc) from None
        if not held:
            return None
        fields = {k.decode(): v.decode() for k, v in held.items()}
        total = int(fields["calls"])
        calls = []
        for seq, stored_call in enumerate(stored, start=total - len(stored) + 1):
            calls.append(Call.model_validate_json(stored_call).model_copy(update={"seq": seq}))
        reward = fields.get("reward")
        binding = Binding(
            fields["case"], fields["env"], fields.get("context"), fields.get("row"), reward is not None
        )
        return Episode(
            episode_id,
            binding,
            float(fields["created"]),
            float(fields["last_seen"]),
            total,
            calls,
            json.loads(reward) if reward is not None else None,
        )

    async def live(self, now: float) -> int:
        try:
            return await self.redis.zcount(LIVE, now - self.idle_s, "+inf")
        except RedisError as exc:
            raise _unavailable(exc) from None

    async def ping(self) -> None:
        try:
            await self.redis.ping()
        except RedisError as exc:
            raise _unavailable(exc) from None

    async def close(self) -> None:
        await self.redis.aclose()
        await self.pool.aclose()


def _unavailable(exc: RedisError) -> StoreUnavailableError:
    return StoreUnavailableError(f"the episode store (Redis) is unreachable ({type(exc).__name__})")
