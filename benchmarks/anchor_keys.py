"""Benchmark of the anchors package: keys + grouping, fingerprints, similarity clustering.

Writes benchmarks/results/anchor_keys.json. Run: ``python -m agent_rl.benchmarks.anchor_keys`` (add ``--quick``
for a small smoke run). Every corpus is synthetic but shaped like real rollouts and is generated from a
fixed seed, so runs are comparable.
"""

from __future__ import annotations

import argparse
import difflib
import time
from pathlib import Path

import numpy as np  # noqa: E402
from rich.console import Console
from rich.progress import Progress  # noqa: E402

from agent_rl.anchors import cluster_similar, compute_anchor_keys, error_fingerprint, group_steps  # noqa: E402
from agent_rl.benchmarks.common import write_result
from agent_rl.envs.minicode_lang import compile_program, run  # noqa: E402

console = Console()

ADJECTIVES = "damp sunny narrow dusty ancient quiet flooded frozen gilded crooked smoky silent".split()
PLACES = "cellar kitchen hallway library armory chapel vault garden tower crypt stable attic".split()
OBJECTS = "lantern rusty-key scroll dagger goblet map rope shield coin-purse mirror skull candle".split()
IDENTIFIERS = "count total idx user_id parse_row buf tmp result helper node cfg items".split()


