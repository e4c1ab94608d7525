"""``fedrun --help``: every setting a user may set, its value in the run the command line makes,
what it does and what it takes.

Two sources, the ones the rest of fedrun already keeps: what a setting does is the comment beside
it in its YAML file (``conf/config.yaml``, the chosen option of each group, and the files an
option builds on through its ``defaults``), and what it takes is the type the checks hold it to
(:data:`fedrun.command.settings.SCHEMA`, or the annotation of the ``_target_``'s argument, as
:func:`fedrun.command.settings.check_object` reads it).  Left out, as a user may not set them: the
objects built from ``hyperparams`` (``federation``, ``local``, ``participation``), the mode's
``centralized``, a preset's ``tuned`` values and ``tags``, Hydra's ``_target_``-like keys, and
keys that only copy another setting (``model.in_channels: ${dataset.channels}``).
"""
from __future__ import annotations

import re
import textwrap
from pathlib import Path

from omegaconf import DictConfig, ListConfig, OmegaConf

from fedrun.command import resolvers  # noqa: F401  (registers ${fedrun.num_clients:...}, used by the scale presets)
from fedrun.command import settings
from fedrun.paths import conf_dir, conf_options

GROUPS = ("dataset", "model", "partition", "aggregator", "hyperparams", "engine", "logger", "mode", "experiment",
          "scale")
HIDDEN = ("federation", "local", "participation", "centralized", "tuned", "tags", "hydra", "choices", "overrides",
          "logger.use")  # logger.use: set by choosing logger=<option> (or a list of them)
# An interpolation that copies another setting (the user sets that one), as opposed to a default
# a preset may tune (``${oc.select:tuned...}``) or the environment's (``${oc.env:...}``).
MIRROR = re.compile(r"^\$\{(?!oc\.select:tuned|oc\.env:)[^}]*\}$")
WIDTH = 100  # the help's lines, at most (a terminal's usual width)
_LINE = re.compile(r"^(?P<indent>\s*)(?P<key>[A-Za-z_][\w]*):(?P<rest>.*)$")


