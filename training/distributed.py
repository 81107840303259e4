"""Scale-out on engines the field already runs: generation replicas as Ray actors, and
data-parallel learners under ``torchrun`` (torch.distributed: gloo on CPU, NCCL on GPU).

:class:`RayEngine` has the ``Engine`` interface (``generate`` / ``update_weights`` / ``close``), so the
rollout collector and the trainer use it unchanged. Each replica builds its own ``hf`` or ``vllm``
engine from the policy's config, weights and tokenizer files shipped through the Ray object store
(no shared filesystem needed). Requests are split into contiguous, near-equal chunks, one per
replica, and gathered in request order; ``update_weights`` puts the new state dict in the object
store once and every replica loads it.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from training.engines import Completion, SamplingParams, make_engine


class EngineReplica:
    """One generation engine inside a Ray actor."""

    def __init__(self, config: dict[str, Any], state_dict: dict[str, torch.Tensor], tokenizer_files: dict[str, bytes],
                 kind: str, engine_kwargs: dict[str, Any]) -> None:
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        self._tokenizer_dir = tempfile.TemporaryDirectory(prefix="agent-rl-replica-")
        for name, content in tokenizer_files.items():
            (Path(self._tokenizer_dir.name) / name).write_bytes(content)
        tokenizer = AutoTokenizer.from_pretrained(self._tokenizer_dir.name, local_files_only=True)
        model_config = AutoConfig.for_model(**config)
        self.model = AutoModelForCausalLM.from_config(model_config).to(next(iter(state_dict.values())).dtype)
        self.model.load_state_dict(state_dict)
        self.model.eval()
        self.engine = make_engine(kind, self.model, tokenizer, **engine_kwargs)

    def generate(self, prompts_token_ids: Sequence[Sequence[int]], n: int, sampling: SamplingParams) -> list[list[Completion]]:
        return self.engine.generate(prompts_token_ids, n, sampling)

    def load_state_dict(self, state_dict: dict[str, torch.Tensor]) -> None:
        self.model.load_state_dict(state_dict)
        self.engine.update_weights(self.model)

    def close(self) -> None:
        self.engine.close()
        self._tokenizer_dir.cleanup()


def _cpu_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().to("cpu").clone() for name, tensor in model.state_dict().items()}


class RayEngine:
    """``n_replicas`` generation engines (``kind`` hf or vllm) on Ray actors behind one ``Engine``.

    Replica ``i`` is seeded with ``seed + i``. ``address`` connects to a running cluster; ``None``
    starts a local Ray (or reuses this process's). On GPU clusters give each vLLM replica a GPU with
    ``num_gpus_per_replica=1``; tensor parallelism inside one replica is vLLM's own
    ``tensor_parallel_size`` engine argument."""

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer,
        *,
        n_replicas: int = 2,
        kind: str = "hf",
        seed: int = 0,
        address: str | None = None,
        num_cpus_per_replica: float = 1.0,
        num_gpus_per_replica: float = 0.0,
        init_kwargs: dict[str, Any] | None = None,
        **engine_kwargs: Any,
    ) -> None:
        import ray

        if n_replicas < 1:
            raise ValueError(f"n_replicas must be >= 1, got {n_replicas}")
        if kind not in ("hf", "vllm"):
            raise ValueError(f"RayEngine replicas are hf or vllm engines, got {kind!r}")
        if not ray.is_initialized():
            ray.init(address=address, include_dashboard=False, log_to_driver=False, **(init_kwargs or {}))
        self._ray = ray
        with tempfile.TemporaryDirectory(prefix="agent-rl-tokenizer-") as directory:
            tokenizer.save_pretrained(directory)
            tokenizer_files = {p.name: p.read_bytes() for p in Path(directory).iterdir() if p.is_file()}
        state_ref = ray.put(_cpu_state(model))
        replica_class = ray.remote(num_cpus=num_cpus_per_replica, num_gpus=num_gpus_per_replica)(EngineReplica)
        self._replicas = [
            replica_class.remote(model.config.to_dict(), state_ref, tokenizer_files, kind, {**engine_kwargs, "seed": seed + i})
            for i in range(n_replicas)
        ]

    def generate(self, prompts_token_ids: Sequence[Sequence[int]], n: int, sampling: SamplingParams) -> list[list[Completion]]:
        prompts = [list(p) for p in prompts_token_ids]
        chunks = [c for c in np.array_split(np.arange(len(prompts)), len(self._replicas)) if len(c)]
        futures = [
            replica.generate.remote([prompts[i] for i in chunk], n, sampling)
            for replica, chunk in zip(self._replicas, chunks)
        ]
        return [completions for answer in self._ray.get(futures) for completions in answer]

    def update_weights(self, model: torch.nn.Module) -> None:
        state_ref = self._ray.put(_cpu_state(model))
        self._ray.get([replica.load_state_dict.remote(state_ref) for replica in self._replicas])

    def close(self) -> None:
        for replica in self._replicas:
            try:
                self._ray.get(replica.close.remote())
            finally:
                self._ray.kill(replica)
        self._replicas = []


# ---- data-parallel learners under torchrun ----------------------------------------------------------


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
