"""The package's shape: its public names, its layers, and the learned-state record.

The layers themselves are checked by import-linter (``nox -s lint``, contracts in
pyproject.toml, described in docs/architecture.md); this file checks that no module
escapes the contract by not being listed, and that the public surface is deliberate.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import json
import math
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from autothrottle import Throttle
from autothrottle._fleet_turns import Run
from autothrottle.store import MemoryStore, SlotState
from helpers import FakeClock, record_of

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "autothrottle"

PUBLIC = {
    "autothrottle": [
        "AIMDPolicy",
        "Acquiring",
        "AdaptiveConcurrencyPolicy",
        "AutoThrottlePolicy",
        "FixedDelayPolicy",
        "FixedRatePolicy",
        "HostSettings",
        "Lease",
        "Slot",
        "SlotSnapshot",
        "SlotStats",
        "Throttle",
        "ThrottleEvent",
        "ThrottleInfo",
        "ThrottleStats",
        "ThrottleTimeout",
        "__version__",
    ],
    "autothrottle.policy": ["DelayPolicy", "Sample", "SlotConfig", "policy_from_text"],
    "autothrottle.store": ["MemoryStore", "RateLimit", "SlotState", "SlotStore"],
    "autothrottle.options": ["CONTROL_HEADER", "RequestOptions"],
    "autothrottle.timeline": ["Mark", "SlotSample", "Timeline"],
    "autothrottle.cli": ["main"],
    "autothrottle.httpx": [
        "ThrottledClient",
        "ThrottledTransport",
        "ThrottlePoolTimeout",
        "AsyncThrottledClient",
        "AsyncThrottledTransport",
    ],
    "autothrottle.httpx2": [
        "AsyncThrottledClient",
        "AsyncThrottledTransport",
        "ThrottlePoolTimeout",
        "ThrottledClient",
        "ThrottledTransport",
    ],
    "autothrottle.aiohttp": [
        "ThrottledSession",
        "throttle_info",
        "throttle_middleware",
        "throttle_of",
        "throttle_trace_config",
    ],
    "autothrottle.requests": [
        "ThrottleWaitTimeout",
        "ThrottledHTTPAdapter",
        "ThrottledSession",
        "throttle_info",
    ],
    "autothrottle.scrapy": [
        "AutoThrottleMiddleware",
        "INFO_KEY",
        "ThrottleWaitTimeout",
        "blocked",
    ],
    "autothrottle.otel": ["Instrumentation", "instrument"],
    "autothrottle.testing": ["VirtualClock", "Wait"],
    "autothrottle.redis": ["RedisStore"],
    "autothrottle.sim": [
        "Behaviour",
        "CDN",
        "Capacity",
        "HostStats",
        "RateLimited",
        "RequestRecord",
        "SimServer",
        "SoftBlock",
        "VariableLatency",
        "is_blocked_page",
        "main",
        "max_in_window",
        "parse_behaviour",
    ],
}


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_public_names_are_pinned(module: str) -> None:
    imported = importlib.import_module(module)
    assert sorted(imported.__all__) == sorted(PUBLIC[module])
    for name in imported.__all__:
        assert getattr(imported, name) is not None


#: Subpackages that are one unit in the layers contract (with their own contracts inside).
_UNITS = ("sim", "cli", "timeline", "_headers", "_httpx", "_httpx2")


def _modules() -> list[str]:
    names = []
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if len(parts) > 2 and parts[1] in _UNITS:
            continue  # a subpackage is one unit in the layers contract
        names.append(".".join(parts))
    return sorted(names)


def test_every_module_is_in_the_layers_contract() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contract = config["tool"]["importlinter"]["contracts"][0]
    listed = {
        name.strip() for layer in contract["layers"] for name in layer.replace(":", "|").split("|")
    }
    missing = [m for m in _modules() if m != "autothrottle" and m not in listed]
    assert not missing, f"add these modules to a layer in pyproject.toml: {missing}"


#: The modules that may import a client library: the adapters and the tools over them.
_CLIENT_SIDE = {
    "autothrottle.__main__", "autothrottle.aiohttp", "autothrottle.httpx", "autothrottle.httpx2",
    "autothrottle.requests", "autothrottle.scrapy", "autothrottle.redis", "autothrottle.otel",
    "autothrottle.sim", "autothrottle.cli", "autothrottle.timeline", "autothrottle._httpx",
    "autothrottle._httpx2", "autothrottle._redis_lua", "autothrottle._redis_parts",
    "autothrottle._redis_outage", "autothrottle._redis_runs", "autothrottle._redis_send",
    "autothrottle._redis_listen", "autothrottle._scrapy_settings", "autothrottle._scrapy_parts",
    "autothrottle._aiohttp_parts", "autothrottle._requests_parts",
}  # fmt: skip


def test_every_engine_module_is_kept_from_the_client_libraries() -> None:
    """A new engine module joins the import-linter contract that keeps the clients out."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (contract,) = [
        c for c in config["tool"]["importlinter"]["contracts"] if c["name"].startswith("The engine")
    ]
    engine = {m for m in _modules() if m != "autothrottle" and m not in _CLIENT_SIDE}
    missing = sorted(engine - set(contract["source_modules"]))
    assert not missing, f"add these modules to the engine contract in pyproject.toml: {missing}"


