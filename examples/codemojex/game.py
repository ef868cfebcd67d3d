"""The rules of codemojex: guess a hidden row of emoji, scored like Mastermind.

A game is a seed. The hidden row is derived from it with PBKDF2, so a scorer
needs no shared state to know the answer (and spends a little CPU each time,
as a real anti-cheat check would). Keys of one game live under
``codemojex:{<game>}:`` beside the queue's own keys.
"""

from __future__ import annotations

import hashlib
import random

PALETTE = "🍎🍌🍇🍉🍒🥝🍍🥥"
LENGTH = 6
ROUNDS = 2000  # PBKDF2 rounds per scoring: about half a millisecond of CPU
EXACT, PRESENT = 10, 3  # points per emoji in its place, and per emoji elsewhere in the row
SOLVED = EXACT * LENGTH
FLOODER = "flooder"


def secret(game: str) -> str:
    """The hidden row of a game."""
    digest = hashlib.pbkdf2_hmac("sha256", game.encode(), b"codemojex", ROUNDS)
    return "".join(PALETTE[b % len(PALETTE)] for b in digest[:LENGTH])


def score(hidden: str, guess: str) -> int:
    """Points for a guess: EXACT per emoji in its place, PRESENT per other shared emoji."""
    if len(guess) != LENGTH or any(ch not in PALETTE for ch in guess):
        raise ValueError(f"a guess is {LENGTH} emoji from {PALETTE}, got {guess!r}")
    exact = sum(a == b for a, b in zip(hidden, guess, strict=True))
    shared = sum(min(hidden.count(ch), guess.count(ch)) for ch in set(guess))
    return exact * EXACT + (shared - exact) * PRESENT


def random_guess(rng: random.Random) -> str:
    return "".join(rng.choice(PALETTE) for _ in range(LENGTH))


class GameKeys:
    """Where a game keeps its board and its record of scored guesses."""

    def __init__(self, game: str) -> None:
        prefix = f"codemojex:{{{game}}}:"
        self.best = prefix + "best"          # zset: player -> best score
        self.players = prefix + "scored:players"  # list of "created_ms:scored_ms"
        self.flood = prefix + "scored:flood"
        self.channel = prefix + "board"      # pub/sub: "player score" on a new best
