"""Run fedrun's console entry point in-process for many command lines, in one Python process.

A catalogue of bad command lines would spend most of its time starting Python and importing
PyTorch once per line; this driver starts once and calls :func:`fedrun.command.cli.main` per case, as the
``fedrun`` script does.  Reads a JSON list of ``{"args": [...], "cwd": DIR, "env": {...}}`` on
stdin; prints one JSON line per case: ``{"code": exit status, "stdout": ..., "stderr": ...}``
(code -1 and the traceback in stderr when an exception escaped ``main``).
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import traceback


def main() -> None:
    cases = json.load(sys.stdin)
    from fedrun.command.cli import main as fedrun_main

    base_env = dict(os.environ)
    for case in cases:
        os.environ.clear()
        os.environ.update({**base_env, **case.get("env", {})})
        os.chdir(case["cwd"])
        sys.argv = ["fedrun", *case["args"]]
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                fedrun_main()
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 1
            except BaseException:  # noqa: BLE001 - what the user would see as a traceback
                traceback.print_exc()
                code = -1
        print(json.dumps({"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()}), flush=True)


if __name__ == "__main__":
    main()