def test_no_module_imports_another_modules_underscore_names() -> None:
    """Each module keeps its private names: what another module needs is public in it
    (a private module's public names are the package's internals). ``from . import _x``
    names a submodule, which is allowed. ruff's SLF001 checks attribute access likewise."""
    borrowed = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or node.module is None:
                continue
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    borrowed.append(f"{path.relative_to(ROOT)}:{node.lineno} {alias.name}")
    assert not borrowed, borrowed


def test_no_function_in_the_package_is_longer_than_sixty_lines() -> None:
    long = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length >= 60:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({length})")
    assert not long, long


def test_learned_state_round_trips_through_a_memory_store_as_plain_data() -> None:
    clock = FakeClock()
    store = MemoryStore()
    throttle = Throttle(start_delay=1.0, store=store, clock=clock, wall_clock=clock.wall)
    lease = throttle.try_acquire("api.example")
    assert lease is not None
    lease.observe(latency=0.4, status=200)
    lease.release()
    clock.advance(2.0)
    throttle.observe(
        "api.example",
        latency=0.1,
        status=429,
        headers={"Retry-After": "30", "RateLimit": '"d";r=0;t=30'},
    )
    record = store.load("api.example")
    assert record is record_of(throttle.slot("api.example"))

    data = json.loads(json.dumps(record.to_dict(now=clock.now)))
    later = 50_000.0  # another process, another monotonic clock
    loaded = SlotState.from_dict(data, now=later)
    assert loaded.delay == record.delay
    assert loaded.refused_gap == record.refused_gap
    assert loaded.status_counts == record.status_counts
    assert loaded.policy_state == record.policy_state
    assert loaded.rate_limit == record.rate_limit
    assert loaded.pause_until - later == pytest.approx(record.pause_until - clock.now)
    assert loaded.backoff_at - later == pytest.approx(record.backoff_at - clock.now)
    assert loaded.ok_first == -math.inf or math.isfinite(loaded.ok_first)

    # A new throttle whose store holds the record starts where the first left off.
    fresh = MemoryStore()
    fresh.save("api.example", loaded)
    resumed = Throttle(start_delay=1.0, store=fresh, clock=lambda: later)
    slot = resumed.slot("api.example")
    assert slot.delay == record.delay
    assert slot.snapshot().pause_remaining == pytest.approx(30.0)
    assert resumed.try_acquire("api.example") is None  # still paused


@pytest.mark.parametrize(
    ("data", "error"),
    [
        ([], TypeError),
        ({"delay": 1.0, "colour": "red"}, ValueError),
        ({}, ValueError),
        ({"delay": "fast"}, TypeError),
        ({"delay": 1.0, "pause_until": "soon"}, TypeError),
    ],
)
def test_a_bad_record_is_refused_naming_what_is_wrong(data: object, error: type) -> None:
    with pytest.raises(error):
        SlotState.from_dict(data, now=0.0)  # type: ignore[arg-type]


