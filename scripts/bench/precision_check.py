"""Accuracy check of the engines' speed modes against FP32, on a real run.

``bench.py --precision/--compile`` (beside this script) compares the *speed* of a mode with FP32
and the first round's updates.  Whether a mode may be recommended depends on what it does to a whole run, so
this script runs the same fedrun configuration once per mode (``engine.precision`` = fp32 | tf32 |
bf16, and fp32 with ``engine.compile=true``), one after the other, and prints side by side: the
seconds per round, the final and best test accuracy, the largest per-round test-accuracy
difference from the FP32 run, and the mean training-loss difference.  Same config and seed, so
every mode sees the same clients and batches; only the arithmetic differs.

Every argument after the options is a fedrun override (default: the README's main job, 15
rounds of FedNNNN on FashionMNIST).  Runs go to ``OUT/<mode>``; a finished run there is reused,
so adding a mode later costs one run.

Usage::

    python scripts/bench/precision_check.py                                   # CPU, main job
    python scripts/bench/precision_check.py --modes fp32,bf16 hyperparams.rounds=5
    python scripts/bench/precision_check.py --out outputs/precision_gpu device=cuda engine=batched \\
        experiment=fednnnn/mnist_iid_b hyperparams.rounds=20

On a CPU, tf32 is FP32 (TF32 is a CUDA tensor-core format), so it is skipped there unless named.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

# mode -> the engine overrides that select it
MODES = {
    "fp32": ["engine.precision=fp32", "engine.compile=false"],
    "tf32": ["engine.precision=tf32", "engine.compile=false"],
    "bf16": ["engine.precision=bf16", "engine.compile=false"],
    "compile": ["engine.precision=fp32", "engine.compile=true"],
}


def run_mode(mode: str, overrides: list[str], out: Path) -> Path:
    """Run fedrun once in ``mode`` into ``out/mode`` (reused when already finished)."""
    folder = out / mode
    if (folder / "summary.json").exists():
        print(f"  {mode}: reusing the finished run in {folder}")
        return folder
    fedrun = [sys.executable, "-m", "fedrun"]  # the fedrun this interpreter imports
    cmd = fedrun + overrides + MODES[mode] + [f"hydra.run.dir={folder}", "progress=false"]
    print(f"  {mode}: {' '.join(cmd[len(fedrun):])}", flush=True)
    t0 = time.perf_counter()
    done = subprocess.run(cmd)
    if done.returncode != 0:
        sys.exit(f"precision_check: the {mode} run failed (exit {done.returncode}); see {folder}/fedrun.log")
    print(f"  {mode}: {time.perf_counter() - t0:.0f} s", flush=True)
    return folder


def compare(folders: dict[str, Path]) -> pd.DataFrame:
    """One row per mode: speed and accuracy, with differences from the fp32 run."""
    rounds = {mode: pd.read_csv(folder / "rounds.csv") for mode, folder in folders.items()}
    ref = rounds["fp32"]
    rows = []
    for mode, df in rounds.items():
        n = min(len(df), len(ref))
        acc_diff = (df["test_acc"].iloc[:n] - ref["test_acc"].iloc[:n]).abs()
        loss_diff = (df["train_loss"].iloc[:n] - ref["train_loss"].iloc[:n]).abs()
        summary = json.loads((folders[mode] / "summary.json").read_text())
        # Round 1 includes warm-up (and compilation): report it apart from the steady rounds.
        steady = df["wall_s"].iloc[1:] if len(df) > 1 else df["wall_s"]
        rows.append({
            "mode": mode,
            "rounds": len(df),
            "first_round_s": df["wall_s"].iloc[0],
            "s_per_round": steady.mean(),
            "speed_vs_fp32": (ref["wall_s"].iloc[1:].mean() / steady.mean()) if len(df) > 1 else float("nan"),
            "final_acc": summary["final_test_acc"],
            "best_acc": summary["best_test_acc"],
            "max_abs_acc_diff": acc_diff.max(),
            "mean_abs_train_loss_diff": loss_diff.mean(),
        })
    return pd.DataFrame(rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="outputs/precision_check", help="run directories go to OUT/<mode>")
    parser.add_argument("--modes", default=None,
                        help=f"comma-separated, from {', '.join(MODES)} (default: all; tf32 only on CUDA)")
    parser.add_argument("overrides", nargs="*", help="fedrun overrides shared by every mode")
    args = parser.parse_args()
    import torch

    cuda = torch.cuda.is_available() and "device=cpu" not in args.overrides
    modes = args.modes.split(",") if args.modes else [m for m in MODES if cuda or m != "tf32"]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        parser.error(f"--modes: unknown mode {unknown[0]!r}; allowed: {', '.join(MODES)}")
    if "fp32" not in modes:
        modes = ["fp32"] + modes  # the reference every mode is compared with
    out = Path(args.out)
    print(f"precision check: {', '.join(modes)}; fedrun overrides: {' '.join(args.overrides) or '(none)'}")
    folders = {mode: run_mode(mode, args.overrides, out) for mode in modes}
    table = compare(folders)
    pd.set_option("display.width", 200)
    print()
    print(table.to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    table.to_csv(out / "precision_check.csv", index=False)
    print(f"\nwritten: {out / 'precision_check.csv'}  (accuracies are fractions; "
          "max_abs_acc_diff is the largest per-round |test_acc - fp32's|)")


if __name__ == "__main__":
    main()
