"""The house rules of fedrun's imports, and of the scripts' beside it, which a wrong import breaks:

* ``import fedrun`` loads neither Hydra nor OmegaConf (the library takes plain Python values);
* only the command floor imports Hydra or OmegaConf, anywhere in a module (at the top or inside a
  function);
* the library's floors, from the top (:data:`FLOORS`): the command (``command/``, ``__main__``, the
  package's face) -> the analysis of finished runs (``plot.py`` -> ``results.py``) -> the run harness
  (``harness/``) -> the catalog of methods (``aggregators.py``) -> ``server/`` -> ``client/`` ->
  ``diagnostics/`` -> ``data/``, ``models/`` -> the ground floor (errors, logs, seeding, params,
  paths, moved, tables).  A module imports its own room and the floors below it, never a floor
  above nor another room of its own floor (``data/`` and ``models/`` know nothing of each other);
* the library imports no script;
* the scripts (``scripts/``): ``common/`` imports no paper; a paper's folder (``fednnnn/``, ``pd/``,
  ``fedlayerwise/``, ``fedlap/``, ``niidbench/``, and ``datasets/``, the reproductions about data)
  imports ``common/`` and itself, never another paper; ``claims.py`` alone loads every paper's
  claims; ``bench/`` is apart (it imports no script, no script imports it); and the scripts reach
  fedrun only through its public face (:data:`FACE`), but for the few reaches inside that
  :data:`INSIDE` names with their reason.

The modules' floors and rooms are read from their paths (:func:`floor`, :func:`script_room`), so a
new module is checked as soon as it exists, and one that no floor holds fails
:func:`test_the_modules_are_found` until it is given one.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO_ROOT

PACKAGE = REPO_ROOT / "fedrun"
SCRIPTS = REPO_ROOT / "scripts"
BENCH = SCRIPTS / "bench"
CONFIG_LIBRARIES = ("hydra", "omegaconf")

# The library's floors, from the top: (floor, its rooms).  A room is a module or a package (every
# module inside it); the package's face, ``fedrun`` (``fedrun.run``: the command from Python,
# imported when called), counts as the command floor.
FLOORS = [
    ("command", ("fedrun", "fedrun.__main__", "fedrun.command")),
    ("plot", ("fedrun.plot",)),
    ("results", ("fedrun.results",)),
    ("harness", ("fedrun.harness",)),
    ("catalog", ("fedrun.aggregators",)),
    ("server", ("fedrun.server",)),
    ("client", ("fedrun.client",)),
    ("diagnostics", ("fedrun.diagnostics",)),
    ("data and models", ("fedrun.data", "fedrun.models")),
    ("ground", ("fedrun.errors", "fedrun.logs", "fedrun.seeding", "fedrun.params", "fedrun.paths", "fedrun.moved",
                "fedrun.tables")),
]
# The floors that are one room: their modules import each other freely.
ONE_ROOM = {"command", "ground"}
ANALYSIS = ("plot", "results")

# What of fedrun the scripts may import: the analysis of finished runs and the ground they stand on,
# and the sweep table (grid.py writes a sweep folder's table as ``fedrun -m`` does).
FACE = ("fedrun", "fedrun.results", "fedrun.plot", "fedrun.tables", "fedrun.paths", "fedrun.errors", "fedrun.moved",
        "fedrun.command.sweeps")
# The scripts' reaches inside the library, each with its reason; any other fails.
INSIDE = {
    # A run's global model and data rebuilt as fedrun built them, only from fedrun's own targets, and
    # the loss evaluated around it: the library's own checks and functions, not copies of them.
    "scripts.pd.loss_surface": {"fedrun.harness.rundir", "fedrun.data.preparation", "fedrun.diagnostics.landscape"},
    # dataset=mnist_train10k's files written from MNIST's, read as fedrun reads them.
    "scripts.datasets.mnist_train10k": {"fedrun.data.datasets"},
}
# The scripts' rooms that are no paper: their package's face, the claims command and the shared
# floor.  Every other folder of scripts/ (bench/ aside) is a paper's, or a topic's held as one (datasets/).
NOT_PAPERS = ("scripts", "claims", "common")
PAPERS = ("fednnnn", "pd", "fedlayerwise", "fedlap", "niidbench")


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def within(module: str, rooms: tuple[str, ...]) -> bool:
    """Whether ``module`` is one of ``rooms`` or inside one (``fedrun``, the face, holds only itself)."""
    return any(module == r or (r != "fedrun" and module.startswith(r + ".")) for r in rooms)


def floor(module: str) -> str | None:
    """The library floor of ``module`` (:data:`FLOORS`), or None where none holds it."""
    return next((name for name, rooms in FLOORS if within(module, rooms)), None)


def room(module: str) -> str | None:
    """The room of ``module`` on its floor: the package or module of :data:`FLOORS` that holds it."""
    return next((r for _, rooms in FLOORS for r in rooms if within(module, (r,))), None)


def rank(module: str) -> int:
    """How high ``module``'s floor stands (the ground floor 0)."""
    return len(FLOORS) - 1 - [name for name, _ in FLOORS].index(floor(module))


