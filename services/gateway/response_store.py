"""Where stored responses live (`store: true`, read back by id and by `previous_response_id`): one protocol, two
backends chosen at start-up — SQLite in a file (the embedded default; gateway processes on one host share the file)
and Redis (gateways on several hosts or pods). Store I/O never runs on the event loop: SQLite calls go to one
thread of their own, Redis is asyncio-native. Knows nothing of HTTP or of what a record holds beyond its owner."""

import asyncio
import json
import logging
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

log = logging.getLogger(__name__)
REDIS_PREFIX = "tandem:response:"
REDIS_TIMEOUT_S = 5.0  # an unreachable Redis is a 503 after this long, not a request hung forever
SQLITE_BUSY_TIMEOUT_S = 10.0  # several gateway processes write one file: wait for the lock, do not fail


@dataclass(frozen=True, slots=True)
class StoredResponse:
    response_id: str
    owner: str  # a digest of the API key that made it ("" when keys are off): nobody else may read it
    record: dict  # the response object and the conversation it continues (JSON-serialisable)

    def to_json(self) -> str:
        return json.dumps({"owner": self.owner, "record": self.record})

    @classmethod
    def from_json(cls, response_id: str, text: str | bytes) -> "StoredResponse":
        data = json.loads(text)
        return cls(response_id, data["owner"], data["record"])


class ResponseStore(Protocol):
    async def put(self, stored: StoredResponse) -> None: ...

    async def get(self, response_id: str) -> StoredResponse | None:
        """The response, or None when there is none (never stored, deleted, or expired)."""

    async def delete(self, response_id: str) -> bool: ...

    async def close(self) -> None: ...


class SqliteStore:
    """One table in one file, in WAL mode so that readers never wait for a writer; expired rows are skipped on
    read and purged on write."""

    def __init__(self, path: Path, ttl_s: float):
        self._path, self._ttl_s = path, ttl_s
        self._conn: sqlite3.Connection | None = None
        # NOTE: one thread owns the connection: sqlite3 objects must stay on the thread that uses them
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="response-store")

    async def _run(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self._path, timeout=SQLITE_BUSY_TIMEOUT_S, isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(
                "CREATE TABLE IF NOT EXISTS responses (id TEXT PRIMARY KEY, expires_at REAL NOT NULL, "
                "body TEXT NOT NULL)"
            )
            conn.execute("CREATE INDEX IF NOT EXISTS responses_expiry ON responses (expires_at)")
            self._conn = conn
        return self._conn

    async def put(self, stored: StoredResponse) -> None:
        await self._run(self._put, stored.response_id, stored.to_json())

    def _put(self, response_id: str, body: str) -> None:
        now = time.time()
        db = self._db()
        db.execute("INSERT OR REPLACE INTO responses VALUES (?, ?, ?)", (response_id, now + self._ttl_s, body))
        db.execute("DELETE FROM responses WHERE expires_at < ?", (now,))

    async def get(self, response_id: str) -> StoredResponse | None:
        body = await self._run(self._get, response_id)
        return None if body is None else StoredResponse.from_json(response_id, body)

    def _get(self, response_id: str) -> str | None:
        row = (
            self._db()
            .execute("SELECT body FROM responses WHERE id = ? AND expires_at >= ?", (response_id, time.time()))
            .fetchone()
        )
        return None if row is None else row[0]

    async def delete(self, response_id: str) -> bool:
        return await self._run(self._delete, response_id)

    def _delete(self, response_id: str) -> bool:
        return self._db().execute("DELETE FROM responses WHERE id = ?", (response_id,)).rowcount > 0

    async def close(self) -> None:
        if self._conn is not None:
            await self._run(self._conn.close)
            self._conn = None
        self._thread.shutdown(wait=False)


class RedisStore:
    """One key per response under REDIS_PREFIX, expiring with Redis's own TTL."""

    def __init__(self, url: str, ttl_s: float, password: str = ""):
        import redis.asyncio as redis  # NOTE: imported only when Redis is the configured store

        # NOTE: a password given apart wins over one in the URL (which `docker inspect` would show)
        self._redis = redis.Redis.from_url(
            url,
            socket_connect_timeout=REDIS_TIMEOUT_S,
            socket_timeout=REDIS_TIMEOUT_S,
            **({"password": password} if password else {}),
        )
        self._ttl_ms = int(ttl_s * 1000)

    async def put(self, stored: StoredResponse) -> None:
        await self._redis.set(REDIS_PREFIX + stored.response_id, stored.to_json(), px=self._ttl_ms)

    async def get(self, response_id: str) -> StoredResponse | None:
        body = await self._redis.get(REDIS_PREFIX + response_id)
        return None if body is None else StoredResponse.from_json(response_id, body)

    async def delete(self, response_id: str) -> bool:
        return await self._redis.delete(REDIS_PREFIX + response_id) > 0

    async def close(self) -> None:
        await self._redis.aclose()


def make_store(kind: str, *, path: Path, redis_url: str, ttl_s: float, redis_password: str = "") -> ResponseStore:
    """The store the settings name (they were validated at start-up)."""
    if kind == "redis":
        log.info("response store: redis at %s", redis_url.rpartition("@")[2])  # NOTE: never log a password
        return RedisStore(redis_url, ttl_s, redis_password)
    log.info("response store: sqlite at %s", path)
    return SqliteStore(path, ttl_s)
