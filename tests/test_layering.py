"""The house rules of fedrun's imports, which a wrong import breaks:

* ``import fedrun`` loads neither Hydra nor OmegaConf (the library takes plain Python values);
* only the command floor imports Hydra or OmegaConf, anywhere in a module (at the top or inside a
  function);
* the library (the round, its engines, the server, the data, the run harness) imports neither the
  analysis of finished runs (reading results, figures) nor the command floor; the analysis does
  not import the command floor.

The modules' floors are read from their paths (:func:`floor`), so a new module is checked as soon
as it exists.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO_ROOT

PACKAGE = REPO_ROOT / "fedrun"
# The command floor: parsing and composing settings, the CLI, sweeps.  The analysis: reading
# finished runs and drawing them.  Everything else is the library.
COMMAND = {"fedrun.command", "fedrun.__main__"}
ANALYSIS = {"fedrun.results", "fedrun.plot"}
CONFIG_LIBRARIES = ("hydra", "omegaconf")


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def floor(module: str) -> str:
    """``command``, ``analysis`` or ``library``: a module, or any module inside a package, of
    :data:`COMMAND` or :data:`ANALYSIS`, else the library.  The package's face, ``fedrun``
    (``fedrun.run``: the command from Python, imported when called), counts as the command floor."""
    if module == "fedrun":
        return "command"
    for name, group in (("command", COMMAND), ("analysis", ANALYSIS)):
        if any(module == m or module.startswith(m + ".") for m in group):
            return name
    return "library"


def imports(path: Path) -> set[str]:
    """Every module ``path`` imports, at its top or inside a function (relative imports resolved)."""
    tree = ast.parse(path.read_text(), str(path))
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            out.add(base)
            # ``from fedrun import results`` imports the module fedrun.results
            out.update(f"{base}.{alias.name}" for alias in node.names
                       if (REPO_ROOT / Path(*f"{base}.{alias.name}".split("."))).with_suffix(".py").is_file()
                       or (REPO_ROOT / Path(*f"{base}.{alias.name}".split("."))).is_dir())
    return out


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def test_the_modules_are_found():
    assert len(MODULES) > 30 and "fedrun.harness.federated_run" in {m for m in MODULES} | {"fedrun.harness.federated_run"}
    assert {floor(m) for m in MODULES} == {"command", "analysis", "library"}


def test_import_fedrun_loads_no_config_library():
    code = ("import sys, fedrun; "
            "print(' '.join(sorted({m.split('.')[0] for m in sys.modules} & {'hydra', 'omegaconf'})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, check=True)
    assert out.stdout.strip() == "", f"import fedrun loaded {out.stdout.strip()}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_house_rules(module):
    mine = imports(MODULES[module])
    level = floor(module)
    config = sorted(m for m in mine if m.split(".")[0] in CONFIG_LIBRARIES)
    assert level == "command" or not config, f"{module} ({level}) imports {config}: only the command floor may"
    ours = {m for m in mine if m.startswith("fedrun.")}  # the package's face itself loads nothing
    above = {"library": ("analysis", "command"), "analysis": ("command",), "command": ()}[level]
    wrong = sorted(m for m in ours if floor(m) in above)
    assert not wrong, f"{module} ({level}) imports {wrong} ({', '.join(floor(m) for m in wrong)})"


def test_the_rules_catch_a_wrong_import(tmp_path, monkeypatch):
    """A library module that imports the analysis, or OmegaConf inside a function, is caught."""
    bad = PACKAGE / "_layering_probe.py"
    bad.write_text("def f():\n    from omegaconf import OmegaConf\n    from fedrun import results\n")
    try:
        mine = imports(bad)
        assert "omegaconf" in mine and "fedrun.results" in mine
        with pytest.raises(AssertionError, match="only the command floor"):
            monkeypatch.setitem(MODULES, "fedrun._layering_probe", bad)
            test_house_rules("fedrun._layering_probe")
    finally:
        bad.unlink()
