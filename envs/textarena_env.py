"""TextArena's single-player games (the ``textarena`` package) as agent-rl text environments,
registered as ``textarena/<TextArena game id>`` (e.g. ``textarena/Sokoban-v0``).

The game logic, observations, rewards, invalid-move rules and win condition are TextArena's own;
the adapter adds what the agent-rl contract needs on top, per game family: the action grammar (the
bare move and TextArena's bracketed form are both accepted), the legal moves the prompt shows, a
state anchor and an instance key from the game's own state, and an oracle where one is cheap.

TextArena draws its games from Python's global ``random`` module (its state object calls
``random.seed``). Every call into a game runs with the game's own saved ``random`` state swapped
in, so games are reproducible per seed whatever else uses ``random`` in between, and they never
disturb the caller's random stream.
"""

from __future__ import annotations

import importlib
import json
import random
import re
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from hashlib import blake2b
from typing import Any, Callable, Iterator

import gymnasium as gym

from agent_rl.envs.base import EnvUnavailableError, TextEnv, Transition

NAMESPACE = "textarena"
ENTRY_POINT = "agent_rl.envs.textarena_env:TextArenaEnv"
DIRECTIONS = ("up", "down", "left", "right")
DIRECTION_ALIASES = {"w": "up", "a": "left", "s": "down", "d": "right"}
_OUTSIDE_CHARSET = str.maketrans({"√": "*"})
"""TextArena characters outside the observation charset (Sokoban's box on a goal)."""
_BRACKETED = re.compile(r"\[([^\[\]]*)\]")
_INVALID_REASON = re.compile(r"Reason: (.*?) Please resubmit", re.DOTALL)


@dataclass(frozen=True)
class GameRules:
    """What agent-rl adds to one TextArena game family."""

    description: str
    """One line for ``agent-rl envs``."""
    move: re.Pattern[str]
    """Full match on the text of a move (without brackets, lower case); its groups are the move's parts."""
    canonical: Callable[[tuple[str, ...]], str]
    """The bracketed move TextArena receives, from ``move``'s groups."""
    legal: Callable[[Any], list[str]]
    """The moves that are legal in the observable state (what the prompt lists)."""
    state: Callable[[Any], Any]
    """The game state as JSON-able data (the anchor)."""
    instance: Callable[[Any, int], Any]
    """Key of the instance a reset produced, from the game and its seed, for the held-out split
    (None: the game has a single instance and opts out)."""
    oracle: Callable[[Any], list[str]] | None = None
    """A winning move sequence from the current state, where one is cheap to compute."""


# ---- Sokoban ------------------------------------------------------------------------------------
def _sokoban_oracle(game: Any) -> list[str]:
    """Shortest plan by the A* solver of ``agent_rl/Sokoban-v0`` on TextArena's board (padded with walls);
    empty in a dead state (a box stuck where no plan wins)."""
    from agent_rl.envs.sokoban import push_distances, solve

    fixed, state = game.room_fixed, game.room_state
    rows, cols = fixed.shape
    width = cols + 2
    walls = [True] * ((rows + 2) * width)
    targets, boxes, player = set(), set(), 0
    for r in range(rows):
        for c in range(cols):
            cell = (r + 1) * width + c + 1
            walls[cell] = bool(fixed[r, c] == 0)
            targets |= {cell} if fixed[r, c] == 2 else set()
            boxes |= {cell} if state[r, c] in (3, 4) else set()
            player = cell if state[r, c] == 5 else player
    plan = solve(width, tuple(walls), push_distances(width, tuple(walls), frozenset(targets)), player, frozenset(boxes))
    return [f"[{move}]" for move in plan or []]


SOKOBAN = GameRules(
    description="push every box onto a target; moves [up] [down] [left] [right]",
    move=re.compile(r"(up|down|left|right|w|a|s|d)"),
    canonical=lambda g: f"[{DIRECTION_ALIASES.get(g[0], g[0])}]",
    legal=lambda game: [f"[{d}]" for d in DIRECTIONS if not game._would_collide_with_wall(d)],
    state=lambda game: game.room_state.tolist(),
    instance=lambda game, seed: [game.room_fixed.tolist(), game.room_state.tolist()],
    oracle=_sokoban_oracle,
)


