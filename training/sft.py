"""Supervised warm start: teach a policy built from scratch the action format before RL.

``random`` clones uniformly random admissible actions: the model learns to answer with one valid
command in the prompt format of the rollouts, but nothing about which command wins, so RL has the
whole task left to learn. ``oracle`` clones the environments' oracle plans (``envs.oracle_actions``).
Demonstrations are played by the rollouts' episode loop (``training.rollout.play_episodes``) with a
:class:`DemonstrationActor` in place of the policy, so their prompts are built exactly like rollout
prompts, and the response is the action followed by the tokenizer's EOS, as the engines generate it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from agent_rl.config import Config, RolloutConfig
from training.envpool import EnvFactory, EnvPool, env_pool
from training.learner import response_logits
from training.prompts import PromptFormat
from training.rollout import Episode, Move, PlayStats, draw_seeds, play_episodes

SFT_MODES = ("random", "oracle")


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


class DemonstrationActor:
    """Plays random admissible actions (``random``) or the oracle's plan (``oracle``), planned at the
    start of an episode and again after each perturbed turn. ``perturb`` (oracle mode) is the
    probability that a turn plays a random action instead: a random admissible action or a random
    step of the current plan, which is often invalid where it is played. That turn is not cloned;
    the oracle plans again from where it led, so the clone also sees histories with detours and
    errors, and how to recover from them (noise injection, as in DART). Without it, a clone that
    once errs finds itself in a prompt no demonstration showed and tends to repeat the error."""

    def __init__(self, pool: EnvPool, tokenizer, prompt_format: PromptFormat, *, mode: str, rng: np.random.Generator,
                 perturb: float = 0.0):
        self.pool, self.tokenizer, self.format = pool, tokenizer, prompt_format
        self.mode, self.rng, self.perturb = mode, rng, perturb
        self.plans: dict[int, list[str]] = {}
        """The rest of each slot's oracle plan."""

    def act(self, episodes: list[Episode]) -> list[Move]:
        if self.mode == "oracle":
            stale = [e for e in episodes if not e.history or e.slot not in self.plans]  # a new episode, or a detour
            for episode, plan in zip(stale, self.pool.oracle([e.slot for e in stale]) if stale else []):
                self.plans[episode.slot] = list(plan or [])
        return [self._move(e) for e in episodes]

    def _move(self, episode: Episode) -> Move:
        admissible = episode.admissible_actions
        if self.mode == "random":
            if not admissible:
                raise ValueError("sft.mode=random needs an environment with info['admissible_actions']")
            return self._cloned(episode, admissible[int(self.rng.integers(len(admissible)))])
        plan = self.plans[episode.slot]
        if not plan:  # won, or no winning plan is left from here
            return Move(None)
        if self.perturb and self.rng.random() < self.perturb:
            candidates = [*(admissible or []), *plan]
            del self.plans[episode.slot]  # the oracle plans again from where this leads
            return Move(candidates[int(self.rng.integers(len(candidates)))], learn=False)
        return self._cloned(episode, plan.pop(0))

    def _cloned(self, episode: Episode, action: str) -> Move:
        prompt = self.format.prompt_ids(
            self.tokenizer, episode.task, episode.history, episode.observation, episode.admissible_actions
        )
        text = self.format.response_text(action)
        return Move(action, prompt, list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) + [self.tokenizer.eos_token_id])


def collect_demonstrations(
    envs: EnvPool | EnvFactory,
    tokenizer,
    config: RolloutConfig,
    *,
    mode: str,
    seeds: Sequence[int],
    rng: np.random.Generator,
    perturb: float = 0.0,
) -> Demonstrations:
    """Play one episode per seed with random admissible or oracle actions (see
    :class:`DemonstrationActor`) in the prompt format of ``config``, and record one (prompt,
    response) pair per cloned turn. Episodes are played one after another, so ``rng`` is drawn in
    episode order. An episode whose environment raises adds no pairs."""
    if mode not in SFT_MODES:
        raise ValueError(f"SFT mode must be 'random' or 'oracle', got {mode!r}")
    if not 0.0 <= perturb < 1.0:
        raise ValueError(f"perturb must be in [0, 1), got {perturb}")
    prompts: list[list[int]] = []
    responses: list[list[int]] = []
    successes = 0
    with env_pool(envs, 1) as pool:
        if mode == "oracle" and not pool.has_oracle:
            raise ValueError(
                f"sft.mode=oracle needs an environment with an oracle() method and {pool.env_id} has none; use "
                "sft.mode=random (clones random admissible actions) or sft.mode=none"
            )
        actor = DemonstrationActor(pool, tokenizer, PromptFormat.from_rollout(config), mode=mode, rng=rng, perturb=perturb)
        for seed in seeds:
            (episode,) = play_episodes(pool, actor, [seed], [0], config, PlayStats())
            if episode.failure is None:
                cloned = [row for row in episode.rows if row["learn"]]
                prompts += [row["prompt_ids"].tolist() for row in cloned]
                responses += [row["response_ids"].tolist() for row in cloned]
                successes += int(bool(episode.rows and episode.rows[-1]["won"]))
    return Demonstrations(prompts, responses, len(seeds), successes)


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