def script_room(module: str) -> str:
    """``common``, ``claims`` (scripts/claims.py), ``scripts`` (the scripts' package face) or a
    paper's folder (:data:`PAPERS`, or a topic's, as ``datasets``)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "scripts"


def imports(path: Path, here: str | None = None) -> set[str]:
    """Every module ``path`` imports, at its top or inside a function (relative imports resolved);
    ``here``: its module name, where its path does not say it (a probe outside the checkout)."""
    tree = ast.parse(path.read_text(), str(path))
    here = here or module_name(path)
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
SCRIPT_MODULES = {module_name(p): p for p in sorted(SCRIPTS.rglob("*.py")) if BENCH not in p.parents}
BENCH_MODULES = {p.stem: p for p in sorted(BENCH.glob("*.py"))}  # imported by their bare names, beside each other


def test_the_modules_are_found():
    assert len(MODULES) > 30 and "fedrun.harness.federated_run" in MODULES
    nowhere = sorted(m for m in MODULES if floor(m) is None)
    assert not nowhere, f"{nowhere}: on no floor of FLOORS; give each its floor"
    assert {room(m) for m in MODULES} == {r for _, rooms in FLOORS for r in rooms}  # no room left empty
    assert len(SCRIPT_MODULES) > 30 and "scripts.pd.tables" in SCRIPT_MODULES and len(BENCH_MODULES) > 5
    assert {"scripts", "claims", "common", "datasets", *PAPERS} <= {script_room(m) for m in SCRIPT_MODULES}


def test_import_fedrun_loads_no_config_library():
    code = ("import sys, fedrun; "
            "print(' '.join(sorted({m.split('.')[0] for m in sys.modules} & {'hydra', 'omegaconf'})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, check=True)
    assert out.stdout.strip() == "", f"import fedrun loaded {out.stdout.strip()}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_house_rules(module):
    check_library(module, MODULES[module])


def check_library(module: str, path: Path, here: str | None = None) -> None:
    mine = imports(path, here)
    level = floor(module)
    config = sorted(m for m in mine if m.split(".")[0] in CONFIG_LIBRARIES)
    assert level == "command" or not config, f"{module} ({level}) imports {config}: only the command floor may"
    scripts = sorted(m for m in mine if m.split(".")[0] == "scripts" or m in BENCH_MODULES)
    assert not scripts, f"{module} imports {scripts}: the library imports no script"
    ours = {m for m in mine if m.startswith("fedrun.")}  # the package's face itself loads nothing
    wrong = sorted(m for m in ours if floor(m) is not None and room(m) != room(module)
                   and (rank(m) > rank(module) or (rank(m) == rank(module) and level not in ONE_ROOM)))
    assert not wrong, (f"{module} ({level}) imports {wrong} ({', '.join(str(floor(m)) for m in wrong)}): "
                       "a floor above, or another room of its own floor")


def test_the_analysis_and_the_command_stand_above_the_library():
    """The rules of before the floors were ordered, still read off :data:`FLOORS`: the library (the
    round, its engines, the server, the data, the run harness) stands below the analysis of finished
    runs, and the analysis below the command floor."""
    names = [name for name, _ in FLOORS]
    assert names[0] == "command" and names[1:3] == list(ANALYSIS) and names.index("harness") == 3


@pytest.mark.parametrize("module", sorted(SCRIPT_MODULES))
def test_script_rules(module):
    check_script(module, SCRIPT_MODULES[module])


def check_script(module: str, path: Path, here: str | None = None) -> None:
    mine = imports(path, here)
    where = script_room(module)
    others = {script_room(m) for m in mine if m.split(".")[0] == "scripts" and m != "scripts"} - {where}
    if where == "claims":  # the command on top: it loads every paper's claims
        others = set()
    assert "claims" not in others, f"{module} imports scripts/claims.py, the command on top"
    if where == "common":
        assert not others, f"{module} imports {sorted(others)}: common/ imports no paper"
    elif where not in NOT_PAPERS:
        assert others <= {"common"}, f"{module} imports {sorted(others - {'common'})}: a paper imports no other paper"
    bench = sorted(m for m in mine if m.split(".")[0] in BENCH_MODULES)
    assert not bench, f"{module} imports {bench}: scripts/bench/ is apart"
    fedrun = {m for m in mine if m.split(".")[0] == "fedrun"}
    inside = sorted(m for m in fedrun if m not in FACE and m not in INSIDE.get(module, ()))
    assert not inside, (f"{module} imports {inside}: the scripts reach fedrun through {', '.join(FACE)} "
                        "(or a reach named in INSIDE, with its reason)")


def test_every_reach_inside_is_still_made():
    """INSIDE names no reach that its script no longer makes (it would let a new one through unseen)."""
    for module, reaches in INSIDE.items():
        assert reaches <= imports(SCRIPT_MODULES[module]), module


@pytest.mark.parametrize("module", sorted(BENCH_MODULES))
def test_bench_is_apart(module):
    mine = imports(BENCH_MODULES[module], f"bench.{module}")
    scripts = sorted(m for m in mine if m.split(".")[0] == "scripts")
    assert not scripts, f"scripts/bench/{module}.py imports {scripts}: the benchmarks are apart"


def test_claims_py_alone_loads_every_papers_claims():
    """Each paper's claims (``scripts/<paper>/claims*.py``) are imported by scripts/claims.py, and by
    no module but its own paper's (a table or plot script that prints its sections)."""
    claims = {m for m in SCRIPT_MODULES
              if m.rpartition(".")[2].startswith("claims") and script_room(m) not in NOT_PAPERS}
    assert len(claims) >= 12
    assert claims <= imports(SCRIPT_MODULES["scripts.claims"])
    for module, path in SCRIPT_MODULES.items():
        strangers = {m for m in imports(path) & claims if script_room(m) != script_room(module)}
        assert module == "scripts.claims" or not strangers, f"{module} loads {sorted(strangers)}"


