"""``fedrun`` with the disk filled at a chosen write: the real file system's ENOSPC, at a known point.

    python tests/disk_full_driver.py MOUNT POINT -- <fedrun arguments>

MOUNT is a small file system (a tmpfs) holding the run directory; POINT names the write before
which the file system is filled, by a ballast file in MOUNT written until the kernel says
ENOSPC (nothing is faked: the write then meets a real full disk):

* ``now``: before fedrun starts (its first write fails);
* ``csv:NAME:ROUND``: the append of ROUND's rows to NAME (``clients.csv``, ...; ROUND 0: the
  header a new run writes);
* ``save:NAME:ROUND``: ``torch.save`` of ``checkpoint.pt`` (``models/round_NNNN.pt``) after ROUND;
* ``json:NAME``: ``summary.json`` or ``run.json`` (its last write);
* ``partition``: ``partition.csv``;  ``config``: ``config.yaml``;
* ``log:ROUND``: the log line of ROUND (fedrun.log);  ``dashboard:ROUND``: TensorBoard's points.

Only writes below MOUNT are watched: in a population, the other runs write elsewhere.  Then
:func:`fedrun.command.cli.main` runs as the ``fedrun`` command does.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

BALLAST = "ballast"


def fill(mount: Path) -> None:
    """Write ``mount/ballast`` until the file system is full (page by page, then byte by byte)."""
    fd = os.open(mount / BALLAST, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        for chunk in (1 << 16, 4096, 1):
            try:
                while True:
                    os.write(fd, b"\0" * chunk)
            except OSError:
                pass
    finally:
        os.close(fd)


def under(path, mount: Path) -> bool:
    """Whether ``path`` lies on ``mount`` (through links: a run directory may be one)."""
    return os.path.realpath(path).startswith(os.path.realpath(mount) + os.sep)


def install(mount: Path, point: str) -> None:
    from fedrun.harness import recorder, rundir

    kind, *args = point.split(":")
    done = []

    def trigger(path) -> None:
        if not done and under(path, mount):
            done.append(path)
            fill(mount)

    if kind == "now":
        fill(mount)
    elif kind == "csv":
        name, round_ = args[0], int(args[1])
        init, append = recorder.CsvLog.__init__, recorder.CsvLog.append

        def new_init(self, path, columns, truncate_to=None):
            if round_ == 0 and Path(path).name == name and truncate_to is None:
                trigger(path)
            init(self, path, columns, truncate_to)

        def new_append(self, rows):
            if self.path.name == name and rows and rows[0].get("round") == round_:
                trigger(self.path)
            append(self, rows)

        recorder.CsvLog.__init__, recorder.CsvLog.append = new_init, new_append
    elif kind == "save":
        name, round_ = args[0], int(args[1])
        save = recorder.atomic_save

        def new_save(obj, path):
            if Path(path).name == name and obj.get("round") == round_:
                trigger(path)
            save(obj, path)

        recorder.atomic_save = new_save
    elif kind == "json":
        write = recorder.write_json

        def new_write(obj, path):
            if Path(path).name == args[0] and (args[0] != "run.json" or obj and "finished" in obj[-1]):
                trigger(path)
            write(obj, path)

        recorder.write_json = new_write
    elif kind == "partition":
        write_partition = recorder.write_partition

        def new_partition(path, counts):
            trigger(path)
            write_partition(path, counts)

        recorder.write_partition = new_partition
    elif kind == "config":
        write_atomic = rundir.write_atomic

        def new_atomic(path, write, binary=False):
            if Path(path).name == "config.yaml":
                trigger(path)
            write_atomic(path, write, binary)

        rundir.write_atomic = new_atomic
    elif kind == "log":
        emit = rundir.RunLog.emit

        def new_emit(self, record):
            if record.getMessage().startswith(f"round {args[0]}/"):
                trigger(self.baseFilename)
            emit(self, record)

        rundir.RunLog.emit = new_emit
    elif kind == "dashboard":
        from fedrun.harness import dashboards

        log = dashboards.TensorBoard.log

        def new_log(self, t, row, layer_rows):
            if t == int(args[0]):
                trigger(self.writer.log_dir)
            log(self, t, row, layer_rows)

        dashboards.TensorBoard.log = new_log
    else:
        raise SystemExit(f"disk_full_driver: unknown point {point}")


def main() -> None:
    mount, point, sep, *args = sys.argv[1:]
    assert sep == "--", "usage: disk_full_driver.py MOUNT POINT -- <fedrun arguments>"
    install(Path(mount).absolute(), point)
    from fedrun.command.cli import main as fedrun_main

    sys.argv = ["fedrun", *args]
    fedrun_main()


if __name__ == "__main__":
    main()
