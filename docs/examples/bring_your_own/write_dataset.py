"""Write a small Hugging Face dataset to disk, as a researcher's own data would be, then train on it.

    python docs/examples/bring_your_own/write_dataset.py my_hf_data
    fedrun dataset=huggingface dataset.load.path=my_hf_data dataset.image_size=8 dataset.num_classes=3 \
        dataset.load.client_column=writer partition=natural hyperparams.num_clients=6 \
        hyperparams.client_fraction=0.5 model=mlp hyperparams.rounds=5

The dataset: 8 x 8 grey images of three classes (a bar in one of three places, plus noise), each
drawn by one of 6 "writers" who hold different numbers of images and different shares of the
classes: clients as real data has them.  It needs `pip install 'fedrun[huggingface]'` and no
network (``save_to_disk`` and ``load_from_disk`` are local).
"""
from __future__ import annotations

import sys

import numpy as np
from datasets import ClassLabel, Dataset, DatasetDict, Features, Image, Value


def images(n: int, rng: np.random.Generator) -> tuple[list[np.ndarray], list[int], list[str]]:
    xs, ys, writers = [], [], []
    for w in range(6):
        count = 20 + 10 * w  # unequal clients: 20, 30, ..., 70 images
        favourite = w % 3  # each writer draws mostly one class
        for _ in range(count if n else 0):
            y = favourite if rng.random() < 0.7 else int(rng.integers(3))
            img = rng.integers(0, 60, (8, 8))
            img[:, 2 * y + 1: 2 * y + 3] = 255  # the class's bar
            xs.append(img.astype(np.uint8))
            ys.append(y)
            writers.append(f"writer_{w:02d}")
    return xs, ys, writers


def main(folder: str) -> None:
    rng = np.random.default_rng(0)
    features = Features({"image": Image(), "label": ClassLabel(names=["left", "middle", "right"]),
                         "writer": Value("string")})
    splits = {}
    for split in ("train", "test"):
        xs, ys, writers = images(1, rng)
        splits[split] = Dataset.from_dict({"image": xs, "label": ys, "writer": writers}, features=features)
    DatasetDict(splits).save_to_disk(folder)
    print(f"wrote {folder}: {len(splits['train'])} training and {len(splits['test'])} test images of 6 writers")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "my_hf_data")
