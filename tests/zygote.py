"""A process that has imported PyTorch, Hydra and fedrun once, and forks a child per command line.

Most of a tiny ``python -m fedrun ...`` run from the command line is Python starting and importing
PyTorch (4 to 5 s of CPU on a 2-core machine; the run itself takes a tenth of a second).  The
suite runs hundreds of such command lines.  This server imports everything once and, for each
request, forks: the child is a separate process, as ``subprocess.run`` would start, with its own
working directory, environment, ``sys.argv``, standard streams and exit status, but it starts with
the imports already done.  :func:`conftest.python_run` is its client.

Protocol (one Unix-socket connection a command line): the client sends one JSON line
``{"argv": [...], "cwd": DIR, "env": {...}, "out": FILE, "err": FILE}`` where ``argv`` is what
follows ``python`` (``["-m", "fedrun", ...]`` or ``["path/to/script.py", ...]``); the child
answers ``{"pid": PID}`` at once (the client kills its process group on a timeout) and
``{"code": STATUS}`` when the program has ended; stdout and stderr go to the two files.

Fork safety: nothing here runs a PyTorch operation, so no OpenMP or CUDA state exists to be
copied into a child; each child sets up its threads as a fresh process does.
"""
from __future__ import annotations

import atexit
import json
import os
import runpy
import signal
import socket
import sys
import traceback


def _preload() -> None:
    """What a fedrun command line imports, so that no child spends its time importing it."""
    import matplotlib

    matplotlib.use("Agg")  # what the scripts select; a child cannot switch once pyplot is loaded
    import matplotlib.pyplot  # noqa: F401
    import pandas  # noqa: F401
    import torch  # noqa: F401
    import torchvision  # noqa: F401

    import fedrun.command.build  # noqa: F401
    import fedrun.command.cli  # noqa: F401


def _child(conn: socket.socket) -> int:
    """Run one command line in this (forked) process; return its exit status."""
    request = json.loads(conn.makefile("r").readline())
    os.setpgid(0, 0)  # its own process group: a timeout kills it and whatever it started
    conn.sendall((json.dumps({"pid": os.getpid()}) + "\n").encode())
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for fd, path in ((1, request["out"]), (2, request["err"])):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(f, fd)
        os.close(f)
    argv = request["argv"]
    if argv[0] == "-m":  # python -m MODULE: sys.path[0] is the working directory
        sys.argv = [argv[1], *argv[2:]]
        sys.path[0] = os.getcwd()
        run = lambda: runpy.run_module(argv[1], run_name="__main__", alter_sys=True)  # noqa: E731
    else:  # python SCRIPT: sys.path[0] is the script's folder
        script = os.path.abspath(argv[0])
        sys.argv = [argv[0], *argv[1:]]
        sys.path[0] = os.path.dirname(script)
        run = lambda: runpy.run_path(script, run_name="__main__")  # noqa: E731
    try:
        run()
        code = 0
    except SystemExit as e:  # what the interpreter does with sys.exit's argument
        if e.code is None:
            code = 0
        elif isinstance(e.code, int):
            code = e.code
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001 - an uncaught exception: traceback, status 1
        traceback.print_exc()
        code = 1
    try:
        atexit._run_exitfuncs()  # logging's flush, multiprocessing's clean-up ... as at interpreter exit
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
    return code & 0xFF


def main() -> None:
    path = sys.argv[1]
    _preload()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(64)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    print("ready", flush=True)
    parent = os.getppid()
    server.settimeout(2.0)
    while True:
        try:
            conn, _ = server.accept()
        except TimeoutError:
            if os.getppid() != parent:  # the test worker is gone (killed): leave no server behind
                return
            continue
        conn.settimeout(None)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid:
            conn.close()
            continue
        # the child: a fresh process's signal dispositions, then the command line
        server.close()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # its own subprocesses must be waitable
        code = 1
        try:
            code = _child(conn)
            conn.sendall((json.dumps({"code": code}) + "\n").encode())
        finally:
            os._exit(code)


if __name__ == "__main__":
    main()
