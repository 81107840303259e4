"""A CUDA machine in one command: what runs, how fast, and whether engine and learner agree in bf16.

It checks and measures, in about 8 minutes on one GPU:
- the GPU's bf16 and fp32 matrix-product peaks (square products, mean of the timed repeats);
- engine-vs-learner logprob parity (:func:`parity`): the hf engine samples completions of chat
  prompts and the learner (``agent_rl.training.serving.logprobs.sequence_logprobs``) scores them again, both in
  the library's bf16 (bf16 body, float32 output head), both under plain bf16 autocast, and both in
  float32 (the control), with what each gap does to an update's importance ratios;
- a short RL run of the policy (SmolLM2-135M-Instruct by default) on Sokoban with the hf engine and
  ``policy.precision=bf16``, from its zero-shot start (no warm start): per iteration the rollout,
  update and sync times, generated tokens/s, and the learner's MFU: ``6 * parameters * forwarded
  tokens / update time`` against the measured bf16 peak (forwarded tokens count prompts and padding,
  so this is the hardware's view, not the useful work);
- torch.distributed: a process group of world size 1 (NCCL on a GPU, gloo on the CPU), an all-reduce
  and a broadcast checked for their values, and the all-reduce's time.

    python -m agent_rl.benchmarks.gpu_check --model smollm2-135m-instruct  # -> benchmarks/results/gpu/<gpu>-<date>.json
    python -m agent_rl.benchmarks.gpu_check --dry-run --out /tmp/gpu       # the same code on the CPU, in seconds

Without CUDA (and without ``--dry-run``) it says so in one line and exits with status 2. The GPU
image needs torch and transformers, plus the project's pure-Python requirements (gymnasium, and gguf
to read a GGUF file); vLLM is not used.
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import re
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from agent_rl.benchmarks.common import RESULTS_DIR, write_result
from agent_rl.core.presets import LOSS_PRESETS

OUT_DIR = RESULTS_DIR / "gpu"
SOKOBAN = "{width: 6, height: 6, n_boxes: 1, reverse_steps: 20, max_steps: 20}"
QUESTIONS = [
    "You are in a warehouse. Push the box onto the target. Reply with one move.",
    "What is the capital of France?",
    "Name three colors.",
    "You are in the hall. Exits: north, east. Reply with one command.",
    "Write a haiku about keys and doors.",
    "Count from one to five.",
    "Which is heavier, a kilogram of iron or a kilogram of feathers?",
    "Say hello in French.",
]
SIZES = {
    # matrix size and repeats of the peak, parity prompts x samples, the RL run's shape.
    "gpu": dict(
        matmul_n=8192,
        matmul_repeats=20,
        prompts=8,
        samples=8,
        max_new_tokens=32,
        n_groups=8,
        group_size=8,
        max_turns=10,
        iterations=6,
        eval_episodes=64,
        micro_batch_size=64,
        allreduce_mib=256,
    ),
    "dry-run": dict(
        matmul_n=256,
        matmul_repeats=3,
        prompts=2,
        samples=2,
        max_new_tokens=8,
        n_groups=2,
        group_size=2,
        max_turns=2,
        iterations=1,
        eval_episodes=2,
        micro_batch_size=8,
        allreduce_mib=1,
    ),
}
PARITY_TOLERANCE = {"fp32": 1e-3, "bf16": 0.05}
"""Largest |engine - learner| logprob a token may show. In bf16 the engine's cached decoding and the
learner's full forward pass round differently (bf16 keeps 8 bits of mantissa), so the bound is loose;
the mean gap is the figure to compare across machines."""


def matmul_peak(device: torch.device, dtype: torch.dtype, n: int, repeats: int) -> float:
    """TFLOP/s of an ``n x n @ n x n`` product in ``dtype`` (TF32 off for float32): mean over
    ``repeats`` timed products after three untimed ones."""
    torch.backends.cuda.matmul.allow_tf32 = False
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    _sync(device)
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    _sync(device)
    return 2 * n**3 * repeats / (time.perf_counter() - start) / 1e12


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def scored(
    model, prompts: list[list[int]], completions, precision: str, rows_per_pass: int | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The learner's logprobs of the sampled tokens of ``completions`` (one list per prompt) at
    temperature 1 under ``precision``, the engine's, and the mask of real tokens; all ``(rows, T)``.
    With ``rows_per_pass``, the learner scores that many shuffled rows at a time, as an update's
    micro-batches hold other rows (other padding, other shared prefixes) than one pass over all."""
    from agent_rl.training.serving.logprobs import sequence_logprobs

    flat_prompts = [p for p, group in zip(prompts, completions) for _ in group]
    flat = [c for group in completions for c in group]
    device = next(model.parameters()).device
    order = (
        list(range(len(flat)))
        if rows_per_pass is None
        else torch.randperm(len(flat), generator=torch.Generator().manual_seed(0)).tolist()
    )
    per_pass = rows_per_pass or len(flat)
    logp = torch.zeros(len(flat), max(len(c.token_ids) for c in flat), device=device)
    engine, mask = torch.zeros_like(logp), torch.zeros_like(logp)
    with torch.no_grad():
        for start in range(0, len(order), per_pass):
            rows = order[start : start + per_pass]
            part, _ = sequence_logprobs(
                model, [flat_prompts[i] for i in rows], [flat[i].token_ids for i in rows], 1.0, precision
            )
            logp[rows, : part.shape[1]] = part
    for i, c in enumerate(flat):
        engine[i, : len(c.logprobs)] = torch.tensor(c.logprobs)
        mask[i, : len(c.token_ids)] = 1.0
    return logp, engine, mask


