"""Building a config: YAML files and ``key=value`` overrides on top of the defaults, each value
checked against its field's type (unknown keys get a "did you mean"), and writing one back."""

from __future__ import annotations

import dataclasses
import difflib
import importlib.resources
import os
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml

from agent_rl.config.schema import Config, ConfigError
from agent_rl.config.validation import validate


def _section_types() -> dict[str, type]:
    return typing.get_type_hints(Config)


def _field_hints(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _all_keys() -> list[str]:
    keys = []
    for section, cls in _section_types().items():
        keys += [f"{section}.{name}" for name in _field_hints(cls)]
    return keys


def _unknown(key: str) -> ConfigError:
    close = difflib.get_close_matches(key, _all_keys() + list(_section_types()), n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return ConfigError(f"unknown config key {key!r}{hint}")


def _coerce(value: Any, hint: Any, key: str) -> Any:
    """Check ``value`` against the type ``hint`` of field ``key``; convert where unambiguous."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if hint is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _coerce(value, arg, key)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if len(errors) == 1 else f"config key {key!r}: invalid value {value!r}")
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"config key {key!r}: {value!r} is not one of {list(args)}")
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"config key {key!r} expects true/false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"config key {key!r} expects an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, str):  # YAML 1.1 reads "1e-4" (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                raise ConfigError(f"config key {key!r} expects a number, got {value!r}") from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"config key {key!r} expects a number, got {value!r}")
        return float(value)
    if hint is str:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        if not isinstance(value, str):
            raise ConfigError(f"config key {key!r} expects a string, got {value!r}")
        return value
    if origin is list:
        items = value if isinstance(value, (list, tuple)) else [value]
        return [_coerce(v, args[0], f"{key}[{i}]") for i, v in enumerate(items)]
    if origin is tuple:
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            raise ConfigError(f"config key {key!r} expects a list of {len(args)} values, got {value!r}")
        return tuple(_coerce(v, a, f"{key}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"config key {key!r} expects a mapping, got {value!r}")
        return {str(k): v for k, v in value.items()}
    raise ConfigError(f"config key {key!r}: unsupported type {hint!r}")


class _Edits(dict):
    """Sub-key edits of a mapping field (``env.kwargs.max_steps=40``), applied on top of the field's
    value once its section is built: ``env.kwargs``'s default depends on the final ``env.id``."""


def _build_section(cls: type, values: dict[str, Any], section: str) -> Any:
    hints = _field_hints(cls)
    default = getattr(Config(), section)
    # Missing keys keep the embedded defaults of this section; a field declared None stays None for
    # __post_init__ to derive from the others (env.kwargs from env.id).
    kwargs = {f.name: None if f.default is None else getattr(default, f.name) for f in dataclasses.fields(cls)}
    edits = {}
    for name, value in values.items():
        key = f"{section}.{name}"
        if name not in hints:
            raise _unknown(key)
        if isinstance(value, _Edits):
            edits[name] = value
        else:
            kwargs[name] = _coerce(value, hints[name], key)
    built = cls(**kwargs)
    for name, edit in edits.items():
        setattr(built, name, _coerce({**(getattr(built, name) or {}), **edit}, hints[name], f"{section}.{name}"))
    return built


def config_from_dict(data: dict[str, Any]) -> Config:
    """Build and validate a :class:`Config` from a nested dict (missing keys keep their defaults)."""
    if not isinstance(data, dict):
        raise ConfigError(f"a config must be a mapping of sections, got {type(data).__name__}")
    sections = _section_types()
    built = {}
    for section, values in data.items():
        if section not in sections:
            raise _unknown(str(section))
        cls = sections[section]
        if not isinstance(values, dict):
            shorthand = getattr(cls, "_shorthand", None)
            if shorthand is None:
                raise ConfigError(f"config section {section!r} expects a mapping, got {values!r}")
            values = {shorthand: values}
        built[section] = _build_section(cls, values, section)
    config = Config(**built)
    validate(config)
    return config


def config_to_dict(config: Config) -> dict[str, Any]:
    """Plain nested dict (YAML/JSON-safe: tuples become lists)."""

    def plain(value: Any) -> Any:
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        return value

    return {s.name: plain(dataclasses.asdict(getattr(config, s.name))) for s in dataclasses.fields(config)}


def _set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    sections = _section_types()
    parts = key.split(".")
    section = parts[0]
    if section not in sections:
        raise _unknown(key)
    cls = sections[section]
    current = data.setdefault(section, {})
    if not isinstance(current, dict):  # the YAML used the shorthand form (algo: gigpo)
        current = data[section] = {cls._shorthand: current}
    if len(parts) == 1:
        if isinstance(value, dict):
            current.update(value)
            return
        shorthand = getattr(cls, "_shorthand", None)
        if shorthand is None:
            raise ConfigError(f"config key {key!r} is a section; set one of its fields ({key}.FIELD=VALUE)")
        current[shorthand] = value
        return
    name = parts[1]
    hints = _field_hints(cls)
    if name not in hints:
        raise _unknown(f"{section}.{name}")
    if len(parts) == 2:
        current[name] = value
        return
    if dict not in (typing.get_origin(hints[name]), *map(typing.get_origin, typing.get_args(hints[name]))):
        raise _unknown(key)
    if current.get(name) is None:  # a sub-key override edits the default mapping rather than replacing it
        current[name] = _Edits()
    target = current[name]
    for part in parts[2:-1]:
        target = target.setdefault(part, {})
    target[parts[-1]] = value


def parse_override(text: str) -> tuple[str, Any]:
    """``'trainer.iterations=50'`` -> ``('trainer.iterations', 50)`` (value via yaml.safe_load)."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {text!r} is not of the form key=value")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {text!r}: cannot parse the value: {exc}") from None
    return key.strip(), value


def resolve_config_path(name_or_path: str) -> Path:
    """A YAML path, or the name of a bundled recipe in ``agent_rl.training``'s ``configs`` (``maze``)."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    recipes = Path(str(importlib.resources.files("agent_rl.training") / "configs"))
    recipe = recipes / f"{name_or_path}.yaml"
    if recipe.is_file():
        return recipe
    known = ", ".join(sorted(p.stem for p in recipes.glob("*.yaml"))) or "none"
    raise ConfigError(f"config file {name_or_path!r} not found (bundled recipes: {known})")


def load_config(
    path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = (), base: dict[str, Any] | None = None
) -> Config:
    """Defaults <- ``base`` dict <- YAML file ``path`` <- ``overrides`` (``key=value`` strings)."""
    data: dict[str, Any] = yaml.safe_load(yaml.safe_dump(base)) if base else {}
    if path is not None:
        file_path = resolve_config_path(str(path))
        try:
            loaded = yaml.safe_load(file_path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {str(file_path)!r} is not valid YAML: {exc}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {str(file_path)!r} must hold a mapping of sections")
        for section, values in loaded.items():
            _set_dotted(data, str(section), values)
    for text in overrides:
        key, value = parse_override(text)
        _set_dotted(data, key, value)
    return config_from_dict(data)


DEFAULT_RECIPE = "maze"
"""The bundled recipe that ``agent-rl train`` runs when given no ``--config`` (the main job), and that
``agent-rl eval`` evaluates a model directory with."""


def load_default_config(overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """``DEFAULT_RECIPE`` with ``overrides``; when the overrides name another environment, the library
    defaults with them instead: a recipe's settings (its environment's arguments, the warm start's
    sizes, the prompt) belong to its environment."""
    library = load_config(None, overrides)
    if library.env.id != load_config(DEFAULT_RECIPE).env.id:
        return library
    return load_config(DEFAULT_RECIPE, overrides)


def save_config(config: Config, path: str | Path) -> None:
    """Write ``config.yaml`` atomically: a reader (another learner resuming) never sees half a file."""
    path = Path(path)
    staging = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    staging.write_text(yaml.safe_dump(config_to_dict(config), sort_keys=False))
    os.replace(staging, path)