def test_every_module_of_a_layered_subpackage_is_in_its_contract() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    for contract in config["tool"]["importlinter"]["contracts"]:
        for container in contract.get("containers", []):
            folder = PACKAGE.parent.joinpath(*container.split("."))
            listed = {n.strip() for layer in contract["layers"] for n in layer.split("|")}
            present = {p.stem for p in folder.glob("*.py") if p.stem != "__init__"}
            assert present <= listed, f"add to {container}'s layers: {sorted(present - listed)}"


def test_every_module_of_a_layers_contract_is_drawn_in_docs_architecture() -> None:
    """docs/architecture.md draws the contracts' layers and says what each module owns:
    a module that joins a contract joins the drawing."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    missing = []
    for contract in config["tool"]["importlinter"]["contracts"]:
        for layer in contract.get("layers", []):
            for name in layer.replace(":", "|").split("|"):
                short = name.strip().rpartition(".")[2]
                if not re.search(rf"`?(?<![\w]){re.escape(short)}(?!\w)", text):
                    missing.append(name.strip())
    assert not missing, f"draw these modules in docs/architecture.md: {missing}"


@pytest.mark.parametrize(
    ("client", "others"),
    [
        ("requests", "httpx, aiohttp, redis, otel"),
        ("scrapy", "httpx, aiohttp, requests, redis, otel"),
    ],
)
def test_only_its_own_adapter_imports_an_optional_client(client: str, others: str) -> None:
    """The core and the other adapters work without ``requests`` and Scrapy installed."""
    modules = ", ".join(f"autothrottle.{name}" for name in others.split(", "))
    code = f"import sys, autothrottle, {modules}\nprint({client!r} in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "False"


def test_importing_the_library_loads_none_of_its_tools() -> None:
    """``import autothrottle`` and the adapters are the library: no command line, no
    timeline, no simulator, no matplotlib (the tools are imported only by who uses them)."""
    code = (
        "import sys, autothrottle, autothrottle.httpx, autothrottle.aiohttp\n"
        "tools = ('autothrottle.cli', 'autothrottle.timeline', 'autothrottle.sim', 'matplotlib')\n"
        "print([m for m in tools if m in sys.modules])"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]"


# ----------------------------------------------------------------------------- ownership

#: Each record of a slot's learned state, and the one module that may write it.
OWNERS = {
    ("autothrottle._pace", "Pace"): "_pace.py",
    ("autothrottle._limits", "Limits"): "_limits.py",
    ("autothrottle._recovery", "Refusal"): "_recovery.py",
    ("autothrottle._cache", "Cache"): "_cache.py",
    ("autothrottle._counters", "Counters"): "_counters.py",
}

_MUTATORS = frozenset(
    {"append", "extend", "insert", "update", "clear", "pop", "popitem", "setdefault"}
    | {"remove", "add", "discard", "sort", "reverse", "subtract", "__setitem__", "__delitem__"}
)


def _record_fields() -> dict[str, str]:
    """Every record field, mapped to the file of its owner."""
    owner_of: dict[str, str] = {}
    for (module, name), owner in OWNERS.items():
        record = getattr(importlib.import_module(module), name)
        for field in dataclasses.fields(record):
            assert field.name not in owner_of, f"{field.name} is in two records"
            owner_of[field.name] = owner
    return owner_of


def _written_attributes(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, attribute) of every write to ``x.attribute`` (x not ``self``): an
    assignment, an augmented one, a deletion, an item stored into it, a mutating
    method called on it, or a ``setattr`` naming it."""

    def attribute(node: ast.expr) -> str | None:
        if isinstance(node, ast.Attribute) and not (
            isinstance(node.value, ast.Name) and node.value.id == "self"
        ):
            return node.attr
        return None

    written: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = list(node.targets)
        elif isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr in _MUTATORS:
                targets = [func.value]
            elif isinstance(func, ast.Name) and func.id in ("setattr", "delattr") and node.args:
                arg = node.args[1] if len(node.args) > 1 else None
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    written.append((line, arg.value))
        flat: list[ast.expr] = []
        for target in targets:
            flat.extend(target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target])
        for target in flat:
            while isinstance(target, ast.Subscript):
                target = target.value
            name = attribute(target)
            if name is not None:
                written.append((line, name))
    return written