def scheduled_lr(step: int, steps: int, lr: float, schedule: str) -> float:
    """Learning rate of optimizer step ``step`` (0-based) of ``steps``. ``constant``: ``lr``.
    ``cosine``: a linear warmup over the first 5% of the steps (at least one), then a cosine decay from
    ``lr`` towards 0, so training ends on a settled iterate rather than on a full-size step."""
    if schedule == "constant":
        return lr
    warmup = max(1, round(0.05 * steps))
    if step < warmup:
        return lr * (step + 1) / warmup
    return lr * 0.5 * (1.0 + math.cos(math.pi * (step - warmup) / (steps - warmup)))


def train_supervised(
    model: torch.nn.Module,
    demos: Demonstrations,
    *,
    steps: int,
    lr: float,
    batch_size: int,
    rng: np.random.Generator,
    schedule: str = "constant",
    progress: bool = True,
) -> dict[str, float]:
    """``steps`` AdamW steps on random batches of ``demos`` with the learning rate of ``scheduled_lr``;
    reports the loss and token accuracy averaged over the last tenth of the steps (at least one)."""
    if len(demos) == 0:
        raise ValueError("no SFT demonstrations were collected")
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
    model.train()
    history: list[tuple[float, float]] = []
    columns = (
        TextColumn("[bold]SFT"), BarColumn(), MofNCompleteColumn(), TextColumn("loss {task.fields[loss]:.3f}"),
        TextColumn("acc {task.fields[acc]:.3f}"), TimeElapsedColumn(), TimeRemainingColumn(),
    )
    with Progress(*columns, disable=not progress, transient=True) as bar:
        task = bar.add_task("sft", total=steps, loss=float("nan"), acc=float("nan"))
        for step in range(steps):
            for group in optimizer.param_groups:
                group["lr"] = scheduled_lr(step, steps, lr, schedule)
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


def warm_start(model: torch.nn.Module, tokenizer, make_env: EnvFactory, config: Config,
               console: Console | None = None) -> dict[str, float]:
    """The supervised warm start ``config.sft`` asks for, on demonstrations in the rollout prompt
    format; returns its metrics (none when ``sft.mode`` is ``none``)."""
    sft = config.sft
    if sft.mode == "none" or sft.steps == 0:
        return {}
    rng = np.random.default_rng([config.trainer.seed, 3])
    demos = collect_demonstrations(
        make_env, tokenizer, config.rollout, mode=sft.mode, seeds=draw_seeds(rng, sft.episodes, set()), rng=rng,
        perturb=sft.perturb,
    )
    metrics = train_supervised(model, demos, steps=sft.steps, lr=sft.lr, batch_size=sft.batch_size, rng=rng,
                               schedule=sft.lr_schedule, progress=config.logging.console)
    limit = config.rollout.max_new_tokens
    too_long = [len(r) for r in demos.responses if len(r) > limit]
    metrics["sft/overlong_fraction"] = len(too_long) / len(demos)
    if console is not None:
        console.print(
            f"SFT ({sft.mode}): {int(metrics['sft/pairs'])} pairs, {sft.steps} steps, "
            f"token accuracy {metrics['sft/token_accuracy']:.3f}, loss {metrics['sft/loss']:.3f}"
        )
        if too_long:
            # The policy learns replies that generation then cuts off: those actions can never be played.
            console.print(
                f"[yellow]warning[/]: {len(too_long)} of {len(demos)} demonstrated replies are longer than "
                f"rollout.max_new_tokens={limit} (up to {max(too_long)} tokens with the end-of-sequence token); "
                "the policy cannot finish them when it acts. Raise rollout.max_new_tokens."
            )
    return metrics
