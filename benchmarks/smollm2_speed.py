"""What each speed lever saves on an RL iteration of SmolLM2-135M-Instruct on the CPU, and whether
bf16 pays on the main job's embedded model.

Part ``smollm2``: one warm start of the ``smollm2-maze`` recipe, then one short RL run per arm from
it: the same seed, the same recipe settings, and only the arm's overrides changed. Arms run one
after another, each in its own process (an in-process vLLM engine pins that process's threads), so
their times compare within one run of this script. Per arm (``OUT/smollm2_speed.json``):
- mean seconds per RL iteration and per phase (rollout, advantages, update, weight sync), and the
  seconds the baseline's workload would take at the arm's rates (:func:`add_speedups`);
- the greedy evaluation's seconds per episode (``--eval-episodes`` held-out mazes, at the end);
- rollout generated tokens/s; the learner's forwarded tokens/s and FLOP/s (the count of
  ``agent_rl.benchmarks.smollm2_recipe.summarize``), against the float32 and bfloat16 matmul peaks measured
  before the runs;
- speed-ups over the first arm.
Besides the arms: the warm start's seconds in float32 and under bf16 autocast (the same steps), and
the logprob parity of ``agent_rl.benchmarks.gpu_check.parity`` on the CPU (hf engine against the learner, in
bf16 and float32).

Part ``tiny``: the main job (``agent-rl train`` with no ``--config``) in float32 and bf16, a shorter
warm start and two RL iterations each (:func:`tiny_main_job`).

    python -m agent_rl.benchmarks.smollm2_speed                      # both parts (about an hour on 2 cores)
    python -m agent_rl.benchmarks.smollm2_speed --parts tiny         # one part; the file keeps the other
    python -m agent_rl.benchmarks.smollm2_speed --report             # summarize the SmolLM2 runs' logs again
    python -m agent_rl.benchmarks.smollm2_speed --out /tmp/speed --parts smollm2 --arms fp32-hf,bf16-hf \\
        --iterations 1 --eval-episodes 2 sft.steps=2 sft.episodes=2          # a short check
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from agent_rl.benchmarks.common import RESULTS_DIR, machine_info, runs_stop_with_this_process, write_result

RECIPE = "smollm2-maze"
MEASURED_WITH = ("rollout.history_turns=1",)
"""The recipe's shapes as the committed result measured them: one history turn in every prompt (the
recipe now shows none, which is what the ``history0`` arm measures)."""
ARMS: dict[str, tuple[str, ...]] = {
    "fp32-vllm": ("engine=vllm", "policy.precision=fp32"),
    "bf16-vllm": ("engine=vllm", "policy.precision=bf16"),
    "fp32-hf": ("engine=hf", "policy.precision=fp32"),
    "bf16-hf": ("engine=hf", "policy.precision=bf16"),
    "bf16-vllm-lora16": ("engine=vllm", "policy.precision=bf16", "policy.lora_rank=16"),
    "bf16-vllm-history0": ("engine=vllm", "policy.precision=bf16", "rollout.history_turns=0"),
}
"""Arm name -> recipe overrides. The first is the baseline: the recipe in float32 on the vllm engine
(what ``engine: auto`` picks where vLLM is installed). ``lora16`` trains rank-16 adapters and generates
from the merged weights; ``history0`` shows no past turn (shorter prompts; the warm start was cloned
with one, so its episodes may differ, and the per-token rates are the figures to compare)."""
PARTS = ("smollm2", "tiny")
"""``smollm2``: the SmolLM2 warm starts, parity and arms; ``tiny``: the main job's embedded model in
float32 and bf16 (:func:`tiny_main_job`)."""
PARITY_SIZES = {"prompts": 8, "samples": 2, "max_new_tokens": 12}


def run_train(
    overrides: list[str], run_dir: Path, console: Console, recipe: str | None = RECIPE
) -> list[dict[str, Any]]:
    """``agent-rl train --config recipe`` (no ``--config`` when None: the main job) in a fresh
    process; its metrics records."""
    from agent_rl.training.infra.logger import read_metrics

    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    command = [
        sys.executable,
        "-m",
        "agent_rl.cli",
        "train",
        *(["--config", recipe] if recipe else []),
        *overrides,
        f"trainer.run_dir={run_dir}",
        "logging.tensorboard=false",
        "logging.console=false",
    ]
    with (run_dir / "train.log").open("w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        with runs_stop_with_this_process(lambda: [process]):
            code = process.wait()
    if code != 0:
        raise RuntimeError(f"{' '.join(command)} failed (exit code {code}); its log: {run_dir / 'train.log'}")
    console.print(f"  done: {run_dir}")
    return read_metrics(run_dir)


def tiny_main_job(out: Path, steps: int, console: Console) -> dict[str, Any]:
    """The main job (the embedded model, ``agent-rl train`` with no ``--config``) in float32 and
    under bf16 autocast: a warm start of ``steps`` cloning steps, then two RL iterations; its seconds,
    token accuracy and the learner's forwarded tokens/s."""
    result: dict[str, Any] = {"sft_steps": steps}
    for precision in ("fp32", "bf16"):
        console.print(f"main job, embedded model ({precision})")
        run_dir = out / "tiny" / precision
        records = run_train(
            [
                f"policy.precision={precision}",
                f"sft.steps={steps}",
                f"sft.episodes={steps * 4}",
                "trainer.iterations=2",
                "trainer.eval_first=false",
                "trainer.eval_every=0",
                "trainer.eval_episodes=8",
                "trainer.target_success=null",
            ],
            run_dir,
            console,
            recipe=None,
        )
        shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
        iterations = records[1:]
        update_s = sum(r["time/update"] for r in iterations)
        result[precision] = {
            "warm_start_s": records[0]["time/elapsed"],
            "sft/token_accuracy": records[0]["sft/token_accuracy"],
            "sft/loss": records[0]["sft/loss"],
            "learner_tokens_per_s": sum(r["update/forwarded_tokens"] for r in iterations) / update_s
            if update_s
            else None,
            "rollout_s_per_iteration": sum(r["time/rollout"] for r in iterations) / len(iterations),
        }
    result["warm_start_speedup_bf16"] = result["fp32"]["warm_start_s"] / result["bf16"]["warm_start_s"]
    return result