def gap(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Largest and mean |a - b| over the masked tokens, and what ``a - b`` does as the log importance
    ratio of an update's first step (``a`` the learner, ``b`` the engine that sampled): the share of
    tokens outside PPO's clip (GRPO's 0.2) and of sequences whose GSPO ratio (the exponential of the
    mean log ratio) leaves GSPO's band, where the gradient of that row is clipped before any update."""
    log_ratio = (a - b) * mask
    diff = log_ratio.abs()
    sequence = log_ratio.sum(dim=1) / mask.sum(dim=1).clamp(min=1)
    ppo, gspo = LOSS_PRESETS["grpo"], LOSS_PRESETS["gspo_token"]
    ratio = log_ratio.exp()
    outside_ppo = ((ratio < 1 - ppo["clip_low"]) | (ratio > 1 + ppo["clip_high"])) & (mask > 0)
    sequence_ratio = sequence.exp()
    outside_gspo = (sequence_ratio < 1 - gspo["clip_low"]) | (sequence_ratio > 1 + gspo["clip_high"])
    return {
        "max": float(diff.max()),
        "mean": float(diff.sum() / mask.sum()),
        "tokens": int(mask.sum()),
        "sequence_log_ratio_abs_mean": float(sequence.abs().mean()),
        "tokens_outside_ppo_clip": float(outside_ppo.sum() / mask.sum()),
        "sequences_outside_gspo_band": float(outside_gspo.float().mean()),
    }


def parity(model, tokenizer, sizes: dict[str, int]) -> dict[str, Any]:
    """Engine-vs-learner logprob gaps in float32 (the control), in the library's bf16 (body under
    bf16 autocast, output head in float32: ``agent_rl.training.infra.distributed.forward_precision``) and
    under plain bf16 autocast (the head in bf16 too), and how far the library's bf16 moves the
    learner's own logprobs from float32."""
    from agent_rl.training.serving.engines import HFEngine, SamplingParams

    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True, return_dict=True
        )["input_ids"]
        for q in (QUESTIONS * 2)[: sizes["prompts"]]
    ]
    sampling = SamplingParams(1.0, 1.0, sizes["max_new_tokens"])
    result: dict[str, Any] = {
        "prompts": len(prompts),
        "samples_per_prompt": sizes["samples"],
        "tolerance": PARITY_TOLERANCE,
    }
    device = next(model.parameters()).device
    for variant, precision, outer in (("bf16", "bf16", False), ("bf16_head", "fp32", True), ("fp32", "fp32", False)):
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=outer):
            completions = HFEngine(model, tokenizer, seed=1, precision=precision).generate(
                prompts, sizes["samples"], sampling
            )
            learner, engine, mask = scored(model, prompts, completions, precision)
        gaps = gap(learner, engine, mask)
        tolerance = PARITY_TOLERANCE["fp32" if variant == "fp32" else "bf16"]
        result[f"engine_vs_learner_{variant}"] = {**gaps, "within_tolerance": gaps["max"] <= tolerance}
        if variant == "bf16":
            learner_fp32 = scored(model, prompts, completions, "fp32")[0]
            result["learner_bf16_vs_fp32"] = gap(learner, learner_fp32, mask)
            result["learner_bf16_rebatched"] = gap(
                learner, scored(model, prompts, completions, "bf16", REBATCH)[0], mask
            )
    return result


