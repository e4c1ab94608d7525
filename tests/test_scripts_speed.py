"""The speed scripts: scripts/bench/bench.py (partial rounds projected to K clients, the profile),
scripts/bench/bench_lockstep.py (the presets' lock-steps, counted and timed) and
scripts/bench/precision_check.py (a whole run per engine mode, compared with FP32).  CPU, offline."""
from __future__ import annotations

import json
import math
import re
import subprocess
from pathlib import Path

import bench  # scripts/bench/ is on the tests' path (pyproject.toml: pythonpath)
import pandas as pd
import precision_check
import pytest
import torch
from conftest import TINY, python_run

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "scripts" / "bench"


def script(name: str, *args: str, cwd: Path = ROOT, timeout: float = 300) -> subprocess.CompletedProcess:
    return python_run([str(BENCH / name), *args], cwd, timeout=timeout)


def test_bench_projects_a_partial_round_and_profiles_it():
    done = script("bench.py", "small", "--clients", "2", "--device", "cpu", "--profile", "--profile-rows", "3")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "2,000 samples a round" in out  # the workload's round: 20 clients x 100 x E=1
    assert "timing 2 of the 20 clients a round (200 samples)" in out
    lines = re.findall(r"(sequential|batched)\s+fp32:\s+([\d,]+) samples/s \|\s+([\d.]+) s/round \(projected\)", out)
    assert [engine for engine, *_ in lines] == ["sequential", "batched"]
    for _engine, rate, round_s in lines:
        train_s = 200 / float(rate.replace(",", ""))  # the 2 clients' local training
        # projected: 10x the measured training (all 20 clients) plus aggregation and evaluation once
        assert float(round_s) >= 10 * train_s * 0.98
    assert out.count("profile of one round") == 2 and out.count("top 3 operators") == 2
    shares = [float(s) for s in re.findall(r"([\d.]+)% of wall", out)]
    assert len(shares) == 2 * 7  # five families + other operators + overhead, per engine
    assert abs(sum(shares[:7]) - 100) < 1.0  # the families and the overhead partition the wall time
    assert "convolution (fwd + bwd)" in out and "batched/sequential speed (fp32)" in out


def test_bench_sweeps_chunk_sizes():
    done = script("bench.py", "small", "--clients", "4", "--device", "cpu", "--engines", "batched",
                  "--clients-per-step", "2,all")
    assert done.returncode == 0, done.stderr
    assert re.search(r"batched\[2\]\s+fp32:.*\| 2 clients a step", done.stdout)
    assert re.search(r"batched\[all\]\s+fp32:.*\| 4 clients a step", done.stdout)  # all of the 4 timed
    bad = script("bench.py", "small", "--clients-per-step", "auto,0")
    assert bad.returncode == 2 and "--clients-per-step: '0' is not auto, all or a positive number" in bad.stderr


def test_bench_population_against_one_by_one():
    """``bench.py population``: both modes timed on the same runs, the speedup of their seconds
    per round, the same test accuracies."""
    done = script("bench.py", "population", "--workload", "tiny", "--rounds", "3", "--repeat", "1", "--device", "cpu")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "population benchmark 'tiny': 3 runs, 3 rounds timed (of 10)" in out
    rows = {mode: (float(seconds), float(speedup)) for mode, seconds, speedup in
            re.findall(r"(one by one, batched engine|population)\s+([\d.]+)\s+[\d.]+\s+([\d.]+)x", out)}
    assert rows.keys() == {"one by one, batched engine", "population"}
    (alone, one), (together, speedup) = rows["one by one, batched engine"], rows["population"]
    assert one == 1.0 and together > 0 and speedup == pytest.approx(alone / together, rel=0.05, abs=0.02)
    assert "largest difference 0.0000 over 3 runs x 3 rounds" in out
    bad = script("bench.py", "population", "--runs", "1")
    assert bad.returncode == 2 and "--runs must be at least 2" in bad.stderr


def test_bench_rejects_bad_arguments_in_one_line():
    done = script("bench.py", "small", "--clients", "0")
    assert done.returncode == 2 and "--clients must be a positive number of clients, got 0" in done.stderr
    done = script("bench.py", "small", "--engines", "sequential,vmap")
    assert done.returncode == 2 and "--engines: 'sequential,vmap'; allowed: sequential, batched" in done.stderr
    if not torch.cuda.is_available():
        done = script("bench.py", "small", "--device", "cuda")
        assert done.returncode == 2 and "--device cuda: this machine has no CUDA device" in done.stderr


