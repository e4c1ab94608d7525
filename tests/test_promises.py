"""The promise "a new YAML needs no edit elsewhere", kept by tests that read the config folder:

* every option of a config group is in docs/configuration.md's table of that group, and the
  table names no option that is gone;
* a factory-backed YAML (``conf/aggregator``, ``conf/partition``, ``conf/engine``) names a
  factory that takes each of its keys, and each default written both in the YAML and in the
  factory's signature is the same value (one may not drift from the other);
* a method's YAML is named after its factory (``conf/aggregator/fedprox.yaml`` ->
  ``fedrun.aggregators.fedprox``).
"""
from __future__ import annotations

import importlib
import inspect
import re

import pytest
import yaml
from conftest import CONF_DIR, REPO_ROOT

from fedrun.paths import conf_options

DOC = (REPO_ROOT / "docs" / "configuration.md").read_text()
# The groups whose section in docs/configuration.md has a table of options.
DOCUMENTED = ("mode", "dataset", "model", "partition", "aggregator", "hyperparams", "scale", "logger", "engine")
FACTORY_GROUPS = ("aggregator", "partition", "engine")
TUNED = re.compile(r"^\$\{oc\.select:tuned\.[\w.]+,(.*)\}$")


def documented_options(group: str) -> set[str]:
    """The options in the first column of the first ``| option |`` table of the group's section."""
    section = DOC.split(f"## `{group}`", 1)[1].split("\n## ", 1)[0]
    rows = section.split("| option |", 1)[1].split("\n\n", 1)[0].splitlines()[2:]
    names = set()
    for row in rows:
        first = row.split("|")[1]
        names.update(re.findall(r"`([\w/]+)`", first))
    return names


@pytest.mark.parametrize("group", DOCUMENTED)
def test_the_docs_table_lists_every_option(group):
    options = set(conf_options(group))
    listed = documented_options(group)
    assert options and not options - listed, f"docs/configuration.md's {group} table lacks {sorted(options - listed)}"
    assert not listed - options, f"docs/configuration.md's {group} table names {sorted(listed - options)}, not in conf/"


def yaml_of(group: str, option: str) -> dict:
    return yaml.safe_load((CONF_DIR / group / f"{option}.yaml").read_text())


def factory(target: str):
    module, _, name = target.rpartition(".")
    return getattr(importlib.import_module(module), name)


def written_default(value):
    """A YAML value as the factory receives it when nothing overrides it: the fallback of a
    ``${oc.select:tuned.<method>.<key>,DEFAULT}``, a literal as is; None for an interpolation of
    another setting (``${dataset.channels}``), which has no default of its own, and for an object
    the YAML builds (a ``_target_`` node: partition=flwr's partitioner), which no signature can hold."""
    if isinstance(value, dict) and "_target_" in value:
        return False, None
    if isinstance(value, str) and value.startswith("${"):
        match = TUNED.match(value)
        return (True, yaml.safe_load(match.group(1))) if match else (False, None)
    return True, value


@pytest.mark.parametrize("group, option", [(g, o) for g in FACTORY_GROUPS for o in conf_options(g)])
def test_yaml_defaults_are_the_factorys(group, option):
    node = yaml_of(group, option)
    make = factory(node["_target_"])
    params = inspect.signature(make).parameters
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    for key, value in node.items():
        if key.startswith("_"):
            continue
        assert key in params or takes_any, f"conf/{group}/{option}.yaml: {key} is no argument of {node['_target_']}"
        known, default = written_default(value)
        if not known or key not in params or params[key].default is inspect.Parameter.empty:
            continue
        assert default == params[key].default, (f"conf/{group}/{option}.yaml: {key}: {default!r}, "
                                                f"but {node['_target_']} defaults to {params[key].default!r}")


@pytest.mark.parametrize("option", conf_options("aggregator"))
def test_a_method_yaml_is_named_after_its_factory(option):
    assert yaml_of("aggregator", option)["_target_"] == f"fedrun.aggregators.{option}"
