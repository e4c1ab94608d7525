"""CIFAR-10's labelled JPEG copy (``dataset=cifar10_jpeg``) and its exact-pixel subset
(``dataset=cifar10_exact``): loaders on small files the tests write in the copy's layout, the
decoded cache, the one-line refusals, the label that names the copy wherever its runs are shown,
and, where ``../shared/data`` is beside the checkout, the real copy against the exact pixels."""
from __future__ import annotations

import io
import json
import lzma

import numpy as np
import pytest
import torch
from conftest import REPO_ROOT, SHARED_DATA, compose, fedrun_ok

from fedrun.data import cifar10_copy
from fedrun.data.cifar10_copy import COPY_LABEL, cifar10_exact_subset, cifar10_jpeg, decoded_copy
from fedrun.data.datasets import cifar10
from fedrun.data.names import dataset_label
from fedrun.errors import ConfigError, DataError

COPY = SHARED_DATA / "cifar10-jpeg"


def smooth_images(n: int, seed: int) -> np.ndarray:
    """``n`` 32x32 RGB images smooth enough that JPEG keeps them close (gradients plus a colour)."""
    rng = np.random.default_rng(seed)
    ramp = np.linspace(0, 1, 32)
    out = np.empty((n, 32, 32, 3), dtype=np.uint8)
    for i in range(n):
        a, b, c = rng.uniform(40, 215, 3)
        out[i, ..., 0] = a + 30 * ramp[None, :]
        out[i, ..., 1] = b + 30 * ramp[:, None]
        out[i, ..., 2] = c
    return out


def jpeg_blob(images: np.ndarray, quality: int = 75) -> tuple[np.ndarray, np.ndarray]:
    from PIL import Image

    parts = []
    for image in images:
        buffer = io.BytesIO()
        Image.fromarray(image).save(buffer, format="JPEG", quality=quality)
        parts.append(buffer.getvalue())
    offsets = np.cumsum([0] + [len(p) for p in parts]).astype(np.int64)
    return np.frombuffer(b"".join(parts), dtype=np.uint8), offsets


def write_copy(path, train, test, y_train, y_test, xz=True, drop=(), **replace):
    arrays = {}
    for split, images, labels in (("train", train, y_train), ("test", test, y_test)):
        arrays[f"{split}_jpeg"], arrays[f"{split}_offsets"] = jpeg_blob(images)
        arrays[f"y_{split}"] = np.asarray(labels, dtype=np.uint8)
    arrays.update(replace)
    for key in drop:
        arrays.pop(key)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    path.write_bytes(lzma.compress(buffer.getvalue()) if xz else buffer.getvalue())
    return path


@pytest.fixture
def copy_files(tmp_path):
    """A copy of 12 training and 6 test images (labels 0..9 in turn), and its exact subset: the
    training images 2, 5, 7 and 11 and the first 3 test images with their exact pixels."""
    train, test = smooth_images(12, 0), smooth_images(6, 1)
    y_train, y_test = np.arange(12) % 10, (np.arange(6) + 3) % 10
    copy = write_copy(tmp_path / "copy.npz.xz", train, test, y_train, y_test)
    keep = np.array([2, 5, 7, 11])
    exact = tmp_path / "exact.npz"
    np.savez(exact, x_train=train[keep], y_train=y_train[keep].astype(np.uint8), train_index=keep.astype(np.int32),
             x_test=test[:3], y_test=y_test[:3].astype(np.uint8), test_index=np.arange(3, dtype=np.int32))
    return {"copy": copy, "exact": exact, "train": train, "test": test, "y_train": y_train, "y_test": y_test,
            "keep": keep, "cache": tmp_path / "cache"}


