"""SmolLM2-135M-Instruct as a policy: GGUF conversion cost and engine/learner logprob agreement.

Measures, for the installed model (``agent-rl models install smollm2-135m-instruct``):
- conversion: dequantizing the Q4_1 GGUF into a float32 Hugging Face directory in a fresh cache
  (hashing included), the directory's size, the check of a warm cache (it hashes the file) and
  loading the converted directory;
- logprob agreement, float32: the largest |engine logprob - learner logprob|
  (``agent_rl.training.serving.engines.sequence_logprobs``) over sampled completions of chat prompts, for the hf
  engine and (when importable) the vllm engine, at temperature 1 and 0.7, before and after a weight
  sync (``update_weights`` with every parameter moved by Gaussian noise of std 0.01), and whether
  greedy completions agree between the engines.

    python -m agent_rl.benchmarks.smollm2      # -> benchmarks/results/smollm2.json
"""

from __future__ import annotations

import copy
import tempfile
import time

import torch
from rich.console import Console

from agent_rl.benchmarks.common import write_result
from agent_rl.training.infra.resolution import vllm_available
from agent_rl.training.models.gguf import file_sha256, gguf_policy_dir
from agent_rl.training.models.known import model_file
from agent_rl.training.models.policy import load_policy
from agent_rl.training.serving.engines import HFEngine, SamplingParams, make_engine
from agent_rl.training.serving.logprobs import sequence_logprobs

NAME = "smollm2-135m-instruct"
QUESTIONS = [
    "What is the capital of France?",
    "Name a color.",
    "You are in the hall. Exits: north, east. Reply with one command.",
    "Write a haiku about keys and doors.",
]
SAMPLINGS = {"t1": SamplingParams(1.0, 1.0, 24), "t0.7": SamplingParams(0.7, 1.0, 24)}
GREEDY = SamplingParams(max_new_tokens=24, greedy=True)


def max_gap(model, prompts, completions, temperature: float) -> float:
    flat_prompts = [p for p, group in zip(prompts, completions) for _ in group]
    flat = [c for group in completions for c in group]
    with torch.no_grad():
        logp, mask = sequence_logprobs(model, flat_prompts, [c.token_ids for c in flat], temperature)
    engine_logp = torch.zeros_like(logp)
    for i, c in enumerate(flat):
        engine_logp[i, : len(c.logprobs)] = torch.tensor(c.logprobs)
    return float(((logp - engine_logp) * mask).abs().max())


def gaps(engine, model, prompts) -> dict[str, float]:
    return {key: max_gap(model, prompts, engine.generate(prompts, 4, s), s.temperature) for key, s in SAMPLINGS.items()}


def main() -> None:
    console = Console()
    source = model_file(NAME)
    result: dict = {"model": NAME, "gguf": source.name, "gguf_bytes": source.stat().st_size}
    with tempfile.TemporaryDirectory(prefix="agent-rl-smollm2-") as cache:
        start = time.perf_counter()
        file_sha256(source)
        result["hash_s"] = time.perf_counter() - start
        start = time.perf_counter()
        directory = gguf_policy_dir(source, cache)
        result["conversion_s"] = time.perf_counter() - start
        result["converted_bytes"] = sum(p.stat().st_size for p in directory.iterdir())
        result["converted_files"] = sorted(p.name for p in directory.iterdir())
        start = time.perf_counter()
        gguf_policy_dir(source, cache)
        result["warm_cache_check_s"] = time.perf_counter() - start
        start = time.perf_counter()
        model, tokenizer = load_policy(directory)
        result["load_converted_s"] = time.perf_counter() - start
    console.print(f"conversion {result['conversion_s']:.1f} s, {result['converted_bytes'] / 2**20:.0f} MiB")
    result["parameters"] = sum(p.numel() for p in model.parameters())

    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        for q in QUESTIONS
    ]
    moved = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in moved.parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=generator))

    hf = HFEngine(model, tokenizer, seed=0)
    hf_greedy = [g[0].token_ids for g in hf.generate(prompts, 1, GREEDY)]
    result["greedy_answers"] = {q: tokenizer.decode(ids) for q, ids in zip(QUESTIONS, hf_greedy)}
    result["hf"] = {"before_sync": gaps(hf, model, prompts)}
    hf.update_weights(moved)
    result["hf"]["after_sync"] = gaps(hf, moved, prompts)
    console.print(f"hf max |logprob gap|: {result['hf']}")

    if vllm_available():
        engine = make_engine("vllm", model, tokenizer, kv_cache_memory_bytes=256 * 2**20, max_model_len=2048)
        try:
            result["vllm"] = {"before_sync": gaps(engine, model, prompts)}
            result["vllm"]["greedy_equals_hf"] = [
                g[0].token_ids for g in engine.generate(prompts, 1, GREEDY)
            ] == hf_greedy
            start = time.perf_counter()
            engine.update_weights(moved)
            result["vllm"]["sync_s"] = time.perf_counter() - start
            result["vllm"]["after_sync"] = gaps(engine, moved, prompts)
            result["vllm"]["after_sync_vs_old_weights"] = max_gap(
                model, prompts, engine.generate(prompts, 4, SAMPLINGS["t1"]), 1.0
            )
            moved_greedy = [g[0].token_ids for g in HFEngine(moved, tokenizer).generate(prompts, 1, GREEDY)]
            result["vllm"]["greedy_equals_hf_after_sync"] = [
                g[0].token_ids for g in engine.generate(prompts, 1, GREEDY)
            ] == moved_greedy
        finally:
            engine.close()
        console.print(f"vllm max |logprob gap|: {result['vllm']}")
    path = write_result("smollm2", result)
    console.print(f"wrote {path}")


if __name__ == "__main__":
    main()
