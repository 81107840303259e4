"""``agent_rl/Sokoban-v0``: push every box onto a target on a text grid.

Levels come from reverse play: boxes start on their targets and a player walks randomly, sometimes
pulling the box behind it; every state along that walk is solvable by playing it backwards. The
generator keeps the most scrambled state of the walk and accepts the level only if the bounded A*
solver finds a plan, which becomes the oracle of the start state. Cells are flat indices
``y * width + x`` so stepping is integer arithmetic on a set of box cells.
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from agent_rl.envs.base import TextEnv, Transition

WALL, FLOOR, TARGET, BOX, BOX_ON_TARGET, PLAYER, PLAYER_ON_TARGET = "#", " ", ".", "$", "*", "@", "+"
MOVES = ("up", "down", "left", "right")
MOVE_ALIASES = {
    **{m: m for m in MOVES},
    **{f"{verb} {m}": m for verb in ("go", "move", "push", "walk") for m in MOVES},
    "u": "up",
    "d": "down",
    "l": "left",
    "r": "right",
    "north": "up",
    "south": "down",
    "west": "left",
    "east": "right",
}
SOLVER_MAX_EXPANSIONS = 50_000
"""Bound of the A* search; generation rejects levels it cannot solve within it."""
UNREACHABLE = 1 << 30
REVERSE_WALKS = 4
"""Reverse-play walks per candidate room; the most scrambled state over all of them is kept."""


@dataclass(frozen=True)
class SokobanLevel:
    """One generated level: the fixed grid, the start state and a shortest plan from it."""

    width: int
    height: int
    walls: tuple[bool, ...]
    targets: frozenset[int]
    player: int
    boxes: frozenset[int]
    plan: tuple[str, ...]
    push_distance: tuple[int, ...]
    """Per cell: fewest pushes to bring a box from there onto some target (UNREACHABLE = dead cell)."""


def move_offsets(width: int) -> dict[str, int]:
    return {"up": -width, "down": width, "left": -1, "right": 1}


def push_distances(width: int, walls: tuple[bool, ...], targets: frozenset[int]) -> tuple[int, ...]:
    """Fewest pushes from each cell to a target, ignoring other boxes: BFS of *pulls* from the targets.

    A box at ``c`` can be pulled to ``c + d`` when ``c + d`` and ``c + 2d`` are free (the player
    walks back from ``c + d`` to ``c + 2d``). Cells it never reaches are dead squares.
    """
    distance = [UNREACHABLE] * len(walls)
    queue = deque(targets)
    for target in targets:
        distance[target] = 0
    while queue:
        cell = queue.popleft()
        for offset in move_offsets(width).values():
            box_from, player_at = cell + offset, cell + 2 * offset
            if not walls[box_from] and not walls[player_at] and distance[box_from] == UNREACHABLE:
                distance[box_from] = distance[cell] + 1
                queue.append(box_from)
    return tuple(distance)


def solve(
    width: int,
    walls: tuple[bool, ...],
    push_distance: tuple[int, ...],
    player: int,
    boxes: frozenset[int],
    max_expansions: int = SOLVER_MAX_EXPANSIONS,
) -> list[str] | None:
    """Shortest move sequence that puts every box on a target (A*, admissible heuristic: sum of
    per-box push distances), or None when none is found within ``max_expansions`` expansions."""
    offsets = move_offsets(width)
    start = (player, boxes)
    start_h = sum(push_distance[b] for b in boxes)
    if start_h >= UNREACHABLE:
        return None
    parent: dict[tuple[int, frozenset[int]], tuple[tuple[int, frozenset[int]], str] | None] = {start: None}
    best_g = {start: 0}
    heap = [(start_h, 0, 0, start)]
    counter = 0
    expansions = 0
    while heap:
        _, g, _, state = heapq.heappop(heap)
        if g > best_g[state]:
            continue
        player, boxes = state
        h_now = sum(push_distance[b] for b in boxes)
        if h_now == 0:
            plan = []
            while parent[state] is not None:
                state, move = parent[state]
                plan.append(move)
            return plan[::-1]
        expansions += 1
        if expansions > max_expansions:
            return None
        for move, offset in offsets.items():
            nxt = player + offset
            if walls[nxt]:
                continue
            h = h_now
            new_boxes = boxes
            if nxt in boxes:
                beyond = nxt + offset
                if walls[beyond] or beyond in boxes or push_distance[beyond] >= UNREACHABLE:
                    continue
                new_boxes = boxes - {nxt} | {beyond}
                h = h_now - push_distance[nxt] + push_distance[beyond]
            child = (nxt, new_boxes)
            if g + 1 < best_g.get(child, UNREACHABLE):
                best_g[child] = g + 1
                parent[child] = (state, move)
                counter += 1
                heapq.heappush(heap, (g + 1 + h, g + 1, counter, child))
    return None


def carve_room(rng: random.Random, width: int, height: int) -> tuple[bool, ...]:
    """Walls everywhere except a connected region carved by a random walk with a wide brush."""
    walls = [True] * (width * height)
    interior = (width - 2) * (height - 2)
    x, y = rng.randrange(1, width - 1), rng.randrange(1, height - 1)
    dx, dy = rng.choice(((0, 1), (0, -1), (1, 0), (-1, 0)))
    carved = 0
    for _ in range(20 * interior):
        brush = ((x, y), (x + 1, y), (x, y + 1), (x + 1, y + 1)) if rng.random() < 0.3 else ((x, y),)
        for cx, cy in brush:
            if 1 <= cx < width - 1 and 1 <= cy < height - 1 and walls[cy * width + cx]:
                walls[cy * width + cx] = False
                carved += 1
        if carved >= 0.7 * interior:
            break
        if rng.random() < 0.35:
            dx, dy = rng.choice(((0, 1), (0, -1), (1, 0), (-1, 0)))
        x = min(max(x + dx, 1), width - 2)
        y = min(max(y + dy, 1), height - 2)
    return tuple(walls)


@lru_cache(maxsize=1024)
def generate_level(level_seed: int, width: int, height: int, n_boxes: int, reverse_steps: int) -> SokobanLevel:
    """Reverse-play generation (cached: group members share a seed and so a level)."""
    rng = random.Random(level_seed)
    offsets = list(move_offsets(width).values())
    for _ in range(1000):
        walls = carve_room(rng, width, height)
        floor = [cell for cell, wall in enumerate(walls) if not wall]
        if len(floor) < n_boxes + 2:
            continue
        targets = frozenset(rng.sample(floor, n_boxes))
        distance = push_distances(width, walls, targets)
        # Keep the most scrambled state of a few walks: most boxes off target, then most pushes left.
        best_score, best = (0, 0), None
        for _ in range(REVERSE_WALKS):
            player = rng.choice([cell for cell in floor if cell not in targets])
            boxes = set(targets)
            for _ in range(reverse_steps):
                offset = rng.choice(offsets)
                nxt = player + offset
                if walls[nxt] or nxt in boxes:
                    continue
                if player - offset in boxes:  # walking away from a box pulls it along
                    boxes.remove(player - offset)
                    boxes.add(player)
                player = nxt
                score = (len(boxes - targets), sum(distance[b] for b in boxes))
                if score >= best_score and score[0] > 0:
                    best_score, best = score, (player, frozenset(boxes))
        if best is None:
            continue
        plan = solve(width, walls, distance, best[0], best[1])
        if plan:
            return SokobanLevel(width, height, walls, targets, best[0], best[1], tuple(plan), distance)
    raise RuntimeError(
        f"could not generate a solvable {width}x{height} level with {n_boxes} boxes; "
        "use a larger grid, fewer boxes or more reverse_steps"
    )


class SokobanEnv(TextEnv):
    """Push every box (``$``) onto a target (``.``); ``@`` is the player, ``#`` a wall, ``*`` a box on
    a target, ``+`` the player on a target. Commands: ``up``, ``down``, ``left``, ``right`` (also
    ``u/d/l/r`` and ``move <direction>``). A move into a wall or against a box that cannot move is
    invalid (``info["action_valid"] = False``) and changes nothing. The anchor is the grid text.

    Difficulty knobs:
        width, height: grid size including the border walls (5..30).
        n_boxes: boxes (and targets) on the grid.
        reverse_steps: length of the reverse-play walk that scrambles the solved state; longer walks
            give harder levels (the A* solver bounds how hard: levels it cannot solve are rejected).
        max_steps: step limit (default 100).
    """

    def __init__(
        self,
        *,
        width: int = 7,
        height: int = 7,
        n_boxes: int = 2,
        reverse_steps: int = 100,
        max_steps: int = 100,
        **base_kwargs: Any,
    ) -> None:
        for name, value in (("width", width), ("height", height)):
            if not 5 <= value <= 30:
                raise ValueError(f"{name} must be in [5, 30], got {value}")
        if not 1 <= n_boxes <= (width - 2) * (height - 2) // 4:
            raise ValueError(
                f"n_boxes must be in [1, {(width - 2) * (height - 2) // 4}] for a {width}x{height} grid, got {n_boxes}"
            )
        if reverse_steps < 1:
            raise ValueError(f"reverse_steps must be >= 1, got {reverse_steps}")
        super().__init__(max_steps=max_steps, **base_kwargs)
        self.width, self.height, self.n_boxes, self.reverse_steps = width, height, n_boxes, reverse_steps
        self.offsets = move_offsets(width)
        self.level: SokobanLevel | None = None
        self._player = 0
        self._boxes: frozenset[int] = frozenset()
        self._grid = ""
        self._background: list[str] = []
        """The grid without player and boxes, one character per cell."""

    def _new_game(self, options: dict[str, Any] | None) -> str:
        level_seed = int(self.np_random.integers(2**63))
        self.level = generate_level(level_seed, self.width, self.height, self.n_boxes, self.reverse_steps)
        self._background = [
            WALL if wall else TARGET if cell in self.level.targets else FLOOR
            for cell, wall in enumerate(self.level.walls)
        ]
        self._player, self._boxes = self.level.player, self.level.boxes
        self.task = (
            f"Push every box ($) onto a target (.). You are @; # is a wall, * a box on a target, + you on a "
            f"target. Commands: up, down, left, right. There are {self.n_boxes} boxes."
        )
        self._render()
        return self._describe("")

    def _apply(self, command: str) -> Transition:
        move = MOVE_ALIASES.get(command)
        if move is None:
            message = (
                f"Unknown command {command!r}. Use up, down, left or right."
                if command
                else ("Please type a command: up, down, left or right.")
            )
            return Transition(self._describe(message), valid=False, error=message)
        offset = self.offsets[move]
        nxt = self._player + offset
        if self.level.walls[nxt]:
            message = f"You can't move {move}: a wall is in the way."
            return Transition(self._describe(message), valid=False, error=message)
        if nxt in self._boxes:
            beyond = nxt + offset
            if self.level.walls[beyond] or beyond in self._boxes:
                blocker = "a wall" if self.level.walls[beyond] else "another box"
                message = f"You can't push the box {move}: it is blocked by {blocker}."
                return Transition(self._describe(message), valid=False, error=message)
            self._boxes = self._boxes - {nxt} | {beyond}
            self._player = nxt
            self._render()
            return Transition(self._describe(f"You push the box {move}."))
        self._player = nxt
        self._render()
        return Transition(self._describe(f"You move {move}."))

    def _render(self) -> None:
        self._grid = self._grid_text(self._player, self._boxes)

    def _grid_text(self, player: int, boxes: frozenset[int]) -> str:
        cells = self._background.copy()
        for box in boxes:
            cells[box] = BOX_ON_TARGET if cells[box] == TARGET else BOX
        cells[player] = PLAYER_ON_TARGET if cells[player] == TARGET else PLAYER
        w = self.width
        return "\n".join("".join(cells[row * w : row * w + w]) for row in range(self.height))

    def _describe(self, message: str) -> str:
        on_target = len(self._boxes & self.level.targets)
        status = f"Boxes on targets: {on_target}/{self.n_boxes}."
        return f"{message}\n{self._grid}\n{status}" if message else f"{self._grid}\n{status}"

    def admissible_actions(self) -> list[str]:
        walls, boxes = self.level.walls, self._boxes
        actions = []
        for move, offset in self.offsets.items():
            nxt = self._player + offset
            if walls[nxt]:
                continue
            if nxt in boxes and (walls[nxt + offset] or nxt + offset in boxes):
                continue
            actions.append(move)
        return actions

    def anchor(self) -> str:
        return self._grid

    def instance_key(self) -> str:
        """The start grid: walls, targets, boxes and the player."""
        return self._grid_text(self.level.player, self.level.boxes)

    def is_won(self) -> bool:
        return self._boxes <= self.level.targets

    def oracle(self) -> list[str]:
        """Shortest plan from the current state (A*); empty when the search finds none within
        ``SOLVER_MAX_EXPANSIONS`` expansions (a dead state: a box stuck against a wall, off every target)."""
        if (self._player, self._boxes) == (self.level.player, self.level.boxes):
            return list(self.level.plan)
        return solve(self.width, self.level.walls, self.level.push_distance, self._player, self._boxes) or []