# ---- FrozenLake ---------------------------------------------------------------------------------
_STEPS = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}


def _frozenlake_oracle(game: Any) -> list[str]:
    """Shortest path to the goal around the holes (breadth-first search)."""
    grid, start, goal = (
        game.state.game_state["grid"],
        tuple(game.state.game_state["player_pos"]),
        tuple(game.state.game_state["goal_pos"]),
    )
    size = len(grid)
    parent: dict[tuple[int, int], tuple[tuple[int, int], str] | None] = {start: None}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        if cell == goal:
            plan = []
            while parent[cell] is not None:
                cell, move = parent[cell]
                plan.append(f"[{move}]")
            return plan[::-1]
        for move, (dr, dc) in _STEPS.items():
            nxt = (cell[0] + dr, cell[1] + dc)
            if 0 <= nxt[0] < size and 0 <= nxt[1] < size and grid[nxt[0]][nxt[1]] != "H" and nxt not in parent:
                parent[nxt] = (cell, move)
                queue.append(nxt)
    raise RuntimeError("no path to the goal from this state")


def _frozenlake_legal(game: Any) -> list[str]:
    r, c = game.state.game_state["player_pos"]
    size = len(game.state.game_state["grid"])
    return [f"[{move}]" for move, (dr, dc) in _STEPS.items() if 0 <= r + dr < size and 0 <= c + dc < size]


FROZENLAKE = GameRules(
    description="walk to the goal across the ice without falling into a hole; moves [up] [down] [left] [right]",
    move=re.compile(r"(up|down|left|right|w|a|s|d)"),
    canonical=lambda g: f"[{DIRECTION_ALIASES.get(g[0], g[0])}]",
    legal=_frozenlake_legal,
    state=lambda game: [list(game.state.game_state["player_pos"]), game.state.game_state["grid"]],
    instance=lambda game, seed: [game.state.game_state["grid"], list(game.state.game_state["player_pos"])],
    oracle=_frozenlake_oracle,
)


# ---- TowerOfHanoi -------------------------------------------------------------------------------
_TOWERS = ("A", "B", "C")


def _hanoi_moves(towers: dict[str, list[int]]) -> list[tuple[str, str]]:
    return [
        (s, t)
        for s in _TOWERS
        for t in _TOWERS
        if s != t and towers[s] and (not towers[t] or towers[t][-1] > towers[s][-1])
    ]


def _hanoi_oracle(game: Any) -> list[str]:
    """Shortest move sequence to stack every disk on C (breadth-first search over the 3**n states)."""
    start = {k: list(v) for k, v in game.state.game_state["towers"].items()}
    goal = list(range(game.num_disks, 0, -1))
    key = lambda towers: tuple(tuple(towers[t]) for t in _TOWERS)  # noqa: E731
    parent: dict[tuple, tuple[tuple, str] | None] = {key(start): None}
    queue = deque([start])
    while queue:
        towers = queue.popleft()
        if towers["C"] == goal:
            plan, node = [], key(towers)
            while parent[node] is not None:
                node, move = parent[node]
                plan.append(move)
            return plan[::-1]
        for s, t in _hanoi_moves(towers):
            nxt = {k: list(v) for k, v in towers.items()}
            nxt[t].append(nxt[s].pop())
            if key(nxt) not in parent:
                parent[key(nxt)] = (key(towers), f"[{s.lower()} {t.lower()}]")
                queue.append(nxt)
    raise RuntimeError("no solution from this state")


HANOI = GameRules(
    description="move the disk stack from tower A to tower C; moves like [a c]",
    move=re.compile(r"([abc])\s*,?\s*([abc])"),
    canonical=lambda g: f"[{g[0]} {g[1]}]",
    legal=lambda game: [f"[{s.lower()} {t.lower()}]" for s, t in _hanoi_moves(game.state.game_state["towers"])],
    state=lambda game: game.state.game_state["towers"],
    instance=lambda game, seed: None,  # one start position per disk count
    oracle=_hanoi_oracle,
)


