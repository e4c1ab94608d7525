"""scripts/datasets/mnist_train10k.py: the files ``dataset=mnist_train10k`` reads, made from MNIST's own, so
anyone with MNIST has them.  CPU, offline (MNIST-format files written here; the real copy beside
the checkout, where it is, must come out identical)."""
from __future__ import annotations

from scripts.datasets import mnist_train10k
import numpy as np
import pytest
from conftest import compose
from test_gpu_check import IDX
from test_models_data import write_idx

from fedrun.data.datasets import idx, read_idx


def fake_mnist(folder, n_train: int = 12_000, n_test: int = 100):
    rng = np.random.default_rng(0)
    arrays = {IDX[0]: rng.integers(0, 256, (n_train, 28, 28)), IDX[1]: rng.integers(0, 10, n_train),
              IDX[2]: rng.integers(0, 256, (n_test, 28, 28)), IDX[3]: np.arange(n_test) % 10}
    for name, array in arrays.items():
        write_idx(folder / f"{name}.gz", array)
    return arrays


def test_the_first_10000_training_images_grouped_by_digit(tmp_path, capsys):
    arrays = fake_mnist(tmp_path / "data" / "MNIST" / "raw")
    out = tmp_path / "mnist-train10k"
    assert mnist_train10k.main([str(out), "--data-root", str(tmp_path / "data"), "--no-download"]) == 0
    images, labels = read_idx(out / "images-idx3-ubyte.gz"), read_idx(out / "labels-idx1-ubyte.gz")
    x, y = arrays[IDX[0]][:10_000], arrays[IDX[1]][:10_000]
    assert images.shape == (10_000, 28, 28) and labels.tolist() == sorted(y.tolist())
    for digit in range(10):  # each digit's images in MNIST's own order
        assert np.array_equal(images[labels == digit], x[y == digit])
    assert f"export FEDRUN_MNIST10K={out.resolve()}" in capsys.readouterr().out


def test_dataset_mnist_train10k_reads_what_it_wrote(tmp_path, monkeypatch):
    """MNIST's files in a folder of their own (--search); dataset=mnist_train10k then reads the
    output where FEDRUN_MNIST10K points: 8,000 images to train, 2,000 to test."""
    fake_mnist(tmp_path / "mnist_files")
    out = tmp_path / "m10k"
    assert mnist_train10k.main([str(out), "--data-root", str(tmp_path / "empty"), "--search",
                                str(tmp_path / "mnist_files"), "--no-download"]) == 0
    monkeypatch.setenv("FEDRUN_MNIST10K", str(out))
    load = compose(["dataset=mnist_train10k"], resolve=True)["dataset"]["load"]
    data = idx(**{k: v for k, v in load.items() if k != "_target_"})
    assert (len(data.train_y), len(data.test_y)) == (8_000, 2_000)


def test_the_real_copy_comes_out_identical(tmp_path, shared_data):
    """From the whole MNIST, the files equal the copy beside the checkout, image for image."""
    out = tmp_path / "m10k"
    assert mnist_train10k.main([str(out), "--data-root", str(tmp_path / "none"), "--search",
                                str(shared_data / "mnist"), "--no-download"]) == 0
    for name in mnist_train10k.NAMES:
        assert np.array_equal(read_idx(out / name), read_idx(shared_data / "mnist-train10k" / name)), name


def test_without_mnist_one_line(tmp_path, capsys):
    assert mnist_train10k.main([str(tmp_path / "out"), "--data-root", str(tmp_path / "none"), "--no-download"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mnist_train10k: error: MNIST not found") and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("n", [9_999])
def test_too_few_training_images_one_line(tmp_path, capsys, n):
    fake_mnist(tmp_path / "data" / "MNIST" / "raw", n_train=n)
    assert mnist_train10k.main([str(tmp_path / "out"), "--data-root", str(tmp_path / "data"), "--no-download"]) == 2
    assert "not MNIST's training set" in capsys.readouterr().err