#: The modules through which a record can be reached: a module that imports none
#: of them holds no record, and an attribute of the same name there is another's.
_REACH = frozenset(
    {"_state", "_slot", "_gate", "_pace", "_limits", "_recovery", "_cache", "_counters"}
)


def _reaches_records(tree: ast.AST) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            names = [node.module or ""] + [alias.name for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        if any(name.rpartition(".")[2] in _REACH for name in names):
            return True
    return False


def test_only_its_owner_writes_a_record_of_the_learned_state() -> None:
    owner_of = _record_fields()
    wrong = []
    checked = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        if not _reaches_records(tree):
            continue
        checked.append(path.name)
        for line, name in _written_attributes(tree):
            owner = owner_of.get(name)
            if owner is not None and path.name != owner:
                wrong.append(f"{path.relative_to(ROOT)}:{line} writes {name} (owner: {owner})")
    assert not wrong, wrong
    # The engine modules that pass records around are among those checked.
    assert {"_rules.py", "_gate.py", "_slot.py", "_store.py", "_throttle.py", "redis.py"} <= set(
        checked
    )


@pytest.mark.parametrize(
    "code",
    [
        "state.pace.delay = 1.0",
        "slot.state.counters.sent += 1",
        "a, state.refusal.backoff_at = 1, 2",
        "state.counters.status_counts[200] += 1",
        "state.counters.latency_buckets.append(0)",
        "del limits.rate_limit",
        "setattr(cache, 'miss_share', 0.5)",
    ],
)
def test_the_ownership_check_sees_each_kind_of_write(code: str) -> None:
    owner_of = _record_fields()
    written = [name for _, name in _written_attributes(ast.parse(code))]
    assert any(name in owner_of for name in written), code


def test_the_ownership_check_leaves_an_objects_own_attributes_alone() -> None:
    assert _written_attributes(ast.parse("self.delay = 1.0\nx = state.pace.delay")) == []


#: A slot's fields that belong to this process alone (not learned state), and their writer.
_PROCESS_FIELDS = {"senders": "_fleet.py", "fleet_went": "_fleet.py"}


def _writes_elsewhere(writers: dict[str, str | None]) -> list[str]:
    """Each write of a field named in ``writers`` outside the module given as its
    one writer (None: no module writes it from outside its own class)."""
    return [
        f"{path.relative_to(ROOT)}:{line} writes {name}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for line, name in _written_attributes(ast.parse(path.read_text()))
        if name in writers and writers[name] != path.name
    ]


def test_only_the_fleet_writes_what_this_process_sees_of_a_fleets_slot() -> None:
    wrong = _writes_elsewhere(dict(_PROCESS_FIELDS))
    assert not wrong, wrong


#: What a process keeps of its runs of a slot (rule 8) that a ``Run`` does not write
#: itself, and the one module that writes it: the store's ``Runs``.
_RUN_FIELDS = {"behind": "_redis_runs.py"}

#: Whether a ``Run``'s ask is on its way, and what it learned of the fleet at its last
#: reservation: written by its own methods alone (given what the store answered), no
#: module writes them from outside.
_RUN_OWN = ("asking", "free", "last_due", "slack", "spacing")


def test_only_the_runs_write_what_a_process_keeps_of_its_runs() -> None:
    wrong = _writes_elsewhere(dict(_RUN_FIELDS))
    assert not wrong, wrong


def test_a_run_is_the_only_writer_of_what_it_learned_of_the_fleet() -> None:
    assert set(_RUN_OWN) <= set(Run.__slots__)
    wrong = _writes_elsewhere(dict.fromkeys(_RUN_OWN))
    assert not wrong, wrong
