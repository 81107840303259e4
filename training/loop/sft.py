"""Supervised warm start: teach a policy built from scratch the action format before RL.

``random`` clones uniformly random admissible actions: the model learns to answer with one valid
command in the prompt format of the rollouts, but nothing about which command wins, so RL has the
whole task left to learn. ``oracle`` clones the environments' oracle plans (``agent_rl.envs.oracle_actions``),
optionally followed by a DAgger round in which the clone plays and the oracle labels the states it
reached (:class:`OracleLabeller`). Demonstrations are played by the rollouts' episode loop
(``agent_rl.training.loop.rollout.play_episodes``) with a :class:`DemonstrationActor` in place of the policy, so
their prompts are built exactly like rollout prompts, and the response is the action followed by the
tokenizer's EOS, as the engines generate it.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from agent_rl.config import SFT_MODES, Config, RolloutConfig
from agent_rl.training.loop.learner import warmup_lr
from agent_rl.training.loop.rollout import (
    ChoosingActor,
    Episode,
    Move,
    PlayStats,
    PolicyActor,
    draw_seeds,
    oracle_plans,
    play_episodes,
    policy_actor,
    sampling_params,
    split_failed,
    turn_prompt_ids,
)
from agent_rl.training.models.prompts import PromptFormat
from agent_rl.training.serving.engines import Engine, HFEngine
from agent_rl.training.serving.envpool import EnvFactory, EnvPool, env_pool
from agent_rl.training.serving.logprobs import response_logits

FORMAT_CHECK_EVERY = 25
"""Cloning steps between two measurements of the format accuracy (``sft.format_target``)."""
FORMAT_PROBES = 64
"""Demonstration prompts held out of training to measure the format accuracy on."""


@dataclass
class Demonstrations:
    """(prompt, response) token-id pairs for supervised training."""

    prompts: list[list[int]]
    responses: list[list[int]]
    episodes: int
    """Episodes played to collect them."""
    successes: int
    """Of those, how many were won (in ``oracle`` mode, all but those a perturbed turn led into a dead
    state, where the oracle has no plan left and the demonstration ends)."""
    admissible: list[list[str] | None] = field(default_factory=list)
    """The admissible actions each prompt listed (None where the environment lists none)."""
    failures: list[str] = field(default_factory=list)
    """Why each episode whose environment raised failed (``agent_rl.training.serving.envpool``'s form)."""

    def __len__(self) -> int:
        return len(self.prompts)

    def split(self, rows: np.ndarray) -> tuple[Demonstrations, Demonstrations]:
        """``(the pairs at rows, the others)``, each counting the same episodes and failures."""
        chosen = np.zeros(len(self), dtype=bool)
        chosen[rows] = True

        def part(mask: np.ndarray) -> Demonstrations:
            index = np.flatnonzero(mask)
            return Demonstrations(
                [self.prompts[i] for i in index],
                [self.responses[i] for i in index],
                self.episodes,
                self.successes,
                [self.admissible[i] for i in index] if self.admissible else [],
                self.failures,
            )

        return part(chosen), part(~chosen)


class DemonstrationActor:
    """Plays random admissible actions (``random``) or the oracle's plan (``oracle``), planned at the
    start of an episode and again after each perturbed turn. ``perturb`` (oracle mode) is the
    probability that a turn plays a random action instead: a random admissible action or a random
    step of the current plan, which is often invalid where it is played. That turn is not cloned;
    the oracle plans again from where it led, so the clone also sees histories with detours and
    errors, and how to recover from them (noise injection, as in DART). Without it, a clone that
    once errs finds itself in a prompt no demonstration showed and tends to repeat the error.
    ``epsilon`` (oracle mode) is the probability that a turn plays a random admissible action and
    clones it: the demonstrations of an epsilon-greedy expert."""

    def __init__(
        self,
        pool: EnvPool,
        tokenizer,
        prompt_format: PromptFormat,
        *,
        mode: str,
        rng: np.random.Generator,
        perturb: float = 0.0,
        epsilon: float = 0.0,
    ):
        self.pool, self.tokenizer, self.format = pool, tokenizer, prompt_format
        self.mode, self.rng, self.perturb, self.epsilon = mode, rng, perturb, epsilon
        self.plans: dict[int, list[str]] = {}
        """The rest of each slot's oracle plan."""

    def act(self, episodes: list[Episode]) -> list[Move]:
        if self.mode == "oracle":
            stale = [e for e in episodes if not e.history or e.slot not in self.plans]  # a new episode, or a detour
            for episode, plan in zip(stale, oracle_plans(self.pool, stale)):
                self.plans[episode.slot] = plan
        return [self._move(e) for e in episodes]

    def _move(self, episode: Episode) -> Move:
        admissible = episode.admissible_actions
        if self.mode == "random":
            if not admissible:
                call = "step()" if episode.history else "reset()"
                raise ValueError(
                    f"sft.mode=random needs info['admissible_actions'] at every turn, and the info "
                    f"{self.pool.env_id}'s {call} returned for turn {len(episode.history)} has none"
                )
            return self._cloned(episode, admissible[int(self.rng.integers(len(admissible)))])
        plan = self.plans[episode.slot]
        if not plan:  # won, or no winning plan is left from here
            return Move(None)
        if self.perturb and self.rng.random() < self.perturb:
            candidates = [*(admissible or []), *plan]
            del self.plans[episode.slot]  # the oracle plans again from where this leads
            return Move(candidates[int(self.rng.integers(len(candidates)))], learn=False)
        if self.epsilon and admissible and self.rng.random() < self.epsilon:
            del self.plans[episode.slot]
            return self._cloned(episode, admissible[int(self.rng.integers(len(admissible)))])
        return self._cloned(episode, plan.pop(0))

    def _cloned(self, episode: Episode, action: str) -> Move:
        prompt = turn_prompt_ids(self.format, self.tokenizer, episode)
        return Move(action, prompt, self.format.response_ids(self.tokenizer, action))


class OracleLabeller:
    """DAgger: the policy's action is played, and the turn is labelled with the oracle's first action
    from the state the policy reached, so the clone learns what to do in the states its own errors
    lead to (and that expert demonstrations never visit). A turn from which the oracle has no
    winning plan is played but not labelled."""

    def __init__(self, policy: PolicyActor | ChoosingActor, pool: EnvPool, tokenizer, prompt_format: PromptFormat):
        self.policy, self.pool, self.tokenizer, self.format = policy, pool, tokenizer, prompt_format

    def act(self, episodes: list[Episode]) -> list[Move]:
        moves = self.policy.act(episodes)
        plans = oracle_plans(self.pool, episodes)
        return [
            dataclasses.replace(move, response_ids=self.format.response_ids(self.tokenizer, plan[0]))
            if plan
            else dataclasses.replace(move, learn=False)
            for move, plan in zip(moves, plans)
        ]


def demonstrations_of(episodes: Sequence[Episode]) -> Demonstrations:
    """The (prompt, response) pairs of the learned turns of ``episodes``; an episode whose environment
    raised adds none. ``successes`` counts the won episodes."""
    played, failures = split_failed(episodes)
    cloned = [row for e in played for row in e.rows if row["learn"]]
    return Demonstrations(
        [row["prompt_ids"].tolist() for row in cloned],
        [row["response_ids"].tolist() for row in cloned],
        len(episodes),
        sum(bool(e.rows and e.rows[-1]["won"]) for e in played),
        [row["admissible"] for row in cloned],
        failures,
    )


def collect_demonstrations(
    envs: EnvPool | EnvFactory,
    tokenizer,
    config: RolloutConfig,
    *,
    mode: str,
    seeds: Sequence[int],
    rng: np.random.Generator,
    perturb: float = 0.0,
    epsilon: float = 0.0,
    timeout_s: float | None = None,
) -> Demonstrations:
    """Play one episode per seed with random admissible or oracle actions (see
    :class:`DemonstrationActor`) in the prompt format of ``config``, and record one (prompt,
    response) pair per cloned turn. Episodes are played one after another, so ``rng`` is drawn in
    episode order. An episode whose environment raises, or takes more than ``timeout_s`` in one call
    (a factory's pool; see ``env.timeout_s``), adds no pairs."""
    if mode not in SFT_MODES:
        raise ValueError(f"SFT mode must be 'random' or 'oracle', got {mode!r}")
    if not 0.0 <= perturb < 1.0:
        raise ValueError(f"perturb must be in [0, 1), got {perturb}")
    if not 0.0 <= epsilon <= 1.0:
        raise ValueError(f"epsilon must be in [0, 1], got {epsilon}")
    with env_pool(envs, 1, timeout_s=timeout_s) as pool:
        if mode == "oracle" and not pool.has_oracle:
            raise ValueError(
                f"sft.mode=oracle needs an environment with an oracle() method and {pool.env_id} has none; use "
                "sft.mode=random (clones random admissible actions) or sft.mode=none"
            )
        actor = DemonstrationActor(
            pool, tokenizer, PromptFormat.from_rollout(config), mode=mode, rng=rng, perturb=perturb, epsilon=epsilon
        )
        episodes = [
            episode for seed in seeds for episode in play_episodes(pool, actor, [seed], [0], config, PlayStats())
        ]
    demos = demonstrations_of(episodes)
    if not demos.prompts and demos.failures:
        raise ValueError(
            f"no SFT demonstrations were collected: {len(demos.failures)} of {len(episodes)} demonstration "
            f"episodes failed in {pool.env_id}; the first error: {demos.failures[0]}"
        )
    return demos


def collect_dagger(
    envs: EnvPool | EnvFactory,
    engine: Engine,
    tokenizer,
    config: RolloutConfig,
    *,
    seeds: Sequence[int],
    batch: int,
    timeout_s: float | None = None,
) -> Demonstrations:
    """Play one greedy episode of ``engine``'s policy per seed, ``batch`` at a time, labelling each
    turn with the oracle's action (:class:`OracleLabeller`). Greedy, because the policy is evaluated
    greedily and a greedy policy's errors repeat: its loops are the states to correct.
    ``successes`` counts the policy's own wins."""
    play = PlayStats()
    policy = policy_actor(engine, tokenizer, config, play, greedy=True)
    episodes: list[Episode] = []
    with env_pool(envs, min(batch, len(seeds)), timeout_s=timeout_s) as pool:
        if not pool.has_oracle:
            raise ValueError(
                f"sft.dagger_episodes needs an environment with an oracle() method and {pool.env_id} has none"
            )
        actor = OracleLabeller(policy, pool, tokenizer, policy.format)
        for start in range(0, len(seeds), batch):
            chunk = seeds[start : start + batch]
            episodes += play_episodes(pool, actor, chunk, range(len(chunk)), config, play)
    return demonstrations_of(episodes)


def supervised_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    prompts: list[list[int]],
    responses: list[list[int]],
    precision: str = "fp32",
    weights: Sequence[float] | None = None,
) -> tuple[float, float]:
    """One cross-entropy step on the response tokens; returns (loss, token accuracy) of the batch:
    means over the response tokens, each row's tokens weighted by its ``weights`` entry (1 without)."""
    logits, targets, mask = response_logits(model, prompts, responses, precision)
    if weights is not None:
        mask = mask * torch.as_tensor(weights, dtype=mask.dtype, device=mask.device)[:, None]
    token_nll = F.cross_entropy(logits.float().transpose(1, 2), targets, reduction="none")
    loss = (token_nll * mask).sum() / mask.sum().clamp(min=1e-12)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    correct = (logits.detach().argmax(-1) == targets).float()
    accuracy = float((correct * mask).sum() / mask.sum().clamp(min=1e-12))
    return float(loss.detach()), accuracy