def test_bench_lockstep_counts_the_presets_lock_steps_and_times_a_step(tmp_path):
    """``bench_lockstep.py --tiny``: the structural figures of both presets' partitions, which can be
    checked by hand (eq. 1 of fedrun.client.round_plan), and every measured column present; no timing
    is asserted."""
    done = script("bench_lockstep.py", "--tiny", "--device", "cpu", "--json", str(tmp_path / "lockstep.json"))
    assert done.returncode == 0, done.stderr[-3000:]
    out, figures = done.stdout, json.loads((tmp_path / "lockstep.json").read_text())
    assert "synthetic MNIST-shaped stand-in (60,000 images" in out
    assert figures["data"] == "synthetic" and figures["chunk"] == 5 and figures["width"] == 2  # CPU chunk; --tiny
    ub, b = (figures["workloads"][f"fednnnn_mnist_noniid_{c}"] for c in ("ub", "b"))
    for w in (ub, b):
        assert (w["clients"], w["epochs"], w["batch_size"]) == (100, 5, 50)
        assert w["critical_path"] == w["epochs"] * math.ceil(w["largest"] / w["batch_size"])
        assert w["critical_path"] <= w["lock_steps"] <= w["total_steps"]
        assert w["mean_steps"] == w["total_steps"] / w["clients"] and 0 < w["occupancy"] <= 1
        assert math.isfinite(w["floor_eager_s"])  # a figure, not checked: timings on a shared CPU are noise
    # balanced: 600 images each, 12 batches x 5 epochs, every lock-step full; unbalanced: the largest
    # client's steps are far more than the mean's (sec. 5.1 iv: the largest holds about 19% of N)
    assert (b["largest"], b["smallest"], b["critical_path"], b["total_steps"]) == (600, 600, 60, 6000)
    assert b["occupancy"] == 1.0 and b["lock_steps"] == 20 * 60  # 20 chunks of 5, each 60 lock-steps
    assert ub["largest"] > 10_000 and ub["critical_path"] > 10 * ub["mean_steps"]
    measured = figures["measured"]
    modes = ("eager", "captured") if figures["capture"] else ("eager",)
    assert set(measured) == {f"{shape}_{mode}" for shape in ("one", "full") for mode in modes}
    # operators a lock-step: counted, so exact (the long round's less the short one's)
    assert all(math.isfinite(m["ms"]) and m["aten_calls"] > 10 for m in measured.values())
    assert "aten calls" in out and out.count("floor a round (eager)") == 2
    if not figures["capture"]:
        assert "capture columns left out" in out
    else:
        assert math.isfinite(ub["floor_captured_s"]) and "captured/eager" in out
    bad = script("bench_lockstep.py", "fednnnn_mnist_iid")
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "bench_lockstep: unknown workload 'fednnnn_mnist_iid'; choose from fednnnn_mnist_noniid_ub, "
        "fednnnn_mnist_noniid_b"]


def test_op_families_sort_operators():
    family = {op: next((f for f, keys in bench.OP_FAMILIES if any(k in op for k in keys)), "other")
              for op in ("convolution_backward", "mkldnn_convolution", "addmm", "max_pool2d_with_indices",
                         "index", "add_", "lerp_", "native_batch_norm", "detach")}
    assert family["convolution_backward"] == family["mkldnn_convolution"] == "convolution (fwd + bwd)"
    assert family["addmm"] == "linear / matmul"
    assert family["max_pool2d_with_indices"] == family["native_batch_norm"] == "pooling, activation, norm, loss"
    assert family["index"] == "batch gathering, copies"  # not 'indices' of pooling: pool matches first
    assert family["add_"] == family["lerp_"] == "elementwise (optimizer, grads)"
    assert family["detach"] == "other"


def fake_run(folder: Path, acc: list[float], loss: list[float], wall: list[float]) -> Path:
    folder.mkdir(parents=True)
    pd.DataFrame({"round": range(1, len(acc) + 1), "test_acc": acc, "train_loss": loss,
                  "wall_s": wall}).to_csv(folder / "rounds.csv", index=False)
    (folder / "summary.json").write_text(json.dumps({"final_test_acc": acc[-1], "best_test_acc": max(acc)}))
    return folder


