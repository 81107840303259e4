"""Devices, and data-parallel learners under ``torchrun`` (torch.distributed: gloo on CPU, NCCL on GPU).

Rank 0 collects rollouts and broadcasts the rows; every rank backpropagates its share of each
minibatch and the gradients are summed. Outside torchrun every helper is a no-op on one process.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np
import torch

from agent_rl.config import PRECISIONS


def resolve_device(name: str) -> torch.device:
    """``policy.device``: ``auto`` is cuda when available, else cpu."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def bf16_supported(device: torch.device) -> bool:
    """Whether ``device`` runs bfloat16 matrix products natively: a CUDA GPU with bf16, or a CPU
    with AVX512-BF16 or AMX (elsewhere torch emulates them, slower than float32)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return device.type == "cpu" and (torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def check_precision(precision: str, device: torch.device) -> None:
    """Refuse a precision ``device`` cannot run (``policy.precision``)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if precision == "bf16" and not bf16_supported(device):
        raise ValueError(
            f"precision 'bf16' needs a CUDA GPU with bf16 or a CPU with AVX512-BF16 or AMX; {device} has neither "
            "(override it: policy.precision=fp32)"
        )


class Float32Head(torch.nn.Linear):
    """A linear output head that computes the logits in float32 inside bf16 autocast (its weights are
    float32): rounding logits of size ~10-30 to bf16's 8 mantissa bits moves a token's logprob by up
    to ~0.1, and the engine's cached decoding and the learner's full forward pass round differently."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        with torch.autocast(hidden.device.type, enabled=False):
            return super().forward(hidden.to(self.weight.dtype))


@contextlib.contextmanager
def forward_precision(model: torch.nn.Module, device: torch.device, precision: str) -> Iterator[None]:
    """The context ``model``'s forward passes run in. ``fp32``: nothing. ``bf16``: bfloat16 autocast
    for the transformer body, while the output head (a plain ``nn.Linear``) runs in float32 for the
    block (:class:`Float32Head`), so the logits are not rounded to bf16: on SmolLM2 that cuts the mean
    engine-vs-learner logprob gap from 0.035 to 0.020 (``benchmarks/precision_parity.py``). Weights
    stay float32 either way."""
    if precision != "bf16":
        yield
        return
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    swap = type(head) is torch.nn.Linear
    if swap:
        head.__class__ = Float32Head
    try:
        with torch.autocast(device.type, dtype=torch.bfloat16):
            yield
    finally:
        if swap:
            head.__class__ = torch.nn.Linear


@dataclass(frozen=True)
class DistContext:
    """This process's place among the learners. ``world_size == 1`` means no process group."""

    rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def init_distributed(device: torch.device) -> DistContext:
    """Join the process group torchrun describes (``RANK``/``WORLD_SIZE``/``MASTER_ADDR`` ...): gloo on
    CPU, NCCL on GPU. Outside torchrun this is a single process and nothing is initialized."""
    import os

    import torch.distributed as dist

    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size == 1:
        return DistContext()
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return DistContext(rank=dist.get_rank(), world_size=dist.get_world_size())


def shutdown_distributed(ctx: DistContext) -> None:
    """Leave the process group (``destroy_process_group``). No barrier: after a failure the ranks
    are in different collectives, and a barrier would hang instead of letting the rank exit."""
    import torch.distributed as dist

    if ctx.enabled and dist.is_initialized():
        dist.destroy_process_group()


def broadcast_ragged(rows: list[np.ndarray] | None, dtype: torch.dtype, ctx: DistContext) -> list[np.ndarray]:
    """Rank 0's list of 1-D arrays on every rank, sent as two tensors (lengths, then the values)."""
    import torch.distributed as dist

    if not ctx.enabled:
        return list(rows)
    count = torch.tensor([len(rows) if ctx.is_main else 0], dtype=torch.int64)
    dist.broadcast(count, 0)
    lengths = torch.tensor([len(r) for r in rows] if ctx.is_main else [0] * int(count), dtype=torch.int64)
    dist.broadcast(lengths, 0)
    total = int(lengths.sum())
    values = (
        torch.as_tensor(np.concatenate(rows) if total else np.zeros(0)).to(dtype)
        if ctx.is_main
        else torch.empty(total, dtype=dtype)
    )
    dist.broadcast(values, 0)
    return [chunk.numpy() for chunk in torch.split(values, lengths.tolist())]


def broadcast_parameters(model: torch.nn.Module, ctx: DistContext) -> None:
    """Every rank takes rank 0's weights (after a warm start that only rank 0 ran)."""
    import torch.distributed as dist

    if ctx.enabled:
        with torch.no_grad():
            for tensor in model.state_dict().values():
                dist.broadcast(tensor, 0)


def all_reduce_gradients(parameters: Sequence[torch.nn.Parameter], ctx: DistContext) -> None:
    """Sum gradients over ranks. Each rank's loss is already divided by the *global* token/row
    counts, so the sum is exactly the single-process gradient of the whole minibatch."""
    import torch.distributed as dist

    if not ctx.enabled:
        return
    for parameter in parameters:
        if parameter.grad is None:
            parameter.grad = torch.zeros_like(parameter)
        dist.all_reduce(parameter.grad, op=dist.ReduceOp.SUM)


def broadcast_flag(value: bool, ctx: DistContext) -> bool:
    """Rank 0's boolean on every rank (e.g. "the target success was reached: stop")."""
    import torch.distributed as dist

    if not ctx.enabled:
        return value
    flag = torch.tensor([int(value)], dtype=torch.int64)
    dist.broadcast(flag, 0)
    return bool(flag.item())
