"""Where fedrun's own files are (the Hydra configs), and whether a folder it will write can be.

:func:`conf_dir` is the folder of ``config.yaml`` and the config groups (``dataset/``,
``model/``, ``scale/``, ...): the ``fedrun/conf`` folder that ``pip install`` ships, or, in a source
checkout (an editable install, or ``PYTHONPATH=<checkout>``), the checkout's top-level ``conf/``:
the configs of the code that is running.  Scripts read the options of a config group from here,
not from the repository layout.
"""
from __future__ import annotations

import importlib.resources
import os
import tempfile
from pathlib import Path

from fedrun.errors import ConfigError


def conf_dir() -> Path:
    """The folder holding fedrun's ``config.yaml`` and config groups: always the one that belongs
    to the fedrun code imported, so code and configs never come from two copies.

    In order: ``fedrun/conf`` inside the imported package (an installed wheel); the top-level
    ``conf/`` beside the imported package (a checkout: editable install, or ``PYTHONPATH``); then
    whatever ``fedrun.conf`` resolves to.  Asking ``importlib.resources`` first would be wrong for a
    checkout run with ``PYTHONPATH`` in an environment holding an editable install of another
    checkout: the editable finder maps ``fedrun.conf`` to the other checkout's ``conf/``, and a
    sweep would compose that checkout's YAML for this checkout's code."""
    here = Path(__file__).resolve().parent
    for folder in (here / "conf", here.parent / "conf"):
        if (folder / "config.yaml").is_file():
            return folder
    try:
        packaged = Path(str(importlib.resources.files("fedrun.conf")))
    except (ModuleNotFoundError, TypeError):
        packaged = None
    if packaged is not None and (packaged / "config.yaml").is_file():
        return packaged
    return here.parent / "conf"


def conf_options(group: str) -> list[str]:
    """The options of a config group (``dataset``, ``scale``, ...): its YAML files' names, sorted,
    relative to the group's folder (``experiment``'s ``fednnnn/mnist_iid_b``)."""
    folder = conf_dir() / group
    return sorted(str(p.relative_to(folder).with_suffix("")) for p in folder.rglob("*.yaml"))


def writable_folder(setting: str, folder: Path, shown: str | None = None) -> None:
    """One line naming ``setting`` (its value ``shown``, default the folder) unless ``folder`` is,
    or can be made, a folder this process writes to.  A folder that exists (a run resumed, a
    sweep's folder, a script's output folder) is asked first (permissions, a read-only mount);
    then, there or in the nearest existing parent, a folder is made and removed at once, which is
    what /proc and other special file systems refuse whatever the permissions say (root may write
    anywhere by them).  Nothing is left behind, and the probed folder's mtime is put back, so a
    refused command leaves it as it was."""
    shown = str(folder) if shown is None else shown
    if folder.exists() and not folder.is_dir():
        raise ConfigError(setting, shown, "is a file, not a folder; choose another")
    if folder.is_dir():
        if not os.access(folder, os.W_OK | os.X_OK):
            raise ConfigError(setting, shown, f"cannot be written: {folder} does not let this process write (no "
                              "permission)")
        if hasattr(os, "statvfs") and os.statvfs(folder).f_flag & getattr(os, "ST_RDONLY", 1):
            raise ConfigError(setting, shown, f"cannot be written: {folder} is on a read-only file system")
    existing = next(p for p in [folder, *folder.absolute().parents] if p.exists())
    before = existing.stat()
    try:
        Path(tempfile.mkdtemp(prefix=".fedrun-check-", dir=existing)).rmdir()
    except OSError as e:
        raise ConfigError(setting, shown, f"cannot be written: {existing} refuses a new folder ({e.strerror})") from None
    try:  # the probe leaves no trace: the parent's mtime as it was
        os.utime(existing, ns=(before.st_atime_ns, before.st_mtime_ns))
    except OSError:
        pass


def writable_file(setting: str, path: Path, shown: str | None = None) -> None:
    """One line naming ``setting`` unless ``path`` is, or can be made, a file this process writes
    (a CSV a script is asked to write): not a folder, not a file it may not write, and in a folder
    that exists or can be made (:func:`writable_folder`).  Checked before anything is read or
    written, so a refused command leaves nothing behind."""
    shown = str(path) if shown is None else shown
    if path.is_dir():
        raise ConfigError(setting, shown, "is a folder, not a file; give a file name, such as "
                          f"{Path(shown) / 'table.csv'}")
    if path.exists() and not os.access(path, os.W_OK):
        raise ConfigError(setting, shown, "cannot be written (no permission); choose another file")
    parent = path.absolute().parent
    blocker = next((p for p in [parent, *parent.parents] if p.exists()), None)
    if blocker is not None and not blocker.is_dir():
        raise ConfigError(setting, shown, f"cannot be written: {blocker} is a file, not a folder")
    writable_folder(setting, parent, shown)
