#!/usr/bin/env python
"""Write the files ``dataset=mnist_train10k`` reads: the first 10,000 images of MNIST's training
set, with their labels, grouped by digit (a stable sort: within a digit, in MNIST's order), as two
gzip-compressed IDX files, ``images-idx3-ubyte.gz`` and ``labels-idx1-ubyte.gz``, in OUT.

They are made from MNIST's own training files, read where ``fedrun dataset=mnist`` reads them
(``<data root>/MNIST/raw``: ``$FEDRUN_DATA`` or ``data``, and the ``--search`` folders) or
downloaded there by torchvision when the network allows. Then point fedrun at OUT:

    python scripts/datasets/mnist_train10k.py data/mnist-train10k
    export FEDRUN_MNIST10K=$PWD/data/mnist-train10k
    fedrun dataset=mnist_train10k
"""
from __future__ import annotations

import argparse
import gzip
import os
import struct
import sys
from pathlib import Path

import numpy as np

from fedrun.data.datasets import IDX_FILES, mnist, read_idx
from fedrun.errors import FedrunError, first_line

COUNT = 10_000
NAMES = ("images-idx3-ubyte.gz", "labels-idx1-ubyte.gz")


def training_files(root: Path, search: list[Path], download: bool) -> tuple[Path, Path]:
    """MNIST's training images and labels: the first folder holding both, else after a download
    into ``root/MNIST/raw`` (fedrun's own loader, which says in one line what is missing)."""
    folders = [root / "MNIST" / "raw", *search]
    for _ in range(2):
        for folder in folders:
            found = [next((p for p in (folder / n, folder / f"{n}.gz") if p.is_file()), None) for n in IDX_FILES["train"]]
            if all(found):
                return found[0], found[1]
        mnist(str(root), download=download, search=[str(s) for s in search])  # downloads, or raises why not
    raise FedrunError(f"MNIST's training files not found in {', '.join(map(str, folders))}")


def first_10k(images: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The first 10,000 images and labels, grouped by digit in MNIST's order within each."""
    if len(images) < COUNT or len(images) != len(labels):
        raise FedrunError(f"MNIST's training files hold {len(images):,} images and {len(labels):,} labels: "
                          f"not MNIST's training set (60,000 of each)")
    order = np.argsort(labels[:COUNT], kind="stable")
    return images[:COUNT][order], labels[:COUNT][order]


def write_idx(path: Path, array: np.ndarray) -> None:
    header = struct.pack(">HBB", 0, 0x08, array.ndim) + struct.pack(">" + "I" * array.ndim, *array.shape)
    with gzip.GzipFile(path, "wb", compresslevel=9, mtime=0) as f:
        f.write(header + np.ascontiguousarray(array, dtype=np.uint8).tobytes())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="mnist_train10k.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", help="folder to write the two files into (made if missing)")
    p.add_argument("--data-root", default=os.environ.get("FEDRUN_DATA") or "data",
                   help="fedrun's data root, whose MNIST/raw holds (or receives) MNIST's files "
                        "(default: $FEDRUN_DATA, else data)")
    p.add_argument("--search", action="append", default=[], metavar="FOLDER",
                   help="another folder holding MNIST's four files (repeatable)")
    p.add_argument("--no-download", action="store_true", help="never download MNIST")
    args = p.parse_args(argv)
    try:
        images, labels = training_files(Path(args.data_root), [Path(s) for s in args.search], not args.no_download)
        x, y = first_10k(read_idx(images), read_idx(labels))
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        write_idx(out / NAMES[0], x)
        write_idx(out / NAMES[1], y)
    except (FedrunError, OSError) as e:
        print(f"mnist_train10k: error: {first_line(e, limit=1000)}", file=sys.stderr)
        return 2
    print(f"wrote {out / NAMES[0]} and {out / NAMES[1]} (10,000 images from {images.parent}); "
          f"use them with: export FEDRUN_MNIST10K={out.resolve()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
