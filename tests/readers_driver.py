"""Run the result readers' command lines in-process, many in one Python process.

As tests/cli_driver.py does for ``fedrun``: a catalogue of bad command lines for ``fedrun-plot``
and the scripts in ``scripts/`` would spend most of its time starting Python and importing
pandas, matplotlib and PyTorch once per line; this driver starts once and calls each program's
``main(argv)`` per case, as its command line would.  Reads a JSON list of
``{"prog": name, "args": [...], "cwd": DIR}`` on stdin (``prog``: a key of :data:`PROGRAMS`);
prints one JSON line per case: ``{"code": exit status, "stdout": ..., "stderr": ...}`` (code -1
and the traceback in stderr when an exception escaped ``main``).
"""
from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import sys
import traceback
from pathlib import Path

# The programs, by the name they print, and the module whose main(argv) each one is.
PROGRAMS = {
    "fedrun-plot": "fedrun.plot", "readings": "scripts.common.readings", "fednnnn_table2": "scripts.fednnnn.table2",
    "fedlayerwise_table1": "scripts.fedlayerwise.table1", "niidbench_table3": "scripts.niidbench.table3",
    "pd_tables": "scripts.pd.tables", "plot_fednnnn": "scripts.fednnnn.plot", "plot_fedlayerwise": "scripts.fedlayerwise.plot",
    "plot_fedlap": "scripts.fedlap.plot", "plot_pd": "scripts.pd.plot", "loss_surface": "scripts.pd.loss_surface",
}


def run(main, args: list[str]) -> tuple[int, str, str]:
    """``main(args)`` with its output captured: (exit status, stdout, stderr), as the shell sees them."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(args) or 0
        except SystemExit as e:
            if isinstance(e.code, str):  # sys.exit("message"): Python prints it, exit status 1
                print(e.code, file=sys.stderr)
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:  # noqa: BLE001 - what the user would see as a traceback
            traceback.print_exc()
            code = -1
    return code, out.getvalue(), err.getvalue()


def main() -> None:
    cases = json.load(sys.stdin)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's root: scripts.*
    for case in cases:
        os.chdir(case["cwd"])
        program = importlib.import_module(PROGRAMS[case["prog"]]).main
        code, out, err = run(program, case["args"])
        print(json.dumps({"code": code, "stdout": out, "stderr": err}), flush=True)


if __name__ == "__main__":
    main()