# ---- GuessTheNumber -----------------------------------------------------------------------------
def _guess_oracle(game: Any) -> list[str]:
    """The guesses binary search makes from the hints so far, simulated against the hidden number."""
    low, high = game.min_number, game.max_number
    for guess, hint in game.state.game_state["guess_history"]:
        low, high = (max(low, guess + 1), high) if hint == "higher" else (low, min(high, guess - 1))
    target, plan = game.game_number, []
    while True:
        untried = [n for n in range(low, high + 1) if n not in game.guessed_numbers]
        guess = untried[(len(untried) - 1) // 2]
        plan.append(f"[{guess}]")
        if guess == target:
            return plan
        low, high = (guess + 1, high) if guess < target else (low, guess - 1)


GUESS = GameRules(
    description="find the hidden number from higher/lower hints; moves like [7]",
    move=re.compile(r"(\d{1,9})"),
    canonical=lambda g: f"[{int(g[0])}]",
    legal=lambda game: [f"[{n}]" for n in range(game.min_number, game.max_number + 1) if n not in game.guessed_numbers],
    state=lambda game: [game.game_number, sorted(game.guessed_numbers)],
    instance=lambda game, seed: game.game_number,
    oracle=_guess_oracle,
)


# ---- Minesweeper --------------------------------------------------------------------------------
MINESWEEPER = GameRules(
    description="reveal every cell without a mine; moves like [3 2] (row, column)",
    move=re.compile(r"(\d{1,3})\s*,?\s*(\d{1,3})"),
    canonical=lambda g: f"[{int(g[0])} {int(g[1])}]",
    legal=lambda game: [f"[{r} {c}]" for r in range(game.rows) for c in range(game.cols) if not game.revealed[r][c]],
    state=lambda game: [game.revealed, None if game.first_move else game.grid],
    # Mines are placed by the first reveal from the game's random state, so the seed is the instance.
    instance=lambda game, seed: seed,
)

GAMES: dict[str, GameRules] = {
    "Sokoban-v0": SOKOBAN,
    "FrozenLake-v0": FROZENLAKE,
    "FrozenLake-v0-random": FROZENLAKE,
    "FrozenLake-v0-hardcore": FROZENLAKE,
    "TowerOfHanoi-v0": HANOI,
    "TowerOfHanoi-v0-medium": HANOI,
    "TowerOfHanoi-v0-hard": HANOI,
    "TowerOfHanoi-v0-hardcore": HANOI,
    "TowerOfHanoi-v0-extreme": HANOI,
    "GuessTheNumber-v0": GUESS,
    "GuessTheNumber-v0-hardcore": GUESS,
    "Minesweeper-v0": MINESWEEPER,
    "Minesweeper-v0-small": MINESWEEPER,
    "Minesweeper-v0-medium": MINESWEEPER,
    "Minesweeper-v0-hard": MINESWEEPER,
}
"""The adapted games: TextArena ids that work offline, by their rules."""

NETWORK_DATA: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(
        ("Wordle-v0", "Wordle-v0-hardcore", "Wordle-v0-long", "Wordle-v0-long-hardcore"),
        ("words", "averaged_perceptron_tagger_eng"),
    ),
    **dict.fromkeys(
        ("Hangman-v0", "Hangman-v0-hardcore", "WordLadder-v0", "WordLadder-v0-medium", "WordLadder-v0-hard"), ("words",)
    ),
    **dict.fromkeys(("WordSearch-v0", "WordSearch-v0-hardcore"), ("words",)),
}
"""Single-player games whose modules download NLTK data when imported: registered only to refuse."""

