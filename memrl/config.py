"""Typed configs: dataclasses composed with OmegaConf, presets from YAML, dotted CLI overrides.

    cfg = load_config(TrainConfig, ["workflow=memagent", "algorithm.n=8"], preset="demo_cpu")

- A preset is `memrl/configs/<name>.yaml` (packaged) or a path to a YAML file.
- `section=value`, where `section` is a dataclass field (or a free-form dict section) with a `name`
  field, selects by name (`workflow=rememr1` is `workflow.name=rememr1`), as Hydra's config groups read
  on the command line.
- Unknown keys and wrong types fail with a `ConfigError` naming the key and what was expected.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
import typing
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from memrl.errors import UsageError

T = TypeVar("T")


class ConfigError(UsageError):
    """A config key, value or preset is invalid; the message names it (the CLI exits 2)."""


REMOVED_KEYS: dict[str, str] = {}
"""Dotted keys a config may no longer set -> what replaces them (filled by the config modules, e.g.
memrl.training.config). A preset or override that sets one fails with one line naming the replacement;
a key ending in `.<removed key>` (e.g. the demo's `train.algorithm.actual_n`) counts too."""


OPEN_SECTIONS: dict[str, str] = {}
"""Top-level section -> its dict field that holds the sub-sections the schema does not declare (filled by
the config modules: `algorithm` -> `plugins`, the options of an estimator or loss from a user's module).
`algorithm.<name>.<field>` is spelled the same for every estimator; a <name> that is not a declared field
is stored as `algorithm.plugins.<name>.<field>` and checked against the registered names by the section."""


def _undeclared(schema: Any, section: str, sub: str) -> bool:
    """`section.sub` is an open section's sub-section that `schema` does not declare."""
    if section not in OPEN_SECTIONS or not dataclasses.is_dataclass(schema):
        return False
    f = next((f for f in dataclasses.fields(schema) if f.name == section), None)
    inner = f.default_factory() if f is not None and callable(f.default_factory) else None
    return dataclasses.is_dataclass(inner) and sub not in {g.name for g in dataclasses.fields(inner)}


def _open_override(schema: Any, ov: str) -> str:
    """`algorithm.<undeclared>.<field>=v` -> `algorithm.plugins.<undeclared>.<field>=v` (OPEN_SECTIONS)."""
    key, value = ov.split("=", 1)
    parts = key.split(".")
    if len(parts) >= 3 and _undeclared(schema, parts[0], parts[1]):
        return ".".join([parts[0], OPEN_SECTIONS[parts[0]], *parts[1:]]) + "=" + value
    return ov


def _open_preset(schema: Any, loaded: Any) -> None:
    """The same move for a preset's tree (in place): undeclared sub-sections (mappings) of an open section."""
    if not isinstance(loaded, DictConfig):
        return
    for section, into in OPEN_SECTIONS.items():
        node = loaded.get(section)
        if not isinstance(node, DictConfig):
            continue
        for sub in [k for k in node.keys() if isinstance(node[k], DictConfig) and _undeclared(schema, section, k)]:
            moved = node.pop(sub)
            if into not in node:
                node[into] = {}
            node[into][sub] = moved


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


INHERIT_KEY = "inherit"
"""A preset's top-level `inherit: <preset name or path>`: that preset is loaded first, this one on top."""


def preset_chain(path: Path) -> list[tuple[Path, Any]]:
    """[(path, loaded YAML without its inherit key)] from the root ancestor to `path`."""
    chain: list[tuple[Path, Any]] = []
    seen: list[Path] = []
    while True:
        if path.resolve() in seen:
            raise ConfigError(f"preset {path}: `{INHERIT_KEY}` loops ({' -> '.join(str(p) for p in seen)})")
        seen.append(path.resolve())
        check_yaml_size(path)
        loaded = OmegaConf.load(path)
        parent = loaded.pop(INHERIT_KEY, None) if isinstance(loaded, DictConfig) else None
        chain.append((path, loaded))
        if parent is None:
            return chain[::-1]
        if not isinstance(parent, str) or not parent:
            raise ConfigError(f"preset {path}: `{INHERIT_KEY}` must name a preset, got {parent!r}")
        path = preset_path(parent)


MAX_YAML_BYTES = 4 << 20
MAX_YAML_NODES = 200_000
"""Bounds of a preset: its size, and its node count with every alias expanded (an alias bomb is a few
lines whose aliases expand to billions of nodes, hanging the loader)."""


def check_yaml_size(path: Path) -> None:
    """ConfigError when preset `path` is larger than MAX_YAML_BYTES or expands (aliases followed) to more
    than MAX_YAML_NODES nodes (`check_yaml_text`)."""
    size = path.stat().st_size
    if size > MAX_YAML_BYTES:
        raise ConfigError(f"preset {path} is {size} bytes; a preset may have at most {MAX_YAML_BYTES}")
    check_yaml_text(path.read_text(encoding="utf-8"), f"preset {path}")


def check_yaml_text(text: str, where: str) -> None:
    """ConfigError naming `where` when YAML `text` expands (aliases followed) to more than MAX_YAML_NODES
    nodes; composing the node graph does not expand aliases, so this check is cheap."""
    node = yaml.compose(text, Loader=yaml.SafeLoader)
    sizes: dict[int, int] = {}

    def expanded(n: Any) -> int:
        if id(n) in sizes:
            return sizes[id(n)]
        sizes[id(n)] = 1  # a cycle counts once; OmegaConf refuses it anyway
        if isinstance(n, yaml.MappingNode):
            total = 1 + sum(expanded(k) + expanded(v) for k, v in n.value)
        elif isinstance(n, yaml.SequenceNode):
            total = 1 + sum(expanded(v) for v in n.value)
        else:
            total = 1
        sizes[id(n)] = min(total, MAX_YAML_NODES + 1)
        return sizes[id(n)]

    if node is not None and expanded(node) > MAX_YAML_NODES:
        raise ConfigError(f"{where}: its aliases expand to more than {MAX_YAML_NODES} values (an alias "
                          "bomb?); refusing to load it")


def refuse_interpolations(node: Any, origin: str, prefix: str = "") -> None:
    """ConfigError for the first `${...}` in a user-supplied tree (a preset or an override): memrl resolves
    none, so a shared preset cannot pull an environment variable (`${oc.env:VAR}`) or another field's
    secret into a URL or prompt. A literal `${` is written `\\${`."""
    if not isinstance(node, DictConfig | ListConfig):
        return
    keys = node.keys() if isinstance(node, DictConfig) else range(len(node))
    for k in keys:
        path = f"{prefix}{k}" if isinstance(node, DictConfig) else f"{prefix.rstrip('.')}[{k}]"
        if OmegaConf.is_interpolation(node, k):  # type: ignore[arg-type]
            raw = node._get_node(k)._value()  # type: ignore[union-attr]
            raise ConfigError(f"{path}={raw!r} (set by {origin}) is an interpolation; memrl resolves no ${{...}} "
                              "in configs (write the value itself, or \\${ for a literal)")
        refuse_interpolations(node._get_node(k), origin, f"{path}.")  # type: ignore[union-attr]


_SURROGATE = re.compile("[\ud800-\udfff]")


def refuse_surrogates(tree: Any, origin: str, prefix: str = "") -> None:
    """ConfigError naming the dotted key of the first string (a key or a value) of a user-supplied tree (a
    preset's, an override's) that holds a lone surrogate: YAML's double-quoted "\\ud800" escape makes one, and
    tokenizers, terminals and JSON writers refuse such text mid-run."""
    if isinstance(tree, DictConfig | ListConfig):
        tree = OmegaConf.to_container(tree, resolve=False)
    items = tree.items() if isinstance(tree, dict) else enumerate(tree) if isinstance(tree, list) else ()
    for k, v in items:
        path = f"{prefix}{k}" if isinstance(tree, dict) else f"{prefix.rstrip('.')}[{k}]"
        for text in (k, v):
            m = _SURROGATE.search(text) if isinstance(text, str) else None
            if m is not None:
                shown = path.encode("utf-8", "backslashreplace").decode("utf-8")  # a surrogate key prints escaped
                raise ConfigError(f"{shown} (set by {origin}) holds a lone surrogate \\u{ord(m.group()):04x} at "
                                  f"character {m.start()} of {'its key' if text is k else 'its value'} (not valid "
                                  "Unicode text)")
        refuse_surrogates(v, origin, f"{path}.")


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
            for part_path, loaded in preset_chain(path):  # `inherit: <preset>`: the parent first
                refuse_interpolations(loaded, f"preset {part_path}")
                refuse_surrogates(loaded, f"preset {part_path}")
                _check_removed(_flat_keys(OmegaConf.to_container(loaded)), f"preset {part_path}")
                _open_preset(schema, loaded)
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
    dotlist = [_open_override(schema, ov) for ov in dotlist]
    for ov in dotlist:
        try:
            given = OmegaConf.from_dotlist([ov])
            refuse_interpolations(given, "an override")
            refuse_surrogates(given, "an override")
            cfg = OmegaConf.merge(cfg, given)  # type: ignore[assignment]
        except OmegaConfBaseException as e:
            raise _wrap(e, f"override '{redact_text(ov)}'") from e
        except yaml.YAMLError as e:  # a value YAML cannot parse ("[1", "{a")
            problem = getattr(e, "problem", None) or str(e).splitlines()[0]
            raise ConfigError(f"override '{redact_text(ov)}': the value is not valid YAML ({problem}); quote it "
                              "to pass it as text") from e
    try:
        obj = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as e:
        raise _wrap(e, "config") from e
    except (TypeError, ValueError) as e:  # a dataclass __post_init__ rejected a value
        _check_raw(schema, cfg, "")  # a value outside its declared range: named by its dotted path
        raise ConfigError(str(e)) from e
    check_config(obj)
    return obj  # type: ignore[return-value]


def _check_raw(schema: type, node: Any, where: str) -> None:
    """The declared ranges of `schema`'s fields checked on a not yet constructed config tree (a
    DictConfig), so an out-of-range value is named by its dotted path even when the dataclass's own
    __post_init__ (which sees only its own fields) would reject it first."""
    if not dataclasses.is_dataclass(schema) or not isinstance(node, DictConfig):
        return
    try:
        hints = typing.get_type_hints(schema)
    except Exception:  # noqa: BLE001 - an unresolvable annotation: nothing to add to the original error
        return
    values = {k: node.get(k) for k in node.keys()}
    for f in dataclasses.fields(schema):
        path = f"{where}.{f.name}" if where else f.name
        value = values.get(f.name)
        if dataclasses.is_dataclass(hints.get(f.name)):
            _check_raw(hints[f.name], value, path)
            continue
        rule = allowed_of(f)
        if rule is None or value is None or rule.choices is not None:
            continue  # a choice's own __post_init__ message may say more (a removed name and its successor)
        items = list(value) if OmegaConf.is_list(value) or isinstance(value, list | tuple) else [value]
        if not all(is_finite(v) for v in items):
            raise ConfigError(f"{path}={value!r} is not allowed: must be a finite number (not nan or inf)")
        owner = _Values(values)
        for v in items:
            if not rule.admits(v, owner):
                raise ConfigError(f"{path}={value!r} is not allowed: must be {rule.describe(path, owner)}")


class _Values:
    """Attribute access over a dict (sibling-field bounds of a not yet constructed section)."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.__dict__.update(values)


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
        obj = OmegaConf.to_object(merged)
    except OmegaConfBaseException as e:
        raise _wrap(e, where) from e
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}: {e}") from e
    check_config(obj, where)
    return obj  # type: ignore[return-value]


REDACTED = "<redacted>"


def is_secret_key(key: object) -> bool:
    """Config keys whose values are credentials: `api_key` and `*_api_key`."""
    return isinstance(key, str) and (key == "api_key" or key.endswith("_api_key"))


URL_CREDENTIALS = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)[^/@\s'\"]+@")
"""The user[:password]@ part of a URL (http://user:pw@host/...)."""
SECRET_ASSIGNMENT = re.compile(r"(?P<key>(?:[\w.+-]*\.)?(?:api_key|[\w]+_api_key))(?P<eq>=|: )(?P<value>[^\s,;'\"]+)")
"""`...api_key=VALUE` (an override) or `api_key: VALUE` in free text."""


def redact_text(text: str) -> str:
    """`text` with URL credentials and `<...>api_key=VALUE` assignments replaced by REDACTED: for command
    lines, override lists and messages that are printed or saved."""
    text = URL_CREDENTIALS.sub(lambda m: f"{m['scheme']}{REDACTED}@", text)
    return SECRET_ASSIGNMENT.sub(lambda m: m["key"] + m["eq"] + (REDACTED if m["value"] != REDACTED else m["value"]),
                                 text)


def redact_argv(argv: list[str] | tuple[str, ...]) -> list[str]:
    """A command line as it may be saved or shown (`redact_text` on each argument)."""
    return [redact_text(a) for a in argv]


def redact_secrets(value: Any) -> Any:
    """A copy of a dict / list tree with every non-empty secret value (is_secret_key) replaced by
    REDACTED and URL credentials in every string removed (`redact_text`): what configs look like when
    saved or printed (eval_config.json, config.yaml, tracker configs, --print-config). Keys stay, so a
    saved config still says a key was set; set it again through its environment variable (api_key_env)."""
    if isinstance(value, dict):
        return {k: (REDACTED if is_secret_key(k) and v not in (None, "") else redact_secrets(v))
                for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact_secrets(v) for v in value]
    if isinstance(value, str):
        return redact_text(value)
    return value


def to_yaml(obj: Any) -> str:
    """A config dataclass as YAML (saved next to every run), secrets redacted (`redact_secrets`)."""
    tree = OmegaConf.to_container(OmegaConf.structured(obj), resolve=True)
    return OmegaConf.to_yaml(OmegaConf.create(redact_secrets(tree)))



# ----------------------------------------------------------------------------------------- valid values
# Every config field declares the values it admits, next to its default: `lr: float = valid(1e-6, gt=0)`.
# One walker (`check_config`) checks a whole config tree against those declarations before any work, and
# names the dotted field, the value and what is allowed. Fields with no declaration admit any value of
# their type (strings such as paths, booleans); every numeric field must declare a range (tested).

ALLOWED = "allowed"
"""The `dataclasses.field` metadata key holding a field's `Allowed` declaration."""

# Upper bounds for numbers where a huge value cannot mean anything: past them a run overflows a float
# (a learning rate of 1e30 trains garbage; a clip of 1e308 overflows), allocates without end (a batch of a
# billion tasks) or hands a library a value it cannot take (a seed past 64 bits). Each is far beyond any
# value a run has reason to use; every numeric config field and command-line option declares one (tested).
MAX_SEED = 2**32 - 1
"""Seeds: numpy's legacy seed range (torch and random take more; nothing needs more)."""
MAX_COUNT = 1_000_000
"""Counts: steps, epochs, tasks, rows, batch sizes, samples, turns, retries, intervals."""
MAX_TOKENS = 1 << 24
"""Token lengths and budgets (16.7M tokens: past every model's context window)."""
MAX_CHARS = 1 << 28
"""Character lengths (256 MiB of text)."""
MAX_VOCAB = 1 << 20
"""Vocabulary sizes and top-k cut-offs (the largest published vocabularies hold about 256K tokens)."""
MAX_PARALLEL = 4096
"""Workers, engines, ranks, threads and CPUs or GPUs per worker."""
MAX_LR = 1.0
"""Learning rates (Adam's update is about lr per step: above 1 every weight moves by more than itself)."""
MAX_COEF = 1000.0
"""Loss coefficients, reward weights and penalties, clip ranges and caps, tolerances."""
MAX_TEMPERATURE = 100.0
"""Sampling temperatures (at 100 every distribution is already near uniform)."""
MAX_SECONDS = 86_400.0
"""Timeouts and back-offs (a day)."""
MAX_MB = 1 << 20
"""Sizes in MB or GiB (a TiB in MB)."""

Bound = float | int | str | None
"""A bound: a number, or the name of a sibling field of the same dataclass (its value is the bound)."""


@dataclass(frozen=True)
class Allowed:
    """The values a config field admits: a range (each end inclusive or not, a number or a sibling field's
    name) and/or a set of choices (a tuple, or a function returning the names known at check time). None
    is admitted when the field's type admits it (`int | None`), whatever the range. A list field's
    declaration applies to each of its elements."""

    ge: Bound = None
    gt: Bound = None
    le: Bound = None
    lt: Bound = None
    choices: tuple[Any, ...] | Callable[[], Any] | None = None
    note: str = ""
    """What a special value means, shown in the error ("0 = off")."""
    import_paths: bool = False
    """Besides the choices, an import path "package.module:attr" is admitted (resolved and checked by the
    section that names it: `algorithm.name=mymod:my_estimator`)."""

    def known(self) -> tuple[Any, ...] | None:
        if self.choices is None:
            return None
        return tuple(self.choices() if callable(self.choices) else self.choices)

    def bounds(self, owner: Any = None) -> dict[str, float]:
        """{'ge'|'gt'|'le'|'lt': number}, sibling-field bounds read from `owner`."""
        out = {}
        for k in ("ge", "gt", "le", "lt"):
            b = getattr(self, k)
            if isinstance(b, str):
                b = getattr(owner, b, None) if owner is not None else None
            if b is not None:
                out[k] = b
        return out

    def admits(self, value: Any, owner: Any = None) -> bool:
        known = self.known()
        if self.import_paths and isinstance(value, str) and ":" in value:
            return True
        if known is not None and value not in known:
            return False
        if isinstance(value, bool) or not isinstance(value, int | float):
            return known is not None or not self.bounds(owner)
        if not is_finite(value):  # nan and inf are in no range (an upper bound left open is not infinity)
            return False
        ops = {"ge": lambda v, b: v >= b, "gt": lambda v, b: v > b, "le": lambda v, b: v <= b,
               "lt": lambda v, b: v < b}
        return all(ops[k](value, b) for k, b in self.bounds(owner).items())

    def describe(self, where: str = "", owner: Any = None) -> str:
        """'> 0', 'in [0, 1)', 'one of a, b', '<= trainer.batch_size (128)', plus the note."""
        parts = []
        known = self.known()
        if known is not None:
            parts.append("one of " + ", ".join(str(c) if c != "" else '""' for c in known))
        prefix = where.rsplit(".", 1)[0] + "." if "." in where else ""

        def show(k: str) -> str:
            b = getattr(self, k)
            if isinstance(b, str):
                return f"{prefix}{b} ({getattr(owner, b, '?')})" if owner is not None else prefix + b
            return f"{b:g}" if isinstance(b, float) else str(b)

        lo = "ge" if self.ge is not None else "gt" if self.gt is not None else None
        hi = "le" if self.le is not None else "lt" if self.lt is not None else None
        if lo and hi:
            parts.append(f"in {'[' if lo == 'ge' else '('}{show(lo)}, {show(hi)}{']' if hi == 'le' else ')'}")
        elif lo or hi:
            k = lo or hi
            parts.append(f"{ {'ge': '>=', 'gt': '>', 'le': '<=', 'lt': '<'}[k] } {show(k)}".strip())
        text = " and ".join(parts) or "any value"
        if self.import_paths:
            text += " or an import path package.module:attr"
        return f"{text} ({self.note})" if self.note else text


def valid(default: Any = dataclasses.MISSING, *, default_factory: Any = dataclasses.MISSING, ge: Bound = None,
          gt: Bound = None, le: Bound = None, lt: Bound = None, choices: Any = None, note: str = "",
          import_paths: bool = False) -> Any:
    """A dataclass field with its default and the values it admits (see `Allowed`):

        lr: float = valid(1e-6, gt=0)
        clip_low: float = valid(0.2, ge=0, lt=1)
        mini_batches: int = valid(1, ge=1, le="batch_size")
        loss_agg: str = valid("token-mean", choices=AGG_MODES)
        multipliers: list[int] = valid(default_factory=lambda: [1, 4, 16], ge=1)
    """
    allowed = Allowed(ge=ge, gt=gt, le=le, lt=lt, choices=choices, note=note, import_paths=import_paths)
    return dataclasses.field(default=default, default_factory=default_factory, metadata={ALLOWED: allowed})


def allowed_of(f: dataclasses.Field) -> Allowed | None:
    """A field's declaration (None when it declares none)."""
    return f.metadata.get(ALLOWED)


def _admits_none(f: dataclasses.Field) -> bool:
    t = f.type if isinstance(f.type, str) else str(f.type)
    return "None" in t or "Optional" in t


def is_finite(value: Any) -> bool:
    """False only for a float (or numpy / torch scalar read as one) that is nan or +-inf."""
    return not isinstance(value, float) or math.isfinite(value)


def check_config(obj: Any, where: str = "") -> None:
    """Walk a config tree (nested dataclasses, dicts of them) and raise a one-line `ConfigError` naming
    the dotted field, its value and what is allowed, for the first value outside its declaration; a
    float that is nan or inf is refused in every field, declared or not."""
    if not dataclasses.is_dataclass(obj) or isinstance(obj, type):
        return
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name, None)
        path = f"{where}.{f.name}" if where else f.name
        if dataclasses.is_dataclass(value):
            check_config(value, path)
            continue
        items = list(value) if isinstance(value, list | tuple) else [value]
        bad = next((v for v in items if not is_finite(v)), None)
        if bad is not None:  # inf / nan pass every range check written as ge / gt and break training silently
            what = f"{path}={value!r}" + ("" if items[0] is value else f": item {bad!r}")
            raise ConfigError(f"{what} is not allowed: must be a finite number (not nan or inf)")
        rule = allowed_of(f)
        if rule is None or (value is None and _admits_none(f)):
            continue
        for v in items:
            if not rule.admits(v, obj):
                what = f"{path}={value!r}" + ("" if items[0] is value else f": item {v!r}")
                raise ConfigError(f"{what} is not allowed: must be {rule.describe(path, obj)}")


def bounded(kind: Callable[[str], Any], **rule: Any) -> Callable[[str], Any]:
    """An argparse `type=` that parses with `kind` and admits what `Allowed(**rule)` admits, so command-line
    options declare their ranges the same way config fields do (argparse prints the error, exit 2)."""
    allowed = Allowed(**rule)

    def parse(text: str) -> Any:
        try:
            v = kind(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(f"{text!r} is not a valid {kind.__name__}") from e
        if not allowed.admits(v):
            raise argparse.ArgumentTypeError(f"{v!r} is not allowed: must be {allowed.describe()}")
        return v

    parse.__name__ = kind.__name__
    return parse


def check_shared_fields(obj: Any, declared_by: type, where: str) -> None:
    """Check the fields of `obj` that share a name with a field `declared_by` declares (e.g. a workflow
    config's temperature / top_p / top_k against `SamplingParams`), naming them `where.<field>`: values
    a config passes on unchanged are checked before any work, not when the first request is made."""
    rules = {f.name: allowed_of(f) for f in dataclasses.fields(declared_by) if allowed_of(f) is not None}
    names = [f.name for f in dataclasses.fields(obj)] if dataclasses.is_dataclass(obj) else []
    for name in names:
        rule, value = rules.get(name), getattr(obj, name)
        if rule is not None and value is not None and not rule.admits(value, obj):
            raise ConfigError(f"{where}.{name}={value!r} is not allowed: must be {rule.describe()}")
