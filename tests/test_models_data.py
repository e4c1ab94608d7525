"""Models (FedNNNN Tables 3-4) and data loading: IDX files, MNIST-like folders, CIFAR-10, prepare()."""
from __future__ import annotations

import gzip
import pickle
import re
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from fedrun.data import datasets as D
from fedrun.data import preparation as DP
from fedrun.errors import ConfigError, DataError
from fedrun.models.layers import count_parameters, layers
from fedrun.models.nets import MLP, Cifar10CNN, MnistCNN

# ----------------------------------------------------------------------------- models

def test_mnist_cnn_parameter_count():
    # conv1: 1*20*5*5 + 20 = 520;  conv2: 20*50*5*5 + 50 = 25,050;
    # fc1: 28 -> 24 -> 12 -> 8 -> 4, so 50*4*4 = 800 inputs: 800*500 + 500 = 400,500;
    # fc2: 500*10 + 10 = 5,010.  Total 520 + 25,050 + 400,500 + 5,010 = 431,080 (Table 3).
    model = MnistCNN()
    assert count_parameters(model) == 431_080
    assert [(l.name, l.type, sum(dict(model.named_parameters())[p].numel() for p in l.params))
            for l in layers(model)] == [("conv1", "conv", 520), ("conv2", "conv", 25_050),
                                        ("fc1", "fc", 400_500), ("fc2", "fc", 5_010)]
    assert model(torch.zeros(3, 1, 28, 28)).shape == (3, 10)


def test_cifar10_cnn_parameter_count():
    # conv 3x3 (weights + bias):  conv11 3*32*9+32 = 896      conv12 32*32*9+32 = 9,248
    #                             conv21 32*64*9+64 = 18,496  conv22 64*64*9+64 = 36,928
    #                             conv31 64*128*9+128 = 73,856 conv32 128*128*9+128 = 147,584
    #   convs: 287,008
    # BN (weight + bias): 2*(32+32+64+64+128+128) = 896
    # fc1: 32 -> 16 -> 8 -> 4: 128*4*4 = 2048 inputs: 2048*382 + 382 = 782,718
    # fc2: 382*192 + 192 = 73,536;  fc3: 192*10 + 10 = 1,930;  FCs: 858,184
    # with BN 287,008 + 896 + 858,184 = 1,146,088; without 1,145,192 (Table 4).
    assert count_parameters(Cifar10CNN()) == 1_146_088
    assert count_parameters(Cifar10CNN(batch_norm=False)) == 1_145_192


def test_cifar10_cnn_layers_and_shapes():
    model = Cifar10CNN()
    names = [(l.name, l.type) for l in layers(model)]
    convs = ["conv11", "conv12", "conv21", "conv22", "conv31", "conv32"]
    expected = []
    for c in convs:
        expected += [(c, "conv"), ("bn" + c[4:], "norm")]
    expected += [("fc1", "fc"), ("fc2", "fc"), ("fc3", "fc")]
    assert names == expected
    assert layers(model)[1].params == ("bn11.weight", "bn11.bias")
    # BN running statistics are buffers, not layer parameters.
    assert "bn11.running_mean" in dict(model.named_buffers())
    model.eval()
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 10)
    no_bn = Cifar10CNN(batch_norm=False)
    assert [l.name for l in layers(no_bn)] == convs + ["fc1", "fc2", "fc3"]
    assert len(list(no_bn.buffers())) == 0


def test_models_on_other_shapes():
    # Any model on any dataset: MnistCNN on 32x32x3 (fc1 50*5*5), Cifar10CNN on 28x28x1 (fc1 128*3*3).
    m = MnistCNN(in_channels=3, image_size=32, num_classes=7)
    assert m.fc1.in_features == 50 * 5 * 5 and m(torch.zeros(1, 3, 32, 32)).shape == (1, 7)
    c = Cifar10CNN(in_channels=1, image_size=28).eval()
    assert c.fc1.in_features == 128 * 3 * 3 and c(torch.zeros(1, 1, 28, 28)).shape == (1, 10)


def test_mlp():
    # 784 -> 8 -> 10: (784*8 + 8) + (8*10 + 10) = 6,280 + 90 = 6,370.
    m = MLP(hidden=[8])
    assert count_parameters(m) == 6_370
    assert [(l.name, l.type) for l in layers(m)] == [("fc1", "fc"), ("fc2", "fc")]
    assert m(torch.zeros(4, 1, 28, 28)).shape == (4, 10)
    # FedLap's 2-layer MLP: 784*200+200 + 200*10+10 = 159,010.
    assert count_parameters(MLP()) == 159_010
    deep = MLP(in_channels=3, image_size=4, num_classes=5, hidden=[6, 7])
    assert [l.name for l in layers(deep)] == ["fc1", "fc2", "fc3"]
    assert deep(torch.zeros(2, 3, 4, 4)).shape == (2, 5)


# ----------------------------------------------------------------------------- IDX files

def write_idx(path: Path, array: np.ndarray) -> Path:
    """Write an unsigned-byte IDX file (magic 0x00000803 for 3-D), gzip-compressed if ``.gz``."""
    array = np.asarray(array, dtype=np.uint8)
    payload = struct.pack(">HBB", 0, 0x08, array.ndim) + struct.pack(">" + "I" * array.ndim, *array.shape)
    payload += array.tobytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".gz":
        with gzip.open(path, "wb") as f:
            f.write(payload)
    else:
        path.write_bytes(payload)
    return path


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_read_idx(tmp_path, suffix):
    images = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    labels = np.array([7, 0, 255], dtype=np.uint8)
    assert np.array_equal(D.read_idx(write_idx(tmp_path / f"im{suffix}", images)), images)
    got = D.read_idx(write_idx(tmp_path / f"lb{suffix}", labels))
    assert got.shape == (3,) and got.tolist() == [7, 0, 255]


