"""A researcher's own model and dataset, used by fedrun through their configs' ``_target_``.

Run from this folder (so Python finds this module):

    PYTHONPATH=. fedrun -cd conf model=two_layer dataset=blobs hyperparams.rounds=5
"""
import torch
from torch import nn

from fedrun.data.datasets import RawData


class TwoLayer(nn.Module):
    """Any ``nn.Module`` works; fedrun passes the dataset's shape as these three arguments."""

    def __init__(self, in_channels: int = 1, image_size: int = 8, num_classes: int = 4, hidden: int = 16):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(in_channels * image_size * image_size, hidden),
                                 nn.ReLU(), nn.Linear(hidden, num_classes))

    def forward(self, x):
        return self.net(x)


def blobs(num_train: int = 800, num_test: int = 200, image_size: int = 8, num_classes: int = 4,
          seed: int = 0) -> RawData:
    """A dataset is a function returning ``RawData``: images in [0, 1] ``[N, C, H, W]``, labels."""
    g = torch.Generator().manual_seed(seed)
    centers = torch.rand(num_classes, 1, image_size, image_size, generator=g)

    def draw(n):
        y = torch.randint(0, num_classes, (n,), generator=g)
        return (centers[y] + 0.3 * torch.randn(n, 1, image_size, image_size, generator=g)).clamp(0, 1), y

    (train_x, train_y), (test_x, test_y) = draw(num_train), draw(num_test)
    return RawData(train_x, train_y, test_x, test_y, num_classes)