REBATCH = 4
"""Rows per forward pass of the rescoring: an update's micro-batches hold other rows, with other
padding and shared prefixes, than the rollout's recomputation (``trainer.recompute_old_logprobs``)."""


def rl_config(model_name: str, device: torch.device, precision: str, sizes: dict[str, int], run_dir: str):
    from agent_rl.config import load_config

    return load_config(
        None,
        [
            "env.id=agent_rl/Sokoban-v0",
            f"env.kwargs={SOKOBAN}",
            f"policy={model_name}",
            f"policy.device={device}",
            f"policy.precision={precision}",
            "engine=hf",
            "sft.mode=none",
            f"rollout.n_groups={sizes['n_groups']}",
            f"rollout.group_size={sizes['group_size']}",
            f"rollout.max_turns={sizes['max_turns']}",
            "rollout.history_turns=1",
            "rollout.max_new_tokens=24",
            "rollout.parser=admissible",
            "rollout.max_admissible_actions=12",
            "rollout.max_prompt_tokens=768",
            "optim.lr=1e-5",
            "optim.minibatches=2",
            "optim.minibatch_size=0",
            f"optim.micro_batch_size={sizes['micro_batch_size']}",
            f"trainer.iterations={sizes['iterations']}",
            f"trainer.eval_every={sizes['iterations']}",
            f"trainer.eval_episodes={sizes['eval_episodes']}",
            "trainer.target_success=null",
            f"trainer.save_every={sizes['iterations']}",
            "trainer.seed=0",
            f"trainer.run_dir={run_dir}",
            "logging.tensorboard=false",
        ],
    )


def rl_run(
    model,
    tokenizer,
    model_name: str,
    device: torch.device,
    precision: str,
    sizes: dict[str, int],
    bf16_peak_tflops: float,
) -> dict[str, Any]:
    """A short run of the trainer; per iteration its phase times, tokens/s and learner MFU."""
    from agent_rl.training.loop.trainer import train

    parameters = sum(p.numel() for p in model.parameters())
    iterations: list[dict[str, float]] = []

    def record(iteration: int, metrics: dict[str, float]) -> None:
        row = {
            "iteration": iteration,
            **{k: float(v) for k, v in metrics.items() if k.split("/")[0] in ("time", "rollout", "eval", "update")},
        }
        if metrics.get("time/update") and metrics.get("update/forwarded_tokens"):
            flops = 6 * parameters * metrics["update/forwarded_tokens"]
            row["learner_tflops"] = flops / metrics["time/update"] / 1e12
            row["learner_mfu_bf16"] = row["learner_tflops"] / bf16_peak_tflops
        iterations.append(row)

    with tempfile.TemporaryDirectory(prefix="agent-rl-gpu-check-") as run_dir:
        config = rl_config(model_name, device, precision, sizes, run_dir)
        start = time.perf_counter()
        summary = train(config, model=model, tokenizer=tokenizer, on_iteration=record)
        seconds = time.perf_counter() - start
    rl_rows = [row for row in iterations if row["iteration"] > 0]

    def mean(key: str) -> float | None:
        values = [row[key] for row in rl_rows if key in row]
        return float(sum(values) / len(values)) if values else None

    return {
        "env": "agent_rl/Sokoban-v0",
        "env_kwargs": SOKOBAN,
        "parameters": parameters,
        "precision": precision,
        "trajectories_per_iteration": sizes["n_groups"] * sizes["group_size"],
        "iterations": sizes["iterations"],
        "seconds": seconds,
        "greedy_success_start": iterations[0].get("eval/greedy_success"),
        "greedy_success_end": rl_rows[-1].get("eval/greedy_success") if rl_rows else None,
        "mean_iteration_s": mean("time/rollout")
        and (mean("time/rollout") + mean("time/update") + (mean("time/sync") or 0.0)),
        "mean_rollout_s": mean("time/rollout"),
        "mean_update_s": mean("time/update"),
        "mean_generated_tokens_per_s": mean("rollout/tokens_per_s"),
        "mean_learner_tflops": mean("learner_tflops"),
        "mean_learner_mfu_bf16": mean("learner_mfu_bf16"),
        "summary": summary,
        "per_iteration": iterations,
    }