def arm_summary(
    records: list[dict[str, Any]], non_embedding: int, peaks: dict[str, float], lora: bool, eval_episodes: int
) -> dict[str, Any]:
    """Per-iteration phase means, rates and FLOP/s of one arm's run."""
    from agent_rl.benchmarks.smollm2_recipe import summarize

    summary = summarize(records, non_embedding, peaks["float32"], weight_gradients=not lora)
    iterations = [r for r in records if r["iteration"] > 0]
    evals = [r for r in records if "eval/greedy_success" in r]
    phases = summary["mean_phase_seconds_per_iteration"]
    rows = sum(r["rollout/rows"] for r in iterations)
    return {
        "iterations": len(iterations),
        "iteration_s": sum(phases.values()),
        "phase_s": phases,
        "rows_per_iteration": rows / len(iterations),
        "forwarded_tokens_per_row": summary["learner_forwarded_tokens"] / rows,
        "rollout_rows_per_s": rows / summary["phase_seconds"]["rollout"],
        "rollout_tokens_per_s": summary["rollout_tokens_per_s"],
        "learner_tokens_per_s": summary["learner_tokens_per_s"],
        "learner_flops_per_s": summary["learner_flops_per_s"],
        "learner_fraction_of_fp32_peak": summary["learner_flops_per_s"] / peaks["float32"],
        "learner_fraction_of_bf16_peak": summary["learner_flops_per_s"] / peaks["bfloat16"],
        "eval_s_per_episode": summary["phase_seconds"]["eval"] / eval_episodes,
        "eval_greedy_success": evals[-1]["eval/greedy_success"] if evals else None,
        "train_success": summary["train_success"],
    }


