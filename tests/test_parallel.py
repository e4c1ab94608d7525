"""The parallel engine: a round's clients in single-threaded worker processes, byte for byte the
sequential engine with one thread; a worker that dies is an error naming it; whole runs equal."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from conftest import TINY, fedrun_ok, run_fedrun, same_run, start_fedrun, tiny_mlp, wait_for_rows

from fedrun import aggregators as A
from fedrun.client import engines
from fedrun.client.local_training import ClientResults, LocalTraining
from fedrun.client.parallel import ParallelEngine, WorkerError
from fedrun.client.regularizers import Proximal
from fedrun.client.sequential import SequentialEngine
from fedrun.client.worker_tasks import merge_results
from fedrun.data.augment import make_augmentation
from fedrun.data.datasets import synthetic
from fedrun.data.preparation import prepare
from fedrun.diagnostics.evaluation import evaluate
from fedrun.errors import ConfigError
from fedrun.models.pd_nets import PDNet
from fedrun.params import split_state

# Five clients of uneven sizes over tiny_data's 60 training samples.
SPLIT = [range(0, 10), range(10, 33), range(33, 40), range(40, 52), range(52, 60)]


@pytest.fixture(autouse=True)
def one_thread():
    """The reference is the sequential engine with one thread (the suite's default, conftest)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def both(model_fn, x, y, local, regularizer=None, workers=2):
    seq = SequentialEngine(model_fn(), x, y, local, regularizer, 7)
    par = ParallelEngine(model_fn(), x, y, local, regularizer, 7, workers=workers)
    return seq, par


def assert_same(a: ClientResults, b: ClientResults) -> None:
    """Every field of two engines' results, bit for bit."""
    assert a.clients == b.clients
    for name in ("deltas", "buffers", "opt_states", "extras"):
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None), name
        if x is not None:
            assert list(x) == list(y), name
            for k in x:
                assert torch.equal(x[k], y[k]) or (x[k].isnan() == y[k].isnan()).all() and torch.equal(
                    x[k].nan_to_num(), y[k].nan_to_num()), f"{name}[{k}]"
    for name in ("num_examples", "loss", "steps", "epochs", "lr", "effective_steps"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name


def scaffold_inputs(params, m, seed=5):
    g = torch.Generator().manual_seed(seed)
    return {k: 0.01 * torch.randn((m, *v.shape), generator=g) for k, v in params.items()}


CASES = {
    "sgd": dict(local=LocalTraining(epochs=2, batch_size=7, lr=0.1)),
    "momentum, weight decay, states": dict(local=LocalTraining(epochs=2, batch_size=7, lr=0.1, momentum=0.9,
                                                               weight_decay=1e-3, optimizer_state="average"),
                                           states=True),
    "adam, states": dict(local=LocalTraining(epochs=1, batch_size=5, lr=1e-3, optimizer="adam",
                                             optimizer_state="local"), states=True),
    "fedprox": dict(local=LocalTraining(epochs=2, batch_size=7, lr=0.1), regularizer=Proximal(0.5)),
    "fedlap": dict(local=LocalTraining(epochs=2, batch_size=7, lr=0.1), regularizer=A.fedlap().regularizer),
    "scaffold": dict(local=LocalTraining(epochs=2, batch_size=7, lr=0.1), regularizer=A.scaffold().regularizer,
                     inputs=True),
    "scaffold after_step": dict(local=LocalTraining(epochs=2, batch_size=7, lr=0.1),
                                regularizer=A.scaffold(correction="after_step").regularizer, inputs=True),
    "stragglers": dict(local=LocalTraining(epochs=3, batch_size=7, lr=0.1), epochs=[3, 1, 2, 3, 1]),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("workers", [2, 3])
def test_every_client_setting_trains_as_the_sequential_engine_with_one_thread(tiny_data, case, workers):
    c = CASES[case]
    seq, par = both(tiny_mlp, tiny_data.train_x, tiny_data.train_y, c["local"], c.get("regularizer"), workers)
    try:
        params, buffers = split_state(tiny_mlp())
        clients = [4, 0, 3, 1, 2]  # not in order: results come back in the round's client order
        indices = [torch.tensor(list(SPLIT[k])) for k in clients]
        states = inputs = None
        if c.get("states"):
            fresh = c["local"].fresh_state(params)
            g = torch.Generator().manual_seed(1)
            states = {k: (v.abs() + 0.1 * torch.rand((5, *v.shape), generator=g)).to(v.dtype)
                      if v.is_floating_point() else v.expand(5, *v.shape).clone() for k, v in fresh.items()}
        if c.get("inputs"):
            inputs = scaffold_inputs(params, 5)
        for round_ in (1, 2):  # the workers live on: a second round reuses them
            args = (params, buffers, clients, indices, round_, c.get("epochs"), 0.05 * round_, states, inputs)
            a, b = seq.train(*args), par.train(*args)
            assert_same(a, b)
            assert bool((a.deltas[next(iter(a.deltas))].flatten(1).norm(dim=1) > 0).all())  # every client moved
        if c.get("regularizer") is not None:
            assert "reg_loss" in b.extras
    finally:
        par.close()


def test_batchnorm_dropout_and_augmentation_in_the_workers():
    """Buffers (BatchNorm statistics), dropout masks and augmentation draws derive from
    (seed, round, client) in whichever process trains the client."""
    raw = synthetic(num_train=48, num_test=30, channels=3, image_size=8, num_classes=10, seed=2)
    data = prepare(raw, (0.5, 0.5, 0.5), (0.25, 0.25, 0.25))
    local = LocalTraining(epochs=1, batch_size=6, lr=0.05, momentum=0.5,
                          augment=make_augmentation(True, (0.25, 0.25, 0.25), dataset="cifar10"))

    def model():
        torch.manual_seed(3)
        return PDNet(3, 8, 10, m=1, norm="bn", dropout=True)

    seq, par = both(model, data.train_x, data.train_y, local)
    try:
        params, buffers = split_state(model())
        indices = [torch.arange(12 * j, 12 * (j + 1)) for j in range(4)]
        a = seq.train(params, buffers, [0, 1, 2, 3], indices, 1, None, local.lr)
        b = par.train(params, buffers, [0, 1, 2, 3], indices, 1, None, local.lr)
        assert_same(a, b)
        assert any(not torch.equal(a.buffers[k][0], buffers[k]) for k in buffers)  # BatchNorm statistics moved
    finally:
        par.close()


def test_evaluation_in_the_workers_equals_the_one_process_evaluation(tiny_data):
    local = LocalTraining(epochs=1, batch_size=7, lr=0.1)
    model = tiny_mlp()
    par = ParallelEngine(tiny_mlp(), tiny_data.train_x, tiny_data.train_y, local, None, 0, workers=3)
    par.share(tiny_data.test_x, tiny_data.test_y)
    try:
        state = model.state_dict()
        for batch in (3, 7, 20, 100):  # 7, 3, 1 and 1 batches over the 20 test images
            assert par.evaluate(model, state, tiny_data.test_x, tiny_data.test_y, batch) == evaluate(
                model, state, tiny_data.test_x, tiny_data.test_y, batch)
        # A split the workers do not hold is scored in the run's process: the same numbers.
        assert par.evaluate(model, state, tiny_data.train_x, tiny_data.train_y, 8) == evaluate(
            model, state, tiny_data.train_x, tiny_data.train_y, 8)
        assert par._pool is not None and len(par._pool.processes) == 3
    finally:
        par.close()


def test_merge_puts_every_part_back_in_client_order():
    def part(clients, value):
        m = len(clients)
        return ClientResults(clients, {"w": torch.full((m, 2), value)}, {}, torch.full((m,), 10), torch.ones(m),
                             torch.ones(m, dtype=torch.long), torch.ones(m, dtype=torch.long),
                             {"only_b": torch.full((m,), value, dtype=torch.float64)} if value == 2.0 else {},
                             None, torch.full((m,), 0.1, dtype=torch.float64), torch.ones(m, dtype=torch.float64))

    merged = merge_results([([0, 2], part([7, 5], 1.0)), ([1], part([9], 2.0))], [7, 9, 5])
    assert merged.clients == [7, 9, 5]
    assert merged.deltas["w"][:, 0].tolist() == [1.0, 2.0, 1.0]
    # A metric one part lacks is NaN for its clients, as the sequential engine leaves it.
    assert merged.extras["only_b"].isnan().tolist() == [True, False, True] and merged.extras["only_b"][1] == 2.0


# ----------------------------------------------------------------------------- failures


class _DiesInWorker(Proximal):
    """FedProx whose client 3 kills its own process (a worker's, never the test's)."""

    parent = os.getpid()

    def init(self, anchor, m, inputs=None):
        if os.getpid() != self.parent and self.die:
            os.kill(os.getpid(), self.die)
        return super().init(anchor, m, inputs)


class _FailsInWorker(Proximal):
    parent = os.getpid()

    def init(self, anchor, m, inputs=None):
        if os.getpid() != self.parent:
            raise ArithmeticError("a bug in a regularizer")
        return super().init(anchor, m, inputs)


def test_a_worker_that_dies_is_an_error_naming_it_the_client_and_the_round(tiny_data):
    reg = _DiesInWorker(0.1)
    reg.die = signal.SIGKILL
    par = ParallelEngine(tiny_mlp(), tiny_data.train_x, tiny_data.train_y, LocalTraining(batch_size=7), reg, 0,
                         workers=2)
    params, buffers = split_state(tiny_mlp())
    start = time.monotonic()
    with pytest.raises(WorkerError, match=r"^engine=parallel: worker \d \(pid \d+\) killed by signal 9 .*on client "
                                          r"\d of round 4; the run stops after its last complete round"):
        par.train(params, buffers, [0, 1], [torch.arange(10), torch.arange(10, 20)], 4, None, 0.05)
    assert time.monotonic() - start < 30  # no hang
    par.close()


def test_an_exception_in_a_worker_reaches_the_run_with_its_type(tiny_data):
    par = ParallelEngine(tiny_mlp(), tiny_data.train_x, tiny_data.train_y, LocalTraining(batch_size=7),
                         _FailsInWorker(0.1), 0, workers=2)
    params, buffers = split_state(tiny_mlp())
    try:
        with pytest.raises(ArithmeticError, match="a bug in a regularizer") as caught:
            par.train(params, buffers, [0, 1], [torch.arange(10), torch.arange(10, 20)], 2, None, 0.05)
        if sys.version_info >= (3, 11):
            assert "in parallel worker" in caught.value.__notes__[0] and "of round 2" in caught.value.__notes__[0]
        # The pool is still usable after a worker's error (it answered, it did not die).
        assert all(p.is_alive() for p in par._pool.processes)
    finally:
        par.close()


def test_workers_exit_when_the_runs_process_is_killed(tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent("""
        import sys, time, torch
        from fedrun.client.local_training import LocalTraining
        from fedrun.client.parallel import ParallelEngine
        from fedrun.models.nets import MLP
        x, y = torch.randn(40, 1, 4, 4), torch.randint(0, 10, (40,))
        e = ParallelEngine(MLP(1, 4, 10, hidden=[8]), x, y, LocalTraining(batch_size=5), None, 0, workers=2)
        p = {k: v.detach() for k, v in e.model.named_parameters()}
        e.train(p, {}, [0, 1], [torch.arange(20), torch.arange(20, 40)], 1, None, 0.05)
        print(" ".join(str(w.pid) for w in e._pool.processes), flush=True)
        time.sleep(600)
    """))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 2
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.1)
        assert not any(_alive(p) for p in pids)
    finally:
        if proc.poll() is None:
            proc.kill()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_bad_options_are_one_line(tiny_data):
    for workers in (0, -1, "two", 1.5, True):
        with pytest.raises(ConfigError, match=r"^engine.workers="):
            ParallelEngine(tiny_mlp(), tiny_data.train_x, tiny_data.train_y, LocalTraining(), None, 0, workers=workers)
    with pytest.raises(ConfigError, match=r"^engine.compile=True: .*set engine.compile=false"):
        ParallelEngine(tiny_mlp(), tiny_data.train_x, tiny_data.train_y, LocalTraining(), None, 0, compile=True)


# ----------------------------------------------------------------------------- engine=auto


def test_auto_keeps_the_sequential_engine_on_a_cpu(tiny_data):
    """It measured no faster there on 2 cores (docs/performance.md): auto keeps the reference."""
    engine = engines.auto_engine(tiny_mlp(), tiny_data.train_x, tiny_data.train_y, LocalTraining(), None, 0)
    assert type(engine) is SequentialEngine


# ----------------------------------------------------------------------------- whole runs

PARALLEL = [*TINY, "hyperparams.num_clients=6", "hyperparams.client_fraction=0.5", "hyperparams.rounds=3",
            "hyperparams.batch_size=10"]


@pytest.mark.slow
@pytest.mark.parametrize("method", [["aggregator=fednnnn", "hyperparams.stragglers=0.4", "hyperparams.dropouts=0.3"],
                                    ["aggregator=scaffold", "hyperparams.momentum=0.5"],
                                    ["aggregator=fedlap", "hyperparams.validation_fraction=0.2"]],
                         ids=["fednnnn-stragglers-dropouts", "scaffold", "fedlap-validation"])
def test_a_whole_run_equals_the_sequential_one_thread_run(tmp_path, method):
    seq, par = tmp_path / "seq", tmp_path / "par"
    fedrun_ok([*PARALLEL, *method, "engine=sequential", "threads=1", f"hydra.run.dir={seq}"], tmp_path)
    proc = fedrun_ok([*PARALLEL, *method, "engine=parallel", "engine.workers=2", f"hydra.run.dir={par}"], tmp_path)
    assert "(engine: ParallelEngine, 2 single-threaded worker processes)" in proc.stderr
    same_run(seq, par)


@pytest.mark.slow
def test_ctrl_c_stops_the_workers_and_the_run_resumes_byte_exact(tmp_path):
    long = [*PARALLEL, "hyperparams.rounds=30", "hyperparams.batch_size=2", "engine=parallel", "engine.workers=2"]
    straight = tmp_path / "straight"
    fedrun_ok([*long, f"hydra.run.dir={straight}"], tmp_path)
    run = tmp_path / "stopped"
    proc = start_fedrun([*long, f"hydra.run.dir={run}"], tmp_path, capture=True)
    try:
        wait_for_rows(proc, run / "rounds.csv", 2)
        workers = _children(proc.pid)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert workers and not any(_alive(p) for p in workers)
    fedrun_ok([*long, f"hydra.run.dir={run}", "resume=true"], tmp_path)
    same_run(straight, run)


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(entry))
            except (OSError, ValueError):
                pass
    return out