def test_the_copy_keeps_order_labels_and_shape_and_its_pixels_are_near(copy_files):
    raw = cifar10_jpeg(str(copy_files["copy"]), str(copy_files["cache"]))
    assert raw.train_x.shape == (12, 3, 32, 32) and raw.test_x.shape == (6, 3, 32, 32) and raw.num_classes == 10
    assert raw.train_y.tolist() == copy_files["y_train"].tolist() and raw.test_y.tolist() == copy_files["y_test"].tolist()
    original = torch.from_numpy(copy_files["train"]).permute(0, 3, 1, 2).float() / 255
    error = (raw.train_x - original).abs().mean().item() * 255
    assert 0 < error < 4  # lossy (not the original pixels), yet each image its own (the wrong one is tens off)
    wrong = (raw.train_x - original.roll(1, dims=0)).abs().mean().item() * 255
    assert wrong > 10 * error


def test_the_copy_is_decoded_once_and_a_changed_copy_afresh(copy_files, monkeypatch):
    first = decoded_copy(str(copy_files["copy"]), str(copy_files["cache"]))
    cached = list(copy_files["cache"].glob("*.npz"))
    assert len(cached) == 1 and not list(copy_files["cache"].glob("*.part"))

    def no_decoding(*args, **kwargs):
        raise AssertionError("decoded again although the cache holds the copy")

    monkeypatch.setattr(cifar10_copy, "_decode", no_decoding)
    again = decoded_copy(str(copy_files["copy"]), str(copy_files["cache"]))
    for key in first:
        assert np.array_equal(first[key], again[key])
    # Another file under the same name is another copy: decoded, under a cache of its own.
    monkeypatch.undo()
    write_copy(copy_files["copy"], copy_files["train"][::-1], copy_files["test"], copy_files["y_train"][::-1],
               copy_files["y_test"])
    changed = decoded_copy(str(copy_files["copy"]), str(copy_files["cache"]))
    assert changed["y_train"].tolist() == copy_files["y_train"][::-1].tolist()
    assert len(list(copy_files["cache"].glob("*.npz"))) == 2


def test_a_cache_cut_short_is_decoded_again(copy_files):
    decoded_copy(str(copy_files["copy"]), str(copy_files["cache"]))
    (cached,) = copy_files["cache"].glob("*.npz")
    cached.write_bytes(cached.read_bytes()[:100])
    again = decoded_copy(str(copy_files["copy"]), str(copy_files["cache"]))
    assert again["x_train"].shape == (12, 32, 32, 3)


def test_the_exact_subset_trains_on_exact_or_copied_pixels_of_the_same_images(copy_files):
    exact = cifar10_exact_subset(str(copy_files["exact"]))
    jpeg = cifar10_exact_subset(str(copy_files["exact"]), "jpeg", str(copy_files["copy"]), str(copy_files["cache"]))
    keep = copy_files["keep"]
    assert exact.train_y.tolist() == jpeg.train_y.tolist() == copy_files["y_train"][keep].tolist()
    assert torch.equal(exact.train_x, torch.from_numpy(copy_files["train"][keep]).permute(0, 3, 1, 2).float() / 255)
    full = cifar10_jpeg(str(copy_files["copy"]), str(copy_files["cache"]))
    assert torch.equal(jpeg.train_x, full.train_x[keep])  # the copy's pixels of the same canonical images
    assert torch.equal(exact.test_x, jpeg.test_x)  # both tested on the exact test images
    assert exact.test_y.tolist() == copy_files["y_test"][:3].tolist()