def format_accuracy(engine: Engine, tokenizer, config: RolloutConfig, probes: Demonstrations) -> float:
    """The share of replies ``engine`` samples for the prompts of ``probes`` (one each, at the rollout's
    temperature) that name an action of the game: one admissible in any of the probes' states. Which
    of them is legal where (a wall, the board's edge) is the task, which RL learns; a clone of random
    legal moves learns it only in part, and a target on legality would keep it cloning."""
    prompt_format = PromptFormat.from_rollout(config)
    actions = sorted(set().union(*(listed or () for listed in probes.admissible)))
    completions = engine.generate(probes.prompts, 1, sampling_params(config))
    named = [
        prompt_format.parse(tokenizer.decode(completion.token_ids, skip_special_tokens=True), actions)[0] in actions
        for (completion,) in completions
    ]
    return float(np.mean(named))


def listed_weights(counts: Sequence[int]) -> np.ndarray:
    """Row weights of pairs that teach ``counts[k]`` responses each: ``1 / counts[k]`` on each of
    pair ``k``'s rows, so every pair weighs 1 in all."""
    counts = np.asarray(counts, dtype=np.int64)
    return np.repeat(1.0 / counts, counts)


def scheduled_lr(step: int, steps: int, lr: float, schedule: str) -> float:
    """Learning rate of optimizer step ``step`` (0-based) of ``steps``. ``constant``: ``lr``.
    ``cosine``: a linear warmup over the first 5% of the steps (at least one), then a cosine decay from
    ``lr`` towards 0, so training ends on a settled iterate rather than on a full-size step."""
    if schedule == "constant":
        return lr
    warmup = max(1, round(0.05 * steps))
    if step < warmup:
        return warmup_lr(step + 1, lr, warmup)
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
    dagger: tuple[int, Callable[[], Demonstrations]] | None = None,
    precision: str = "fp32",
    until: Callable[[int], bool] | None = None,
    listed: list[list[list[int]]] | None = None,
) -> dict[str, float]:
    """``steps`` AdamW steps on random batches of ``demos`` with the learning rate of ``scheduled_lr``;
    reports the loss and token accuracy averaged over the last tenth of the steps taken (at least
    one) and ``sft/steps_taken``. ``listed[i]`` (``sft.targets=listed``), when given, holds the
    responses pair ``i`` of ``demos`` teaches in place of its own, each weighted by one over their
    number (``listed_weights``). ``dagger=(step, collect)`` calls ``collect()`` (in eval mode)
    before that step, and from it on draws half of every batch from the pairs it returns: they are
    few next to the demonstrations, but they are the clone's own mistakes (``sft/dagger_*``
    metrics). ``until(steps_taken)`` is asked after every step; True ends training there."""
    if len(demos) == 0:
        raise ValueError("no SFT demonstrations were collected")
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
    model.train()
    history: list[tuple[float, float]] = []
    extra: Demonstrations | None = None
    columns = (
        TextColumn("[bold]SFT"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]:.3f}"),
        TextColumn("acc {task.fields[acc]:.3f}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, disable=not progress, transient=True) as bar:
        task = bar.add_task("sft", total=steps, loss=float("nan"), acc=float("nan"))
        for step in range(steps):
            for group in optimizer.param_groups:
                group["lr"] = scheduled_lr(step, steps, lr, schedule)
            if dagger is not None and step == dagger[0]:
                model.eval()
                extra = dagger[1]()
                model.train()
            pairs = [demos, extra] if extra else [demos]  # a round that labelled nothing changes nothing
            shares = [batch_size - batch_size // 2, batch_size // 2] if extra else [batch_size]
            batch = [
                (part, int(i))
                for part, share in zip(pairs, shares)
                for i in rng.choice(len(part), size=min(share, len(part)), replace=False)
            ]
            taught = [listed[i] if listed is not None and part is demos else [part.responses[i]] for part, i in batch]
            loss, accuracy = supervised_step(
                model,
                optimizer,
                [part.prompts[i] for (part, i), responses in zip(batch, taught) for _ in responses],
                [response for responses in taught for response in responses],
                precision,
                listed_weights([len(responses) for responses in taught]) if listed is not None else None,
            )
            history.append((loss, accuracy))
            bar.update(task, advance=1, loss=loss, acc=accuracy)
            if until is not None and until(step + 1):
                break
    model.eval()
    tail = history[-max(1, len(history) // 10) :] if history else [(float("nan"), float("nan"))]
    return {
        "sft/loss": float(np.mean([h[0] for h in tail])),
        "sft/token_accuracy": float(np.mean([h[1] for h in tail])),
        "sft/steps_taken": float(len(history)),
        "sft/pairs": float(len(demos)),
        "sft/demo_success_rate": demos.successes / max(demos.episodes, 1),
        **(
            {"sft/dagger_pairs": float(len(extra)), "sft/dagger_success_rate": extra.successes / max(extra.episodes, 1)}
            if extra is not None
            else {}
        ),
    }


def warm_start(
    model: torch.nn.Module,
    tokenizer,
    make_env: EnvFactory,
    config: Config,
    console: Console | None = None,
    engine: Engine | None = None,
) -> dict[str, float]:
    """The supervised warm start ``config.sft`` asks for, on demonstrations in the rollout prompt
    format; returns its metrics (none when ``sft.mode`` is ``none``). The DAgger round
    (``sft.dagger_episodes``, oracle mode) plays the clone on ``engine``, synced to ``model`` first.

    Cloning stops early (``sft/steps_taken``) once ``sft.max_seconds`` have passed, and in random mode
    once the format accuracy (:func:`format_accuracy`, on ``FORMAT_PROBES`` demonstration pairs held
    out of training, or half of the pairs where there are fewer than twice as many, every
    ``FORMAT_CHECK_EVERY`` steps, sampled on ``engine`` or an hf engine on ``model``) reaches
    ``sft.format_target``: random actions teach the format, not the task."""
    sft = config.sft
    if sft.mode == "none" or sft.steps == 0:
        return {}
    rng = np.random.default_rng([config.trainer.seed, 3])
    used: set[int] = set()
    demos = collect_demonstrations(
        make_env,
        tokenizer,
        config.rollout,
        mode=sft.mode,
        seeds=draw_seeds(rng, sft.episodes, used),
        rng=rng,
        perturb=sft.perturb,
        epsilon=sft.epsilon,
        timeout_s=config.env.timeout_s,
    )
    checks: list[float] = []
    probes = None
    if sft.mode == "random" and sft.format_target is not None and len(demos) >= 2:
        # At most half of the pairs are held out, so a small demonstration set still trains.
        probes, demos = demos.split(rng.choice(len(demos), size=min(FORMAT_PROBES, len(demos) // 2), replace=False))
        engine = (
            engine
            if engine is not None
            else HFEngine(model, tokenizer, seed=config.trainer.seed, precision=config.policy.precision)
        )
    started = time.perf_counter()

    def until(steps_taken: int) -> bool:
        if sft.max_seconds is not None and time.perf_counter() - started >= sft.max_seconds:
            return True
        if probes is None or steps_taken % FORMAT_CHECK_EVERY:
            return False
        engine.update_weights(model)
        checks.append(format_accuracy(engine, tokenizer, config.rollout, probes))
        return checks[-1] >= sft.format_target

    dagger = None
    if sft.mode == "oracle" and sft.dagger_episodes > 0:
        if engine is None:
            raise ValueError("sft.dagger_episodes > 0 needs the engine the clone plays on: pass engine=")

        def collect() -> Demonstrations:
            engine.update_weights(model)
            return collect_dagger(
                make_env,
                engine,
                tokenizer,
                config.rollout,
                seeds=draw_seeds(rng, sft.dagger_episodes, used),
                batch=config.rollout.n_groups * config.rollout.group_size,
                timeout_s=config.env.timeout_s,
            )

        dagger = (int(sft.steps * (1.0 - sft.dagger_fraction)), collect)
    listed = None
    if sft.targets == "listed":  # random mode (validation): every turn lists its actions
        prompt_format = PromptFormat.from_rollout(config.rollout)
        # A game has a few distinct actions over thousands of turns: tokenize each once.
        actions_of_game = set().union(*demos.admissible)
        response_of = {action: prompt_format.response_ids(tokenizer, action) for action in actions_of_game}
        listed = [[response_of[action] for action in actions] for actions in demos.admissible]
    metrics = train_supervised(
        model,
        demos,
        steps=sft.steps,
        lr=sft.lr,
        batch_size=sft.batch_size,
        rng=rng,
        schedule=sft.lr_schedule,
        progress=config.logging.console,
        dagger=dagger,
        precision=config.policy.precision,
        until=until,
        listed=listed,
    )
    if checks:
        metrics["sft/format_accuracy"] = checks[-1]
    limit = config.rollout.max_new_tokens
    too_long = [len(r) for r in demos.responses if len(r) > limit]
    metrics["sft/overlong_fraction"] = len(too_long) / len(demos)
    if console is not None:
        if demos.failures:
            console.print(
                f"[yellow]warning[/]: {len(demos.failures)} of {demos.episodes} demonstration episodes failed "
                f"(their environment raised) and add no pairs; the first error: {demos.failures[0]}"
            )
        reached = f", format accuracy {checks[-1]:.2f}" if checks else ""
        console.print(
            f"SFT ({sft.mode}): {int(metrics['sft/pairs'])} pairs, {int(metrics['sft/steps_taken'])} of {sft.steps} "
            "steps, "
            f"token accuracy {metrics['sft/token_accuracy']:.3f}, loss {metrics['sft/loss']:.3f}{reached}"
        )
        if "sft/dagger_pairs" in metrics:
            console.print(
                f"DAgger: the clone won {metrics['sft/dagger_success_rate']:.0%} of {sft.dagger_episodes} greedy "
                f"episodes; {int(metrics['sft/dagger_pairs'])} oracle-labelled pairs for the last "
                f"{sft.dagger_fraction:.0%} of the steps"
            )
        if too_long:
            # The policy learns replies that generation then cuts off: those actions can never be played.
            console.print(
                f"[yellow]warning[/]: {len(too_long)} of {len(demos)} demonstrated replies are longer than "
                f"rollout.max_new_tokens={limit} (up to {max(too_long)} tokens with the end-of-sequence token); "
                "the policy cannot finish them when it acts. Raise rollout.max_new_tokens."
            )
    return metrics