@pytest.mark.slow
def test_bad_workers_on_the_command_line_is_one_line(tmp_path):
    proc = run_fedrun([*TINY, "engine=parallel", "engine.workers=0", f"hydra.run.dir={tmp_path / 'r'}"], tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("fedrun: error: engine.workers=0: a number of worker")
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_a_killed_run_resumes_at_once_its_workers_never_held_its_lock(tmp_path):
    """The workers are forked before the run locks its directory: a SIGKILLed run's workers, still
    finishing their share of a round, do not keep the resume out."""
    long = [*PARALLEL, "hyperparams.rounds=30", "hyperparams.batch_size=2", "engine=parallel", "engine.workers=2"]
    run = tmp_path / "killed"
    proc = start_fedrun([*long, f"hydra.run.dir={run}"], tmp_path)
    try:
        wait_for_rows(proc, run / "rounds.csv", 2)
        workers = _children(proc.pid)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert len(workers) == 2
    fedrun_ok([*long, f"hydra.run.dir={run}", "resume=true", "hyperparams.rounds=30"], tmp_path)
    straight = tmp_path / "straight"
    fedrun_ok([*long, f"hydra.run.dir={straight}"], tmp_path)
    same_run(straight, run)
    assert not any(_alive(p) for p in workers)


# ----------------------------------------------------------------------------- Ray


def test_bad_backends_are_one_line(tiny_data):
    with pytest.raises(ConfigError, match=r"^engine.backend=spark: choose one of: processes, ray$"):
        ParallelEngine(tiny_mlp(), tiny_data.train_x, tiny_data.train_y, LocalTraining(), None, 0, backend="spark")
    with pytest.raises(ConfigError, match=r"^engine.address=auto: is the Ray cluster to join: set engine.backend=ray"):
        ParallelEngine(tiny_mlp(), tiny_data.train_x, tiny_data.train_y, LocalTraining(), None, 0, address="auto")


def test_without_ray_the_ray_backend_is_one_line(tiny_data, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # as if not installed
    with pytest.raises(ConfigError, match=r"^engine.backend=ray: needs Ray: pip install 'fedrun\[ray\]'"):
        ParallelEngine(tiny_mlp(), tiny_data.train_x, tiny_data.train_y, LocalTraining(), None, 0, backend="ray")


@pytest.mark.slow
def test_ray_actors_train_and_evaluate_as_the_sequential_engine(tiny_data):
    """A Ray instance started by the engine on this machine, two actors of one CPU each."""
    pytest.importorskip("ray", reason="Ray is not installed (pip install 'fedrun[ray]')")
    c = CASES["scaffold"]
    seq, _ = SequentialEngine(tiny_mlp(), tiny_data.train_x, tiny_data.train_y, c["local"], c["regularizer"], 7), None
    par = ParallelEngine(tiny_mlp(), tiny_data.train_x, tiny_data.train_y, c["local"], c["regularizer"], 7,
                         workers=2, backend="ray")
    par.share(tiny_data.test_x, tiny_data.test_y)
    try:
        par.start()
        assert par.workers == 2 and par.summary == "ParallelEngine, 2 single-threaded Ray actors"
        params, buffers = split_state(tiny_mlp())
        clients = [3, 1, 4, 0, 2]
        indices = [torch.tensor(list(SPLIT[k])) for k in clients]
        args = (params, buffers, clients, indices, 2, None, 0.05, None, scaffold_inputs(params, 5))
        assert_same(seq.train(*args), par.train(*args))
        model = tiny_mlp()
        assert par.evaluate(model, model.state_dict(), tiny_data.test_x, tiny_data.test_y, 6) == evaluate(
            model, model.state_dict(), tiny_data.test_x, tiny_data.test_y, 6)
    finally:
        par.close()
    import ray

    assert not ray.is_initialized()  # the instance the engine started is stopped with it


@pytest.mark.slow
def test_a_whole_run_on_ray_equals_the_sequential_one_thread_run(tmp_path):
    pytest.importorskip("ray", reason="Ray is not installed (pip install 'fedrun[ray]')")
    seq, par = tmp_path / "seq", tmp_path / "ray"
    method = ["aggregator=fedprox"]
    fedrun_ok([*PARALLEL, *method, "engine=sequential", "threads=1", f"hydra.run.dir={seq}"], tmp_path)
    proc = fedrun_ok([*PARALLEL, *method, "engine=parallel", "engine.backend=ray", "engine.workers=2",
                      f"hydra.run.dir={par}"], tmp_path, timeout=300)
    assert "(engine: ParallelEngine, 2 single-threaded Ray actors)" in proc.stderr
    same_run(seq, par)
