"""``benchmarks/_fleet_trace.py`` (``redis_store.py --trace``) patches private
functions of the store and the fleet. When one of them changed its parameters
or its answer, the traced crawl sent nothing at all (every worker's call raised
a TypeError) and no test noticed: here each patch is called as the code calls
the function it replaces."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from autothrottle._fleet import GO, Fleet
from autothrottle._fleet_wire import WireCheck
from autothrottle._lease import Lease
from autothrottle.redis import RedisStore

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture
def trace_tool(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    pytest.importorskip("aiohttp")
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    for owner, name in (
        (RedisStore, "_answer"),
        (Fleet, "_done"),
        (Lease, "wire_wait"),
        (WireCheck, "_taken"),
    ):
        monkeypatch.setattr(owner, name, getattr(owner, name))  # undone after the test
    monkeypatch.delitem(sys.modules, "_fleet_trace", raising=False)
    import _fleet_trace  # type: ignore[import-not-found]  # benchmarks/, put on the path above

    module: ModuleType = _fleet_trace
    return module


def _parameters(function: Any) -> list[str]:
    return [p.name for p in inspect.signature(function).parameters.values()]


def test_the_trace_patches_take_what_the_patched_functions_take(trace_tool: ModuleType) -> None:
    originals = {
        "answer": RedisStore._answer,
        "done": Fleet._done,
        "taken": WireCheck._taken,
    }
    trace_tool.install([])
    assert RedisStore._answer is not originals["answer"]
    assert Fleet._done is not originals["done"]
    assert WireCheck._taken is not originals["taken"]
    # the patches are called with the originals' arguments, positionally
    done = _parameters(originals["done"])
    assert len(_parameters(Fleet._done)) == len(done), done
    taken = _parameters(originals["taken"])
    assert len(_parameters(WireCheck._taken)) == len(taken), taken
    answer = _parameters(originals["answer"])
    traced = inspect.signature(RedisStore._answer)
    assert traced.bind(*answer)  # *rest takes what follows the reply


def test_a_turn_the_fleet_lets_go_is_recorded_and_its_verdict_passed_on(
    trace_tool: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    def verdict(*_: Any) -> int:
        return GO

    monkeypatch.setattr(Fleet, "_done", verdict)
    records: list[dict[str, Any]] = []
    trace_tool.install(records)

    class _Slot:
        key = "http://127.0.0.2"

    class _Turn:
        lease = "lease-1"
        due = 1.0
        joined = False
        closes = True

    answer = Fleet._done(object(), _Slot(), object(), _Turn(), False)  # type: ignore[arg-type]
    assert answer == GO
    assert len(records) == 1
    assert records[0]["key"] == "http://127.0.0.2"
    assert records[0]["went"] is not None