def test_compare_against_fp32_golden(tmp_path):
    folders = {
        "fp32": fake_run(tmp_path / "fp32", [0.5, 0.6, 0.7], [2.0, 1.5, 1.0], [9.0, 2.0, 2.0]),
        "bf16": fake_run(tmp_path / "bf16", [0.5, 0.65, 0.68], [2.0, 1.4, 1.2], [3.0, 1.0, 1.0]),
    }
    table = precision_check.compare(folders).set_index("mode")
    assert table.loc["fp32", "max_abs_acc_diff"] == 0 and table.loc["fp32", "speed_vs_fp32"] == 1
    bf16 = table.loc["bf16"]
    assert bf16["max_abs_acc_diff"] == pytest.approx(0.05)  # round 2: 0.65 vs 0.6
    assert bf16["mean_abs_train_loss_diff"] == pytest.approx((0 + 0.1 + 0.2) / 3)
    assert bf16["s_per_round"] == 1.0 and bf16["first_round_s"] == 3.0  # round 1 (warm-up) kept apart
    assert bf16["speed_vs_fp32"] == 2.0
    assert (bf16["final_acc"], bf16["best_acc"]) == (0.68, 0.68)


def test_precision_check_runs_each_mode_and_reuses_finished_runs(tmp_path):
    args = ["--out", str(tmp_path), "--modes", "bf16", *TINY]
    done = script("precision_check.py", *args)
    assert done.returncode == 0, done.stderr
    table = pd.read_csv(tmp_path / "precision_check.csv").set_index("mode")
    assert list(table.index) == ["fp32", "bf16"]  # fp32 added: the reference
    assert table.loc["fp32", "max_abs_acc_diff"] == 0
    assert table.loc["bf16", "rounds"] == 2 and table.loc["bf16", "max_abs_acc_diff"] < 0.2
    for mode in ("fp32", "bf16"):
        config = (tmp_path / mode / "config.yaml").read_text()
        assert f"precision: {mode}" in config
    again = script("precision_check.py", *args)
    assert again.returncode == 0 and again.stdout.count("reusing the finished run") == 2


def test_precision_check_rejects_an_unknown_mode(tmp_path):
    done = script("precision_check.py", "--out", str(tmp_path), "--modes", "fp16")
    assert done.returncode == 2 and "unknown mode 'fp16'; allowed: fp32, tf32, bf16, compile" in done.stderr


def test_bench_round_sums_times_block_sizes_against_the_gram_path():
    """``bench_round_sums.py``: every block size and the Gram path on the same updates, each total the
    sum of its two phases, the default block's ratio 1."""
    done = script("bench_round_sums.py", "--clients", "6,40", "--chunks", "64,4096", "--repeat", "1",
                  "--gram-up-to", "6", "--threads", "1")
    assert done.returncode == 0, done.stderr
    rows = re.findall(r"^\s*([\d,]+)\s+(streamed, [\d.e-]+ MiB blocks|Gram matrices)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$",
                      done.stdout, re.M)
    assert [(m, name.startswith("Gram")) for m, name, *_ in rows] == [
        ("6", False), ("6", False), ("6", False), ("6", True), ("40", False), ("40", False), ("40", False)]
    for _m, name, stats_ms, div_ms, total_ms, ratio in rows:
        assert abs(float(stats_ms) + float(div_ms) - float(total_ms)) <= 0.11  # printed to 0.1 ms each
        if name == "streamed, 4 MiB blocks":  # the CPU's default (fedrun.diagnostics.nwda.stream_chunk)
            assert ratio == "1.00"


def test_bench_cross_device_runs_a_natural_federation_through_the_command(tmp_path):
    """``bench_cross_device.py``: a synthetic-writers run through ``fedrun``, the sizes of its writers
    and the round's parts, with the run kept where ``--out`` says."""
    done = script("bench_cross_device.py", "--writers", "30", "--per-round", "5", "--rounds", "2", "--model", "mlp",
                  "--out", str(tmp_path / "run"), "--set", "model.hidden=[8]", "--set", "dataset.image_size=8")
    assert done.returncode == 0, done.stderr
    part = pd.read_csv(tmp_path / "run" / "partition.csv")
    assert len(part) == 30 and f"30 writers ({part['examples'].sum():,} training images" in done.stdout
    assert "5 a round" in done.stdout and re.search(r"bookkeeping [\d.]+ s \([\d.]+% of training\)", done.stdout)
    assert len(pd.read_csv(tmp_path / "run" / "rounds.csv")) == 2
