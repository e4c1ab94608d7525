"""A catalogue of tampered run directories: each resume refused in one line naming the file or
setting at fault, exit 2, nothing written.

A resume trusts a checkpoint no less for what it lost (no ``version``, no ``digests``, no
``settings``: a downgrade is refused), names a checkpoint swapped in from another run as such,
refuses data changed since the run stopped (the checkpoint records its digest), and leaves the
run folder as it found it (its files, their bytes and mtimes, the folder's own mtime): a refused
command never writes a config.yaml of its settings, which would refuse every later resume.
Cases run through fedrun's console entry point in one driver process (tests/cli_driver.py), as
tests/test_bad_input.py's do.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TINY, edit_same_length, fedrun_ok, refusal_failures, run_fedrun
from test_bad_input import edit_config, run_catalogue

# A dataset read from a file a user may edit between a stop and its resume.
TABLE = ["dataset=table", "dataset.channels=1", "dataset.image_size=4", "dataset.num_classes=3", "partition=natural",
         "model=mlp", "model.hidden=[8]", "hyperparams.num_clients=5", "hyperparams.rounds=2", "progress=false"]


def write_table(path: Path) -> None:
    rng = np.random.default_rng(0)
    rows = ["label,client," + ",".join(f"f{i}" for i in range(16))]
    rows += [f"{i % 3},u{i % 5}," + ",".join(f"{v:.3f}" for v in rng.normal(size=16)) for i in range(200)]
    path.write_text("\n".join(rows) + "\n")


def edit_checkpoint(folder: Path, **fields) -> None:
    """The run's checkpoint.pt with ``fields`` set (None: removed; a function: applied to the
    field), saved as torch saves it."""
    path = folder / "checkpoint.pt"
    ckpt = torch.load(path, weights_only=True)
    for key, value in fields.items():
        if value is None:
            ckpt.pop(key, None)
        else:
            ckpt[key] = value(ckpt[key]) if callable(value) else value
    torch.save(ckpt, path)


def without(key: str):
    """A dict field less one key (a checkpoint's digests without rounds.csv's)."""
    return lambda d: {k: v for k, v in d.items() if k != key}


def swap_checkpoint(other: str, drop_run_json: bool = False):
    def damage(run: Path, made: dict) -> None:
        shutil.copy2(made[other] / "checkpoint.pt", run / "checkpoint.pt")
        if drop_run_json:
            (run / "run.json").unlink()
    return damage


# name: (how the stopped run is damaged, the resume's extra overrides, substrings of the one line).
# "{run}" in a substring is the damaged run's folder.
DAMAGE = {
    # Downgrades: a checkpoint of this fedrun that lost a field is refused, never trusted less.
    "no_digests": (lambda run, made: edit_checkpoint(run, digests=None), [],
                   ["{run}/checkpoint.pt", "missing or damaged: digests"]),
    "no_digests_edited_rounds": (lambda run, made: (edit_checkpoint(run, digests=None),
                                                    edit_same_length(run / "rounds.csv")), [],
                                 ["{run}/checkpoint.pt", "missing or damaged: digests"]),
    "one_digest_less": (lambda run, made: edit_checkpoint(run, digests=without("rounds")), [],
                        ["{run}/checkpoint.pt", "missing or damaged: digests"]),
    "no_settings_edited_config": (lambda run, made: (edit_checkpoint(run, settings=None, values=None),
                                                     edit_config(run, "hyperparams.lr", "local.lr")),
                                  ["hyperparams.lr=0.1"], ["{run}/checkpoint.pt", "missing or damaged: settings"]),
    "settings_nulled": (lambda run, made: edit_checkpoint(run, settings=lambda _: None, values=lambda _: None), [],
                        ["{run}/checkpoint.pt", "missing or damaged: settings"]),
    "no_version": (lambda run, made: edit_checkpoint(run, version=None), [],
                   ["{run}/checkpoint.pt", "records no version", "written by an earlier fedrun, or fields removed"]),
    "no_version_no_digests": (lambda run, made: (edit_checkpoint(run, version=None, digests=None),
                                                 edit_same_length(run / "rounds.csv")), [],
                              ["{run}/checkpoint.pt", "records no version"]),
    "version_1": (lambda run, made: edit_checkpoint(run, version=1, digests=None, data=None), [],
                  ["{run}/checkpoint.pt", "is of version 1", "resume it with the fedrun that wrote it"]),
    "version_99": (lambda run, made: edit_checkpoint(run, version=99), [],
                   ["{run}/checkpoint.pt", "of version 99", "newer fedrun"]),
    "no_data_digest": (lambda run, made: edit_checkpoint(run, data=None), [],
                       ["{run}/checkpoint.pt", "missing or damaged: data"]),
    "no_run_id": (lambda run, made: edit_checkpoint(run, run=None), [],
                  ["{run}/checkpoint.pt", "missing or damaged: run"]),
    # config.yaml deleted: a resume with other settings is refused and writes none of its own.
    "no_config_other_lr": (lambda run, made: (run / "config.yaml").unlink(), ["hyperparams.lr=0.2"],
                           ["resume=true", "hyperparams.lr, local.lr", "config.yaml, which recorded them, is missing",
                            "nothing was written"]),
    "no_config_other_seed": (lambda run, made: (run / "config.yaml").unlink(), ["seed=1"],
                             ["resume=true", "differ from those the checkpoint's 2 rounds ran with in: seed"]),
    # A checkpoint from another run is named as such, not config.yaml or a CSV.
    "swapped_other_lr": (swap_checkpoint("other_lr"), [], ["{run}/checkpoint.pt", "not this run's checkpoint",
                                                           "copied from another run"]),
    "swapped_other_seed": (swap_checkpoint("other_seed"), [], ["{run}/checkpoint.pt", "not this run's checkpoint"]),
    "swapped_same_settings": (swap_checkpoint("same"), [], ["{run}/checkpoint.pt", "not this run's checkpoint"]),
    "swapped_no_run_json": (swap_checkpoint("other_lr", drop_run_json=True), [],
                            ["{run}/checkpoint.pt", "not this run's checkpoint", "it records none of the CSVs here"]),
    # Files that are not files.
    "config_is_a_folder": (lambda run, made: ((run / "config.yaml").unlink(), (run / "config.yaml").mkdir()), [],
                           ["{run}/config.yaml", "cannot be read"]),
    "rounds_is_a_folder": (lambda run, made: ((run / "rounds.csv").unlink(), (run / "rounds.csv").mkdir()), [],
                           ["{run}/rounds.csv", "not a file"]),
}


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict:
    """A stopped run (its last round done, summary.json removed so a resume would go on) copied and
    damaged in every way of :data:`DAMAGE`, the runs their checkpoints are swapped from, and a run
    on a CSV table edited since it stopped."""
    d = tmp_path_factory.mktemp("resume")
    runs = {"run": [], "other_lr": ["hyperparams.lr=0.05", "hyperparams.rounds=3"], "other_seed": ["seed=1"],
            "same": []}
    made = {}
    for name, extra in runs.items():
        fedrun_ok([*TINY, *extra, f"hydra.run.dir={d / name}"], d)
        made[name] = d / name
    (d / "run" / "summary.json").unlink()
    for name, (damage, _, _) in DAMAGE.items():
        shutil.copytree(d / "run", d / name)
        damage(d / name, made)
        made[name] = d / name
    write_table(d / "table.csv")
    fedrun_ok([*TABLE, f"dataset.load.path={d / 'table.csv'}", f"hydra.run.dir={d / 'table_run'}"], d)
    (d / "table_run" / "summary.json").unlink()
    text = (d / "table.csv").read_text().splitlines()
    text[5] = text[5][:-1] + ("1" if text[5][-1] != "1" else "2")  # one feature of one row, the same length
    (d / "table.csv").write_text("\n".join(text) + "\n")
    made["table_run"], made["table"] = d / "table_run", d / "table.csv"
    return made


def state(folder: Path) -> dict:
    """Every entry below ``folder`` and the folder itself: bytes (files), mtimes, and kind."""
    found = {".": ("dir", folder.stat().st_mtime_ns)}
    for path in sorted(folder.rglob("*")):
        stat = path.lstat()
        found[str(path.relative_to(folder))] = (path.read_bytes() if path.is_file() else "dir", stat.st_mtime_ns)
    return found


def test_every_tampered_resume_is_one_line_and_leaves_the_run_as_it_was(made, tmp_path):
    cases = [([*TINY, *extra, f"hydra.run.dir={made[name]}", "resume=true"],
              [s.replace("{run}", str(made[name])) for s in expected], made[name])
             for name, (_, extra, expected) in DAMAGE.items()]
    cases.append(([*TABLE, f"dataset.load.path={made['table']}", f"hydra.run.dir={made['table_run']}", "resume=true"],
                  [f"dataset=table (dataset.load.path={made['table']})", "its data are not those the checkpoint's 2 "
                   "rounds trained on", "nothing was written"], made["table_run"]))
    assert len(cases) >= 20
    before = {run: state(run) for _, _, run in cases}
    table = made["table"].read_bytes()
    problems = []
    for (args, expected, run), result in zip(cases, run_catalogue([c[:2] for c in cases], tmp_path)):
        failed = refusal_failures(result, expected, named="names the file or setting",
                                  **{"the run as it was": state(run) == before[run]})
        if failed:
            problems.append(f"{run.name}: {', '.join(failed)} (exit {result['code']}):\n{result['stderr'][-1500:]}")
    assert not problems, "\n\n".join(problems)
    assert made["table"].read_bytes() == table


def test_a_refused_resume_leaves_the_run_resumable(made, tmp_path):
    """config.yaml deleted, a resume with other settings refused: it wrote no config.yaml of its
    own, so the resume with the run's own settings goes on (and writes config.yaml again), and so
    does every one after it."""
    run = tmp_path / "run"
    shutil.copytree(made["run"], run)
    (run / "config.yaml").unlink()
    refused = run_fedrun([*TINY, f"hydra.run.dir={run}", "resume=true", "hyperparams.lr=0.2"], tmp_path)
    assert refused.returncode == 2 and not (run / "config.yaml").exists(), refused.stderr[-2000:]
    fedrun_ok([*TINY, f"hydra.run.dir={run}", "resume=true"], tmp_path)
    assert (run / "config.yaml").is_file() and (run / "summary.json").is_file()
    again = fedrun_ok([*TINY, f"hydra.run.dir={run}", "resume=true"], tmp_path)
    assert "is complete (2 of 2 rounds); nothing to do" in again.stderr


def test_a_checkpoint_records_its_version_and_what_vouches_for_it(made):
    from fedrun.harness.recorder import CHECKPOINT_VERSION, VOUCHING_KEYS

    ckpt = torch.load(made["same"] / "checkpoint.pt", weights_only=True)
    assert ckpt["version"] == CHECKPOINT_VERSION
    assert all(ckpt[key] is not None for key in VOUCHING_KEYS)
    assert set(ckpt["digests"]) == set(ckpt["offsets"])
    sessions = json.loads((made["same"] / "run.json").read_text())
    assert {s["run"] for s in sessions} == {ckpt["run"]}


def test_a_run_committed_by_an_earlier_version_resumes_with_its_overrides():
    """The whole-MNIST Table 2 runs in outputs/reproductions/fednnnn_whole were written by an earlier
    fedrun (before ``dataset.label`` and ``divergence_every``): composed now with the overrides they
    ran with, their settings compare equal, so ``table2.py run --resume`` goes on from their
    checkpoints (a setting added since must be in ``rundir.ADDED_SETTINGS`` at its neutral value)."""
    import yaml
    from conftest import compose

    from fedrun.command.build import build, resolved
    from fedrun.harness.rundir import _settings

    run = Path(__file__).resolve().parents[1] / "outputs/reproductions/fednnnn_whole/mnist_iid_b/fedavg_seed0"
    stored = yaml.safe_load((run / "config.yaml").read_text())
    assert "label" not in stored["dataset"] and "divergence_every" not in stored  # an earlier version's config
    overrides = ["experiment=fednnnn/mnist_iid_b", "aggregator=fedavg", "seed=0", "progress=false",
                 "dataset.load.search=[../shared/data/mnist]", "dataset.load.download=false", "threads=1"]
    cfg = compose(overrides)
    build(cfg)  # completes the dataset node with DatasetConfig's defaults, as a run does
    now = resolved(cfg)  # the config a run writes (fedrun.command.build.federated_run)
    chosen = compose(overrides, hydra=True).hydra.runtime.choices
    now["choices"] = {k: v for k, v in chosen.items() if not k.startswith("hydra")}
    now["overrides"] = overrides
    old, new = _settings(stored), _settings(now)
    assert sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k)) == []
