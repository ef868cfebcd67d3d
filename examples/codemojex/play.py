"""Play a round of codemojex on a real supervisor and show what lanes do for fairness.

200 players each send a few guesses spread over the round while one flooder
sends 20,000 at once. Every guess is a job on the ``guesses`` queue with its
player's id as its lane, so claims rotate between players and the flood waits
its own turn. The leaderboard prints as it changes; at the end, the normal
players' guess-to-score latency is printed next to the flooder's.

``--single-lane`` puts every guess in one lane (a plain FIFO queue) for the
comparison. Uses ECHOMQ_REDIS_URL when set, else a private Valkey; passes
ECHOMQ_FLOOR_URL (if set) on to the supervisor.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import redis

import echomq
from examples.codemojex.game import FLOODER, SOLVED, GameKeys, random_guess

ROOT = Path(__file__).resolve().parents[2]
HANDLER = "examples.codemojex.handler:score_guess"


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="codemojex", description=__doc__.splitlines()[0])
    p.add_argument("--players", type=int, default=200)
    p.add_argument("--guesses", type=int, default=5, help="guesses per normal player")
    p.add_argument("--flood", type=int, default=20_000, help="guesses the flooder sends")
    p.add_argument("--window", type=float, default=12.0,
                   help="seconds over which the normal players' guesses are spread")
    p.add_argument("--processes", type=int, default=4)
    p.add_argument("--queue", default="guesses")
    p.add_argument("--doorbell", choices=("list", "marker"), default="list",
                   help="what the supervisor parks on (see echomq.wake)")
    p.add_argument("--single-lane", action="store_true",
                   help="every guess in one lane: a FIFO queue, for comparison")
    p.add_argument("--timeout", type=float, default=90.0, help="give up after this many seconds")
    p.add_argument("--json", action="store_true", help="print the figures as one JSON line")
    p.add_argument("--seed", type=int, default=None)
    return p.parse_args(argv)


def percentile(values: list[int], q: float) -> int:
    """Nearest-rank percentile (0 for no values)."""
    if not values:
        return 0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(q * len(ordered) + 0.5) - 1))]


def figures(raw: list[bytes]) -> dict[str, int]:
    """Latency figures (ms) from "created_ms:scored_ms" records."""
    pairs = [tuple(int(x) for x in item.split(b":")) for item in raw]
    lat = [done - created for created, done in pairs]
    return {"scored": len(pairs), "p50_ms": percentile(lat, 0.50),
            "p99_ms": percentile(lat, 0.99), "max_ms": max(lat, default=0),
            "first_ms": min((c for c, _ in pairs), default=0),
            "last_ms": max((d for _, d in pairs), default=0)}


class Board(threading.Thread):
    """Prints the top five whenever a new best changes them (at most twice a second)."""

    def __init__(self, r: redis.Redis, keys: GameKeys, t0: float, quiet: bool) -> None:
        super().__init__(daemon=True)
        self.r, self.keys, self.t0, self.quiet = r, keys, t0, quiet
        self.pubsub = r.pubsub(ignore_subscribe_messages=True)
        self.pubsub.subscribe(keys.channel)
        self.done = threading.Event()
        self.shown: list[tuple[bytes, float]] = []
        self.solved: list[str] = []

    def run(self) -> None:
        last = 0.0
        dirty = False
        while not self.done.is_set():
            msg = self.pubsub.get_message(timeout=0.25)
            if msg is not None:
                player, points = msg["data"].decode().split()
                if int(points) == SOLVED:
                    self.solved.append(player)
                dirty = True
            if dirty and time.monotonic() - last >= 0.5:
                dirty, last = False, time.monotonic()
                self.show()
        self.pubsub.close()

    def show(self) -> None:
        top = self.r.zrevrange(self.keys.best, 0, 4, withscores=True)
        if top == self.shown or self.quiet:
            return
        self.shown = top
        row = "  ".join(f"{i}. {p.decode()} {int(s)}" for i, (p, s) in enumerate(top, 1))
        print(f"{time.monotonic() - self.t0:5.1f}s  leaderboard  {row}", flush=True)


def start_supervisor(url: str, queue: str, processes: int, doorbell: str,
                     log_path: Path) -> subprocess.Popen:
    env = {**os.environ, "ECHOMQ_REDIS_URL": url,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, "-m", "echomq.supervisor.cli", "start", "--queue", queue,
           "--handler", HANDLER, "--processes", str(processes), "--beat-ms", "500",
           "--doorbell", doorbell]
    with open(log_path, "wb") as log:
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT)


def wait_for(predicate: Any, timeout: float, what: str, sup: subprocess.Popen) -> None:
    """Re-check ``predicate`` until it holds (this script watches; the queue does not poll)."""
    deadline = time.monotonic() + timeout
    tick = threading.Event()
    while not predicate():
        if sup.poll() is not None:
            raise RuntimeError(f"the supervisor exited with {sup.returncode} while waiting "
                               f"for {what}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what}")
        tick.wait(0.05)


def play(url: str, args: argparse.Namespace, log_path: Path) -> dict[str, Any]:
    rng = random.Random(args.seed)
    game = uuid.uuid4().hex[:10]
    keys = GameKeys(game)
    r = redis.Redis.from_url(url)
    q = echomq.Queue(args.queue, redis_url=url)
    sup = start_supervisor(url, args.queue, args.processes, args.doorbell, log_path)
    try:
        # one warm-up guess per process: the round starts once consumers are scoring
        warm = GameKeys(f"{game}-warmup")
        q.add_many([("guess", {"game": f"{game}-warmup", "player": f"warmup-{i}",
                               "guess": random_guess(rng)}) for i in range(args.processes)])
        wait_for(lambda: r.llen(warm.players) >= args.processes, 60, "the consumers", sup)
        return play_round(url, r, q, sup, game, keys, rng, args)
    finally:
        if sup.poll() is None:
            sup.send_signal(signal.SIGTERM)
        try:
            sup.wait(30)
        except subprocess.TimeoutExpired:
            sup.kill()
            sup.wait()
        r.close()
        q.close()


def play_round(url: str, r: redis.Redis, q: echomq.Queue, sup: subprocess.Popen, game: str,
               keys: GameKeys, rng: random.Random, args: argparse.Namespace) -> dict[str, Any]:
    def lane(player: str) -> str:
        return "all" if args.single_lane else player

    players = [f"player-{i:03d}" for i in range(args.players)]
    plan = sorted((rng.uniform(0, args.window), p) for p in players for _ in range(args.guesses))
    flood = [("guess", {"game": game, "player": FLOODER, "guess": random_guess(rng)},
              {"lane": lane(FLOODER)}) for _ in range(args.flood)]
    t0 = time.monotonic()
    board = Board(r, keys, t0, quiet=args.json)
    board.start()

    def send_flood() -> None:
        flooder = echomq.Queue(args.queue, redis_url=url)
        for i in range(0, len(flood), 1000):
            flooder.add_many(flood[i:i + 1000])
        flooder.close()

    flooding = threading.Thread(target=send_flood, daemon=True)
    flooding.start()
    tick = threading.Event()
    for at, player in plan:  # each normal guess at its planned moment
        wait = at - (time.monotonic() - t0)
        if wait > 0:
            tick.wait(wait)
        q.add("guess", {"game": game, "player": player, "guess": random_guess(rng)},
              lane=lane(player))
    flooding.join()
    total = len(plan)
    next_note = time.monotonic()

    def finished() -> bool:
        nonlocal next_note
        done_players, done_flood = r.llen(keys.players), r.llen(keys.flood)
        if not args.json and time.monotonic() >= next_note:
            next_note = time.monotonic() + 2.0
            print(f"{time.monotonic() - t0:5.1f}s  scored: players {done_players}/{total}, "
                  f"flooder {done_flood}/{args.flood}", flush=True)
        return done_players >= total and done_flood >= args.flood

    wait_for(finished, max(1.0, args.timeout - (time.monotonic() - t0)), "every guess", sup)
    elapsed = time.monotonic() - t0
    board.done.set()
    board.join(2)
    board.show()
    normal = figures(r.lrange(keys.players, 0, -1))
    flooder = figures(r.lrange(keys.flood, 0, -1))
    leader = r.zrevrange(keys.best, 0, 0, withscores=True)
    return {
        "game": game, "single_lane": args.single_lane, "players": args.players,
        "guesses": total, "flood": args.flood, "processes": args.processes,
        "seconds": round(elapsed, 2), "normal": normal, "flooder": flooder,
        "flood_drain_ms": flooder["last_ms"] - flooder["first_ms"],
        "solved": sorted(set(board.solved)),
        "leader": [leader[0][0].decode(), int(leader[0][1])] if leader else None,
        "players_on_board": r.zcard(keys.best),
    }


def report(result: dict[str, Any]) -> None:
    n, f = result["normal"], result["flooder"]
    mode = "one lane for everyone (FIFO)" if result["single_lane"] else "one lane per player"
    print()
    print(f"guess-to-score latency, {mode}, {result['processes']} consumer processes:")
    print(f"  {'':28} {'p50':>8} {'p99':>8} {'max':>8}   scored")
    print(f"  {'players (' + format(result['players'], ',') + ')':28} {n['p50_ms']:>6}ms "
          f"{n['p99_ms']:>6}ms {n['max_ms']:>6}ms   {n['scored']:,}")
    print(f"  {'flooder':28} {f['p50_ms']:>6}ms {f['p99_ms']:>6}ms {f['max_ms']:>6}ms   "
          f"{f['scored']:,}")
    leader = result["leader"]
    solved = result["solved"]
    print()
    print(f"summary: {result['guesses']:,} guesses from {result['players']} players and "
          f"{result['flood']:,} from the flooder scored in {result['seconds']:.1f}s "
          f"({(result['guesses'] + result['flood']) / result['seconds']:,.0f}/s); "
          f"the flood took {result['flood_drain_ms'] / 1000:.1f}s to drain while the "
          f"players' p99 was {n['p99_ms']:,}ms.")
    if leader:
        print(f"         leader {leader[0]} with {leader[1]} points; "
              f"{len(solved)} player(s) found the hidden row"
              + (f" ({', '.join(solved[:5])})" if solved else "") + ".")


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    url = os.environ.get("ECHOMQ_REDIS_URL")
    server = None
    if not url:
        from echomq.supervisor.drills.localredis import LocalRedis

        server = LocalRedis().start()
        url = server.url
        if not args.json:
            print(f"started a private {os.path.basename(server.binary)} at {url}", flush=True)
    log_dir = Path(tempfile.mkdtemp(prefix="codemojex-"))
    log_path = log_dir / "supervisor.log"
    try:
        if not args.json:
            print(f"codemojex: {args.players} players × {args.guesses} guesses over "
                  f"{args.window:.0f}s, one flooder × {args.flood:,} at once", flush=True)
        result = play(url, args, log_path)
    except RuntimeError as exc:
        print(f"codemojex: {exc}\n--- supervisor log ({log_path}) ---\n"
              f"{log_path.read_text()[-4000:]}", file=sys.stderr)
        return 1
    finally:
        if server is not None:
            server.stop()
    shutil.rmtree(log_dir, ignore_errors=True)  # kept above, when something went wrong
    if args.json:
        print(json.dumps(result))
    else:
        report(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
