"""Supervised warm start: teach a policy built from scratch the action format before RL.

``random`` clones uniformly random admissible actions: the model learns to answer with one valid
command in the prompt format of the rollouts, but nothing about which command wins, so RL has the
whole task left to learn. ``oracle`` clones the environments' oracle plans (``envs.oracle_actions``).
Demonstration prompts are built exactly like rollout prompts (``training.prompts.build_prompt_ids``:
task + last K turns + observation + admissible actions) and the response is the action followed by
the tokenizer's EOS, as the engines generate it.
"""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from training.engines import response_logits
from training.prompts import Turn, build_prompt_ids


@dataclass
class Demonstrations:
    """(prompt, response) token-id pairs for supervised training."""

    prompts: list[list[int]]
    responses: list[list[int]]
    episodes: int
    """Episodes played to collect them."""
    successes: int
    """Of those, how many were won (every one for ``oracle``)."""

    def __len__(self) -> int:
        return len(self.prompts)


def response_text(action: str, parser: str) -> str:
    """What the model should write for ``action`` under the rollout's action parser."""
    return f"<action>{action}</action>" if parser == "action_tag" else action


def collect_demonstrations(
    env: gym.Env,
    tokenizer,
    *,
    mode: str,
    episodes: int,
    seeds: np.ndarray,
    rng: np.random.Generator,
    max_turns: int,
    history_turns: int,
    parser: str,
    max_prompt_tokens: int,
    show_admissible: bool = True,
    history_observations: bool = True,
    system_prompt: str | None = None,
    perturb: float = 0.0,
) -> Demonstrations:
    """Play ``episodes`` episodes (one per seed) choosing random admissible or oracle actions and
    record one (prompt, response) pair per turn.

    ``perturb`` (oracle mode) is the probability that a turn plays a random action instead: a random
    admissible action or a random step of the current plan, which is often invalid where it is
    played. That turn is not cloned; the oracle plans again from where it led, so the clone also sees
    histories with detours and errors, and how to recover from them (noise injection, as in DART).
    Without it, a clone that once errs finds itself in a prompt no demonstration showed and tends to
    repeat the error.
    """
    from envs import has_oracle, oracle_actions

    if mode not in ("random", "oracle"):
        raise ValueError(f"SFT mode must be 'random' or 'oracle', got {mode!r}")
    if not 0.0 <= perturb < 1.0:
        raise ValueError(f"perturb must be in [0, 1), got {perturb}")
    if len(seeds) < episodes:
        raise ValueError(f"need {episodes} seeds, got {len(seeds)}")
    if mode == "oracle" and not has_oracle(env):
        raise ValueError(
            f"sft.mode=oracle needs an environment with an oracle() method and {type(env.unwrapped).__name__} has "
            "none; use sft.mode=random (clones random admissible actions) or sft.mode=none"
        )
    eos = [tokenizer.eos_token_id]
    prompts: list[list[int]] = []
    responses: list[list[int]] = []
    successes = 0
    for seed in seeds[:episodes]:
        observation, info = env.reset(seed=int(seed))
        task = info.get("task", "")
        plan = oracle_actions(env) if mode == "oracle" else []
        history: list[Turn] = []
        for _ in range(max_turns):
            admissible = info.get("admissible_actions")
            if mode == "oracle":
                if not plan:  # won, or no winning plan is left from here
                    break
                if perturb and rng.random() < perturb:
                    candidates = [*(admissible or []), *plan]
                    action = candidates[int(rng.integers(len(candidates)))]
                    history.append(Turn(observation, action))
                    observation, _, terminated, truncated, info = env.step(action)
                    if terminated or truncated:
                        break
                    plan = oracle_actions(env)
                    continue
                action = plan.pop(0)
            else:
                if not admissible:
                    raise ValueError("sft.mode=random needs an environment with info['admissible_actions']")
                action = admissible[int(rng.integers(len(admissible)))]
            prompts.append(
                build_prompt_ids(
                    tokenizer, task, history, observation, admissible if show_admissible else None,
                    parser=parser, history_turns=history_turns, max_prompt_tokens=max_prompt_tokens,
                    history_observations=history_observations, system_prompt=system_prompt,
                )
            )
            text = response_text(action, parser)
            responses.append(list(tokenizer(text, add_special_tokens=False)["input_ids"]) + eos)
            history.append(Turn(observation, action))
            observation, _, terminated, truncated, info = env.step(action)
            if terminated or truncated:
                break
        successes += int(bool(info.get("won", False)))
    return Demonstrations(prompts, responses, episodes, successes)


def supervised_step(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, prompts: list[list[int]], responses: list[list[int]]
) -> tuple[float, float]:
    """One cross-entropy step on the response tokens; returns (loss, token accuracy) of the batch."""
    logits, targets, mask = response_logits(model, prompts, responses)
    token_nll = F.cross_entropy(logits.float().transpose(1, 2), targets, reduction="none")
    loss = (token_nll * mask).sum() / mask.sum().clamp(min=1.0)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    correct = (logits.detach().argmax(-1) == targets).float()
    accuracy = float((correct * mask).sum() / mask.sum().clamp(min=1.0))
    return float(loss.detach()), accuracy


def train_supervised(
    model: torch.nn.Module,
    demos: Demonstrations,
    *,
    steps: int,
    lr: float,
    batch_size: int,
    rng: np.random.Generator,
    progress: bool = True,
) -> dict[str, float]:
    """``steps`` AdamW steps on random batches of ``demos``; reports the loss and token accuracy
    averaged over the last tenth of the steps (at least one)."""
    if len(demos) == 0:
        raise ValueError("no SFT demonstrations were collected")
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    history: list[tuple[float, float]] = []
    columns = (
        TextColumn("[bold]SFT"), BarColumn(), MofNCompleteColumn(), TextColumn("loss {task.fields[loss]:.3f}"),
        TextColumn("acc {task.fields[acc]:.3f}"), TimeElapsedColumn(), TimeRemainingColumn(),
    )
    with Progress(*columns, disable=not progress, transient=True) as bar:
        task = bar.add_task("sft", total=steps, loss=float("nan"), acc=float("nan"))
        for _ in range(steps):
            rows = rng.choice(len(demos), size=min(batch_size, len(demos)), replace=False)
            loss, accuracy = supervised_step(
                model, optimizer, [demos.prompts[i] for i in rows], [demos.responses[i] for i in rows]
            )
            history.append((loss, accuracy))
            bar.update(task, advance=1, loss=loss, acc=accuracy)
    model.eval()
    tail = history[-max(1, steps // 10) :] if history else [(float("nan"), float("nan"))]
    return {
        "sft/loss": float(np.mean([h[0] for h in tail])),
        "sft/token_accuracy": float(np.mean([h[1] for h in tail])),
        "sft/pairs": float(len(demos)),
        "sft/demo_success_rate": demos.successes / max(demos.episodes, 1),
    }