LEFT_OUT: dict[str, str] = {
    f"{NAMESPACE}/Sokoban-v0-medium": (
        "TextArena's level generator took from 2 s to about a minute per reset on the seeds tried"
    ),
    f"{NAMESPACE}/FifteenPuzzle-v0": (
        "crashes when the puzzle is solved (it calls set_winners, which its single-player state lacks)"
    ),
    f"{NAMESPACE}/Klondike-v0": "its module does not import in textarena 0.7.4 (a syntax error)",
    f"{NAMESPACE}/GuessWho-v0, TwentyQuestions-v0(-hardcore)": (
        "an LLM answers the questions through OpenRouter (an API key and the network)"
    ),
    f"{NAMESPACE}/2048, Bandit, BabyAiText, Blackjack, Countdown, Crosswords, Cryptarithm, LightsOut, LogicPuzzle, "
    "Mastermind, PegJump, RushHour, Secretary, Set, Slitherlink, Sudoku, ThreeCardMonte": (
        "single-player, but no adapter yet (each needs its move grammar, legal moves and state key written down)"
    ),
    f"{NAMESPACE}/<the other ids>": (
        "two or more players; the -train/-raw variants differ only in TextArena's observation wrappers"
    ),
}


def network_data_error(game: str) -> str:
    resources = ", ".join(NETWORK_DATA[game])
    return (
        f"textarena/{game} is not available offline: TextArena downloads NLTK data ({resources}) from the "
        "network when it imports this game, and agent-rl does not adapt it. Offline single-player games: "
        + ", ".join(GAMES)
    )