def distributed_check(device: torch.device, mib: int) -> dict[str, Any]:
    """World size 1 on ``device``'s backend: an all-reduce (sum) and a broadcast of ``mib`` MiB of
    float32, checked for their values, and the all-reduce's time (a copy at world size 1)."""
    import torch.distributed as dist

    backend = "nccl" if device.type == "cuda" else "gloo"
    available = dist.is_nccl_available() if backend == "nccl" else dist.is_gloo_available()
    if not available:
        return {"backend": backend, "available": False}
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        values = torch.arange(mib * 2**18, dtype=torch.float32, device=device)
        reduced = values.clone()
        dist.all_reduce(reduced)
        broadcast = values.clone()
        dist.broadcast(broadcast, 0)
        _sync(device)
        start = time.perf_counter()
        for _ in range(5):
            dist.all_reduce(reduced)
        _sync(device)
        seconds = (time.perf_counter() - start) / 5
        correct = bool(torch.equal(broadcast, values)) and bool(torch.equal(reduced, values))
    finally:
        dist.destroy_process_group()
    return {
        "backend": backend,
        "available": True,
        "world_size": 1,
        "values_correct": correct,
        "mib": mib,
        "all_reduce_ms": seconds * 1e3,
    }


def device_label(device: torch.device) -> str:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--model",
        help="policy (policy=...): a known model, a GGUF file or a model directory "
        "(default smollm2-135m-instruct; embedded with --dry-run)",
    )
    parser.add_argument("--dry-run", action="store_true", help="the same code on the CPU with tiny sizes")
    parser.add_argument("--out", type=Path, default=OUT_DIR, help=f"results directory (default {OUT_DIR})")
    parser.add_argument("--label", help="result file name (default: the device and the date)")
    parser.add_argument(
        "--skip-rl-run",
        action="store_true",
        help="leave out the short RL run (about 3 of its 4 minutes), when the device's time goes to an RL "
        "benchmark whose metrics record the same per-iteration timings",
    )
    args = parser.parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        print(
            f"gpu_check: torch {torch.__version__} sees no CUDA device; run it on a GPU machine, or pass --dry-run "
            "to exercise the same code on the CPU",
            file=sys.stderr,
        )
        return 2
    from rich.console import Console

    from agent_rl.training.infra.distributed import bf16_supported
    from agent_rl.training.models.policy import load_policy

    console = Console()
    device = torch.device("cpu" if args.dry_run else "cuda")
    sizes = SIZES["dry-run" if args.dry_run else "gpu"]
    model_name = args.model or ("embedded" if args.dry_run else "smollm2-135m-instruct")
    precision = "bf16" if bf16_supported(device) else "fp32"
    label = args.label or f"{'dry-run-' if args.dry_run else ''}{device_label(device)}-{dt.date.today().isoformat()}"
    result: dict[str, Any] = {
        "label": label,
        "dry_run": args.dry_run,
        "model": model_name,
        "sizes": sizes,
        "precision": precision,
        "checks": {},
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        result["gpu"] = {
            "name": props.name,
            "memory_gib": props.total_memory / 2**30,
            "capability": f"{props.major}.{props.minor}",
            "multiprocessors": props.multi_processor_count,
            "cuda": torch.version.cuda,
        }
    clock = time.perf_counter()

    peaks = {
        str(dtype).removeprefix("torch."): matmul_peak(device, dtype, sizes["matmul_n"], sizes["matmul_repeats"])
        for dtype in (torch.bfloat16, torch.float32)
    }
    result["checks"]["matmul_peak_tflops"] = peaks
    console.print(f"matmul peak: bf16 {peaks['bfloat16']:.1f}, fp32 {peaks['float32']:.1f} TFLOP/s")

    start = time.perf_counter()
    model, tokenizer = load_policy(model_name, device=device)
    result["checks"]["load_s"] = time.perf_counter() - start

    result["checks"]["parity"] = parity(model, tokenizer, sizes)
    bf16_gap = result["checks"]["parity"]["engine_vs_learner_bf16"]
    console.print(f"parity: bf16 engine vs learner max {bf16_gap['max']:.3g}, mean {bf16_gap['mean']:.3g}")

    if args.skip_rl_run:
        result["checks"]["rl_run"] = {"skipped": "--skip-rl-run"}
    else:
        result["checks"]["rl_run"] = run = rl_run(
            model, tokenizer, model_name, device, precision, sizes, peaks["bfloat16"]
        )
        console.print(
            f"RL: {run['mean_iteration_s'] or math.nan:.1f} s per iteration, "
            f"{run['mean_generated_tokens_per_s'] or math.nan:.0f} tokens/s, MFU "
            f"{run['mean_learner_mfu_bf16'] or math.nan:.3f}"
        )

    result["checks"]["distributed"] = distributed_check(device, sizes["allreduce_mib"])
    result["seconds"] = time.perf_counter() - clock
    path = write_result(label, result, args.out)
    console.print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
