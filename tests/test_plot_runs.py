"""scripts/plot_runs.py: any run directories, one line each, labelled by what differs."""
import json
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import plot_runs  # noqa: E402
from runs import Run  # noqa: E402


def fake_run(path: Path, aggregator: str, seed: int, accs: list[float]) -> Path:
    path.mkdir(parents=True)
    config = {"seed": seed, "aggregator": {"_target_": f"fedrun.aggregators.{aggregator}"},
              "dataset": {"name": "fmnist"}, "hydra": {"x": str(path)}}
    (path / "config.yaml").write_text(yaml.safe_dump(config))
    (path / "summary.json").write_text(json.dumps({"aggregator": aggregator}))
    rows = ["round,test_acc,test_loss,N_over_E,server_step"]
    rows += [f"{t},{a},{1 - a},0.5,0.1" for t, a in enumerate(accs, start=1)]
    (path / "rounds.csv").write_text("\n".join(rows) + "\n")
    return path


def test_labels_name_what_differs(tmp_path):
    a = Run.load(fake_run(tmp_path / "a", "fedavg", 0, [0.5, 0.6]))
    b = Run.load(fake_run(tmp_path / "b", "fednnnn", 1, [0.5, 0.7]))
    assert plot_runs.labels([a, b]) == ["fedavg, seed=0", "fednnnn, seed=1"]
    assert plot_runs.labels([a]) == ["a"]  # nothing differs: the folder name


def test_writes_a_png(tmp_path):
    fake_run(tmp_path / "runs" / "a", "fedavg", 0, [0.5, 0.6])
    fake_run(tmp_path / "runs" / "b", "fednnnn", 0, [0.4, 0.8])
    assert plot_runs.main([str(tmp_path / "runs"), "--out", str(tmp_path / "figs")]) == 0
    png = tmp_path / "figs" / "runs.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert plot_runs.main([str(tmp_path / "nothing_here"), "--out", str(tmp_path / "figs")]) == 2