def test_read_idx_rejects_other_formats(tmp_path):
    bad = tmp_path / "bad"
    bad.write_bytes(struct.pack(">HBB", 0, 0x0D, 1) + struct.pack(">I", 1) + b"\0\0\0\0")  # float IDX
    with pytest.raises(DataError, match="not an unsigned-byte IDX"):
        D.read_idx(bad)


def make_mnist_folder(folder: Path, n_train=12, n_test=5, gz=True, seed=0):
    rng = np.random.default_rng(seed)
    arrays = {
        "train-images-idx3-ubyte": rng.integers(0, 256, (n_train, 28, 28)),
        "train-labels-idx1-ubyte": np.arange(n_train) % 10,
        "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 28, 28)),
        "t10k-labels-idx1-ubyte": (np.arange(n_test) * 3) % 10,
    }
    for name, arr in arrays.items():
        write_idx(folder / (name + (".gz" if gz else "")), arr)
    return arrays


@pytest.mark.parametrize("gz", [True, False])
def test_mnist_from_root_raw(tmp_path, gz):
    arrays = make_mnist_folder(tmp_path / "MNIST" / "raw", gz=gz)
    raw = D.mnist(root=str(tmp_path), download=False)
    assert raw.train_x.shape == (12, 1, 28, 28) and raw.test_x.shape == (5, 1, 28, 28)
    assert raw.train_x.dtype == torch.float32 and raw.train_y.dtype == torch.int64
    # pixels scaled to [0, 1]: value v -> v / 255
    assert torch.allclose(raw.train_x[3, 0], torch.from_numpy(arrays["train-images-idx3-ubyte"][3] / 255.0).float())
    assert raw.train_y.tolist() == (np.arange(12) % 10).tolist()
    assert raw.test_y.tolist() == [0, 3, 6, 9, 2]
    assert raw.num_classes == 10


def test_fashion_mnist_from_search_folder(tmp_path):
    make_mnist_folder(tmp_path / "elsewhere", n_train=7, n_test=3, gz=True)
    raw = D.fashion_mnist(root=str(tmp_path / "empty_root"), download=False,
                          search=[str(tmp_path / "elsewhere")])
    assert raw.train_x.shape == (7, 1, 28, 28) and raw.test_y.shape == (3,)
    raw2 = D.mnist(root=str(tmp_path / "empty_root"), download=False, search=[str(tmp_path / "elsewhere")])
    assert torch.equal(raw.train_x, raw2.train_x)


def test_fashion_mnist_from_root_folder(tmp_path):
    make_mnist_folder(tmp_path / "FashionMNIST" / "raw", gz=False)
    raw = D.fashion_mnist(root=str(tmp_path), download=False)
    assert len(raw.train_y) == 12


@pytest.mark.parametrize("loader", [D.mnist, D.fashion_mnist])
def test_mnist_like_missing_files(tmp_path, loader, monkeypatch):
    # Debian's FashionMNIST folder may exist on this machine; hide it so the error path is exercised.
    if loader is D.fashion_mnist:
        monkeypatch.setattr(D, "_find", _find_except_system(D._find))
    (tmp_path / "MNIST" / "raw").mkdir(parents=True)
    write_idx(tmp_path / "MNIST" / "raw" / "train-images-idx3-ubyte", np.zeros((1, 28, 28)))  # 1 of 4
    with pytest.raises(DataError) as info:
        loader(root=str(tmp_path), download=False)
    msg = str(info.value)
    for name in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                 "t10k-labels-idx1-ubyte"):
        assert name in msg
    assert str(tmp_path) in msg and "download" in msg


def _find_except_system(find):
    def wrapped(name, folder):
        return None if str(folder).startswith("/usr/share") else find(name, folder)
    return wrapped


def test_idx_dataset_with_test_fraction(tmp_path):
    images = write_idx(tmp_path / "im.gz", np.random.default_rng(0).integers(0, 256, (20, 28, 28)))
    labels = write_idx(tmp_path / "lb.gz", np.arange(20) % 4)
    raw = D.idx(str(images), str(labels), test_fraction=0.25, split_seed=0)
    # round(0.25 * 20) = 5 test samples, 15 train; classes = max label + 1 = 4.
    assert len(raw.test_y) == 5 and len(raw.train_y) == 15
    assert raw.num_classes == 4
    assert sorted(raw.train_y.tolist() + raw.test_y.tolist()) == sorted((np.arange(20) % 4).tolist())
    # train and test are disjoint: all 20 images (distinct) appear exactly once.
    every = torch.cat([raw.train_x, raw.test_x]).flatten(1)
    assert torch.unique(every, dim=0).shape[0] == 20
    again = D.idx(str(images), str(labels), test_fraction=0.25, split_seed=0)
    assert torch.equal(again.test_x, raw.test_x)
    other = D.idx(str(images), str(labels), test_fraction=0.25, split_seed=1)
    assert not torch.equal(other.test_x, raw.test_x)