def add_speedups(arms: dict[str, dict[str, Any]], baseline: str) -> None:
    """Each arm's speed-up over ``baseline``: per iteration as run, per evaluation episode, and on the
    baseline's workload (its rollout rows and forwarded tokens per iteration at this arm's rates, plus
    this arm's advantage and sync seconds), since arms that sample differently learn from different
    rows and an iteration's update forwards only rows with a nonzero advantage."""
    base = arms[baseline]
    forwarded = base["rows_per_iteration"] * base["forwarded_tokens_per_row"]
    for arm in arms.values():
        update_s = forwarded / arm["learner_tokens_per_s"] if arm["learner_tokens_per_s"] else 0.0  # no update ran
        arm["iteration_s_on_baseline_workload"] = (
            base["rows_per_iteration"] / arm["rollout_rows_per_s"]
            + update_s
            + arm["phase_s"]["advantage"]
            + arm["phase_s"]["sync"]
        )
    for arm in arms.values():
        arm["speedup_per_iteration"] = base["iteration_s"] / arm["iteration_s"]
        arm["speedup_on_baseline_workload"] = (
            base["iteration_s_on_baseline_workload"] / arm["iteration_s_on_baseline_workload"]
        )
        arm["speedup_per_eval_episode"] = base["eval_s_per_episode"] / arm["eval_s_per_episode"]


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "smollm2_speed", help="results directory")
    parser.add_argument(
        "--arms", default=",".join(ARMS), help=f"comma-separated arms of {list(ARMS)}; the first is the baseline"
    )
    parser.add_argument("--iterations", type=int, default=3, help="RL iterations per arm")
    parser.add_argument("--eval-episodes", type=int, default=32, help="greedy held-out episodes at each arm's end")
    parser.add_argument(
        "--parts",
        default=",".join(PARTS),
        help=f"comma-separated parts of {list(PARTS)}; the result file keeps the parts not rerun",
    )
    parser.add_argument(
        "--tiny-steps", type=int, default=300, help="cloning steps of the main job's warm start (tiny part)"
    )
    parser.add_argument(
        "--report",
        action="store_true",
        help="summarize the SmolLM2 runs already under --out again (their metrics.jsonl); train nothing",
    )
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="recipe overrides for every SmolLM2 run")
    args = parser.parse_args(argv)
    arms, parts = args.arms.split(","), args.parts.split(",")
    unknown = [arm for arm in arms if arm not in ARMS] + [part for part in parts if part not in PARTS]
    if unknown:
        parser.error(f"unknown arm(s) or part(s) {unknown}; arms: {list(ARMS)}, parts: {list(PARTS)}")
    from agent_rl.benchmarks.gpu_check import matmul_peak
    from agent_rl.training.infra.distributed import bf16_supported

    console = Console()
    path = args.out / "smollm2_speed.json"
    result = json.loads(path.read_text()) if path.is_file() else {}
    if args.report:
        result["smollm2"] = summarize_smollm2(args.out, result["smollm2"])
    else:
        cpu = torch.device("cpu")
        if not bf16_supported(cpu):
            raise SystemExit("smollm2_speed: this CPU has neither AVX512-BF16 nor AMX; the bf16 arms cannot run here")
        if "tiny" in parts:
            result["tiny"] = {"machine": machine_info(), **tiny_main_job(args.out, args.tiny_steps, console)}
        if "smollm2" in parts:
            peaks = {
                str(dtype).removeprefix("torch."): matmul_peak(cpu, dtype, 2048, 10) * 1e12
                for dtype in (torch.bfloat16, torch.float32)
            }
            console.print(
                f"matmul peaks: bf16 {peaks['bfloat16'] / 1e9:.0f}, fp32 {peaks['float32'] / 1e9:.0f} GFLOP/s"
            )
            result["smollm2"] = summarize_smollm2(args.out, train_smollm2(args, arms, peaks, console))
    for arm, r in result.get("smollm2", {}).get("arms", {}).items():
        console.print(
            f"{arm:>20}: {r['iteration_s']:6.1f} s/iteration ({r['speedup_per_iteration']:.2f}x; "
            f"{r['speedup_on_baseline_workload']:.2f}x on the baseline's workload), eval "
            f"{r['eval_s_per_episode']:.2f} s/episode, learner {r['learner_flops_per_s'] / 1e9:.0f} GFLOP/s"
        )
    result.pop("machine", None)  # each part holds the machine it ran on
    path = write_result("smollm2_speed", result, args.out)
    console.print(f"wrote {path}")
    return path


