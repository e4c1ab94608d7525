"""``fedrun --help``: every setting a user may set, its value, what it does and what it takes.

What a setting does comes from the comment beside it in its YAML file (or, for the dataset node,
in :class:`fedrun.data.datasets.DatasetConfig`); what it takes, from the type the checks hold it to.  The
last test keeps that promise for every option of every group: a new YAML whose settings say
nothing fails here, without a list to update.
"""
from __future__ import annotations

import pytest
from conftest import REPO_ROOT, compose, run_fedrun
from omegaconf import OmegaConf

from fedrun.command.help import descriptions, user_settings, yaml_comments
from fedrun.paths import conf_options


def lines_of(proc) -> dict[str, str]:
    """``{key=value: the rest of its row}`` of the help's settings (continuation lines joined)."""
    rows, key = {}, None
    for line in proc.stdout.splitlines():
        if line.startswith("  ") and not line.startswith("   ") and "=" in line.split()[0]:
            key, _, rest = line.strip().partition(" ")
            rows[key] = rest.strip()
        elif key is not None and line.startswith("    ") and line.strip():
            rows[key] += " " + line.strip()
        else:
            key = None
    return rows


def test_help_describes_the_settings_of_the_run_the_command_line_makes(tmp_path):
    proc = run_fedrun(["aggregator=fedprox", "hyperparams.lr=0.1", "--help"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "aggregator: " in proc.stdout and "*fedprox" in proc.stdout and "*fmnist" in proc.stdout
    rows = lines_of(proc)
    assert rows["hyperparams.lr=0.1"] == "eta; takes a finite number"
    assert rows["aggregator.mu=0.01"].startswith("the proximal term's weight mu >= 0")
    assert rows["seed=0"] == "every random choice derives from (seed, round, client); takes an integer (64-bit)"
    assert rows["dataset.channels=1"].startswith("image channels")  # DatasetConfig's comment
    shown = " ".join(rows)
    for internal in ("local.", "federation.", "participation.", "centralized=", "model.in_channels=",
                     "dataset.load.root=", "logger.use", "_target_", "hydra.", "tuned"):
        assert internal not in shown, internal
    assert list(rows)[0] == "seed=0"  # the run's own settings first, then the groups'
    assert max(len(line) for line in proc.stdout.splitlines()[7:]) <= 100


def test_help_of_a_bad_command_line_is_its_one_line_error(tmp_path):
    proc = run_fedrun(["aggregator=fedprx", "--help"], tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip() == ("fedrun: error: aggregator=fedprx: unknown option; did you mean fedprox? choose "
                                   "one of: " + ", ".join(conf_options("aggregator")))


def test_yaml_comments_follow_the_nesting():
    comments = yaml_comments(REPO_ROOT / "conf" / "dataset" / "mnist.yaml")
    assert comments["load.search"] == "more folders holding the four IDX files"
    assert "load" not in comments and comments["mean"].startswith("per-channel statistics")


GROUPS = ("dataset", "model", "partition", "aggregator", "hyperparams", "engine", "logger")


@pytest.mark.parametrize("group", GROUPS)
def test_every_setting_of_every_option_says_what_it_does(group):
    missing = []
    for option in conf_options(group):
        cfg = compose([f"{group}={option}"], hydra=True)
        choices = dict(cfg.hydra.runtime.choices)
        notes = descriptions(choices)
        job = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
        missing += [f"{option}: {key}" for key, _ in user_settings(job) if key.startswith(group + ".") and
                    key not in notes]
    assert not missing, f"settings with no comment in their YAML: {missing}"