def yaml_comments(path: Path) -> dict[str, str]:
    """``{dotted key: the comment on its line}`` of a YAML file fedrun ships (block style, one key
    a line, comments after ``#``); keys without a comment are left out."""
    found, stack = {}, []  # stack: (indent, key) of the mappings the line is inside
    for line in path.read_text().splitlines():
        match = _LINE.match(line)
        if not match:
            continue
        indent = len(match["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        key = ".".join([k for _, k in stack] + [match["key"]])
        rest = match["rest"]
        comment = rest.split(" #", 1)[1].strip() if " #" in rest else ""
        if rest.strip().startswith("#"):
            comment = rest.strip().lstrip("#").strip()
        if comment:
            found[key] = comment
        if not rest.split("#", 1)[0].strip():  # a mapping opens: its keys follow, indented
            stack.append((indent, match["key"]))
    return found


def _option_files(group: str, option: str) -> list[Path]:
    """The option's YAML file and those it builds on through ``defaults`` (in the same group)."""
    files, seen, todo = [], set(), [option]
    while todo:
        name = todo.pop(0)
        path = conf_dir() / group / f"{name}.yaml"
        if name in seen or not path.is_file():
            continue
        seen.add(name)
        files.append(path)
        defaults = OmegaConf.load(path).get("defaults") or []
        todo += [d for d in defaults if isinstance(d, str) and d != "_self_"]
    return files


def dataset_fields() -> dict[str, str]:
    """The comments of :class:`fedrun.data.datasets.DatasetConfig`'s fields (the class that checks every
    dataset node), as ``dataset.<field>``: what each dataset option's YAML may leave unsaid."""
    import inspect

    from fedrun.data.datasets import DatasetConfig

    source = inspect.getsource(DatasetConfig)
    return {f"dataset.{m[1]}": m[2].strip() for m in re.finditer(r"^\s+(\w+): [^#\n]*#\s*(.*)$", source, re.M)}


def descriptions(choices: dict) -> dict[str, str]:
    """Every comment of config.yaml, of :class:`fedrun.data.datasets.DatasetConfig`'s fields, and of each
    chosen group option's files (its own winning), by dotted key."""
    found = {**yaml_comments(conf_dir() / "config.yaml"), **dataset_fields()}
    for group in ("dataset", "model", "partition", "aggregator", "hyperparams", "engine", "logger"):
        option = choices.get(group)
        if not option:
            continue
        for path in reversed(_option_files(group, option)):  # the option's own comment wins
            found.update({f"{group}.{k}": v for k, v in yaml_comments(path).items()})
    return found


def _kind(key: str, cfg: DictConfig) -> str:
    """What the checks hold ``key`` to, in words (``an integer (64-bit)``), or ``""``."""
    parts = key.split(".")
    node = settings.SCHEMA
    for part in parts:
        if not isinstance(node, dict) or part not in node:
            node = None
            break
        node = node[part]
    if node is not None and node not in (settings.TARGET, settings.ANY) and not isinstance(node, dict):
        return settings.describe(node)
    parent = OmegaConf.select(cfg, ".".join(parts[:-1])) if len(parts) > 1 else None
    if isinstance(parent, DictConfig) and settings.TARGET in parent:
        try:
            hints = settings._hints(settings.locate(parent[settings.TARGET]))
        except Exception:  # noqa: BLE001 - a user's target that cannot be imported: no type shown
            return ""
        if parts[-1] in hints:
            return settings.describe(hints[parts[-1]])
    return ""


def user_settings(cfg: DictConfig, prefix: str = "") -> list[tuple[str, object]]:
    """``(dotted key, value)`` of every setting a user may set, in the config's order."""
    out = []
    for key in cfg:
        dotted = f"{prefix}{key}"
        if key in settings.HYDRA_KEYS or dotted in HIDDEN:
            continue
        raw = OmegaConf.to_container(cfg, resolve=False)[key]
        if isinstance(raw, str) and MIRROR.match(raw):
            continue
        value = cfg._get_node(key)
        if isinstance(value, DictConfig) and not (key == "augment" or OmegaConf.is_missing(cfg, key)):
            out += user_settings(value, dotted + ".")
        else:
            out.append((dotted, OmegaConf.to_container(value, resolve=True) if isinstance(value, (DictConfig,
                        ListConfig)) else cfg[key]))
    return out


def help_text(cfg: DictConfig, header: str = "", footer: str = "") -> str:
    """The help of the run ``cfg`` (composed with the command line's overrides, Hydra's part
    included: it names the group options chosen)."""
    choices = dict(OmegaConf.select(cfg, "hydra.runtime.choices", default={}) or {})
    cfg = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
    lines = [header.rstrip(), "", "Config groups (group=option; * the one in use):"]
    for group in GROUPS:
        options = conf_options(group)
        chosen = choices.get(group)
        lines += textwrap.wrap(", ".join(f"*{o}" if o == chosen else o for o in options), WIDTH,
                               initial_indent=f"  {group}: ", subsequent_indent=" " * (len(group) + 4))
    lines += ["", "Settings (key=value: the value this command line gives; what it does; what it takes):"]
    notes = descriptions(choices)
    found = user_settings(cfg)
    found = [kv for kv in found if "." not in kv[0]] + [kv for kv in found if "." in kv[0]]  # the run's own first
    rows = [(f"{key}={settings.show(value)}", notes.get(key, ""), _kind(key, cfg)) for key, value in found]
    pad = min(max(len(r[0]) for r in rows) + 2, 40)
    for left, note, kind in rows:
        text = "; ".join(t for t in (note, kind and f"takes {kind}") if t)
        wrapped = textwrap.wrap(text, WIDTH - pad - 2) or [""]
        first = [f"  {left:<{pad}}{wrapped[0]}"] if len(left) < pad else [f"  {left}", f"  {'':<{pad}}{wrapped[0]}"]
        lines += [line.rstrip() for line in first] + [f"  {'':<{pad}}{more}" for more in wrapped[1:]]
    lines += ["", footer.rstrip(), *textwrap.wrap("Every setting with its default and range: docs/configuration.md; "
                                                  "the whole composed config (objects and Hydra's keys too): "
                                                  "fedrun --cfg job", WIDTH)]
    return "\n".join(lines).rstrip() + "\n"
