"""Typed configs: dataclasses composed with OmegaConf, presets from YAML, dotted CLI overrides.

    cfg = load_config(TrainConfig, ["workflow=memagent", "algorithm.n=8"], preset="demo_cpu")

- A preset is `memrl/configs/<name>.yaml` (packaged) or a path to a YAML file.
- `section=value`, where `section` is a dataclass field (or a free-form dict section) with a `name`
  field, selects by name (`workflow=rememr1` is `workflow.name=rememr1`), as Hydra's config groups read
  on the command line.
- Unknown keys and wrong types fail with a `ConfigError` naming the key and what was expected.
"""

from __future__ import annotations

import dataclasses
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from memrl.errors import UsageError

T = TypeVar("T")


class ConfigError(UsageError):
    """A config key, value or preset is invalid; the message names it (the CLI exits 2)."""


REMOVED_KEYS: dict[str, str] = {}
"""Dotted keys a config may no longer set -> what replaces them (filled by the config modules, e.g.
memrl.training.config). A preset or override that sets one fails with one line naming the replacement;
a key ending in `.<removed key>` (e.g. the demo's `train.algorithm.actual_n`) counts too."""


def _flat_keys(node: Any, prefix: str = "") -> list[str]:
    if not isinstance(node, dict):
        return [prefix] if prefix else []
    return [k for key, v in node.items() for k in _flat_keys(v, f"{prefix}{key}.")] or [prefix.rstrip(".")]


def _check_removed(keys: list[str], origin: str) -> None:
    for key in keys:
        key = key.rstrip(".")
        for old, hint in REMOVED_KEYS.items():
            if key == old or key.endswith("." + old):
                raise ConfigError(f"{key} (set by {origin}) was removed: {hint}")


def preset_path(preset: str) -> Path:
    """The YAML file of a preset name (packaged under memrl/configs/) or a path."""
    p = Path(preset)
    if p.suffix in (".yaml", ".yml") or p.exists():
        if not p.exists():
            raise ConfigError(f"preset file {p} does not exist")
        return p
    packaged = resources.files("memrl").joinpath("configs", f"{preset}.yaml")
    if not packaged.is_file():
        raise ConfigError(f"unknown preset {preset!r}; known: {', '.join(preset_names())}")
    return Path(str(packaged))


def preset_names() -> list[str]:
    d = resources.files("memrl").joinpath("configs")
    return sorted(p.name[:-5] for p in d.iterdir() if p.name.endswith(".yaml"))


def _selector_overrides(schema: Any, overrides: list[str]) -> list[str]:
    """Rewrite `section=value` into `section.name=value` for dataclass sections with a `name` field."""
    out = []
    fields = {f.name: f for f in dataclasses.fields(schema)} if dataclasses.is_dataclass(schema) else {}
    for ov in overrides:
        if "=" not in ov:
            raise ConfigError(f"override {ov!r} is not of the form key=value")
        key, value = ov.split("=", 1)
        key = key.lstrip("+")
        f = fields.get(key)
        section = f.default_factory() if f is not None and callable(f.default_factory) else None
        named = (dataclasses.is_dataclass(section) and any(g.name == "name" for g in dataclasses.fields(section))
                 or isinstance(section, dict) and "name" in section)
        if named:
            out.append(f"{key}.name={value}")
            continue
        out.append(f"{key}={value}")
    return out


def _wrap(e: OmegaConfBaseException, origin: str) -> ConfigError:
    key = getattr(e, "full_key", None) or ""
    msg = str(e).splitlines()[0]
    where = f" (key '{key}')" if key else ""
    return ConfigError(f"invalid config from {origin}{where}: {msg}")


def load_config(schema: type[T], overrides: list[str] | tuple[str, ...] = (), preset: str | None = None) -> T:
    """Defaults of `schema`, then the preset YAML, then the overrides; returns a `schema` instance."""
    try:
        cfg: DictConfig = OmegaConf.structured(schema)
    except OmegaConfBaseException as e:  # pragma: no cover - a schema bug
        raise _wrap(e, f"schema {schema.__name__}") from e
    if preset:
        path = preset_path(preset)
        try:
            loaded = OmegaConf.load(path)
            _check_removed(_flat_keys(OmegaConf.to_container(loaded)), f"preset {path}")
            cfg = OmegaConf.merge(cfg, loaded)  # type: ignore[assignment]
        except OmegaConfBaseException as e:
            raise _wrap(e, f"preset {path}") from e
        except yaml.YAMLError as e:  # not YAML at all
            mark = getattr(e, "problem_mark", None)
            where = f" at line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
            problem = getattr(e, "problem", None) or str(e).splitlines()[0]
            raise ConfigError(f"preset {path} is not valid YAML{where}: {problem}") from e
        except (OSError, UnicodeDecodeError) as e:
            reason = e.strerror if isinstance(e, OSError) else "not UTF-8 text"
            raise ConfigError(f"preset {path} cannot be read: {reason}") from e
    dotlist = _selector_overrides(schema, list(overrides))
    _check_removed([ov.split("=", 1)[0] for ov in dotlist], "an override")
    for ov in dotlist:
        try:
            cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist([ov]))  # type: ignore[assignment]
        except OmegaConfBaseException as e:
            raise _wrap(e, f"override '{ov}'") from e
    try:
        obj = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as e:
        raise _wrap(e, "config") from e
    except (TypeError, ValueError) as e:  # a dataclass __post_init__ rejected a value
        raise ConfigError(str(e)) from e
    return obj  # type: ignore[return-value]


def section_from_dict(cls: type[T], values: dict[str, Any] | None, where: str) -> T:
    """Build a dataclass from a free-form dict section, with typed errors naming `where.key`."""
    values = dict(values or {})
    known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(
            f"unknown key(s) {', '.join(where + '.' + k for k in unknown)} for {cls.__name__}; "
            f"known: {', '.join(sorted(known))}"
        )
    try:
        merged = OmegaConf.merge(OmegaConf.structured(cls), values)
        return OmegaConf.to_object(merged)  # type: ignore[return-value]
    except OmegaConfBaseException as e:
        raise _wrap(e, where) from e
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}: {e}") from e


REDACTED = "<redacted>"


def is_secret_key(key: object) -> bool:
    """Config keys whose values are credentials: `api_key` and `*_api_key`."""
    return isinstance(key, str) and (key == "api_key" or key.endswith("_api_key"))


def redact_secrets(value: Any) -> Any:
    """A copy of a dict / list tree with every non-empty secret value (is_secret_key) replaced by
    REDACTED: what configs look like when saved (eval_config.json, config.yaml). Keys stay, so a saved
    config still says a key was set; set it again through its environment variable (api_key_env)."""
    if isinstance(value, dict):
        return {k: (REDACTED if is_secret_key(k) and v not in (None, "") else redact_secrets(v))
                for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact_secrets(v) for v in value]
    return value


def to_yaml(obj: Any) -> str:
    """A config dataclass as YAML (saved next to every run), secrets redacted (`redact_secrets`)."""
    tree = OmegaConf.to_container(OmegaConf.structured(obj), resolve=True)
    return OmegaConf.to_yaml(OmegaConf.create(redact_secrets(tree)))