@pytest.mark.parametrize("case,expected", [
    ("missing", "dataset.load.file: {copy} is not found (the CIFAR-10 JPEG copy"),
    ("folder", "is a folder, not a file"),
    ("not_npz", "is not a NumPy .npz compressed with xz"),
    ("no_labels", "lacks y_test (it holds"),
    ("offsets", "its offsets do not cut its"),
    ("broken_image", "(train split): image 1 cannot be decoded"),
    ("labels_count", "its train split has 12 images but 11 labels"),
    ("label_range", "(training labels): labels span 1..12 but the dataset has 10 classes"),
])
def test_a_broken_copy_is_one_line_naming_it(copy_files, case, expected):
    path = copy_files["copy"]
    c = copy_files
    if case == "missing":
        path = path.with_name("none.npz.xz")
    elif case == "folder":
        path = c["cache"]
        path.mkdir()
    elif case == "not_npz":
        path.write_bytes(lzma.compress(b"not an npz"))
    elif case == "no_labels":
        write_copy(path, c["train"], c["test"], c["y_train"], c["y_test"], drop=("y_test",))
    elif case == "offsets":
        blob, offsets = jpeg_blob(c["train"])
        write_copy(path, c["train"], c["test"], c["y_train"], c["y_test"], train_offsets=offsets[::-1].copy())
    elif case == "broken_image":
        blob, offsets = jpeg_blob(c["train"])
        blob = blob.copy()
        blob[offsets[1]:offsets[2]] = 7
        write_copy(path, c["train"], c["test"], c["y_train"], c["y_test"], train_jpeg=blob)
    elif case == "labels_count":
        write_copy(path, c["train"], c["test"], c["y_train"][:11], c["y_test"])
    elif case == "label_range":
        write_copy(path, c["train"], c["test"], np.arange(12) + 1, c["y_test"])
    with pytest.raises((DataError, ConfigError)) as e:
        cifar10_jpeg(str(path), None)
    message = str(e.value)
    assert expected.format(copy=path) in message and "\n" not in message


def test_the_exact_subset_refuses_other_pixels_and_other_images(copy_files):
    with pytest.raises(ConfigError, match="dataset.load.train_pixels.*must be exact or jpeg"):
        cifar10_exact_subset(str(copy_files["exact"]), "png")
    c = copy_files
    write_copy(c["copy"], c["train"], c["test"], (c["y_train"] + 1) % 10, c["y_test"])
    with pytest.raises(DataError, match="its labels differ from the copy's at the same canonical index"):
        cifar10_exact_subset(str(c["exact"]), "jpeg", str(c["copy"]))


def test_cifar10_without_its_files_names_the_copy_as_the_offline_choice(tmp_path):
    with pytest.raises(DataError) as e:
        cifar10(str(tmp_path), download=False)
    assert "data_batch_1" in str(e.value) and "offline, dataset=cifar10_jpeg reads a JPEG copy" in str(e.value)
    assert '"CIFAR-10 (JPEG q75 copy)", not CIFAR-10' in str(e.value)


PRESETS = ["experiment=fednnnn/cifar10_iid_b", "experiment=fednnnn/cifar10_noniid_ub", "experiment=pd/iid",
           "experiment=pd/vanilla_bs50", "experiment=fedlap/cifar10"]


@pytest.mark.parametrize("preset", PRESETS)
def test_every_cifar10_preset_runs_on_the_copy_under_its_label(preset):
    paper = compose([preset], resolve=True)
    cfg = compose([preset, "dataset=cifar10_jpeg"], resolve=True)
    assert cfg["dataset"]["name"] == "cifar10_jpeg" and cfg["dataset"]["label"] == COPY_LABEL
    assert cfg["tags"] == paper["tags"]  # still filed under the paper's CIFAR-10 cell, marked as substituted
    assert cfg["dataset"]["normalize"] == paper["dataset"]["normalize"]  # the preset's normalization kept
    assert cfg["model"] == paper["model"] and cfg["hyperparams"] == paper["hyperparams"]
    assert dataset_label({**cfg, "choices": {"dataset": "cifar10_jpeg"}}) == COPY_LABEL


def test_the_exact_subsets_label_says_which_pixels_it_trained_on():
    cfg = compose(["dataset=cifar10_exact", "dataset.load.train_pixels=jpeg"], resolve=True)
    assert dataset_label(cfg) == "CIFAR-10 (exact-pixel subset, training pixels jpeg)"


