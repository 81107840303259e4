"""Run under ``torchrun --nproc_per_node 2``: rank 0 broadcasts one fixed minibatch; for each loss
named, every rank backpropagates its shard of the rows, gradients are summed, and rank 0 saves them
(safetensors, ``<out_dir>/<loss>.safetensors``)."""

from __future__ import annotations

import sys

import numpy as np
import torch
from safetensors.torch import save_file

from agent_rl.core.losses import LOSS_PRESETS, LossSpec
from agent_rl.training.infra.distributed import all_reduce_gradients, broadcast_ragged, init_distributed
from agent_rl.training.loop.learner import accumulate_policy_gradient
from agent_rl.training.models.policy import load_policy


def fixed_minibatch(vocab_size: int, rows: int = 10, seed: int = 0):
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(5, vocab_size, rng.integers(3, 12)) for _ in range(rows)]
    responses = [rng.integers(5, vocab_size, rng.integers(1, 7)) for _ in range(rows)]
    old_logprobs = [rng.normal(-3.0, 0.3, len(r)).astype(np.float32) for r in responses]
    advantages = rng.normal(size=rows)
    return prompts, responses, old_logprobs, advantages


def gradients(model, prompts, responses, old_logprobs, advantages, loss, shard=(0, 1)):
    model.zero_grad(set_to_none=True)
    accumulate_policy_gradient(
        model,
        prompts,
        responses,
        old_logprobs,
        advantages,
        loss=LossSpec(**{**LOSS_PRESETS[loss], "kl_coef": 0.0, "norm_length": 8}),
        temperature=1.0,
        micro_batch_size=3,
        shard=shard,
    )


def main(out_dir: str, losses: list[str]) -> None:
    torch.manual_seed(0)
    model, tokenizer = load_policy("embedded")
    ctx = init_distributed(torch.device("cpu"))
    batch = fixed_minibatch(model.config.vocab_size) if ctx.is_main else ([], [], [], np.zeros(0))
    prompts = broadcast_ragged(batch[0], torch.int64, ctx)
    responses = broadcast_ragged(batch[1], torch.int64, ctx)
    old_logprobs = broadcast_ragged(batch[2], torch.float32, ctx)
    (advantages,) = broadcast_ragged([batch[3]], torch.float64, ctx)
    for loss in losses:
        gradients(model, prompts, responses, old_logprobs, advantages, loss, shard=(ctx.rank, ctx.world_size))
        all_reduce_gradients(list(model.parameters()), ctx)
        if ctx.is_main:
            save_file(
                {name: p.grad.contiguous() for name, p in model.named_parameters()}, f"{out_dir}/{loss}.safetensors"
            )
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