def test_idx_dataset_with_test_files_and_errors(tmp_path):
    a = write_idx(tmp_path / "a", np.zeros((4, 2, 2)))
    b = write_idx(tmp_path / "b", np.array([0, 1, 2, 1]))
    c = write_idx(tmp_path / "c", np.zeros((3, 2, 2)))
    d = write_idx(tmp_path / "d", np.array([2, 2, 0]))
    raw = D.idx(str(a), str(b), str(c), str(d), num_classes=5)
    assert (len(raw.train_y), len(raw.test_y), raw.num_classes) == (4, 3, 5)
    with pytest.raises(DataError, match=r"dataset\.load\.train_labels"):
        D.idx(str(a), str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match=r"dataset\.load\.test_fraction"):
        D.idx(str(a), str(b), test_fraction=1.0)


def make_cifar_folder(root: Path, per_batch=4, n_test=6):
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    batches = {}
    # The real files were pickled by Python 2, so their keys load as str under encoding="latin1".
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        n = n_test if name == "test_batch" else per_batch
        entry = {"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
                 "labels": rng.integers(0, 10, n).tolist()}
        batches[name] = entry
        with open(folder / name, "wb") as f:
            pickle.dump(entry, f)
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({"label_names": [f"c{i}" for i in range(10)]}, f)
    return batches


def test_cifar10_from_python_folder(tmp_path, monkeypatch):
    import torchvision
    import torchvision.datasets.cifar as tv_cifar

    batches = make_cifar_folder(tmp_path)
    # torchvision checks the md5 of every file; ours are made up.
    monkeypatch.setattr(torchvision.datasets.CIFAR10, "_check_integrity", lambda self: True)
    monkeypatch.setattr(tv_cifar, "check_integrity", lambda *a, **k: True)
    raw = D.cifar10(root=str(tmp_path), download=False)
    assert raw.train_x.shape == (20, 3, 32, 32) and raw.test_x.shape == (6, 3, 32, 32)
    # A row is 1024 red, 1024 green, 1024 blue values in row-major order.
    first = batches["data_batch_1"]["data"][0]
    assert raw.train_x[0, 1, 0, 0].item() == pytest.approx(first[1024] / 255.0)
    assert raw.train_x[0, 2, 31, 31].item() == pytest.approx(first[3071] / 255.0)
    assert raw.train_y[:4].tolist() == batches["data_batch_1"]["labels"]
    assert raw.test_y.tolist() == batches["test_batch"]["labels"]


def test_cifar10_missing_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match="cifar-10-batches-py"):
        D.cifar10(root=str(tmp_path), download=False)


# ----------------------------------------------------------------------------- synthetic, prepare

def test_synthetic_shapes_and_labels():
    raw = D.synthetic(num_train=50, num_test=20, channels=3, image_size=5, num_classes=5, seed=1)
    assert raw.train_x.shape == (50, 3, 5, 5) and raw.test_x.shape == (20, 3, 5, 5)
    assert torch.bincount(raw.train_y).tolist() == [10] * 5  # y = arange(n) % C, shuffled
    assert raw.num_classes == 5
    again = D.synthetic(num_train=50, num_test=20, channels=3, image_size=5, num_classes=5, seed=1)
    assert torch.equal(raw.train_x, again.train_x)
    with pytest.raises(ConfigError, match=r"dataset\.load\.num_train"):
        D.synthetic(num_train=3, num_classes=5)


def test_prepare_validation_split():
    raw = D.synthetic(num_train=100, num_test=10, image_size=3, seed=0)
    marked = raw.train_x.clone()
    marked[:, 0, 0, 0] = torch.arange(100, dtype=torch.float32)  # tag each image by its index
    raw.train_x = marked
    data = DP.prepare(raw, [0.0], [1.0], validation_fraction=0.2, seed=0)
    # round(0.2 * 100) = 20 held out, 80 kept; with mean 0 / std 1 the tags survive.
    assert len(data.val_y) == 20 and len(data.train_y) == 80
    train_ids = set(data.train_x[:, 0, 0, 0].long().tolist())
    val_ids = set(data.val_x[:, 0, 0, 0].long().tolist())
    assert not train_ids & val_ids and train_ids | val_ids == set(range(100))
    assert torch.equal(data.val_y, raw.train_y[sorted(val_ids)])
    no_val = DP.prepare(raw, [0.0], [1.0])
    assert no_val.val_x is None and no_val.val_y is None and len(no_val.train_y) == 100
    other = DP.prepare(raw, [0.0], [1.0], validation_fraction=0.2, seed=1)
    assert set(other.val_x[:, 0, 0, 0].long().tolist()) != val_ids
    with pytest.raises(ConfigError, match="hyperparams.validation_fraction"):
        DP.prepare(raw, None, None, validation_fraction=1.0)


def test_prepare_normalization():
    raw = D.synthetic(num_train=200, num_test=50, channels=2, image_size=4, seed=0)
    raw.train_x = raw.train_x * 3 + 5
    raw.test_x = raw.test_x * 3 + 5
    data = DP.prepare(raw, None, None)
    # Statistics from the training images: each channel of the train set has mean 0 and std 1.
    assert torch.allclose(data.train_x.mean((0, 2, 3)), torch.zeros(2), atol=1e-4)
    assert torch.allclose(data.train_x.std((0, 2, 3)), torch.ones(2), atol=1e-4)
    # Given statistics: (x - m) / s per channel.
    fixed = DP.prepare(raw, [5.0, 1.0], [2.0, 4.0])
    assert torch.allclose(fixed.test_x[:, 0], (raw.test_x[:, 0] - 5.0) / 2.0)
    assert torch.allclose(fixed.test_x[:, 1], (raw.test_x[:, 1] - 1.0) / 4.0)
    with pytest.raises(ConfigError, match="dataset.mean/std"):
        DP.prepare(raw, [0.5], [0.5])


