"""A private Valkey Cluster on 127.0.0.1: masters with replicas, each a LocalRedis.

The tests, the ``cluster-failover`` drill and ``bench/cluster.py`` start one so
they can SIGKILL a master, watch its replica take over and move a slot, without
touching anyone else's server. ``valkey-cli --cluster create`` (the CLI that
ships beside the server binary) assigns the slots and pairs the replicas.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import redis
from echomq.supervisor.drills.localredis import LocalRedis, server_binary
from redis.crc import key_slot

NODE_TIMEOUT_MS = 1000  # how long a master may be silent before its replica takes over


def cli_binary() -> str | None:
    """valkey-cli beside the server binary, else valkey-cli or redis-cli on PATH."""
    server = server_binary()
    if server:
        for name in ("valkey-cli", "redis-cli"):
            beside = Path(server).parent / name
            if beside.exists():
                return str(beside)
    return shutil.which("valkey-cli") or shutil.which("redis-cli")


def distinct_ports(count: int) -> list[int]:
    """``count`` free loopback ports, all different (held open together while picked)."""
    socks = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            socks.append(sock)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for sock in socks:
            sock.close()


class LocalCluster:
    """``masters`` masters, each with ``replicas`` replicas, all on free loopback ports."""

    def __init__(self, masters: int = 3, replicas: int = 1, *,
                 node_timeout_ms: int = NODE_TIMEOUT_MS) -> None:
        cli = cli_binary()
        if cli is None:
            raise RuntimeError("no valkey-cli/redis-cli to create a cluster with")
        self.cli = cli
        self.masters = masters
        self.replicas = replicas
        self.nodes: list[LocalRedis] = []
        self.entry: LocalRedis
        count = masters * (1 + replicas)
        ports = distinct_ports(2 * count)
        for i in range(count):
            args = ("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                    "--cluster-node-timeout", str(node_timeout_ms),
                    "--cluster-port", str(ports[count + i]), "--appendonly", "no")
            self.nodes.append(LocalRedis(ports[i], extra_args=args))
        self.entry = self.nodes[0]

    @property
    def workdir(self) -> str:
        """The directory holding the nodes' files."""
        return self.nodes[0].workdir

    @property
    def url(self) -> str:
        """A URL naming one node (see :meth:`enter_away_from`): a client discovers the rest."""
        return self.entry.url

    def enter_away_from(self, key: str) -> None:
        """Make :attr:`url` name a live node other than the master of ``key``, so clients
        made after that master is killed still find the cluster through it."""
        owner = self.master_of(key)
        self.entry = next(n for n in self.alive() if n is not owner)

    def start(self, timeout: float = 60.0) -> LocalCluster:
        """Start every node, create the cluster and return once every node agrees it is ok.
        On failure every node started is stopped again."""
        try:
            for node in self.nodes:
                node.start()
            addrs = [f"127.0.0.1:{n.port}" for n in self.nodes]
            subprocess.run([self.cli, "--cluster", "create", *addrs, "--cluster-replicas",
                            str(self.replicas), "--cluster-yes"], check=True, timeout=timeout,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            self.wait_ok(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def client(self, node: LocalRedis) -> redis.Redis:
        """A plain (non-cluster) client for one node."""
        return redis.Redis(host="127.0.0.1", port=node.port, socket_timeout=5,
                           socket_connect_timeout=2)

    def alive(self) -> list[LocalRedis]:
        """The nodes whose process is still running."""
        return [n for n in self.nodes if n.proc is not None and n.proc.poll() is None]

    def wait_ok(self, timeout: float = 60.0) -> None:
        """Until every live node reports cluster_state:ok, the same number of masters
        and covers all slots, and every live replica's link to its master is up.

        The cluster announces none of this as an event a client can wait on: ask again
        every 50 ms until the deadline.
        """
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            try:
                if self._settled():
                    return
            except (redis.exceptions.RedisError, OSError) as exc:
                last = str(exc)
            time.sleep(0.05)  # no event announces a settled cluster (see the docstring)
        raise RuntimeError(f"cluster not ok after {timeout}s {last}")

    def _settled(self) -> bool:
        views = set()
        for node in self.alive():
            c = self.client(node)
            try:
                info = c.cluster("info")
                if info.get("cluster_state") != "ok" or int(info["cluster_slots_ok"]) != 16384:
                    return False
                masters = tuple(sorted(
                    line.split()[1] for line in c.execute_command("CLUSTER", "NODES").decode()
                    .splitlines() if "master" in line.split()[2] and "fail" not in
                    line.split()[2] and len(line.split()) > 8))
                views.add(masters)
                repl = c.info("replication")
                if repl["role"] == "slave" and repl.get("master_link_status") != "up":
                    return False
            finally:
                c.close()
        return len(views) == 1 and len(next(iter(views))) == self.masters

    def master_of(self, key: str) -> LocalRedis:
        """The live node that owns ``key``'s slot now."""
        return self.owner(key_slot(key.encode()))

    def owner(self, slot: int) -> LocalRedis:
        """The live master that owns ``slot`` now."""
        c = self.client(self.alive()[0])
        try:
            for start, end, primary, *_ in c.execute_command("CLUSTER", "SLOTS"):
                if start <= slot <= end:
                    port = int(primary[1])
                    return next(n for n in self.nodes if n.port == port)
        finally:
            c.close()
        raise LookupError(f"no node serves slot {slot}")

    def replica_of(self, master: LocalRedis) -> LocalRedis:
        """The node replicating ``master``."""
        c = self.client(master)
        try:
            repl = c.info("replication")
        finally:
            c.close()
        port = int(repl["slave0"]["port"])
        return next(n for n in self.nodes if n.port == port)

    def stop(self) -> None:
        """Stop every node."""
        for node in self.nodes:
            node.stop()

    def node_id(self, node: LocalRedis) -> str:
        """The cluster node id of ``node``."""
        c = self.client(node)
        try:
            return str(c.execute_command("CLUSTER", "MYID").decode())
        finally:
            c.close()

    def move_slot(self, slot: int, target: LocalRedis) -> int:
        """Move ``slot`` with its keys to ``target`` (a master); returns the keys moved.

        The steps of ``valkey-cli --cluster reshard``: :meth:`begin_move` (SETSLOT
        IMPORTING on the target, MIGRATING on the source, MIGRATE), then
        :meth:`finish_move` (SETSLOT NODE everywhere).
        """
        if self.owner(slot) is target:
            return 0
        moved = self.begin_move(slot, target)
        self.finish_move(slot, target)
        return moved

    def begin_move(self, slot: int, target: LocalRedis) -> int:
        """Mark ``slot`` moving to ``target`` and move its keys there; returns how many.

        The MIGRATING mark and one MIGRATE of every key of the slot are sent in one write,
        so the source runs them back to back: a script of the slot does not run between
        them, where it could meet a key already moved midway and stop with its earlier
        writes kept. Keys made in between (rare) are moved by a second MIGRATE. Until
        :meth:`finish_move` the source answers ASK and the target serves ASKING clients.
        """
        source = self.owner(slot)
        src_id, tgt_id = self.node_id(source), self.node_id(target)
        tgt, src = self.client(target), self.client(source)
        try:
            tgt.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
            keys = src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 1_000_000)
            pipe = src.pipeline(transaction=False)
            pipe.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", tgt_id)
            if keys:
                pipe.execute_command("MIGRATE", "127.0.0.1", target.port, "", 0, 10_000,
                                     "KEYS", *keys)
            pipe.execute()
            moved = len(keys)
            while keys := src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 1000):
                src.execute_command("MIGRATE", "127.0.0.1", target.port, "", 0, 10_000,
                                    "KEYS", *keys)
                moved += len(keys)
            return moved
        finally:
            tgt.close()
            src.close()

    def finish_move(self, slot: int, target: LocalRedis) -> None:
        """Assign ``slot`` to ``target`` on every master (the target first)."""
        tgt_id = self.node_id(target)
        for node in sorted(self.alive(), key=lambda n: n is not target):
            c = self.client(node)
            try:
                c.execute_command("CLUSTER", "SETSLOT", slot, "NODE", tgt_id)
            except redis.exceptions.ResponseError:
                pass  # a replica learns the new owner from its master
            finally:
                c.close()
