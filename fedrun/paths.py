"""Where fedrun's own files are: the Hydra configs.

:func:`conf_dir` is the folder of ``config.yaml`` and the config groups (``dataset/``,
``model/``, ``scale/``, ...): the ``fedrun.conf`` package that ``pip install`` ships, or, in a
source checkout run without installing (``PYTHONPATH=<checkout>``), the checkout's top-level
``conf/``.  Scripts read the options of a config group from here, not from the repository layout.
"""
from __future__ import annotations

import importlib.resources
from pathlib import Path


def conf_dir() -> Path:
    """The folder holding fedrun's ``config.yaml`` and config groups."""
    try:
        packaged = Path(str(importlib.resources.files("fedrun.conf")))
    except (ModuleNotFoundError, TypeError):  # a checkout on PYTHONPATH: no fedrun/conf package
        packaged = None
    if packaged is not None and (packaged / "config.yaml").is_file():
        return packaged
    return Path(__file__).resolve().parents[1] / "conf"


def conf_options(group: str) -> list[str]:
    """The options of a config group (``dataset``, ``scale``, ...): its YAML files' names, sorted,
    relative to the group's folder (``experiment``'s ``fednnnn/mnist_iid_b``)."""
    folder = conf_dir() / group
    return sorted(str(p.relative_to(folder).with_suffix("")) for p in folder.rglob("*.yaml"))