def test_prepare_max_train_and_test():
    raw = D.synthetic(num_train=100, num_test=40, image_size=3, seed=0)
    data = DP.prepare(raw, [0.0], [1.0], max_train=30, max_test=10, seed=0)
    assert len(data.train_y) == 30 and len(data.test_y) == 10
    # A subset of the originals, in their original order.
    flat = raw.train_x.flatten(1)
    pos = [int((flat == row).all(1).nonzero()[0]) for row in data.train_x.flatten(1)]
    assert pos == sorted(pos) and len(set(pos)) == 30
    big = DP.prepare(raw, [0.0], [1.0], max_train=1000)
    assert len(big.train_y) == 100


# ----------------------------------------------------------------------------- real data (optional)

def test_real_fashion_mnist(shared_data):
    folder = shared_data / "fashion-mnist"
    if not (folder / "train-images-idx3-ubyte.gz").is_file():
        pytest.skip(f"{folder} has no FashionMNIST")
    raw = D.fashion_mnist(root=str(shared_data / "nonexistent"), download=False, search=[str(folder)])
    assert raw.train_x.shape == (60_000, 1, 28, 28) and raw.test_x.shape == (10_000, 1, 28, 28)
    assert raw.train_y.min() == 0 and raw.train_y.max() == 9
    assert torch.bincount(raw.train_y).tolist() == [6000] * 10
    assert torch.bincount(raw.test_y).tolist() == [1000] * 10
    assert 0.0 <= raw.train_x.min() and raw.train_x.max() <= 1.0
    # The dataset config's mean/std (0.2860 / 0.3530) are the training set's.
    assert raw.train_x.mean().item() == pytest.approx(0.2860, abs=1e-3)
    assert raw.train_x.std().item() == pytest.approx(0.3530, abs=1e-3)


def test_real_mnist_train10k(shared_data):
    folder = shared_data / "mnist-train10k"
    if not (folder / "images-idx3-ubyte.gz").is_file():
        pytest.skip(f"{folder} is absent")
    raw = D.idx(str(folder / "images-idx3-ubyte.gz"), str(folder / "labels-idx1-ubyte.gz"))
    assert len(raw.train_y) == 8000 and len(raw.test_y) == 2000
    assert raw.num_classes == 10 and raw.train_x.shape[1:] == (1, 28, 28)


# ----------------------------------------------------------------------------- bad files: one clear line

def E(path) -> str:
    """A path for a regular expression."""
    return re.escape(str(path))


def idx_bytes(shape, extra: int = 0, missing: int = 0) -> bytes:
    """An unsigned-byte IDX file for ``shape`` with ``extra`` bytes added or ``missing`` cut."""
    header = struct.pack(">HBB", 0, 0x08, len(shape)) + struct.pack(">" + "I" * len(shape), *shape)
    return header + bytes(int(np.prod(shape)) + extra - missing)


@pytest.mark.parametrize("content,match", [
    (idx_bytes((5, 4, 4), missing=70), r"truncated IDX file: the header says 5x4x4 \(80 bytes\) but 10 follow"),
    (idx_bytes((5, 4, 4), extra=3), r"3 bytes too many: the header says 5x4x4 \(80 bytes\) but 83 follow"),
    (b"", r"empty, not an IDX file"),
    (b"\0\0\x08", r"too short for an IDX file \(3 bytes; the header alone needs at least 8\)"),
    (struct.pack(">HBB", 0, 0x08, 3) + b"\0\0\0\x05", r"truncated IDX header: 3 dimensions need 16 bytes but "
                                                       r"the file has 8"),
    (b"<!DOCTYPE html><html>not found</html>", r"not an IDX file: it starts with 3c21444f, an IDX file with 00 00"),
    (struct.pack(">HBB", 0, 0x08, 0), r"not an IDX file"),
])
def test_read_idx_bad_files(tmp_path, content, match):
    path = tmp_path / "bad-idx3-ubyte"
    path.write_bytes(content)
    with pytest.raises(DataError, match=match) as info:
        D.read_idx(path)
    assert str(info.value).startswith(f"{path}: ")


