"""The fleet on a Redis Cluster: three shards this test starts on loopback ports.

A slot's keys carry one hash tag, so each slot lives on one shard and its
scripts run there; the fleet paces as it does on one Redis (docs/fleet.md).
Skipped, saying why, where ``redis-server`` or ``redis-cli`` is absent.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis.asyncio.cluster as aiocluster
import redis.cluster

from autothrottle import FixedRatePolicy, Throttle
from autothrottle._fleet import TurnAsk
from autothrottle.redis import RedisStore
from helpers import Grants
from redis_keys import fresh_prefix
from test_redis import four_workers_keep_the_pace_of_one

SHARDS = 3


def _free_ports(count: int) -> list[int]:
    """Ports free now, each with its cluster bus port (port + 10000) free too."""
    ports: list[int] = []
    while len(ports) < count:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        if port + 10000 > 65535 or port in ports:
            continue
        with socket.socket() as bus:
            try:
                bus.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        ports.append(port)
    return ports


@contextlib.contextmanager
def cluster(tmp: Path) -> Iterator[list[int]]:
    server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if server is None or cli is None:
        pytest.skip("redis-server and redis-cli are needed to start a Redis Cluster")
    ports = _free_ports(SHARDS)
    processes = []
    try:
        for port in ports:
            folder = tmp / str(port)
            folder.mkdir()
            processes.append(
                subprocess.Popen(
                    [
                        server,
                        "--port",
                        str(port),
                        "--bind",
                        "127.0.0.1",
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        "nodes.conf",
                        "--save",
                        "",
                        "--appendonly",
                        "no",
                        "--dir",
                        str(folder),
                    ],
                    stdout=subprocess.DEVNULL,
                )
            )
        for port in ports:
            _wait_for(lambda port=port: _ping(cli, port), 10)
        subprocess.run(
            [
                cli,
                "--cluster",
                "create",
                *(f"127.0.0.1:{p}" for p in ports),
                "--cluster-replicas",
                "0",
                "--cluster-yes",
            ],
            check=True,
            capture_output=True,
            timeout=30,
        )
        _wait_for(lambda: all(_cluster_ok(cli, port) for port in ports), 20)
        yield ports
    finally:
        for process in processes:
            process.kill()
            process.wait()


def port_of(client: aiocluster.RedisCluster, key: str) -> int:
    """The port of the shard that holds ``key``."""
    node = client.get_node_from_key(key)
    assert node is not None, key
    return int(node.port)


def _ping(cli: str, port: int) -> bool:
    out = subprocess.run([cli, "-p", str(port), "ping"], capture_output=True, text=True)
    return out.stdout.strip() == "PONG"


def _cluster_ok(cli: str, port: int) -> bool:
    out = subprocess.run([cli, "-p", str(port), "cluster", "info"], capture_output=True, text=True)
    return "cluster_state:ok" in out.stdout


def _wait_for(ready: object, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not ready():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise RuntimeError("the Redis Cluster did not come up")
        time.sleep(0.1)


async def test_four_processes_on_a_cluster_keep_the_pace_of_one(tmp_path: Path) -> None:
    with cluster(tmp_path) as ports:
        name = fresh_prefix()
        await four_workers_keep_the_pace_of_one(f"cluster://127.0.0.1:{ports[0]}", name)
        shards = redis.cluster.RedisCluster(host="127.0.0.1", port=ports[0])
        assert shards.hget(f"{{{name}:127.0.0.2}}:s", "record") is not None  # in the cluster
        shards.close()


async def test_slots_spread_over_the_shards_each_pace_as_on_one_redis(tmp_path: Path) -> None:
    """Each slot's turns are reserved by its own shard's script, on that shard's
    clock, a gap apart: as one Redis reserves them.

    It judges the send times the shards granted (``server + waited`` of each
    turn's answer, on the shard's ``TIME``) to the turns that were sent: those
    released as finished requests (a turn reached late goes back unsent, and
    its request takes a new one). The times ``acquire`` returned at would judge
    the event loop's punctuality instead: twelve tasks share it, and one turn
    let go late shortens the next gap by its lateness (0.019 s for a 0.05 s
    gap with two cores busy). A granted time does not move with a late wake-up.
    """
    with cluster(tmp_path) as ports:
        client = aiocluster.RedisCluster(host="127.0.0.1", port=ports[0])
        await client.initialize()
        store = RedisStore(client, prefix=fresh_prefix())
        grants = Grants(store)  # the send times the shards granted, the turns sent
        throttle = Throttle(policy=FixedRatePolicy(20), store=store)
        hosts = [f"host{i}" for i in range(12)]
        nodes = {port_of(client, f"{{{store.prefix}:{h}}}:s") for h in hosts}
        assert len(nodes) >= 2  # the slots live on more than one shard
        started = time.monotonic()

        async def five(host: str) -> None:
            for _ in range(5):
                lease = await throttle.acquire(host)
                lease.observe(latency=0.01, status=200)
                lease.release()

        await asyncio.wait_for(asyncio.gather(*(five(h) for h in hosts)), 30)
        await store.aclose()
    assert time.monotonic() - started < 10
    assert sorted(grants.finished) == sorted(hosts)
    for host in hosts:
        times = grants.sent(host)
        assert len(times) == 5, (host, times)
        gaps = [b - a for a, b in itertools.pairwise(times)]
        # Each slot at 20/s: its shard reserves the turns one gap apart (times
        # the spacing margin, 1.02), whenever the process got to them.
        assert min(gaps) >= 0.05 - 0.0005, (host, gaps)
    assert store.turns >= 60


async def test_a_pause_set_on_any_shard_reaches_a_process_holding_turns(tmp_path: Path) -> None:
    # Rule 2: the merge script publishes the pause on the shard of its slot;
    # classic pub/sub carries it to every node, so the subscriber of a store
    # (on one node) hears the pauses of slots on every shard.
    with cluster(tmp_path) as ports:
        clients = [aiocluster.RedisCluster(host="127.0.0.1", port=ports[0]) for _ in range(2)]
        for client in clients:
            await client.initialize()
        name = fresh_prefix()
        ours, theirs = (RedisStore(client, prefix=name) for client in clients)
        try:
            by_shard: dict[int, str] = {}
            for i in range(64):
                host = f"host{i}"
                node = port_of(clients[0], f"{{{name}:{host}}}:s")
                by_shard.setdefault(node, host)
            assert len(by_shard) == SHARDS
            ask = TurnAsk(0.5, 0.0, 60.0, 8, 300.0, 300.0)
            for host in by_shard.values():  # our turns: our store listens
                assert (await ours.take_turn(host, ask, time.monotonic())).lease is not None
            for _ in range(2500):  # bounded: 5 s
                if ours._listener.listening:
                    break
                await asyncio.sleep(0.002)
            other = Throttle(policy=FixedRatePolicy(2), store=theirs)
            for host in by_shard.values():
                other.backoff(host, pause=5.0)
            await theirs.flush()
            for _ in range(2500):
                if all(host in ours._runs._heard for host in by_shard.values()):
                    break
                await asyncio.sleep(0.002)
            heard = {
                host: ours.fleet_pause(host, 300.0, time.monotonic()) for host in by_shard.values()
            }
            assert all(4.0 < left <= 5.0 for left in heard.values()), heard
        finally:
            for store in (ours, theirs):
                await store.aclose()