class TextArenaEnv(TextEnv):
    """One TextArena single-player game.

    Knobs:
        game: the TextArena id (one of :data:`GAMES`); TextArena's own registration gives its settings.
        error_allowance: invalid moves TextArena tolerates in a row before the game is lost (default:
            TextArena's, 1). Each tolerated one comes back with ``action_valid=False``.
        max_steps: truncation (default twice the game's own turn limit, or 200 without one).
        success_reward: extra reward on a win (default 0: the reward is TextArena's, given when the
            game ends: 1 for a win, the game's partial-completion score otherwise).

    Actions: ``up``, ``[up]``, ``[W]`` and ``I go [up]`` all mean ``[up]`` (the first bracketed part
    counts, as in TextArena). Text that is not a move of this game is never passed on: TextArena
    receives an empty move instead, which its own invalid-move rule answers (and counts).
    """

    default_anchor_key = "state"

    def __init__(
        self,
        *,
        game: str = "Sokoban-v0",
        error_allowance: int | None = None,
        max_steps: int | None = None,
        success_reward: float = 0.0,
        **reward_and_render: Any,
    ) -> None:
        if game in NETWORK_DATA:
            raise EnvUnavailableError(network_data_error(game))
        if game not in GAMES:
            raise ValueError(f"unknown or unadapted TextArena game {game!r}; valid: {', '.join(GAMES)}")
        if error_allowance is not None and error_allowance < 0:
            raise ValueError(f"error_allowance must be >= 0, got {error_allowance}")
        from textarena.envs.registration import ENV_REGISTRY

        spec = ENV_REGISTRY[game]
        module, name = spec.entry_point.split(":")
        self._game = getattr(importlib.import_module(module), name)(**spec.kwargs)
        self.game_id = game
        self.rules = GAMES[game]
        self.error_allowance = error_allowance
        turn_limit = spec.kwargs.get("max_turns") or 100
        super().__init__(
            max_steps=2 * turn_limit if max_steps is None else max_steps,
            success_reward=success_reward,
            **reward_and_render,
        )
        self._random_state = random.Random(0).getstate()
        self._board = ""
        self._instance: Any = None

    @contextmanager
    def _game_random(self) -> Iterator[None]:
        """Run game code with the game's own ``random`` state; the caller's state is restored after."""
        outside = random.getstate()
        random.setstate(self._random_state)
        try:
            yield
        finally:
            self._random_state = random.getstate()
            random.setstate(outside)

    def _new_game(self, options: dict[str, Any] | None) -> str:
        seed = int(self.np_random.integers(2**31))
        with self._game_random():
            self._game.reset(num_players=1, seed=seed)
        if self.error_allowance is not None:
            self._game.state.error_allowance = self.error_allowance
        self._instance = self.rules.instance(self._game, seed)
        self._board = ""
        messages = self._messages()
        prompts = [text for text, kind in messages if kind == "PROMPT"]
        self.task = "\n".join(line.strip() for line in "\n".join(prompts).splitlines()).strip()
        return self._describe([m for m in messages if m[1] != "PROMPT"])

    def _messages(self) -> list[tuple[str, str]]:
        """The messages TextArena has for the player since the last call, without its own echo."""
        _, messages = self._game.get_observation()
        return [
            (str(text).translate(_OUTSIDE_CHARSET), kind.name)
            for _, text, kind in messages
            if kind.name != "PLAYER_ACTION"
        ]

    def _describe(self, messages: list[tuple[str, str]]) -> str:
        """This step's messages, with the latest board appended when the step showed none."""
        boards = [text for text, kind in messages if kind == "GAME_BOARD"]
        if boards:
            self._board = boards[-1]
        lines = [text.strip("\n") for text, _ in messages]
        if not boards and self._board:
            lines.append(self._board.strip("\n"))
        return "\n".join(lines)

    def _apply(self, command: str) -> Transition:
        move = self._parse(command)
        state = self._game.state
        with self._game_random():
            self._game.step(move or "")
        messages = self._messages()
        invalid = state.error_count > 0 or state.game_info[0]["invalid_move"]
        observation = self._describe(messages)
        error = None
        if invalid:
            admin = " ".join(text for text, kind in messages if kind == "GAME_ADMIN")
            found = _INVALID_REASON.search(admin)
            error = found.group(1).strip() if found else str(state.game_info[0].get("reason", admin))
            if move is None:
                error = f"'{command}' is not a move of {self.game_id}: {error}"
        reward = None
        if state.done:
            observation = f"{observation}\n{state.game_info[0].get('reason', '')}".strip()
            reward = float((state.rewards or {}).get(0, 0.0))
        return Transition(observation, valid=not invalid, error=error, terminated=bool(state.done), reward=reward)

    def _parse(self, command: str) -> str | None:
        """The canonical bracketed move ``command`` names, or None when it names none."""
        bracketed = _BRACKETED.search(command)
        text = (bracketed.group(1) if bracketed else command).strip()
        match = self.rules.move.fullmatch(text)
        return self.rules.canonical(match.groups()) if match else None

    def admissible_actions(self) -> list[str]:
        """The legal moves in the observable state (for Minesweeper: every hidden cell, mines included)."""
        return [] if self._game.state.done else self.rules.legal(self._game)

    def anchor(self) -> str:
        """blake2b of the game id, TextArena's game state and its count of tolerated invalid moves."""
        payload = json.dumps([self.game_id, self.rules.state(self._game), self._game.state.error_count], sort_keys=True)
        return blake2b(payload.encode(), digest_size=16).hexdigest()

    def instance_key(self) -> str | None:
        """Key of the game instance the last reset produced: training seeds only reach instances whose
        key hashes to the training split, evaluation seeds the others (see ``agent_rl.envs.base``)."""
        if self._instance is None:
            return None
        return blake2b(json.dumps([self.game_id, self._instance]).encode(), digest_size=16).hexdigest()

    def is_won(self) -> bool:
        state = self._game.state
        return bool(state.done and (state.rewards or {}).get(0, 0.0) >= 1.0)

    def oracle(self) -> list[str]:
        if self.rules.oracle is None:
            raise NotImplementedError(f"textarena/{self.game_id} has no oracle")
        return self.rules.oracle(self._game)


def register_textarena(register_text_env: Callable[..., None]) -> dict[str, str]:
    """Register the adapted games with ``register_text_env`` (``agent_rl.envs.registration``'s, passed in: this
    module sits below the registry) and the network-data games, which refuse with a clear error at
    ``gymnasium.make``; return the left-out ids with the reason for each."""
    for game, rules in GAMES.items():
        description = f"TextArena {game}: {rules.description}."
        register_text_env(
            f"{NAMESPACE}/{game}", ENTRY_POINT, description=description, default_anchor="state", game=game
        )
    for game in NETWORK_DATA:
        gym.register(id=f"{NAMESPACE}/{game}", entry_point=ENTRY_POINT, kwargs={"game": game}, disable_env_checker=True)
    return {
        **{
            f"{NAMESPACE}/{game}": f"needs NLTK data from the network ({', '.join(r)})"
            for game, r in NETWORK_DATA.items()
        },
        **LEFT_OUT,
    }
