"""bf16 autocast (policy.precision=bf16): logprob parity with float32, a training step that stays
finite with float32 weights, the engine under the same autocast, and refusing devices without bf16."""

from __future__ import annotations

import pytest
import torch

from agent_rl.config import ConfigError, load_config
from agent_rl.core.losses import LossSpec
from agent_rl.envs import AUTO_SFT_REASONS
from agent_rl.training.infra import distributed
from agent_rl.training.infra.distributed import bf16_supported, check_precision, forward_precision
from agent_rl.training.loop.learner import accumulate_policy_gradient
from agent_rl.training.serving.engines import HFEngine, SamplingParams
from agent_rl.training.serving.logprobs import sequence_logprobs

CPU = torch.device("cpu")
BF16_TOLERANCE = 0.05
"""Largest |bf16 - fp32| logprob of a token allowed on the tiny model: bf16 keeps 8 mantissa bits, so
logits of size ~10 round by up to ~0.04."""


def tiny_llama(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        eos_token_id=1,
        pad_token_id=0,
    )
    return LlamaForCausalLM(config).eval()


PROMPTS = [[2, 5, 9, 30, 31], [2, 7, 8], [2, 11, 12, 13, 14, 15, 16]]
RESPONSES = [[40, 41, 42], [43], [44, 45, 46, 47, 1]]


def test_bf16_autocasts_the_body_and_computes_the_logits_in_float32():
    model, a = tiny_llama(), torch.randn(4, 4)
    with forward_precision(model, CPU, "fp32"):
        assert (a @ a).dtype == torch.float32
    with torch.no_grad(), forward_precision(model, CPU, "bf16"):
        assert (a @ a).dtype == torch.bfloat16
        hidden = model.model(torch.tensor([PROMPTS[0]])).last_hidden_state
        logits = model.lm_head(hidden)
    assert logits.dtype == torch.float32
    # The float32 product of the hidden state, not its bf16 rounding (which plain autocast gives).
    torch.testing.assert_close(logits, hidden.float() @ model.lm_head.weight.T)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        rounded = model.lm_head(hidden)
    assert rounded.dtype == torch.bfloat16 and not torch.equal(rounded.float(), logits)
    # The head is a plain Linear again after the block, also when the block raises.
    assert type(model.lm_head) is torch.nn.Linear
    with pytest.raises(RuntimeError, match="inside"), forward_precision(model, CPU, "bf16"):
        raise RuntimeError("inside")
    assert type(model.lm_head) is torch.nn.Linear


def test_bf16_logprobs_match_float32_within_tolerance():
    model = tiny_llama()
    with torch.no_grad():
        fp32, mask = sequence_logprobs(model, PROMPTS, RESPONSES, 1.0, "fp32")
        bf16, _ = sequence_logprobs(model, PROMPTS, RESPONSES, 1.0, "bf16")
    assert bf16.dtype == torch.float32  # the softmax runs in float32 on float32 logits
    gap = ((bf16 - fp32) * mask).abs()
    assert 0 < float(gap.max()) <= BF16_TOLERANCE  # different, as bf16 must be, but close
    assert next(model.parameters()).dtype == torch.float32


def test_a_bf16_training_step_is_finite_keeps_float32_weights_and_follows_the_float32_gradient():
    grads = {}
    for precision in ("fp32", "bf16"):
        model = tiny_llama()
        with torch.no_grad():
            logp, _ = sequence_logprobs(model, PROMPTS, RESPONSES)
        old = [row[: len(r)].numpy() for row, r in zip(logp, RESPONSES)]
        spec = LossSpec(ratio_level="token", clip_low=0.2, clip_high=0.2, loss_agg="seq_mean_token_mean", kl_coef=0.0)
        metrics = accumulate_policy_gradient(
            model,
            PROMPTS,
            RESPONSES,
            old,
            torch.tensor([1.0, -0.5, 2.0]).numpy(),
            loss=spec,
            temperature=1.0,
            micro_batch_size=2,
            precision=precision,
        )
        assert torch.isfinite(torch.tensor(metrics["loss"]))
        grads[precision] = torch.cat([p.grad.flatten() for p in model.parameters()])
        assert all(p.grad.dtype == torch.float32 and p.dtype == torch.float32 for p in model.parameters())
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        optimizer.step()
        assert all(torch.isfinite(p).all() for p in model.parameters())
    assert torch.isfinite(grads["bf16"]).all()
    assert float(torch.nn.functional.cosine_similarity(grads["bf16"], grads["fp32"], dim=0)) > 0.99


class _Tokenizer:
    pad_token_id, eos_token_id = 0, 1


def engine_vs_learner_gap(model, precision: str, plain_autocast: bool = False) -> float:
    """Largest |engine - learner| logprob of the hf engine's sampled tokens; with ``plain_autocast``
    both run in float32 code under an outer bf16 autocast, which rounds the logits to bf16 too."""
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=plain_autocast):
        completions = HFEngine(model, _Tokenizer(), seed=3, precision=precision).generate(
            PROMPTS, 4, SamplingParams(1.0, 1.0, 8)
        )
        flat = [c for group in completions for c in group]
        prompts = [p for p in PROMPTS for _ in range(4)]
        with torch.no_grad():
            logp, mask = sequence_logprobs(model, prompts, [c.token_ids for c in flat], 1.0, precision)
    engine = torch.zeros_like(logp)
    for i, c in enumerate(flat):
        engine[i, : len(c.logprobs)] = torch.tensor(c.logprobs)
    return float(((logp - engine) * mask).abs().max())