def test_the_rules_catch_a_wrong_import(tmp_path):
    """A library module that imports the analysis, a floor above or a room beside it, or OmegaConf
    inside a function, is caught; so are a paper importing another, common/ importing a paper and a
    script reaching inside the library.  The probes are written in ``tmp_path``, not in the package."""
    def probe(name: str, code: str) -> Path:
        path = tmp_path / f"{name}.py"
        path.write_text(code)
        return path

    bad = probe("library", "def f():\n    from omegaconf import OmegaConf\n    from fedrun import results\n")
    assert {"omegaconf", "fedrun.results"} <= imports(bad, "fedrun.client.probe")
    with pytest.raises(AssertionError, match="only the command floor"):
        check_library("fedrun.client.probe", bad, "fedrun.client.probe")
    cases = [("fedrun.client.probe", "from fedrun import results\n", "a floor above"),
             ("fedrun.diagnostics.probe", "from fedrun.client import engines\n", "a floor above"),
             ("fedrun.data.probe", "from fedrun.models import nets\n", "another room of its own floor"),
             ("fedrun.server.probe", "from scripts.common import grid\n", "imports no script")]
    for module, code, why in cases:
        with pytest.raises(AssertionError, match=why):
            check_library(module, probe(module.replace(".", "_"), code), module)
    check_library("fedrun.paths", probe("ground", "from fedrun.errors import UsageError\n"), "fedrun.paths")
    check_library("fedrun.harness.probe", probe("down", "from fedrun.server import reduce\n"), "fedrun.harness.probe")

    cases = [("scripts.fednnnn.probe", "from scripts.pd import tables\n", "a paper imports no other paper"),
             ("scripts.common.probe", "from scripts.niidbench import claims\n", "common/ imports no paper"),
             ("scripts.datasets.probe", "import scripts.fedlap.plot\n", "a paper imports no other paper"),
             ("scripts.pd.probe", "def f():\n    from fedrun.harness import federated_run\n",
              "the scripts reach fedrun"),
             ("scripts.pd.probe", "from scripts import claims\n", "the command on top"),
             ("scripts.common.probe", "import resume_runs\n", "scripts/bench/ is apart")]
    for module, code, why in cases:
        with pytest.raises(AssertionError, match=why):
            check_script(module, probe(module.replace(".", "_"), code), module)
    check_script("scripts.pd.probe", probe("fine", "from scripts.common import grid\nfrom fedrun.results import Run\n"),
                 "scripts.pd.probe")