def test_read_idx_bad_gzip(tmp_path):
    good = gzip.compress(idx_bytes((50, 4, 4)))
    cases = {
        "truncated.gz": (good[: len(good) // 2], r"corrupt or truncated gzip file \(EOFError"),
        "corrupt.gz": (good[:10] + b"\xff" * 40 + good[50:], r"corrupt or truncated gzip file \((zlib\.)?error"),
        "badheader.gz": (b"\x1f\x8b\x99" + good[3:], r"corrupt or truncated gzip file \(BadGzipFile"),
        "short.gz": (gzip.compress(idx_bytes((50, 4, 4), missing=1)),
                     r"truncated IDX file: the header says 50x4x4 \(800 bytes\) but 799 follow after decompression"),
        "plain.gz": (b"hello world", r"not an IDX file \(and its \.gz name notwithstanding, not gzip data\)"),
    }
    for name, (content, match) in cases.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(DataError, match=match) as info:
            D.read_idx(tmp_path / name)
        assert str(info.value).startswith(f"{tmp_path / name}: ")
    with pytest.raises(DataError, match=r"missing-file: cannot be read \(No such file or directory\)"):
        D.read_idx(tmp_path / "missing-file")
    # gzip data is recognized by its magic bytes, whatever the file's name.
    (tmp_path / "unnamed").write_bytes(good)
    assert D.read_idx(tmp_path / "unnamed").shape == (50, 4, 4)


def test_mnist_folder_with_bad_files(tmp_path):
    raw_dir = tmp_path / "MNIST" / "raw"
    make_mnist_folder(raw_dir, gz=False)
    labels = raw_dir / "train-labels-idx1-ubyte"
    images = raw_dir / "train-images-idx3-ubyte"
    write_idx(labels, np.arange(11) % 10)  # 12 images, 11 labels
    with pytest.raises(DataError, match=rf"^{E(images)} holds 12 images but {E(labels)} holds 11 labels: the "
                                        r"training files must have one label per image$"):
        D.mnist(root=str(tmp_path), download=False)
    write_idx(labels, np.arange(12) % 11)  # a label 10
    with pytest.raises(DataError, match=rf"^{E(labels)}: labels span 0\.\.10 but the dataset has 10 classes "
                                        r"\(the labels must be 0\.\.9\)$"):
        D.mnist(root=str(tmp_path), download=False)
    write_idx(labels, np.zeros((12, 2)))
    with pytest.raises(DataError, match=rf"^{E(labels)}: labels must be one number per image \(1 dimension\), "
                                        r"not 12x2$"):
        D.mnist(root=str(tmp_path), download=False)
    write_idx(labels, np.arange(12) % 10)
    write_idx(raw_dir / "t10k-images-idx3-ubyte", np.zeros((5, 784)))
    with pytest.raises(DataError, match=r"t10k-images-idx3-ubyte: images must be N x height x width \(or N x "
                                        r"height x width x 1 or 3 channels\), not 5x784"):
        D.mnist(root=str(tmp_path), download=False)
    write_idx(raw_dir / "t10k-images-idx3-ubyte", np.zeros((0, 28, 28)))
    write_idx(raw_dir / "t10k-labels-idx1-ubyte", np.zeros(0))
    with pytest.raises(DataError, match=r"t10k-images-idx3-ubyte: holds no image \(the test set needs at least one\)"):
        D.mnist(root=str(tmp_path), download=False)
    (raw_dir / "t10k-images-idx3-ubyte").write_bytes(idx_bytes((5, 28, 28), missing=1))
    with pytest.raises(DataError, match=r"t10k-images-idx3-ubyte: truncated IDX file"):
        D.mnist(root=str(tmp_path), download=False)


def test_mnist_missing_says_how_to_download(tmp_path, monkeypatch):
    with pytest.raises(DataError, match=r"MNIST not found: .*; download is disabled: "
                                        r"dataset\.load\.download=true would fetch them$"):
        D.mnist(root=str(tmp_path), download=False)
    import torchvision

    def offline(*args, **kwargs):
        raise RuntimeError("Error downloading train-images-idx3-ubyte.gz:\nTried https://x/, got:\n<urlopen error>")
    monkeypatch.setattr(torchvision.datasets, "MNIST", offline)
    with pytest.raises(DataError, match=r"; the download failed \(RuntimeError: Error downloading "
                                        r"train-images-idx3-ubyte\.gz: Tried https://x/, got:\); nothing was "
                                        r"left behind$"):
        D.mnist(root=str(tmp_path), download=True)


def mnist_folder(folder: Path, names=("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                                      "t10k-labels-idx1-ubyte"), n: int = 20) -> Path:
    arrays = {"train-images-idx3-ubyte": np.zeros((n, 28, 28)), "train-labels-idx1-ubyte": np.arange(n) % 10,
              "t10k-images-idx3-ubyte": np.ones((n, 28, 28)), "t10k-labels-idx1-ubyte": np.arange(n) % 10}
    for name in names:
        write_idx(folder / f"{name}.gz", arrays[name])
    return folder


def test_the_bare_data_root_is_never_read_as_another_dataset(tmp_path, monkeypatch):
    """MNIST's files lying in the data root itself are not FashionMNIST (nor read as MNIST: only
    <root>/MNIST/raw and the search folders are)."""
    monkeypatch.setattr(D, "_find", _find_except_system(D._find))
    mnist_folder(tmp_path)
    for loader in (D.fashion_mnist, D.mnist):
        with pytest.raises(DataError, match="not found"):
            loader(root=str(tmp_path), download=False)


def test_the_four_files_come_from_one_folder_which_is_logged(tmp_path, caplog):
    mnist_folder(tmp_path / "MNIST" / "raw", names=("train-images-idx3-ubyte", "train-labels-idx1-ubyte"))
    other = mnist_folder(tmp_path / "elsewhere", names=("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"))
    with pytest.raises(DataError) as info:
        D.mnist(root=str(tmp_path), download=False, search=[str(other)])
    assert f"{tmp_path / 'MNIST' / 'raw'} holds 2 of the 4; {other} holds 2 of the 4" in str(info.value)
    assert "all four in one of" in str(info.value)
    whole = mnist_folder(tmp_path / "whole")
    with caplog.at_level("INFO", logger="fedrun.data.datasets"):
        raw = D.mnist(root=str(tmp_path), download=False, search=[str(other), str(whole)])
    assert f"MNIST: reading {whole}" in caplog.text
    assert float(raw.test_x.mean()) == pytest.approx(1 / 255)  # the test images of `whole`, not of `other`


def test_a_failed_download_leaves_nothing_behind(tmp_path, monkeypatch):
    import torchvision

    root = tmp_path / "new" / "data"
    (tmp_path / "kept").mkdir()

    class HalfDownload:
        def __init__(self, root, train=True, download=False, **kwargs):
            raw = Path(root) / "MNIST" / "raw"
            raw.mkdir(parents=True, exist_ok=True)
            (raw / "train-images-idx3-ubyte.gz.part").write_bytes(b"half")
            raise RuntimeError("Error downloading train-images-idx3-ubyte.gz")

    monkeypatch.setattr(torchvision.datasets, "MNIST", HalfDownload)
    with pytest.raises(DataError, match="the download failed .* nothing was left behind"):
        D.mnist(root=str(root), download=True)
    assert not (tmp_path / "new").exists()
    # A data root that existed keeps what it held, and only that.
    root.mkdir(parents=True)
    (root / "mine.txt").write_text("kept")
    with pytest.raises(DataError):
        D.mnist(root=str(root), download=True)
    assert sorted(p.name for p in root.rglob("*")) == ["mine.txt"]


def test_a_failed_cifar10_download_leaves_nothing_behind(tmp_path, monkeypatch):
    import torchvision

    real = torchvision.datasets.CIFAR10

    class HalfDownload(real):
        def __init__(self, root, train=True, download=False, **kwargs):
            if download:
                Path(root).mkdir(parents=True, exist_ok=True)
                (Path(root) / "cifar-10-python.tar.gz").write_bytes(b"half")
                (Path(root) / real.base_folder).mkdir(exist_ok=True)
                raise RuntimeError("Error downloading cifar-10-python.tar.gz")
            super().__init__(root, train=train, download=False, **kwargs)

    monkeypatch.setattr(torchvision.datasets, "CIFAR10", HalfDownload)
    with pytest.raises(DataError, match="the download failed"):
        D.cifar10(root=str(tmp_path / "data"), download=True)
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize("loader", [D.mnist, D.fashion_mnist, D.cifar10])
def test_an_empty_data_root_is_refused(loader):
    with pytest.raises(ConfigError, match=r"^data_root='': is empty \(FEDRUN_DATA set to nothing\?\)"):
        loader(root="", download=True)


def test_idx_dataset_bad_inputs(tmp_path):
    a = write_idx(tmp_path / "a", np.zeros((4, 2, 2)))
    b = write_idx(tmp_path / "b", np.array([0, 1, 4, 1]))
    c = write_idx(tmp_path / "c", np.zeros((3, 2, 2)))
    d = write_idx(tmp_path / "d", np.array([2, 2]))
    with pytest.raises(DataError, match=rf"^{E(c)} holds 3 images but {E(d)} holds 2 labels: the test files must "
                                        "have one label per image$"):
        D.idx(str(a), str(b), str(c), str(d))
    with pytest.raises(DataError, match=rf"^{E(b)}: labels span 0\.\.4 but dataset\.load\.num_classes=3 \(the "
                                        r"labels must be 0\.\.2\)$"):
        D.idx(str(a), str(b), num_classes=3)
    with pytest.raises(ConfigError, match=r"^dataset\.load\.test_labels=None: must be set together with "
                                          r"dataset\.load\.test_images"):
        D.idx(str(a), str(b), test_images=str(c))
    with pytest.raises(ConfigError, match=r"^dataset\.load\.test_fraction=0\.1: holds out 0 of the 4 images; "
                                          r"must leave at least one in each split \(between 0\.25 and 0\.75 here\)$"):
        D.idx(str(a), str(b), test_fraction=0.1)
    # Without num_classes the classes run to the largest label of either split.
    e = write_idx(tmp_path / "e", np.array([7, 2, 2]))
    assert D.idx(str(a), str(b), str(c), str(e)).num_classes == 8


def test_check_labels_and_empty_raw_data():
    raw = D.synthetic(num_train=20, num_test=10, image_size=2, num_classes=13, seed=0)
    D.check_labels(raw, 13)
    with pytest.raises(DataError, match=r"^dataset: labels span 0\.\.12 but dataset\.num_classes=10 \(the labels "
                                        r"must be 0\.\.9\)$"):
        D.check_labels(raw, 10)
    with pytest.raises(ConfigError, match=r"^dataset\.num_classes=0: must be an integer >= 1$"):
        D.check_labels(raw, 0)
    with pytest.raises(DataError, match=r"^dataset: the test set has no image \(it needs at least one\)$"):
        D.RawData(raw.train_x, raw.train_y, raw.test_x[:0], raw.test_y[:0], 13)
    with pytest.raises(DataError, match=r"^dataset: the training set has 20 images but 19 labels$"):
        D.RawData(raw.train_x, raw.train_y[:19], raw.test_x, raw.test_y, 13)
    with pytest.raises(ConfigError, match=r"^dataset\.load\.num_test=0: must be >= 1$"):
        D.synthetic(num_test=0)


@pytest.mark.parametrize("kwargs,match", [
    ({"max_train": 0}, r"^dataset\.max_train=0: must be >= 1 or null$"),
    ({"max_train": -5}, r"^dataset\.max_train=-5: must be >= 1 or null$"),
    ({"max_test": 0}, r"^dataset\.max_test=0: must be >= 1 or null$"),
    ({"std": [0.0]}, r"^dataset\.std=\[0\.0\]: must be > 0, one per channel"),
    ({"std": [-0.3]}, r"^dataset\.std=\[-0\.3\]: must be > 0, one per channel"),
    ({"std": [float("inf")]}, r"^dataset\.std=\[inf\]: must be > 0, one per channel"),
    ({"std": [float("nan")]}, r"^dataset\.std=\[nan\]: must be > 0, one per channel"),
    ({"mean": [float("nan")]}, r"^dataset\.mean=\[nan\]: must be finite numbers, one per channel"),
    ({"validation_fraction": 0.99}, r"^hyperparams\.validation_fraction=0\.99: holds out 20 of the 20 training "
                                    r"images; must leave at least one \(below 0\.975 here\)$"),
])
def test_prepare_rejects_bad_settings(kwargs, match):
    raw = D.synthetic(num_train=20, num_test=10, image_size=2, seed=0)
    args = {"mean": [0.0], "std": [1.0], **kwargs}
    with pytest.raises(ConfigError, match=match):
        DP.prepare(raw, **args)


def test_prepare_constant_channel():
    raw = D.synthetic(num_train=20, num_test=10, channels=2, image_size=2, seed=0)
    raw.train_x[:, 1] = 0.5
    with pytest.raises(DataError, match=r"^dataset: channel 1 of the training images has no variance \(every "
                                        r"pixel is 0\.5\), so it cannot be normalized by its std; set "
                                        r"dataset\.std \(and dataset\.mean\) to values > 0, one per channel$"):
        DP.prepare(raw, None, None)
    assert DP.prepare(raw, [0.0, 0.5], [1.0, 1.0]).train_x.shape == (20, 2, 2, 2)


def _trust_cifar_files(monkeypatch):
    import torchvision
    import torchvision.datasets.cifar as tv_cifar

    monkeypatch.setattr(torchvision.datasets.CIFAR10, "_check_integrity", lambda self: True)
    monkeypatch.setattr(tv_cifar, "check_integrity", lambda *a, **k: True)


def test_cifar10_missing_without_download(tmp_path):
    with pytest.raises(DataError) as info:
        D.cifar10(root=str(tmp_path), download=False)
    msg = str(info.value)
    assert msg.startswith(f"CIFAR-10 not found: data_batch_1, data_batch_2, data_batch_3, data_batch_4, "
                          f"data_batch_5, test_batch, batches.meta missing from {tmp_path / 'cifar-10-batches-py'}")
    assert "download is disabled: dataset.load.download=true would fetch them; " in msg
    assert msg.endswith('offline, dataset=cifar10_jpeg reads a JPEG copy of CIFAR-10 (shown as "CIFAR-10 (JPEG q75 copy)", '
                        'not CIFAR-10)')
    assert "download=True" not in msg


def test_cifar10_download_failed(tmp_path, monkeypatch):
    import urllib.error

    import torchvision

    def offline(self):
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")
    monkeypatch.setattr(torchvision.datasets.CIFAR10, "download", offline)
    with pytest.raises(DataError) as info:
        D.cifar10(root=str(tmp_path), download=True)
    msg = str(info.value)
    assert msg.startswith("CIFAR-10: the download failed (URLError: <urlopen error [Errno -3] Temporary failure "
                          "in name resolution>); data_batch_1, ")
    assert f"missing from {tmp_path / 'cifar-10-batches-py'}" in msg
    assert "download=True" not in msg


def test_cifar10_unreadable_files(tmp_path, monkeypatch):
    make_cifar_folder(tmp_path)
    folder = tmp_path / "cifar-10-batches-py"
    # Made-up files fail torchvision's md5 test: the message names the first such file.
    with pytest.raises(DataError, match=rf"^{E(folder / 'data_batch_1')}: cannot be read \(checksum mismatch: a "
                                        r"corrupt or incomplete file, not the official CIFAR-10 one\); delete it "
                                        r"and set dataset\.load\.download=true$"):
        D.cifar10(root=str(tmp_path), download=False)
    _trust_cifar_files(monkeypatch)
    (folder / "data_batch_3").write_bytes(b"garbage")
    with pytest.raises(DataError, match=rf"^{E(folder / 'data_batch_3')}: cannot be read \(UnpicklingError: "):
        D.cifar10(root=str(tmp_path), download=False)
    with open(folder / "data_batch_3", "wb") as f:
        pickle.dump({"data": np.zeros((4, 3000), dtype=np.uint8), "labels": [0] * 4}, f)
    with pytest.raises(DataError, match=rf"^{E(folder / 'data_batch_3')}: cannot be read \(ValueError: 'data' has "
                                        r"shape \(4, 3000\), expected \(N, 3072\)\)$"):
        D.cifar10(root=str(tmp_path), download=True)  # the files are there: nothing is downloaded


def test_svhn_missing_without_download(tmp_path, monkeypatch):
    import sys
    import types

    # scipy is optional; the missing-file path never reads a .mat file.
    fake = types.ModuleType("scipy")
    fake.io = types.ModuleType("scipy.io")
    monkeypatch.setitem(sys.modules, "scipy", fake)
    monkeypatch.setitem(sys.modules, "scipy.io", fake.io)
    with pytest.raises(DataError) as info:
        D.svhn(root=str(tmp_path), download=False)
    assert str(info.value) == (f"SVHN not found: train_32x32.mat missing from {tmp_path} (expected train_32x32.mat); "
                               "download is disabled: dataset.load.download=true would fetch them")


# ----------------------------------------------------------------------------- the parameter-divergence code's preprocessing

def test_per_image_standardization_is_tensorflows():
    # Image [[0, 1], [2, 3]] (one channel) in [0, 1] units: mean 1.5, population std sqrt(1.25);
    # a constant image has std 0 and is divided by TF's floor 1 / sqrt(4), scaled to [0, 1] units.
    x = torch.tensor([[[[0.0, 1.0], [2.0, 3.0]]], [[[0.5, 0.5], [0.5, 0.5]]]])
    out = DP.per_image_standardization(x)
    torch.testing.assert_close(out[0, 0], (torch.tensor([[0.0, 1.0], [2.0, 3.0]]) - 1.5) / 1.25 ** 0.5)
    assert out[1].abs().max() == 0
    data = DP.prepare(D.RawData(x, torch.tensor([0, 1]), x, torch.tensor([1, 0]), 2), None, None, normalize="per_image")
    torch.testing.assert_close(data.train_x, out)
    torch.testing.assert_close(data.test_x, out)
    assert data.std is None
    with pytest.raises(ConfigError, match=r"^dataset\.normalize=zscore: choose one of: per_channel, per_image, per_feature$"):
        DP.prepare(D.RawData(x, torch.tensor([0, 1]), x, torch.tensor([1, 0]), 2), None, None, normalize="zscore")


def test_per_class_keeps_the_first_images_of_each_class():
    # Labels 0 1 0 1 0 2 2: the first two of each class are positions 0, 2 (class 0), 1, 3 (class 1), 5, 6 (class 2).
    x = torch.arange(7.0).view(7, 1, 1, 1).expand(7, 1, 2, 2).contiguous()
    y = torch.tensor([0, 1, 0, 1, 0, 2, 2])
    data = DP.prepare(D.RawData(x, y, x[:3], y[:3], 3), [0.0], [1.0], per_class=2)
    assert data.train_y.tolist() == [0, 1, 0, 1, 2, 2]
    assert data.train_x[:, 0, 0, 0].tolist() == [0, 1, 2, 3, 5, 6]
    with pytest.raises(ConfigError, match=r"^dataset\.per_class=3: the training set has fewer images of some "
                                          r"classes \(class 1: 2, class 2: 2\); use at most 2"):
        DP.prepare(D.RawData(x, y, x[:3], y[:3], 3), [0.0], [1.0], per_class=3)


def test_keras_initialization_of_the_fedlayerwise_cnn():
    """model.init=keras: Glorot-uniform weights within sqrt(6 / (fan_in + fan_out)), zero biases
    (Keras's Conv2D/Dense defaults); the default stays PyTorch's (biases not zero)."""
    import math

    from fedrun.errors import ConfigError
    from fedrun.client.local_training import LocalTraining

    torch.manual_seed(0)
    keras = MnistCNN(channels=(32, 64), hidden=512, init="keras")
    for layer, fan_in, fan_out in ((keras.conv1, 25, 32 * 25), (keras.conv2, 32 * 25, 64 * 25),
                                   (keras.fc1, 1024, 512), (keras.fc2, 512, 10)):
        bound = math.sqrt(6 / (fan_in + fan_out))
        assert layer.weight.abs().max() <= bound and layer.weight.abs().max() > 0.9 * bound
        assert torch.count_nonzero(layer.bias) == 0
    torch.manual_seed(0)
    assert torch.count_nonzero(MnistCNN(channels=(32, 64), hidden=512).conv1.bias) > 0
    with pytest.raises(ConfigError, match="model.init=glorot: choose one of: torch, keras"):
        MnistCNN(init="glorot")
    # Adam's epsilon reaches the client optimizer (Keras's default is 1e-7).
    assert LocalTraining(optimizer="adam", adam_eps=1e-7).make_optimizer().eps == 1e-7
    with pytest.raises(ConfigError, match="hyperparams.adam_eps=0"):
        LocalTraining(optimizer="adam", adam_eps=0)


def test_a_chosen_data_root_without_the_files_says_it_reads_the_systems_copy(tmp_path, caplog, monkeypatch):
    # Debian's FashionMNIST stands in a system folder; a data_root the user chose holds none.
    from fedrun.data import datasets

    system = tmp_path / "system"
    rng = np.random.default_rng(0)
    for name, n in (("train-images-idx3-ubyte", 20), ("t10k-images-idx3-ubyte", 10)):
        write_idx(system / f"{name}.gz", rng.integers(0, 256, (n, 28, 28)))
    for name, n in (("train-labels-idx1-ubyte", 20), ("t10k-labels-idx1-ubyte", 10)):
        write_idx(system / f"{name}.gz", np.arange(n) % 10)
    monkeypatch.chdir(tmp_path)
    with caplog.at_level("INFO", logger="fedrun.data.datasets"):
        datasets._mnist_like("FashionMNIST", "FashionMNIST", str(tmp_path / "mine"), False, None, [str(system)])
        datasets._mnist_like("FashionMNIST", "FashionMNIST", "data", False, None, [str(system)])
    said = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert said == [("WARNING", f"data_root={tmp_path / 'mine'} holds no FashionMNIST ({tmp_path / 'mine'}/FashionMNIST/raw): "
                                f"reading the system's copy in {system}"),
                    ("INFO", f"FashionMNIST: reading {system}")]  # the default data root: as before
