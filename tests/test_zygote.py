"""tests/zygote.py: a command line forked from the pre-imported server behaves as ``python ...`` does.

The suite runs most command lines through :func:`conftest.python_run`; these checks hold it to a
fresh interpreter's behaviour on what the tests read: exit status, stdout and stderr, the working
directory, the environment, ``sys.argv``, ``sys.path[0]``, a traceback's status, a timeout."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from conftest import _cli_env, python_run

PROBE = textwrap.dedent("""
    import json, os, sys
    print(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(), "path0": sys.path[0],
                      "omp": os.environ.get("OMP_NUM_THREADS"), "main": __name__}))
    print("to stderr", file=sys.stderr)
    if sys.argv[1:2] == ["fail"]:
        raise ValueError("boom")
    sys.exit(int(sys.argv[1]) if sys.argv[1:2] and sys.argv[1].isdigit() else 0)
""")


@pytest.mark.parametrize("args", [[], ["3"], ["fail"], ["300"]])
def test_a_script_behaves_as_in_a_fresh_interpreter(tmp_path, args):
    (tmp_path / "probe.py").write_text(PROBE)
    run_dir = tmp_path / "here"
    run_dir.mkdir()
    forked = python_run([str(tmp_path / "probe.py"), *args], run_dir)
    fresh = subprocess.run([sys.executable, str(tmp_path / "probe.py"), *args], cwd=run_dir, env=_cli_env(),
                           capture_output=True, text=True, timeout=60)
    assert forked.returncode == fresh.returncode == {"3": 3, "fail": 1, "300": 300 & 0xFF}.get(args[0] if args else "", 0)
    assert forked.stdout == fresh.stdout
    assert '"path0": "%s"' % tmp_path in forked.stdout and '"cwd": "%s"' % run_dir in forked.stdout
    assert forked.stderr.splitlines()[0] == "to stderr"
    assert forked.stderr.rstrip().splitlines()[-1] == fresh.stderr.rstrip().splitlines()[-1]


def test_a_module_sees_the_working_directory_first_on_its_path(tmp_path):
    (tmp_path / "probe_module.py").write_text(PROBE)
    forked = python_run(["-m", "probe_module", "5"], tmp_path)
    assert forked.returncode == 5 and '"path0": "%s"' % tmp_path in forked.stdout
    assert '"main": "__main__"' in forked.stdout and '"argv": ["5"]' in forked.stdout


def test_a_timeout_kills_the_child_and_raises_as_subprocess_does(tmp_path):
    (tmp_path / "sleeper.py").write_text("import time\nprint('started', flush=True)\ntime.sleep(60)\n")
    with pytest.raises(subprocess.TimeoutExpired) as caught:
        python_run([str(tmp_path / "sleeper.py")], tmp_path, timeout=2)
    assert "started" in caught.value.output


def test_another_environment_gets_a_fresh_interpreter(tmp_path):
    (tmp_path / "probe.py").write_text(PROBE)
    done = python_run([str(tmp_path / "probe.py")], tmp_path, env={**_cli_env(), "OMP_NUM_THREADS": "2"})
    assert done.returncode == 0 and '"omp": "2"' in done.stdout
