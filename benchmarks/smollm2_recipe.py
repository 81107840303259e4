"""SmolLM2-135M-Instruct trained with the ``smollm2-maze`` recipe: learning curve, phase times, throughput.

Runs ``agent-rl train --config smollm2-maze`` (plus any ``key=value`` overrides) in this process
and writes, under ``--out`` (default ``benchmarks/results/smollm2_recipe``):
- ``run/``: the run's ``metrics.jsonl`` and ``config.yaml`` (its checkpoints, 0.5 GB each, are deleted);
- ``smollm2_recipe.json``:
  - the machine's float32 matmul peak (torch, 2048 x 2048 x 2048, best of 5, measured before the run);
  - held-out greedy success by iteration against the zero-shot baseline of
    ``benchmarks/results/smollm2_zero_shot.json`` (the same environment and parser);
  - seconds per phase (rollout, advantages, update, weight sync, evaluation) and the wall time, which
    also holds loading, starting the engine and the warm start;
  - rollout tokens/s, the learner's forwarded tokens/s and its achieved FLOP/s, estimated as
    6 x non-embedding parameters x forwarded tokens / update seconds (the usual dense-transformer
    count: attention and the output layer, which the learner applies to response tokens only, are
    left out, so it errs low; 4 x with LoRA adapters, whose frozen weights need no weight gradients),
    as a fraction of the matmul peak.

    python -m agent_rl.benchmarks.smollm2_recipe
    python -m agent_rl.benchmarks.smollm2_recipe --out /tmp/recipe trainer.iterations=1 sft.steps=2   # a short check
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console

from agent_rl.benchmarks.common import RESULTS_DIR, best_of, write_result
from agent_rl.config import load_config
from agent_rl.training.infra.logger import read_metrics
from agent_rl.training.loop.trainer import train
from agent_rl.training.models.policy import load_policy

RECIPE = "smollm2-maze"
PHASES = ("rollout", "advantage", "update", "sync", "eval")


def matmul_peak_flops(size: int = 2048, repeats: int = 5) -> float:
    """Float32 FLOP/s of one ``size``-cubed matmul, best of ``repeats``."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    return 2 * size**3 / best_of(lambda: a @ b, repeats)


def zero_shot_baseline(config) -> dict[str, Any] | None:
    """The committed zero-shot cell of the recipe's environment and parser, if there is one."""
    path = RESULTS_DIR / "smollm2_zero_shot.json"
    if not path.is_file():
        return None
    for cell in json.loads(path.read_text())["cells"]:
        if (
            cell["env_id"] == config.env.id
            and cell["env_kwargs"] == config.env.kwargs
            and cell["parser"] == config.rollout.parser
        ):
            return cell
    return None


def summarize(
    records: list[dict[str, Any]], non_embedding_parameters: int, peak: float, weight_gradients: bool = True
) -> dict[str, Any]:
    """Curve, phase seconds and throughput of a finished run's metrics records; a forwarded token
    costs 2 FLOPs per non-embedding parameter forward, 2 for activation gradients and, unless the
    weights are frozen (``weight_gradients=False``, LoRA), 2 for weight gradients."""
    evals = [r for r in records if "eval/greedy_success" in r]
    iterations = [r for r in records if r["iteration"] > 0]
    phase_seconds = {phase: float(sum(r.get(f"time/{phase}", 0.0) for r in records)) for phase in PHASES}
    update_seconds = phase_seconds["update"]
    forwarded = float(sum(r.get("update/forwarded_tokens", 0.0) for r in iterations))
    generated = float(sum(r["rollout/tokens_per_s"] * r["time/rollout"] for r in iterations))
    flops = (6 if weight_gradients else 4) * non_embedding_parameters * forwarded
    learner_flops = flops / update_seconds if update_seconds else 0.0
    return {
        "curve": {
            "iteration": [r["iteration"] for r in evals],
            "elapsed_s": [r["time/elapsed"] for r in evals],
            "greedy_success": [r["eval/greedy_success"] for r in evals],
            "greedy_invalid_rate": [r.get("eval/greedy_invalid_rate") for r in evals],
            "sampled_success": [r.get("eval/sampled_success") for r in evals],
        },
        "train_success": [r["rollout/success_rate"] for r in iterations],
        "train_invalid_rate": [r["rollout/invalid_rate"] for r in iterations],
        "warm_start": {k: v for k, v in records[0].items() if k.startswith("sft/")} if records else {},
        "wall_s": records[-1]["time/elapsed"] if records else 0.0,
        "phase_seconds": phase_seconds,
        "mean_phase_seconds_per_iteration": {
            p: phase_seconds[p] / max(len(iterations), 1) for p in PHASES if p != "eval"
        },
        "rollout_tokens_generated": generated,
        "rollout_tokens_per_s": generated / phase_seconds["rollout"] if phase_seconds["rollout"] else 0.0,
        "learner_forwarded_tokens": forwarded,
        "learner_tokens_per_s": forwarded / update_seconds if update_seconds else 0.0,
        "learner_flops_per_s": learner_flops,
        "learner_fraction_of_matmul_peak": learner_flops / peak if peak else 0.0,
        "ratio_max": max((r.get("update/ratio_max", 1.0) for r in iterations), default=1.0),
        "clip_frac_mean": float(np.mean([r.get("update/clip_frac", 0.0) for r in iterations])) if iterations else 0.0,
    }


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "smollm2_recipe", help="results directory")
    parser.add_argument(
        "--from-run",
        type=Path,
        metavar="RUN_DIR",
        help="summarize this existing run of the recipe (copied to OUT/run) instead of training",
    )
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="recipe overrides")
    args = parser.parse_args(argv)
    console = Console()
    run_dir = args.out / "run"
    peak = matmul_peak_flops()
    console.print(f"float32 matmul peak: {peak / 1e9:.1f} GFLOP/s")
    if args.from_run is not None:
        if args.from_run.resolve() != run_dir.resolve():
            run_dir.mkdir(parents=True, exist_ok=True)
            for name in ("metrics.jsonl", "config.yaml"):
                shutil.copy(args.from_run / name, run_dir / name)
        config = load_config(run_dir / "config.yaml")
        model, _ = load_policy(config.policy.name_or_path)
    else:
        if run_dir.exists():
            shutil.rmtree(run_dir)
        config = load_config(RECIPE, [*args.overrides, f"trainer.run_dir={run_dir}"])
        model, tokenizer = load_policy(config.policy.name_or_path)
        train(config, model=model, tokenizer=tokenizer)
        shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)  # 0.5 GB each
        shutil.rmtree(run_dir / "tensorboard", ignore_errors=True)  # metrics.jsonl holds the same scalars
    records = read_metrics(run_dir)
    parameters = sum(p.numel() for p in model.parameters())
    non_embedding = parameters - model.get_input_embeddings().weight.numel()
    result = {
        "recipe": RECIPE,
        "overrides": args.overrides,
        "parameters": parameters,
        "non_embedding_parameters": non_embedding,
        "matmul_peak_flops_per_s": peak,
        "best_greedy_success": max(
            (r["eval/greedy_success"] for r in records if "eval/greedy_success" in r), default=None
        ),
        "zero_shot": zero_shot_baseline(config),
        **summarize(records, non_embedding, peak, weight_gradients=not config.policy.lora_rank),
    }
    path = write_result("smollm2_recipe", result, args.out)
    console.print(f"wrote {path}")
    return path


if __name__ == "__main__":
    main()
