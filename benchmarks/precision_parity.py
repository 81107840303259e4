"""How far the engine's and the learner's logprobs of the same tokens differ in each precision, on
this machine's CPU, and what that does to an update's importance ratios. A CPU without native bf16
rounds the same way, only slower, so the gaps do not depend on it (``bf16_native`` records it).

The hf engine samples completions of chat prompts and the learner scores them again
(``agent_rl.benchmarks.gpu_check.parity``): in float32 (the control), in the library's bf16 (the transformer
body under bf16 autocast, the output head and log-softmax in float32) and under plain bf16 autocast
(the head in bf16 too). Per variant: the largest and mean per-token gap, and, taking the gap as the
log ratio of an update's first step, the share of tokens outside PPO's 0.2 clip and of sequences
outside GSPO's 3e-4/4e-4 band.

    python -m agent_rl.benchmarks.precision_parity      # -> benchmarks/results/precision_parity/cpu.json, a few minutes
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from agent_rl.benchmarks.common import RESULTS_DIR, machine_info, write_result

OUT_DIR = RESULTS_DIR / "precision_parity"
MODELS = ("embedded", "smollm2-135m-instruct")
SIZES = {"prompts": 8, "samples": 8, "max_new_tokens": 32}
"""The GPU check's parity sizes (``agent_rl.benchmarks.gpu_check.SIZES["gpu"]``), so the figures compare."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--models", default=",".join(MODELS), help=f"comma-separated policies (default {','.join(MODELS)})"
    )
    parser.add_argument("--out", type=Path, default=OUT_DIR, help=f"results directory (default {OUT_DIR})")
    args = parser.parse_args(argv)
    from rich.console import Console

    from agent_rl.benchmarks.gpu_check import parity
    from agent_rl.training.infra.distributed import bf16_supported
    from agent_rl.training.models.policy import load_policy

    console = Console()
    # Without AVX512-BF16 or AMX torch emulates bf16: slower, with the same rounding, so the gaps hold.
    result = {
        "machine": machine_info(),
        "bf16_native": bf16_supported(torch.device("cpu")),
        "sizes": SIZES,
        "models": {},
    }
    for name in args.models.split(","):
        model, tokenizer = load_policy(name, device=torch.device("cpu"))
        result["models"][name] = found = parity(model, tokenizer, SIZES)
        for variant in ("fp32", "bf16", "bf16_head"):
            g = found[f"engine_vs_learner_{variant}"]
            console.print(
                f"{name} {variant}: max {g['max']:.3g}, mean {g['mean']:.3g}, tokens outside PPO's clip "
                f"{g['tokens_outside_ppo_clip']:.1%}, sequences outside GSPO's band "
                f"{g['sequences_outside_gspo_band']:.1%}"
            )
    console.print(f"wrote {write_result('cpu', result, args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