def test_the_hf_engine_under_bf16_reports_the_logprobs_the_learner_computes_under_bf16():
    assert engine_vs_learner_gap(tiny_llama(), "bf16") <= BF16_TOLERANCE


def test_the_float32_head_computes_the_logits_in_float32_inside_bf16_autocast():
    # Logits of size ~10-30, as a trained model's are: bf16 rounds them by up to ~0.1, and the engine's
    # cached decoding and the learner's full pass can round them differently (how often depends on the
    # CPU's bf16 kernels), so the library keeps the head in float32.
    model = tiny_llama()
    with torch.no_grad():
        model.lm_head.weight.mul_(10.0)
    ids = torch.tensor([[5, 9, 3, 7, 2, 8, 11, 4]])
    with torch.no_grad():
        with forward_precision(model, CPU, "bf16"):
            hidden = model.model(ids).last_hidden_state  # the body under bf16 autocast
            logits = model(ids).logits
        with torch.autocast("cpu", dtype=torch.bfloat16):
            plain = model(ids).logits
    assert type(model.lm_head) is torch.nn.Linear  # the float32 head lasts for the block only
    expected = hidden.float() @ model.lm_head.weight.T
    assert logits.dtype == torch.float32 and plain.dtype == torch.bfloat16
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-4)
    assert float((plain.float() - expected).abs().max()) > 0.01  # a bf16 head rounds them
    assert engine_vs_learner_gap(model, "bf16") <= 0.01


def test_bf16_is_refused_where_the_device_cannot_run_it(monkeypatch, tmp_path):
    check_precision("fp32", CPU)
    with pytest.raises(ValueError, match="precision must be one of"):
        check_precision("fp16", CPU)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    assert not bf16_supported(CPU)
    with pytest.raises(ValueError, match="AVX512-BF16 or AMX"):
        check_precision("bf16", CPU)
    from agent_rl.training.loop.trainer import Trainer
    from agent_rl.training.serving.envpool import env_factory

    config = load_config(
        overrides=[
            "policy.precision=bf16",
            f"trainer.run_dir={tmp_path}",
            "engine=hf",
            "sft.mode=none",
            "logging.console=false",
        ]
    )
    with pytest.raises(ConfigError, match="'policy.precision'.*AVX512-BF16"):
        Trainer(config, model=tiny_llama(), tokenizer=_Tokenizer(), make_env=env_factory(config))
    assert distributed.PRECISIONS == ("fp32", "bf16")


@pytest.mark.parametrize("native", [True, False])
def test_auto_precision_is_bf16_where_the_device_runs_it_and_the_run_records_the_choice(monkeypatch, tmp_path, native):
    import io

    import yaml
    from rich.console import Console

    from agent_rl.training.infra.resolution import resolve
    from agent_rl.training.loop.trainer import Trainer
    from agent_rl.training.serving.envpool import env_factory

    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: native)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    config = load_config(
        overrides=[
            "policy.precision=auto",
            "policy.device=cpu",
            f"trainer.run_dir={tmp_path}",
            "engine=hf",
            "sft.mode=none",
            "logging.tensorboard=false",
        ]
    )
    console = Console(file=io.StringIO(), width=200)
    trainer = Trainer(config, model=tiny_llama(), tokenizer=_Tokenizer(), make_env=env_factory(config), console=console)
    chosen = "bf16" if native else "fp32"
    assert trainer.config.policy.precision == chosen and config.policy.precision == "auto"
    assert f"policy.precision=auto chose {chosen}: cpu" in console.file.getvalue()
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["policy"]["precision"] == chosen
    assert resolve(trainer.config) == trainer.config  # a resolved choice stays made


def test_an_unknown_precision_is_a_config_error():
    with pytest.raises(ConfigError, match="policy.precision"):
        load_config(overrides=["policy.precision=fp16"])


def test_the_auto_choices_are_said_before_an_unusable_precision_is_refused(monkeypatch):
    from agent_rl.training.infra.resolution import report_choices

    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    said: list[str] = []
    asked = load_config(overrides=["sft.mode=auto", "policy.precision=auto"])
    chosen = load_config(overrides=["sft.mode=random", "policy.precision=fp32"])
    report_choices(asked, chosen, CPU, said.append)
    assert said == [
        f"sft.mode=auto chose random: {AUTO_SFT_REASONS['random']}",
        "policy.precision=auto chose fp32: cpu has no native bfloat16 matrix products",
    ]
    said.clear()
    unusable = load_config(overrides=["sft.mode=random", "policy.precision=bf16"])
    with pytest.raises(ConfigError, match="'policy.precision'.*AVX512-BF16"):
        report_choices(asked, unusable, CPU, said.append)
    assert len(said) == 2  # what was chosen is said first
