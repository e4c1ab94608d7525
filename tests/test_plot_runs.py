"""scripts/plot_runs.py: runs grouped by what differs but the seed, mean and band over seeds."""
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import plot_runs  # noqa: E402

from fedrun import results  # noqa: E402


def fake_run(path: Path, aggregator: str, seed: int, accs: list[float], beta: float = 0.7) -> Path:
    path.mkdir(parents=True)
    config = {"seed": seed, "aggregator": {"_target_": f"fedrun.aggregators.{aggregator}", "beta": beta},
              "dataset": {"name": "fmnist"}, "choices": {"aggregator": aggregator, "dataset": "fmnist"}}
    (path / "config.yaml").write_text(yaml.safe_dump(config))
    rows = ["round,test_acc,test_loss,N_over_E,server_step"]
    rows += [f"{t},{a},{1 - a},0.5,0.1" for t, a in enumerate(accs, start=1)]
    (path / "rounds.csv").write_text("\n".join(rows) + "\n")
    return path


def test_groups_are_what_differs_but_the_seed(tmp_path):
    for i, (agg, seed) in enumerate([("fedavg", 0), ("fedavg", 1), ("fednnnn", 0), ("fednnnn", 1)]):
        fake_run(tmp_path / str(i), agg, seed, [0.5, 0.6 + 0.1 * seed])
    df = results.load(tmp_path)
    columns, shown = plot_runs.groups(df)
    assert columns == ["aggregator"] and shown == ["aggregator"]  # seed is averaged over, not a group
    assert plot_runs.label(("fedavg",), columns, shown, 2) == "fedavg (mean of 2)"
    fake_run(tmp_path / "4", "fednnnn", 0, [0.5, 0.6], beta=0.9)
    columns, shown = plot_runs.groups(results.load(tmp_path))
    assert columns == ["aggregator", "aggregator.beta"]
    assert plot_runs.label(("fednnnn", "0.9"), columns, shown, 1) == "fednnnn, beta=0.9"


def test_writes_png_and_pdf_with_seed_bands(tmp_path):
    for i, (agg, seed) in enumerate([("fedavg", 0), ("fedavg", 1), ("fednnnn", 0), ("fednnnn", 1)]):
        fake_run(tmp_path / "runs" / str(i), agg, seed, [0.4, 0.5 + 0.2 * seed, 0.7])
    assert plot_runs.main([str(tmp_path / "runs"), "--out", str(tmp_path / "figs"), "--band", "minmax"]) == 0
    png, pdf = tmp_path / "figs" / "runs.png", tmp_path / "figs" / "runs.pdf"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert pdf.read_bytes()[:5] == b"%PDF-"
    assert plot_runs.main([str(tmp_path / "runs"), "--out", str(tmp_path / "svg"), "--formats", "svg"]) == 0
    assert (tmp_path / "svg" / "runs.svg").read_text().lstrip().startswith("<?xml")
    assert plot_runs.main([str(tmp_path / "runs"), "--out", str(tmp_path / "x"), "--formats", "gif"]) == 2
    (tmp_path / "empty").mkdir()
    assert plot_runs.main([str(tmp_path / "empty"), "--out", str(tmp_path / "figs")]) == 2
