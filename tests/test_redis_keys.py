"""``redis_keys``: the suite's clean-up of the shared Redis deletes every key under
the prefixes a test made, in each form the store and the tests name them, and
no key of another prefix."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from autothrottle._fleet import TurnAsk
from autothrottle.redis import RedisStore
from helpers import needs_redis
from redis_keys import REDIS_URL, delete_made, delete_under, fresh_prefix, starts

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"


@pytest.fixture
def admin() -> Iterator[redis.Redis]:
    needs_redis()
    client = redis.Redis.from_url(REDIS_URL)
    yield client
    client.close()


def under(admin: redis.Redis, prefix: str) -> list[bytes]:
    """The keys under ``prefix``, by a SCAN of their own (not ``redis_keys``'s)."""
    return sorted(
        key
        for key in admin.scan_iter(count=1000)
        if key.decode(errors="replace").startswith(starts(prefix))
    )


def test_every_key_under_the_prefixes_made_goes_and_no_other(admin: redis.Redis) -> None:
    delete_made()  # none of this test's own yet
    ours = fresh_prefix("test-keys")
    theirs = f"test-keys-{uuid.uuid4().hex}"  # made by hand: not the clean-up's
    store = RedisStore(admin, prefix=ours)  # the store's own keys: {ours:slot}:s, :l, :p
    try:
        turn = store.take_turn_blocking("slot", TurnAsk(0.1, 0.0, 60.0, 8, 300.0, 300.0), 0.0)
        assert turn.lease is not None
    finally:
        store.close()
    for name in (ours, theirs):
        admin.set(f"{name}:plain", 1, ex=600)
        admin.set(f"autothrottle:{name}:kept", 1, ex=600)
    assert len(under(admin, ours)) == 5, under(admin, ours)
    try:
        assert delete_made() == 5
        assert under(admin, ours) == []
        assert len(under(admin, theirs)) == 2
        assert delete_made() == 0  # each prefix deleted once
    finally:
        delete_under(admin, theirs)
    assert under(admin, theirs) == []


def test_a_prefix_is_matched_as_written_not_as_a_pattern(admin: redis.Redis) -> None:
    # SCAN's glob characters in a prefix match themselves: "[x]*" is not "x" then
    # anything, and a key that holds the prefix but does not start as one is kept.
    hexes = uuid.uuid4().hex
    written, globbed = f"test-keys-[x]*?-{hexes}", f"test-keys-x-any-{hexes}"
    kept = [f"{globbed}:plain", f"{{{globbed}:slot}}:s", f"elsewhere:{written}:plain"]
    gone = [f"{written}:plain", f"{{{written}:slot}}:s", f"autothrottle:{written}:x"]
    for key in kept + gone:
        admin.set(key, 1, ex=600)
    try:
        assert delete_under(admin, written) == 3
        assert [admin.exists(key) for key in kept + gone] == [1, 1, 1, 0, 0, 0]
    finally:
        admin.unlink(*kept, *gone)


TWO_TESTS = """
import redis
from redis_keys import REDIS_URL, fresh_prefix

MADE = []


def test_make():
    MADE.append(fresh_prefix("test-keys-fixture"))
    redis.Redis.from_url(REDIS_URL).set("{" + MADE[0] + ":slot}:s", 1, ex=600)


def test_gone():
    assert redis.Redis.from_url(REDIS_URL).exists("{" + MADE[0] + ":slot}:s") == 0
"""


def test_the_suites_conftest_deletes_a_tests_keys_once_it_ends(
    admin: redis.Redis, tmp_path: Path
) -> None:
    """Two tests run in order under the suite's own ``conftest.py``: the key the first
    left is gone when the second looks."""
    shutil.copy(HERE / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_two.py").write_text(TWO_TESTS)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(SRC)])},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "2 passed" in done.stdout, done.stdout