def rollout_rows(n_rows: int, rng: np.random.Generator) -> dict[str, list]:
    """Rows of a GRPO batch: 8 trajectories per group, each group its own maze of 40 rooms; a
    quarter of the steps carry tool-style error text."""
    rows_per_group = 1000
    n_groups = max(1, n_rows // rows_per_group)
    group_ids = np.repeat(np.arange(n_groups), rows_per_group)[:n_rows]
    rooms = rng.integers(0, 40, n_rows)
    keys_held = rng.integers(0, 3, n_rows)
    observations = [
        f"Maze {g}, room {r}. You hold {k} keys. Exits lead {'north and east' if r % 2 else 'south and west'}."
        for g, r, k in zip(group_ids.tolist(), rooms.tolist(), keys_held.tolist())
    ]
    states = [f"{g}:{r}:{k}" for g, r, k in zip(group_ids.tolist(), rooms.tolist(), keys_held.tolist())]
    error_pool = error_corpus(200, np.random.default_rng(1))
    has_error = rng.random(n_rows) < 0.25
    picks = rng.integers(0, len(error_pool), n_rows)
    errors = [error_pool[p] if e else None for p, e in zip(picks.tolist(), has_error.tolist())]
    return {"group_ids": group_ids, "observations": observations, "states": states, "errors": errors}


def minicode_diagnostic(source: str) -> str:
    compiled = compile_program(source, ("a", "b"))
    if not hasattr(compiled, "ops"):
        return compiled.render(source)
    try:
        run(compiled, (3, 4))
    except Exception as error:  # MiniCodeError from the interpreter
        return error.render(source)
    return f"wrong answer: input (3, 4): expected 11, got {len(source)}"


def error_corpus(n: int, rng: np.random.Generator) -> list[str]:
    """Realistic tool feedback: Python tracebacks, gcc, rustc, javac, tsc, go, pytest, shell and
    MiniCode, each family with random names, numbers and paths."""

    def name() -> str:
        return str(rng.choice(IDENTIFIERS)) + str(rng.integers(0, 50)) * int(rng.random() < 0.5)

    def num(high: int = 400) -> int:
        return int(rng.integers(1, high))

    path = lambda ext: f"/tmp/run{num(9999)}/{rng.choice(['src', 'lib', 'app'])}/{name()}.{ext}"  # noqa: E731
    families = [
        lambda: (
            "Traceback (most recent call last):\n"
            f'  File "{path("py")}", line {num()}, in <module>\n    main()\n'
            f'  File "{path("py")}", line {num()}, in main\n    return {name()}(rows)\n'
            f"KeyError: '{name()}'"
        ),
        lambda: (
            f"{path('c')}:{num()}:{num(80)}: error: '{name()}' undeclared (first use in this function)\n"
            f"  {num()} |     {name()} = {num()};\n      |     ^~~~~"
        ),
        lambda: (
            f"error[E0308]: mismatched types\n --> {path('rs')}:{num()}:{num(80)}\n  |\n"
            f'{num()} |     let x: i32 = "{name()}";\n  |                  ^^^ expected `i32`, found `&str`\n\n'
            f"error: aborting due to {num(5)} previous errors"
        ),
        lambda: (
            f"{path('java')}:{num()}: error: cannot find symbol\n        {name()}();\n        ^\n"
            f"  symbol:   method {name()}()\n  location: class Main\n1 error"
        ),
        lambda: f"{path('ts')}({num()},{num(80)}): error TS2322: Type 'string' is not assignable to type 'number'.",
        lambda: f"# command-line-arguments\n./{name()}.go:{num()}:{num(40)}: undefined: {name()}",
        lambda: (
            f"E       assert {num()} == {num()}\n\n{path('py')}:{num()}: AssertionError\n"
            f"=== 1 failed, {num(30)} passed in {rng.random():.2f}s ==="
        ),
        lambda: f"bash: {name()}: command not found",
        lambda: (
            f"Segmentation fault at 0x{rng.integers(1 << 40):x} (pid {num(99999)}) on "
            f"2025-0{num(9)}-1{num(9)} 1{num(9)}:{num(59):02d}:{num(59):02d}"
        ),
        lambda: minicode_diagnostic(f"a {name()} add"),
        lambda: minicode_diagnostic("add " * num(3)),
        lambda: minicode_diagnostic(f"a b {'add' if rng.random() < 0.5 else 'mul'}"),
    ]
    return [families[i % len(families)]() for i in range(n)]


def pseudo_word(rng: np.random.Generator) -> str:
    syllables = ["ka", "lo", "mir", "tha", "ven", "dru", "sel", "or", "qui", "zan", "bel", "rok", "ith", "um"]
    return "".join(rng.choice(syllables, int(rng.integers(2, 4))))


def scene_observations(n: int, n_scenes: int, rng: np.random.Generator) -> tuple[list[str], np.ndarray]:
    """High-entropy game observations: one of ``n_scenes`` room descriptions (names and details drawn
    from a large made-up vocabulary, as in generated text worlds) plus per-step counters, so
    observations of one room are near-duplicates that never repeat exactly."""
    scenes = []
    for _ in range(n_scenes):
        adjective, place = rng.choice(ADJECTIVES), rng.choice(PLACES)
        objects = ", ".join(rng.choice(OBJECTS, 2, replace=False))
        exits = " and ".join(rng.choice(["north", "south", "east", "west", "up", "down"], 2, replace=False))
        scenes.append(
            f"You are in the {adjective} {place} of {pseudo_word(rng).title()}. A {pseudo_word(rng)} "
            f"{pseudo_word(rng)} rests near the {pseudo_word(rng)}. You see {objects}. Exits: {exits}."
        )
    truth = rng.integers(0, n_scenes, n)
    turns, health, gold = rng.integers(1, 200, n), rng.integers(1, 21, n), rng.integers(0, 999, n)
    observations = [
        f"Turn {t}. Health {h}/20. Gold {g}. {scenes[s]}"
        for t, h, g, s in zip(turns.tolist(), health.tolist(), gold.tolist(), truth.tolist())
    ]
    return observations, truth


def difflib_first_fit(texts: list[str], threshold: float, time_cap_s: float) -> tuple[np.ndarray, int, float]:
    """The GiGPO reference fallback: each text joins the first cluster whose representative has
    ``SequenceMatcher.ratio() >= threshold``, else founds a cluster. Stops after ``time_cap_s``;
    returns (labels of the processed prefix, texts processed, seconds)."""
    representatives: list[str] = []
    labels = []
    start = time.perf_counter()
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("difflib first-fit", total=len(texts))
        for text in texts:
            for cluster, representative in enumerate(representatives):
                if difflib.SequenceMatcher(None, text, representative).ratio() >= threshold:
                    labels.append(cluster)
                    break
            else:
                labels.append(len(representatives))
                representatives.append(text)
            progress.advance(task)
            if time.perf_counter() - start > time_cap_s:
                break
    return np.array(labels), len(labels), time.perf_counter() - start


def pair_agreement(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
    """Adjusted Rand index, and precision/recall of a's same-cluster pairs against b's."""
    _, a = np.unique(a, return_inverse=True)
    _, b = np.unique(b, return_inverse=True)
    cells = np.sort(a * (b.max() + 1) + b)  # the nonzero cells of the contingency table, sparse
    cell_sizes = np.diff(np.flatnonzero(np.concatenate(([True], cells[1:] != cells[:-1], [True]))))
    pairs = lambda x: (x * (x - 1) // 2).sum()  # noqa: E731
    both, in_a, in_b, total = pairs(cell_sizes), pairs(np.bincount(a)), pairs(np.bincount(b)), pairs(np.array([len(a)]))
    expected = in_a * in_b / total
    return {
        "adjusted_rand_index": float((both - expected) / (0.5 * (in_a + in_b) - expected)),
        "pair_precision": float(both / in_a) if in_a else 1.0,
        "pair_recall": float(both / in_b) if in_b else 1.0,
    }


def timed(function, repeats: int = 1):
    """(result, best seconds over ``repeats`` calls)."""
    best, result = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        result = function()
        best = min(best, time.perf_counter() - start)
    return result, best


def bench_keys(n_rows: int) -> dict:
    console.log(f"keys + grouping: generating {n_rows:,} rollout rows")
    rows = rollout_rows(n_rows, np.random.default_rng(0))
    out = {"rows": n_rows, "unique_observations": len(set(rows["observations"]))}
    for kind in ("state", "observation", "fingerprint"):
        keys, key_s = timed(
            lambda: compute_anchor_keys(kind, rows["observations"], rows["errors"], rows["states"]), repeats=3
        )
        (_, stats), group_s = timed(lambda: group_steps(rows["group_ids"], keys), repeats=3)
        out[kind] = {
            "keys_s": round(key_s, 4),
            "group_s": round(group_s, 4),
            "total_s": round(key_s + group_s, 4),
            "n_step_groups": stats.n_groups,
            "frac_rows_in_groups_ge2": round(stats.frac_rows_in_groups_ge2, 4),
        }
        console.log(f"  {kind}: keys {key_s:.3f} s + grouping {group_s:.3f} s, {stats.n_groups:,} step groups")
    return out


def bench_fingerprints(n: int) -> dict:
    texts = error_corpus(n, np.random.default_rng(2))
    fingerprints, seconds = timed(lambda: [error_fingerprint(text) for text in texts], repeats=3)
    result = {
        "texts": n,
        "seconds": round(seconds, 4),
        "fingerprints_per_s": round(n / seconds),
        "mean_chars": round(float(np.mean([len(t) for t in texts])), 1),
        "distinct_texts": len(set(texts)),
        "distinct_fingerprints": len(set(fingerprints)),
    }
    console.log(
        f"fingerprints: {result['fingerprints_per_s']:,}/s; {result['distinct_texts']:,} texts -> "
        f"{result['distinct_fingerprints']} templates"
    )
    return result


def bench_similarity(n: int, n_scenes: int) -> dict:
    observations, truth = scene_observations(n, n_scenes, np.random.default_rng(3))
    ids, seconds = timed(lambda: cluster_similar(observations, threshold=0.8), repeats=2)
    group_ids = np.arange(n) // 100
    grouped_ids, grouped_seconds = timed(
        lambda: cluster_similar(observations, threshold=0.8, groups=group_ids), repeats=2
    )
    result = {
        "observations": n,
        "true_scenes": n_scenes,
        "seconds": round(seconds, 3),
        "clusters": int(ids.max() + 1),
        "agreement_with_true_scenes": pair_agreement(ids, truth),
        "per_group_groups": int(group_ids.max() + 1),
        "per_group_seconds": round(grouped_seconds, 3),
        "per_group_agreement_with_true_scenes": pair_agreement(grouped_ids, group_ids * n_scenes + truth),
    }
    console.log(
        f"similarity: {n:,} observations in {seconds:.2f} s -> {result['clusters']} clusters ({n_scenes} scenes)"
    )
    return result


def bench_difflib(n: int, n_scenes: int, time_cap_s: float) -> dict:
    observations, truth = scene_observations(n, n_scenes, np.random.default_rng(4))
    minhash_ids, minhash_s = timed(lambda: cluster_similar(observations, threshold=0.8), repeats=3)
    difflib_ids, processed, difflib_s = difflib_first_fit(observations, 0.8, time_cap_s)
    # First-fit cost grows with the number of clusters founded so far; a capped run extrapolates
    # linearly in texts, which underestimates the full run.
    difflib_full_s = difflib_s * n / processed
    _, prefix_minhash_s = timed(lambda: cluster_similar(observations[:processed], threshold=0.8), repeats=3)
    result = {
        "observations": n,
        "true_scenes": n_scenes,
        "threshold": 0.8,
        "minhash_s": round(minhash_s, 4),
        "difflib_s": round(difflib_s, 2),
        "difflib_texts_processed": processed,
        "difflib_extrapolated": processed < n,
        "difflib_full_s_estimate": round(difflib_full_s, 2),
        "speedup": round(difflib_full_s / minhash_s, 1),
        "speedup_measured_on_processed": round(difflib_s / prefix_minhash_s, 1),
        "agreement_minhash_vs_difflib_on_processed": pair_agreement(minhash_ids[:processed], difflib_ids),
        "minhash_vs_true_scenes": pair_agreement(minhash_ids, truth),
        "difflib_vs_true_scenes_on_processed": pair_agreement(difflib_ids, truth[:processed]),
    }
    console.log(
        f"difflib: {processed}/{n} texts in {difflib_s:.1f} s (full ~{difflib_full_s:.1f} s) vs MinHash "
        f"{minhash_s:.3f} s:"
        f" {result['speedup']}x, ARI {result['agreement_minhash_vs_difflib_on_processed']['adjusted_rand_index']:.3f}"
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("--difflib-cap", type=float, default=120.0, help="seconds before the difflib run stops")
    parser.add_argument("--out", type=Path, default=None, help="results directory")
    args = parser.parse_args()
    scale = 100 if args.quick else 1
    results = {
        "keys_and_grouping": bench_keys(1_000_000 // scale),
        "fingerprints": bench_fingerprints(20_000 // scale),
        "similarity": bench_similarity(100_000 // scale, 2000 // scale),
        "difflib_comparison": bench_difflib(5000 // scale, 250 // scale, args.difflib_cap),
    }
    console.log(f"wrote {write_result('anchor_keys', results, args.out)}")


if __name__ == "__main__":
    main()