def test_a_run_on_the_copy_is_labelled_in_its_files_its_tags_and_its_tables(copy_files, tmp_path):
    from scripts.common.papers import dataset_title, setting_deviations

    from fedrun.harness.dashboard_values import run_hparams, run_tags
    from fedrun.plot import setting
    from fedrun.results import Run

    run_dir = tmp_path / "run"
    fedrun_ok(["dataset=cifar10_jpeg", f"dataset.load.file={copy_files['copy']}",
                f"dataset.load.cache={copy_files['cache']}", "model=mlp", "model.hidden=[8]",
                "hyperparams.num_clients=2", "hyperparams.rounds=1", "hyperparams.batch_size=4",
                "progress=false", "+tags.paper=fednnnn", "+tags.dataset=cifar10", f"hydra.run.dir={run_dir}"],
               tmp_path)
    sessions = json.loads((run_dir / "run.json").read_text())
    summary = json.loads((run_dir / "summary.json").read_text())
    assert sessions[-1]["dataset"] == COPY_LABEL and summary["provenance"]["dataset"] == COPY_LABEL
    run = Run.load(run_dir)
    assert run_tags(run.config, run_dir)["dataset_label"] == COPY_LABEL
    assert run_hparams(run.config, run_dir)["dataset_label"] == COPY_LABEL
    assert setting([run_dir]).startswith(f"{COPY_LABEL}, shards, ")  # fedrun-plot's titles and printed setting
    assert dataset_title([run], "cifar10", {"cifar10": "CIFAR10"}) == f"{COPY_LABEL} in place of CIFAR10"
    assert f"data substituted: cifar10_jpeg = {COPY_LABEL} instead of cifar10" in setting_deviations(run, {})
    assert f" on {COPY_LABEL}: K=2 clients" in (run_dir / "fedrun.log").read_text()


# ----------------------------------------------------------------------------- the real copy

@pytest.fixture(scope="module")
def real_copy():
    files = COPY / "cifar10_jpeg_q75.npz.xz", COPY / "cifar10_exact_subset.npz"
    if not all(f.is_file() for f in files):
        pytest.skip(f"{COPY} is absent (the CIFAR-10 JPEG copy beside the checkout)")
    return files


def test_the_real_copy_has_cifar10s_labels_and_is_near_its_exact_pixels(real_copy):
    copy_file, exact_file = real_copy
    arrays = cifar10_copy._npz(copy_file, cifar10_copy.COPY_KEYS, "file")
    with np.load(exact_file) as exact:
        assert np.array_equal(arrays["y_train"], exact["y_train_all"])  # all 50,000 canonical labels
        assert np.array_equal(arrays["y_test"], exact["y_test_all"])
        assert len(arrays["train_offsets"]) == 50_001 and len(arrays["test_offsets"]) == 10_001
        test = cifar10_copy._decode(arrays["test_jpeg"], arrays["test_offsets"], "test")  # 10,000 images, ~1 s
        index, x = exact["test_index"], exact["x_test"].astype(np.int16)
    error = np.abs(test[index].astype(np.int16) - x).mean()
    assert 4.0 < error < 8.0  # the data's README: 5.8/255 on average against the canonical pixels
    assert np.abs(test[index].astype(np.int16) - np.roll(x, 1, axis=0)).mean() > 40  # another image is far off


@pytest.mark.parametrize("script,cell", [("fednnnn/table2.py", ["--cells", "cifar10_iid_b", "--methods", "fedavg"]),
                                         ("pd/tables.py", ["--tables", "4", "--settings", "iid", "--datasets", "cifar10"])])
def test_the_paper_scripts_substitute_the_copy_for_cifar10(script, cell, tmp_path):
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / script), "run", "--dry-run", "--seeds", "0",
                           "--substitute", "cifar10=cifar10_jpeg", *cell, "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, cwd=REPO_ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    commands = [line for line in proc.stdout.splitlines() if " -m fedrun " in line]
    assert commands and all(" dataset=cifar10_jpeg" in c for c in commands)
    assert " dataset=cifar10 " not in proc.stdout and not (tmp_path / "out").exists()
