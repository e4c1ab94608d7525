"""Runs that go on across GPU sessions: resume archives, one mechanism for every stage that needs it
(``gpu_check.sh niidbench``, the draw's ``table2`` step in gpu_draw.py).

A GPU session has 15 minutes of device time; a paper row takes longer.  So such a stage packs each
group's run folders, checkpoints included, into ``<prefix>_resume_<group>.tar.gz`` (paths relative
to the stage's run root) and brings it back.  Committed under the stage's resume folder
(``outputs/reproductions/niidbench_gpu/resume``, ``outputs/reproductions/fednnnn_gpu/resume``),
replacing the group's older archive, it travels with the checkout; the next session unpacks it
into the same run root and goes on with ``resume=true``, from each run's last round.

The device returns a file of at most 16 MiB, so an archive over 15 MiB is not written (its runs
start afresh next time); and a call carries at most 64 MiB, checkout included, so a stage keeps
the checkpoints it packs few: a run that can train no further needs none (:func:`pack`'s
``leave_out``).

A stage with one group of runs to a chain (niidbench) packs each chain with :func:`pack`; one whose
runs are many and large (table2: 20 runs of a 431,080-parameter CNN, their checkpoints about 11 MiB
a condition) packs its whole state with :func:`pack_parts`, into as few archives as the 15 MiB
allow, which replace all the earlier ones.

    python scripts/bench/resume_runs.py take PREFIX CARRIED INTO   # prints the checkpoints under INTO
    python scripts/bench/resume_runs.py pack ROOT ARCHIVE DIR ...  # exit 3: over 15 MiB, not written
"""
from __future__ import annotations

import shutil
import sys
import tarfile
from pathlib import Path

MAX_BYTES = 15 * 2**20  # a file the device returns is at most 16 MiB
CHECKPOINT = "checkpoint.pt"


def archives(carried: Path, prefix: str) -> list[Path]:
    """The stage's resume archives in a folder, by name."""
    return sorted(carried.glob(f"{prefix}_resume_*.tar.gz"))


def take(carried: Path, prefix: str, into: Path) -> int:
    """Unpack every ``<prefix>_resume_*.tar.gz`` of ``carried`` into ``into``; a folder without such
    archives is a folder of run folders, copied whole.  Returns the checkpoints now under ``into``.
    An archive that cannot be unpacked raises ValueError naming it."""
    into.mkdir(parents=True, exist_ok=True)
    found = archives(carried, prefix)
    if not found:
        shutil.copytree(carried, into, dirs_exist_ok=True)
    for archive in found:
        try:
            with tarfile.open(archive, "r:gz") as tar:
                tar.extractall(into, filter="data")  # relative paths inside ``into`` only
        except (OSError, tarfile.TarError) as e:
            raise ValueError(f"{archive} could not be unpacked ({e})") from None
    return sum(1 for _ in into.rglob(CHECKPOINT))


def pack(root: Path, dirs: list[str], archive: Path, leave_out: set[Path] = frozenset(),
         limit: int = MAX_BYTES) -> bool:
    """``root``'s folders ``dirs`` (relative to it), checkpoints included but the files ``leave_out``
    (paths under ``root``), into ``archive``, written whole and then renamed.  False, with nothing
    written, when it would be over ``limit`` bytes."""
    part = archive.with_name(archive.name + ".part")
    with tarfile.open(part, "w:gz") as tar:
        for d in dirs:
            tar.add(root / d, arcname=d, filter=lambda info: None if root / info.name in leave_out else info)
    if part.stat().st_size > limit:
        part.unlink()
        return False
    part.replace(archive)
    return True


def _estimate(root: Path, folder: str, leave_out) -> float:
    """A folder's bytes once gzipped, roughly: a checkpoint's floats hardly shrink, CSVs to a third."""
    files = [f for f in (root / folder).rglob("*") if f.is_file() and f not in leave_out]
    return sum(f.stat().st_size * (1.0 if f.suffix == ".pt" else 0.35) for f in files)


def pack_parts(root: Path, dirs: list[str], out: Path, prefix: str, leave_out: set[Path] = frozenset(),
               max_files: int = 4, limit: int = MAX_BYTES) -> tuple[list[Path], list[str]]:
    """``root``'s folders ``dirs`` into ``<prefix>_resume_1.tar.gz``, ``_2`` ... in ``out``, each under
    ``limit`` bytes and at most ``max_files`` of them, a folder never split between two; every earlier
    ``<prefix>_resume_*.tar.gz`` of ``out`` is removed first (the set is the whole state).  Returns the
    archives written and the folders left out (one over the limit alone, or past ``max_files``)."""
    for old in archives(out, prefix):
        old.unlink()
    bins: list[list[str]] = []
    room = 0.8 * limit  # the estimate's margin
    for d in sorted(dirs, key=lambda d: -_estimate(root, d, leave_out)):  # first fit, largest first
        size = _estimate(root, d, leave_out)
        fit = next((b for b in bins if sum(_estimate(root, x, leave_out) for x in b) + size <= room), None)
        if fit is None:
            bins.append([d])
        else:
            fit.append(d)
    written, left, queue = [], [], [sorted(b) for b in bins]
    while queue:
        part = queue.pop(0)
        if len(written) >= max_files:
            left += part
            continue
        archive = out / f"{prefix}_resume_{len(written) + 1}.tar.gz"
        if pack(root, part, archive, leave_out, limit):
            written.append(archive)
        elif len(part) > 1:  # the estimate was low: halve the part
            queue[:0] = [part[: len(part) // 2], part[len(part) // 2:]]
        else:
            left += part
    return written, left


def main(argv: list[str]) -> int:
    usage = "usage: resume_runs.py take PREFIX CARRIED INTO | pack ROOT ARCHIVE DIR [DIR ...]"
    if len(argv) == 4 and argv[0] == "take":
        try:
            print(take(Path(argv[2]), argv[1], Path(argv[3])))
        except ValueError as e:
            print(e, file=sys.stderr)
            return 2
        return 0
    if len(argv) >= 4 and argv[0] == "pack":
        return 0 if pack(Path(argv[1]), argv[3:], Path(argv[2])) else 3
    print(usage, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
