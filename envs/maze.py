"""``agent_rl/Maze-v0``: rooms on a graph with locked doors, keys and a goal item.

The world is a networkx graph of rooms laid out on a compass grid, so ``go north`` then ``go south``
always returns to the same room. Generation guarantees a solution: keys are placed by repeatedly
opening a locked door on the frontier of the reachable region and hiding its key inside that region,
preferring the region the previous door opened, which builds key chains (the key of one door lies
behind another locked door). Stepping uses plain tuples and dicts compiled from the graph.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass
from typing import Any

import networkx as nx

from agent_rl.envs.base import TextEnv, Transition

DIRECTIONS = ("north", "east", "south", "west")
OFFSETS = {"north": (0, 1), "east": (1, 0), "south": (0, -1), "west": (-1, 0)}
OPPOSITE = {"north": "south", "south": "north", "east": "west", "west": "east"}
DIRECTION_ALIASES = {**{d: d for d in DIRECTIONS}, "n": "north", "e": "east", "s": "south", "w": "west"}

ADJECTIVES = (
    "dusty",
    "damp",
    "bright",
    "narrow",
    "silent",
    "cold",
    "warm",
    "crooked",
    "tiled",
    "painted",
    "musty",
    "vaulted",
    "sunken",
    "drafty",
    "cluttered",
    "empty",
    "mossy",
    "gilded",
    "smoky",
    "quiet",
)
ROOM_NOUNS = (
    "kitchen",
    "library",
    "cellar",
    "hallway",
    "pantry",
    "study",
    "gallery",
    "chapel",
    "workshop",
    "attic",
    "armory",
    "bedroom",
    "parlor",
    "greenhouse",
    "vault",
    "scullery",
    "nursery",
    "ballroom",
    "tower",
    "crypt",
)
KEY_NAMES = (
    "brass key",
    "iron key",
    "silver key",
    "copper key",
    "bone key",
    "glass key",
    "jade key",
    "amber key",
    "steel key",
    "oak key",
    "crystal key",
    "rusty key",
    "ivory key",
    "onyx key",
    "pewter key",
    "tin key",
)
DISTRACTOR_NAMES = (
    "old lamp",
    "torn map",
    "wooden spoon",
    "tin cup",
    "feather",
    "pebble",
    "candle",
    "coil of rope",
    "chipped plate",
    "faded letter",
    "broken clock",
    "leather boot",
)
GOAL_NAMES = ("golden chalice", "ancient idol", "jeweled crown", "silver harp", "crystal orb", "emerald ring")

HELD = -1
"""Item location meaning "in the player's inventory"."""

ORACLES = ("shortest", "explore")
"""What ``MazeEnv.oracle()`` can plan (see its ``oracle`` argument)."""

GRAMMAR = "go <north|east|south|west>, take <item>, drop <item>, unlock <direction> door with <key>, look, inventory"


@dataclass(frozen=True)
class MazeWorld:
    """The fixed part of one episode, compiled from the generation graph for fast stepping."""

    graph: nx.Graph
    """Rooms (nodes with ``name`` and ``pos``) and passages (edges with ``door`` = door index or -1)."""
    room_names: tuple[str, ...]
    exits: tuple[dict[str, tuple[int, int]], ...]
    """Per room: direction -> (neighbour room, door index or -1), in compass order."""
    item_names: tuple[str, ...]
    item_index: dict[str, int]
    door_keys: tuple[int, ...]
    """Per door: the item index of the key that unlocks it."""
    goal_item: int
    start_room: int
    initial_items: tuple[int, ...]
    """Per item: the room it starts in."""


def generate_world(
    rng: random.Random, n_rooms: int, n_locked_doors: int, extra_edges: int, dead_ends: int, n_distractors: int
) -> MazeWorld:
    """Build a solvable world: a core tree grown on the compass grid, side rooms, loops, doors, items."""
    pos: list[tuple[int, int]] = [(0, 0)]
    cell_room = {(0, 0): 0}
    graph = nx.Graph()
    graph.add_node(0)

    def free_directions(room: int) -> list[str]:
        x, y = pos[room]
        return [d for d in DIRECTIONS if (x + OFFSETS[d][0], y + OFFSETS[d][1]) not in cell_room]

    def add_room(parent: int, direction: str) -> None:
        x, y = pos[parent]
        cell = (x + OFFSETS[direction][0], y + OFFSETS[direction][1])
        room = len(pos)
        pos.append(cell)
        cell_room[cell] = room
        graph.add_edge(parent, room)

    # Core: grow from the newest room half the time (long corridors), otherwise from any room (branches).
    n_core = n_rooms - dead_ends
    while len(pos) < n_core:
        parent = len(pos) - 1 if rng.random() < 0.5 else rng.randrange(len(pos))
        free = free_directions(parent)
        if free:
            add_room(parent, rng.choice(free))
    core_edges = list(graph.edges)
    # Loops: join adjacent core rooms that are not yet connected.
    candidates = sorted(
        {
            tuple(sorted((room, cell_room[(x + dx, y + dy)])))
            for room, (x, y) in enumerate(pos)
            for dx, dy in OFFSETS.values()
            if (x + dx, y + dy) in cell_room and not graph.has_edge(room, cell_room[(x + dx, y + dy)])
        }
    )
    for a, b in rng.sample(candidates, min(extra_edges, len(candidates))):
        graph.add_edge(a, b)
        core_edges.append((a, b))
    # Dead ends: one-exit side rooms hanging off the core, never joined by loops (once the core is
    # walled in by them, they hang off each other and form side branches).
    while len(pos) < n_rooms:
        open_rooms = [r for r in range(n_core) if free_directions(r)] or [
            r for r in range(len(pos)) if free_directions(r)
        ]
        parent = rng.choice(open_rooms)
        add_room(parent, rng.choice(free_directions(parent)))

    distance = nx.single_source_shortest_path_length(graph, 0)
    goal_room = max(range(n_rooms), key=lambda room: (distance[room], -room))
    # Lock doors on the way to the goal first, then anywhere in the core.
    goal_path = nx.shortest_path(graph, 0, goal_room)
    on_path = [tuple(sorted(edge)) for edge in zip(goal_path, goal_path[1:])]
    rng.shuffle(on_path)
    on_path_edges = set(on_path)
    others = [edge for edge in map(tuple, map(sorted, core_edges)) if edge not in on_path_edges]
    rng.shuffle(others)
    locked = (on_path + others)[:n_locked_doors]
    door_of = {edge: door for door, edge in enumerate(locked)}
    for a, b in graph.edges:
        graph.edges[a, b]["door"] = door_of.get(tuple(sorted((a, b))), -1)

    # Keys: open frontier doors one at a time, hiding each key in the region reached most recently.
    key_names = rng.sample(KEY_NAMES, n_locked_doors)
    distractors = rng.sample(DISTRACTOR_NAMES, n_distractors)
    goal_name = rng.choice(GOAL_NAMES)
    item_names = (*key_names, *distractors, goal_name)
    item_rooms = [0] * len(item_names)
    open_graph = graph.edge_subgraph([e for e in graph.edges if graph.edges[e]["door"] < 0]).copy()
    open_graph.add_nodes_from(graph.nodes)
    reached = nx.node_connected_component(open_graph, 0)
    newest = sorted(reached - {0}) or [0]
    closed = set(range(n_locked_doors))
    while closed:
        frontier = sorted(door for door in closed if locked[door][0] in reached or locked[door][1] in reached)
        door = rng.choice(frontier)
        item_rooms[door] = rng.choice(newest)
        closed.discard(door)
        open_graph.add_edge(*locked[door])
        grown = nx.node_connected_component(open_graph, 0)
        newest = sorted(grown - reached) or newest  # a door inside the region opens nothing new
        reached = grown
    for item in range(n_locked_doors, n_locked_doors + n_distractors):
        item_rooms[item] = rng.randrange(n_rooms)
    item_rooms[-1] = goal_room

    names = rng.sample(range(len(ADJECTIVES) * len(ROOM_NOUNS)), n_rooms)
    room_names = tuple(f"{ADJECTIVES[i // len(ROOM_NOUNS)]} {ROOM_NOUNS[i % len(ROOM_NOUNS)]}" for i in names)
    exits = []
    for room in range(n_rooms):
        x, y = pos[room]
        room_exits = {}
        for direction in DIRECTIONS:
            neighbour = cell_room.get((x + OFFSETS[direction][0], y + OFFSETS[direction][1]))
            if neighbour is not None and graph.has_edge(room, neighbour):
                room_exits[direction] = (neighbour, graph.edges[room, neighbour]["door"])
        exits.append(room_exits)
    nx.set_node_attributes(graph, {room: {"name": room_names[room], "pos": pos[room]} for room in range(n_rooms)})
    return MazeWorld(
        graph=graph,
        room_names=room_names,
        exits=tuple(exits),
        item_names=item_names,
        item_index={name: index for index, name in enumerate(item_names)},
        door_keys=tuple(range(n_locked_doors)),
        goal_item=len(item_names) - 1,
        start_room=0,
        initial_items=tuple(item_rooms),
    )


class MazeEnv(TextEnv):
    """Find the goal item in a world of rooms and take it; locked doors open with their own keys.

    Commands (exact grammar, case-insensitive; ``n/e/s/w`` and a bare direction also move)::

        go <north|east|south|west>
        take <item>            drop <item>
        unlock <direction> door with <key>
        look                   inventory

    The episode is won when the goal item is in the inventory. Keys are not used up and doors stay
    unlocked. ``info["admissible_actions"]`` lists the commands that succeed in the current state,
    and the anchor is ``room | inventory | unlocked doors | item locations``.

    Difficulty knobs:
        n_rooms: total number of rooms (2..400).
        n_locked_doors: locked doors, each with its own key (0..16); keys may lie behind other
            locked doors, so opening the way can take a chain of detours.
        extra_edges: extra passages between adjacent rooms, which make loops.
        dead_ends: how many of the rooms are one-exit side rooms off the core, never part of a loop
            (keys may hide there).
        n_distractors: useless items lying around.
        max_steps: step limit; ``None`` picks ``(2 * n_locked_doors + 1) * n_rooms + 10``, which is
            always enough for the shortest oracle.
        oracle: what ``oracle()`` plans. ``"shortest"``: a shortest winning plan, found with the whole
            map. ``"explore"``: the plan of an explorer that acts on the current observation alone,
            so a policy that sees it can clone the plan action for action (tree mazes only).
    """

    def __init__(
        self,
        *,
        n_rooms: int = 8,
        n_locked_doors: int = 2,
        extra_edges: int = 1,
        dead_ends: int = 2,
        n_distractors: int = 2,
        max_steps: int | None = None,
        oracle: str = "shortest",
        **base_kwargs: Any,
    ) -> None:
        if not 2 <= n_rooms <= len(ADJECTIVES) * len(ROOM_NOUNS):
            raise ValueError(f"n_rooms must be in [2, {len(ADJECTIVES) * len(ROOM_NOUNS)}], got {n_rooms}")
        if not 0 <= dead_ends <= n_rooms - 2:
            raise ValueError(f"dead_ends must be in [0, n_rooms - 2 = {n_rooms - 2}], got {dead_ends}")
        core_edges = n_rooms - dead_ends - 1
        if not 0 <= n_locked_doors <= min(len(KEY_NAMES), core_edges):
            raise ValueError(
                f"n_locked_doors must be in [0, {min(len(KEY_NAMES), core_edges)}] "
                f"(at most one per core passage and {len(KEY_NAMES)} keys), got {n_locked_doors}"
            )
        if extra_edges < 0:
            raise ValueError(f"extra_edges must be >= 0, got {extra_edges}")
        if not 0 <= n_distractors <= len(DISTRACTOR_NAMES):
            raise ValueError(f"n_distractors must be in [0, {len(DISTRACTOR_NAMES)}], got {n_distractors}")
        if oracle not in ORACLES:
            raise ValueError(f"oracle must be one of {ORACLES}, got {oracle!r}")
        if oracle == "explore" and extra_edges:
            raise ValueError(
                "oracle='explore' follows walls, which can circle a loop forever; it needs extra_edges=0, got "
                f"{extra_edges}"
            )
        if max_steps is None:
            max_steps = (2 * n_locked_doors + 1) * n_rooms + 10
        super().__init__(max_steps=max_steps, **base_kwargs)
        self.n_rooms = n_rooms
        self.n_locked_doors = n_locked_doors
        self.extra_edges = extra_edges
        self.dead_ends = dead_ends
        self.n_distractors = n_distractors
        self.oracle_kind = oracle
        self.world: MazeWorld | None = None
        self._room = 0
        self._unlocked = 0
        """Bit mask of unlocked doors."""
        self._items: tuple[int, ...] = ()
        """Per item: its room, or HELD."""
        self._last_passage: tuple[str, str] | None = None
        """``(verb, direction)`` when the last command went or unlocked a door that way, else None."""
        self._cache: dict[tuple, tuple[list[str], str]] = {}
        """Per state of this episode: (admissible actions, anchor)."""

    # ---- game ------------------------------------------------------------------------------------
    def _new_game(self, options: dict[str, Any] | None) -> str:
        rng = random.Random(int(self.np_random.integers(2**63)))
        self.world = generate_world(
            rng, self.n_rooms, self.n_locked_doors, self.extra_edges, self.dead_ends, self.n_distractors
        )
        self._room = self.world.start_room
        self._unlocked = 0
        self._items = self.world.initial_items
        self._last_passage = None
        self._cache = {}
        self.task = (
            f"Find the {self.world.item_names[self.world.goal_item]} and take it. "
            f"Locked doors open with the matching key. Commands: {GRAMMAR}."
        )
        return self._describe()

    def _apply(self, command: str) -> Transition:
        self._last_passage = None
        verb, _, rest = command.partition(" ")
        if verb in DIRECTION_ALIASES and not rest:
            verb, rest = "go", DIRECTION_ALIASES[verb]
        if verb == "go":
            return self._go(DIRECTION_ALIASES.get(rest, rest))
        if verb in ("take", "get"):
            return self._take(rest)
        if verb == "drop":
            return self._drop(rest)
        if verb == "unlock":
            return self._unlock(rest)
        if command in ("look", "l", "inventory", "i", "inv"):
            return Transition(self._describe())
        if not command:
            return self._invalid(f"Please type a command: {GRAMMAR}.")
        return self._invalid(f"I don't understand {command!r}. Commands: {GRAMMAR}.")

    def _go(self, direction: str) -> Transition:
        world = self.world
        if direction not in OFFSETS:
            return self._invalid(f"{direction!r} is not a direction; use north, east, south or west.")
        exit_ = world.exits[self._room].get(direction)
        if exit_ is None:
            return self._invalid(f"You can't go {direction} from here.")
        neighbour, door = exit_
        if door >= 0 and not self._unlocked >> door & 1:
            return self._invalid(f"The {direction} door is locked.")
        self._room = neighbour
        self._last_passage = ("go", direction)
        return Transition(self._describe(f"You go {direction}."))

    def _take(self, name: str) -> Transition:
        item = self.world.item_index.get(name)
        if item is None or self._items[item] != self._room:
            return self._invalid(f"There is no {name or 'such thing'} here.")
        self._items = (*self._items[:item], HELD, *self._items[item + 1 :])
        return Transition(self._describe(f"Taken: {name}."))

    def _drop(self, name: str) -> Transition:
        item = self.world.item_index.get(name)
        if item is None or self._items[item] != HELD:
            return self._invalid(f"You are not carrying {name or 'that'}.")
        self._items = (*self._items[:item], self._room, *self._items[item + 1 :])
        return Transition(self._describe(f"Dropped: {name}."))

    def _unlock(self, rest: str) -> Transition:
        target, _, key_name = rest.partition(" with ")
        direction = DIRECTION_ALIASES.get(target.removesuffix(" door").strip())
        if direction is None or not key_name:
            return self._invalid("Use: unlock <direction> door with <key>.")
        exit_ = self.world.exits[self._room].get(direction)
        if exit_ is None or exit_[1] < 0:
            return self._invalid(f"There is no door to the {direction}.")
        door = exit_[1]
        if self._unlocked >> door & 1:
            return self._invalid(f"The {direction} door is already unlocked.")
        key = self.world.item_index.get(key_name)
        if key is None or self._items[key] != HELD:
            return self._invalid(f"You are not carrying {key_name}.")
        if self.world.door_keys[door] != key:
            return self._invalid(f"The {key_name} does not fit the {direction} door.")
        self._unlocked |= 1 << door
        self._last_passage = ("unlock", direction)
        return Transition(self._describe(f"You unlock the {direction} door with the {key_name}."))

    def _invalid(self, message: str) -> Transition:
        return Transition(self._describe(message), valid=False, error=message)

    def _describe(self, message: str = "") -> str:
        world = self.world
        exits = []
        for direction, (_, door) in world.exits[self._room].items():
            if door < 0:
                exits.append(direction)
            else:
                exits.append(
                    f"{direction} (unlocked door)" if self._unlocked >> door & 1 else f"{direction} (locked door)"
                )
        here = sorted(world.item_names[i] for i, room in enumerate(self._items) if room == self._room)
        held = sorted(world.item_names[i] for i, room in enumerate(self._items) if room == HELD)
        lines = [message] if message else []
        lines += [
            f"You are in the {world.room_names[self._room]}.",
            f"Exits: {', '.join(exits)}.",
            f"You see: {', '.join(here) if here else 'nothing'}.",
            f"You are carrying: {', '.join(held) if held else 'nothing'}.",
        ]
        return "\n".join(lines)

    # ---- state queries ----------------------------------------------------------------------------
    def _state_facts(self) -> tuple[list[str], str]:
        state = (self._room, self._unlocked, self._items)
        facts = self._cache.get(state)
        if facts is None:
            facts = self._cache[state] = (self._compute_admissible(), self._compute_anchor())
        return facts

    def _compute_admissible(self) -> list[str]:
        world = self.world
        names = world.item_names
        held = [i for i, room in enumerate(self._items) if room == HELD]
        actions = []
        for direction, (_, door) in world.exits[self._room].items():
            if door < 0 or self._unlocked >> door & 1:
                actions.append(f"go {direction}")
            elif world.door_keys[door] in held:
                actions.append(f"unlock {direction} door with {names[world.door_keys[door]]}")
        actions += sorted(f"take {names[i]}" for i, room in enumerate(self._items) if room == self._room)
        actions += sorted(f"drop {names[i]}" for i in held)
        actions += ["look", "inventory"]
        return actions

    def _compute_anchor(self) -> str:
        names = self.world.item_names
        held = "+".join(sorted(names[i] for i, room in enumerate(self._items) if room == HELD))
        unlocked = ",".join(str(d) for d in range(self.n_locked_doors) if self._unlocked >> d & 1)
        items = ",".join(map(str, self._items))
        return f"room={self._room};inventory={held};unlocked={unlocked};items={items}"

    def admissible_actions(self) -> list[str]:
        return list(self._state_facts()[0])

    def instance_key(self) -> str:
        """Passages (locked ones with their key's cell), distractor cells and the goal cell, all by grid
        cell. Names are left out: a renamed copy of a maze has the same layout and the same plan."""
        world = self.world
        cells = nx.get_node_attributes(world.graph, "pos")
        item_cells = [cells[room] for room in world.initial_items]
        passages = sorted(
            "-".join(map(str, sorted((cells[a], cells[b]))))
            + (f" key@{item_cells[world.door_keys[door]]}" if door >= 0 else "")
            for a, b, door in world.graph.edges(data="door")
        )
        distractors = sorted(item_cells[self.n_locked_doors : world.goal_item])
        return f"passages={passages};distractors={distractors};goal={item_cells[world.goal_item]}"

    def anchor(self) -> str:
        return self._state_facts()[1]

    def is_won(self) -> bool:
        return self._items[self.world.goal_item] == HELD

    def oracle(self) -> list[str]:
        """A winning plan from the current state: the shortest one, or the explorer's (``oracle`` argument)."""
        return self._explore_plan() if self.oracle_kind == "explore" else self._shortest_plan()

    def _explore_action(self) -> str:
        """The explorer's command, a function of the current observation (whose first line tells how
        the player got here): take the goal or a key in sight, unlock a door it holds the key of, walk
        through a door it just unlocked, else follow the right-hand wall (the first exit clockwise
        after the one it came in by; after any other command, the first exit in compass order). On a
        tree that visits every reachable room, so it always wins."""
        admissible = self._state_facts()[0]
        goal = f"take {self.world.item_names[self.world.goal_item]}"
        takes = [a for a in admissible if a == goal] + [
            a for a in admissible if a.startswith("take ") and a.endswith(" key")
        ]
        unlocks = [a for a in admissible if a.startswith("unlock ")]
        if takes or unlocks:
            return (takes + unlocks)[0]
        verb, direction = self._last_passage or ("", "")
        if verb == "unlock":
            return f"go {direction}"
        first = (DIRECTIONS.index(OPPOSITE[direction]) + 1) if verb == "go" else 0
        open_exits = {a.removeprefix("go ") for a in admissible if a.startswith("go ")}
        return next(f"go {d}" for d in DIRECTIONS[first:] + DIRECTIONS[:first] if d in open_exits)

    def _explore_state(self) -> tuple:
        """What the explorer's next command depends on, and all a simulated command changes."""
        return self._room, self._unlocked, self._items, self._last_passage

    def _explore_plan(self) -> list[str]:
        """The explorer's commands until it wins, simulated on this episode and undone."""
        saved = self._explore_state()
        plan: list[str] = []
        seen = set()
        try:
            while not self.is_won():
                state = self._explore_state()
                if state in seen:
                    raise RuntimeError("the explorer circles in this maze (it needs a tree; this is a bug)")
                seen.add(state)
                plan.append(self._explore_action())
                self._apply(plan[-1])
        finally:
            self._room, self._unlocked, self._items, self._last_passage = saved
        return plan

    def _shortest_plan(self) -> list[str]:
        """Shortest winning plan by BFS over (room, held keys and goal, unlocked doors).

        Dropping, looking and taking distractors never shorten a plan (the inventory is unbounded and
        keys are not used up), so the search leaves them out and still finds a shortest plan.
        """
        world = self.world
        useful = [*world.door_keys, world.goal_item]
        held = sum(1 << i for i, item in enumerate(useful) if self._items[item] == HELD)
        goal_bit = 1 << (len(useful) - 1)
        start = (self._room, held, self._unlocked)
        parent: dict[tuple[int, int, int], tuple[tuple[int, int, int], str] | None] = {start: None}
        queue = deque([start])
        while queue:
            state = queue.popleft()
            room, held, unlocked = state
            if held & goal_bit:
                plan = []
                while parent[state] is not None:
                    state, command = parent[state]
                    plan.append(command)
                return plan[::-1]
            moves = []
            for bit, item in enumerate(useful):
                if not held >> bit & 1 and self._items[item] == room:
                    moves.append(((room, held | 1 << bit, unlocked), f"take {world.item_names[item]}"))
            for direction, (neighbour, door) in world.exits[room].items():
                if door < 0 or unlocked >> door & 1:
                    moves.append(((neighbour, held, unlocked), f"go {direction}"))
                elif held >> door & 1:  # keys are the first useful items, in door order
                    key_name = world.item_names[world.door_keys[door]]
                    moves.append(((room, held, unlocked | 1 << door), f"unlock {direction} door with {key_name}"))
            for nxt, command in moves:
                if nxt not in parent:
                    parent[nxt] = (state, command)
                    queue.append(nxt)
        raise RuntimeError("the maze has no solution from this state (generation guarantees one; this is a bug)")