def train_smollm2(
    args: argparse.Namespace, arms: list[str], peaks: dict[str, float], console: Console
) -> dict[str, Any]:
    """The SmolLM2 runs: warm starts in both precisions, logprob parity, then the arms from the
    float32 warm start; what :func:`summarize_smollm2` needs besides the runs' logs."""
    from agent_rl.benchmarks.gpu_check import parity
    from agent_rl.training.infra import checkpoint
    from agent_rl.training.models.policy import load_policy

    recipe_overrides = [*MEASURED_WITH, *args.overrides]
    for precision in ("fp32", "bf16"):
        console.print(f"warm start ({precision})")
        run_train(
            [
                *recipe_overrides,
                "engine=hf",
                f"policy.precision={precision}",
                "trainer.iterations=0",
                "trainer.eval_first=false",
            ],
            args.out / "sft" / precision,
            console,
        )
    start_model = checkpoint.find_checkpoint(args.out / "sft" / "fp32", "sft").model_dir
    model, tokenizer = load_policy(str(start_model))
    non_embedding = sum(p.numel() for p in model.parameters()) - model.get_input_embeddings().weight.numel()
    console.print("parity (hf engine vs learner)")
    parity_result = parity(model, tokenizer, PARITY_SIZES)
    del model
    for arm in arms:
        console.print(f"arm {arm}")
        run_train(
            [
                *recipe_overrides,
                *ARMS[arm],
                f"policy={start_model}",
                "sft.mode=none",
                "trainer.eval_first=false",
                f"trainer.iterations={args.iterations}",
                f"trainer.eval_every={args.iterations}",
                f"trainer.eval_episodes={args.eval_episodes}",
                f"trainer.save_every={args.iterations}",
            ],
            args.out / "runs" / arm,
            console,
        )
        shutil.rmtree(args.out / "runs" / arm / "checkpoints", ignore_errors=True)  # 0.5 GB each
    for precision in ("fp32", "bf16"):
        shutil.rmtree(args.out / "sft" / precision / "checkpoints", ignore_errors=True)
    return {
        "machine": machine_info(),
        "recipe": RECIPE,
        "overrides": recipe_overrides,
        "arm_order": arms,
        "eval_episodes": args.eval_episodes,
        "matmul_peak_flops_per_s": peaks,
        "non_embedding_parameters": non_embedding,
        "parity": parity_result,
    }


def summarize_smollm2(out: Path, part: dict[str, Any]) -> dict[str, Any]:
    """``part`` (what :func:`train_smollm2` returned) with the warm starts and arms summarized from
    the runs' ``metrics.jsonl`` under ``out``."""
    from agent_rl.training.infra.logger import read_metrics

    warm = {}
    for precision in ("fp32", "bf16"):
        first = read_metrics(out / "sft" / precision)[0]
        warm[precision] = {"seconds": first["time/elapsed"], **{k: v for k, v in first.items() if k.startswith("sft/")}}
    arms = {}
    for arm in part["arm_order"]:
        records = read_metrics(out / "runs" / arm)
        arms[arm] = {
            "overrides": list(ARMS[arm]),
            **arm_summary(
                records,
                part["non_embedding_parameters"],
                part["matmul_peak_flops_per_s"],
                any(o.startswith("policy.lora_rank=") for o in ARMS[arm]),
                part["eval_episodes"],
            ),
        }
    add_speedups(arms, part["arm_order"][0])
    return {
        **part,
        "warm_start": warm,
        "warm_start_speedup_bf16": warm["fp32"]["seconds"] / warm["bf16"]["seconds"],
        "arms": arms,
    }


if __name__ == "__main__":
    from agent_rl.cli import report_stop

    try:
        main()
    except KeyboardInterrupt as exc:
        sys.exit(report_stop("smollm2_speed", exc, "its result file is unchanged; the same command runs it again"))
