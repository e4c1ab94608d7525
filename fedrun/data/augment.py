"""Data augmentation of training batches on the device (the parameter-divergence paper, Appendix C.6).

The paper's appendix C.6 ("The effect of data augmentation"): "we used random horizontal
flipping, brightness & contrast adjustment, and 24x24 cropping & resizing in the pipeline".
Two pipelines (``hyperparams.augment.pipeline``):

``code`` (the default: what produced the paper's Table 9): the paper's released code
(fl-noniid/fl-noniid, fl_noniid.py lines 83-98), per image: ``random_brightness(0.2)`` on pixels
in [0, 255], ``random_flip_left_right`` (not for SVHN), ``random_contrast(0.0, 1.5)``,
``per_image_standardization``, ``random_crop`` 24x24, then ``resize_image_with_crop_or_pad`` back
to 32x32, which *pads* the crop with zeros (4 pixels a side), it does not rescale it.  Test
images are only standardized.  The brightness shift is cancelled exactly by the per-image
standardization that follows, so this pipeline has none (``brightness`` must be 0); it expects
per-image standardized data (``dataset.normalize=per_image``), on which contrast followed by a
new standardization equals the code's contrast of raw pixels followed by standardization (both
commute with a per-image affine map).

``text``: the TensorFlow CIFAR-10 tutorial pipeline the text describes
(``cifar10_input.distorted_inputs``): ``random_crop`` 24x24, ``random_flip_left_right``,
``random_brightness(max_delta=63)`` on pixels in [0, 255] (63/255 on the [0, 1] scale used
here) and ``random_contrast(0.2, 1.8)``, applied in that order, independently per image.
Differences from the tutorial, and why:

* **Resize back to H x W.**  The tutorial trains on 24x24 crops and evaluates on 24x24 centre
  crops.  fedrun keeps one input size for every model and does not augment test images, so each
  crop of ``round(crop * H) x round(crop * W)`` pixels is resized back to ``H x W`` with bilinear
  interpolation (``align_corners=False``; the same numbers as ``F.interpolate`` on the crop).
* **Normalized space.**  fedrun's training set is already on the device as
  ``(x - mean_c) / std_c``.  Brightness adds ``delta`` to raw pixels, which in normalized units
  is ``delta / std_c`` per channel, so :class:`Augmentation` takes the ``std`` the data was
  normalized with.  Contrast ``x' = (x - m_c) * f + m_c``, with ``m_c`` the image's own
  per-channel spatial mean, commutes with any per-channel affine map, so it is applied to the
  normalized values as is.  Crop, resize and flip are spatial and commute with normalization too.
* **No clipping.**  TF's brightness and contrast ops do not clip either (the tutorial then
  standardizes each image); fedrun's inputs stay normalized by the dataset statistics.
* **Vectorized.**  A batch is augmented in one ``grid_sample`` call with a per-image sampling
  grid (crop, resize and flip folded into the grid) plus two broadcast ops; no loop per image.

Randomness: every number is drawn from the caller's CPU ``torch.Generator`` (fedrun derives it
from ``(seed, purpose, round, client)``, see :func:`fedrun.seeding.torch_generator`) as one
``[b, 5]`` float64 uniform block, then moved to ``x``'s device and dtype, so the draws are the
same on CPU and GPU, for float32 and float64 inputs, and for any setting of the augmentation
(turning flipping off does not change the crops).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from fedrun.errors import ConfigError, check

SETTING = "hyperparams.augment"
FIELDS = ("pipeline", "crop", "flip", "brightness", "contrast")
PIPELINES = ("code", "text")
# Each pipeline's settings (crop: the kept fraction of a side, 24 of 32 pixels).
DEFAULTS = {"code": dict(crop=0.75, flip=True, brightness=0.0, contrast=(0.0, 1.5)),
            "text": dict(crop=0.75, flip=True, brightness=63 / 255, contrast=(0.2, 1.8))}


class Draws(NamedTuple):
    """The random choices for a batch of ``b`` images, on the CPU.

    ``top``, ``left``: integer offsets of each crop, shape ``[b]`` (int64);
    ``flip``: bool ``[b]``; ``delta``: brightness on the [0, 1] pixel scale, float64 ``[b]``;
    ``factor``: contrast factor, float64 ``[b]``; ``crop_h``, ``crop_w``: the crop size in pixels.
    """
    top: Tensor
    left: Tensor
    flip: Tensor
    delta: Tensor
    factor: Tensor
    crop_h: int
    crop_w: int


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


@dataclass(frozen=True)
class Augmentation:
    """Random crop+resize, horizontal flip, brightness and contrast of a normalized batch.

    Attributes:
      pipeline: ``text`` (the steps below) or ``code`` (flip, contrast, per-image
        standardization, crop, zero-pad back: see the module docstring).
      crop: fraction of each side kept by the random crop (0.75: 24 of 32 pixels); the crop is
        resized back to the full size with bilinear interpolation (``align_corners=False``), or
        zero-padded back (centred) with ``pipeline="code"``.  1 disables cropping.
      flip: flip each image left-right with probability 1/2.
      brightness: max |delta| added to raw pixels on the [0, 1] scale (TF: 63 of 255); delta is
        uniform in ``[-brightness, brightness]``.  0 disables it.
      contrast: ``(lower, upper)``; the factor ``f`` is uniform in it and each image becomes
        ``(x - m_c) * f + m_c`` (``m_c`` its per-channel spatial mean).  ``(1, 1)`` disables it.
      std: the per-channel std the data was normalized with (brightness is ``delta / std_c`` in
        normalized units); None means 1 for every channel (unnormalized data).

    Call it as ``aug(x, generator)`` on a ``[b, C, H, W]`` floating tensor; test images are not
    augmented.
    """
    crop: float = 0.75
    flip: bool = True
    brightness: float = 63 / 255
    contrast: tuple[float, float] = (0.2, 1.8)
    std: tuple[float, ...] | None = None
    pipeline: str = "text"

    def __post_init__(self):
        check(self.pipeline in PIPELINES, SETTING + ".pipeline", self.pipeline, f"choose one of: {', '.join(PIPELINES)}")
        check(self.pipeline != "code" or self.brightness == 0, SETTING + ".brightness", self.brightness,
              "must be 0 with pipeline=code: the per-image standardization that follows cancels any brightness shift")
        check(_number(self.crop) and 0 < self.crop <= 1, SETTING + ".crop", self.crop, "must be in (0, 1]")
        check(isinstance(self.flip, bool), SETTING + ".flip", self.flip, "must be true or false")
        check(_number(self.brightness) and self.brightness >= 0, SETTING + ".brightness", self.brightness,
              "must be a number >= 0 (max |delta| on the [0, 1] pixel scale)")
        c = self.contrast
        check(isinstance(c, (tuple, list)) and len(c) == 2 and all(_number(v) for v in c)
              and 0 <= c[0] <= c[1], SETTING + ".contrast", _show(c), "must be [lower, upper] with 0 <= lower <= upper")
        object.__setattr__(self, "contrast", (float(c[0]), float(c[1])))
        if self.std is not None:
            s = self.std
            check(isinstance(s, (tuple, list)) and len(s) >= 1 and all(_number(v) and v > 0 for v in s),
                  SETTING + ".std", _show(s), "must be a list of per-channel stds, each > 0")
            object.__setattr__(self, "std", tuple(float(v) for v in s))

    def crop_size(self, height: int, width: int) -> tuple[int, int]:
        """The crop in pixels, ``round(crop * H) x round(crop * W)``, at least 1 x 1."""
        return max(round(self.crop * height), 1), max(round(self.crop * width), 1)

    def draw(self, batch: int, height: int, width: int, generator: torch.Generator) -> Draws:
        """Draw the choices for ``batch`` images of ``height x width`` from ``generator`` (CPU).

        Always one ``[batch, 5]`` float64 block, whatever the settings, so the generator
        advances the same way and each image's choices come from the same numbers.
        """
        u = torch.rand((batch, 5), generator=generator, dtype=torch.float64)
        ch, cw = self.crop_size(height, width)
        top = (u[:, 0] * (height - ch + 1)).floor().long().clamp_(max=height - ch)
        left = (u[:, 1] * (width - cw + 1)).floor().long().clamp_(max=width - cw)
        flip = (u[:, 2] < 0.5) & self.flip
        delta = (2 * u[:, 3] - 1) * self.brightness
        lo, hi = self.contrast
        factor = lo + (hi - lo) * u[:, 4]
        return Draws(top, left, flip, delta, factor, ch, cw)

    def apply(self, x: Tensor, d: Draws) -> Tensor:
        """Augment ``x`` (``[b, C, H, W]``, normalized) with the choices ``d``; returns a new tensor."""
        if x.dim() != 4 or not x.is_floating_point():
            raise ValueError(f"augmentation needs a floating [b, C, H, W] tensor, got {x.dtype} {tuple(x.shape)}")
        b, channels, h, w = x.shape
        dev, dt = x.device, x.dtype
        if self.std is not None and len(self.std) != channels:
            raise ConfigError(SETTING + ".std", _show(self.std), f"need one value per channel ({channels})")
        if b == 0:
            return x.clone()
        if self.pipeline == "code":
            return self._apply_code(x, d)
        # Crop + resize (+ flip), as sampling coordinates per output row and column: output pixel j
        # reads the crop at (j + 0.5) * crop / size - 0.5, clamped inside the crop like F.interpolate.
        rows = _source(d.top, d.crop_h, h, flip=None)
        cols = _source(d.left, d.crop_w, w, flip=d.flip)
        if d.crop_h == h and d.crop_w == w and not bool(d.flip.any()):
            out = x.clone()
        else:
            gy = rows.to(device=dev, dtype=dt)[:, :, None].expand(b, h, w)
            gx = cols.to(device=dev, dtype=dt)[:, None, :].expand(b, h, w)
            grid = torch.stack((gx, gy), dim=-1)
            out = F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)
        if self.brightness > 0:
            std = torch.tensor(self.std if self.std is not None else (1.0,) * channels, dtype=torch.float64)
            shift = d.delta[:, None] / std[None, :]
            out = out + shift.to(device=dev, dtype=dt)[:, :, None, None]
        if self.contrast != (1.0, 1.0):
            f = d.factor.to(device=dev, dtype=dt)[:, None, None, None]
            mean = out.mean(dim=(2, 3), keepdim=True)
            out = (out - mean) * f + mean
        return out

    def _apply_code(self, x: Tensor, d: Draws) -> Tensor:
        """Flip, contrast, per-image standardization, crop, zero-pad back (the released code)."""
        b, channels, h, w = x.shape
        dev, dt = x.device, x.dtype
        out = torch.where(d.flip.to(dev)[:, None, None, None], x.flip(-1), x)
        if self.contrast != (1.0, 1.0):
            f = d.factor.to(device=dev, dtype=dt)[:, None, None, None]
            mean = out.mean(dim=(2, 3), keepdim=True)
            out = (out - mean) * f + mean
        flat = out.flatten(1)  # standardized again: contrast changed the image's spread
        out = (out - flat.mean(1)[:, None, None, None]) / flat.std(1, unbiased=False).clamp_min(1e-12)[:, None, None, None]
        if d.crop_h == h and d.crop_w == w:
            return out
        rows = (d.top[:, None] + torch.arange(d.crop_h)).to(dev)  # [b, ch]
        cols = (d.left[:, None] + torch.arange(d.crop_w)).to(dev)  # [b, cw]
        index = torch.arange(b, device=dev)[:, None, None]
        crops = out.permute(0, 2, 3, 1)[index, rows[:, :, None], cols[:, None, :]].permute(0, 3, 1, 2)
        top, left = (h - d.crop_h) // 2, (w - d.crop_w) // 2  # TF resize_image_with_crop_or_pad
        padded = torch.zeros_like(out)
        padded[:, :, top:top + d.crop_h, left:left + d.crop_w] = crops
        return padded

    def __call__(self, x: Tensor, generator: torch.Generator) -> Tensor:
        """A randomly augmented copy of the batch ``x`` (``[b, C, H, W]``), same shape and dtype."""
        if x.dim() != 4:
            raise ValueError(f"augmentation needs a [b, C, H, W] tensor, got shape {tuple(x.shape)}")
        b, _, h, w = x.shape
        return self.apply(x, self.draw(b, h, w, generator))


def _source(offset: Tensor, crop: int, size: int, flip: Tensor | None) -> Tensor:
    """Normalized (``align_corners=False``) source coordinates ``[b, size]`` of each output pixel."""
    j = torch.arange(size, dtype=torch.float64)
    src = offset[:, None].double() + (j[None, :] + 0.5) * (crop / size) - 0.5
    src = torch.minimum(torch.maximum(src, offset[:, None].double()), (offset + crop - 1)[:, None].double())
    if flip is not None:
        src = torch.where(flip[:, None], src.flip(-1), src)
    return (2 * src + 1) / size - 1


def _show(v):
    return list(v) if isinstance(v, (tuple, list)) else v


def make_augmentation(cfg: Any, std=None, dataset: str | None = None) -> Augmentation | None:
    """An :class:`Augmentation` from the ``hyperparams.augment`` setting, or None when disabled.

    ``cfg``: None, False or a mapping with ``enabled: false`` disables it; True means the
    ``code`` pipeline with its defaults; a mapping (dict or OmegaConf node) sets the pipeline and
    any of crop, flip, brightness and contrast (the rest from that pipeline's defaults).
    ``std``: the per-channel std the training data was normalized with (None: per-image
    standardized or unnormalized data).  ``dataset``: its name; the ``code`` pipeline does not
    flip SVHN's digits (fl_noniid.py line 92).
    """
    if cfg is None or cfg is False:
        return None
    std = None if std is None else tuple(float(v) for v in std)
    if cfg is True:
        cfg = {}
    if not isinstance(cfg, Mapping):
        raise ConfigError(SETTING, cfg, "must be true, false or a mapping of " + ", ".join(FIELDS))
    settings = dict(cfg)
    enabled = settings.pop("enabled", True)
    check(isinstance(enabled, bool), SETTING + ".enabled", enabled, "must be true or false")
    if not enabled:
        return None
    for key in settings:
        check(key in FIELDS, f"{SETTING}.{key}", settings[key], "unknown setting; choose from " + ", ".join(FIELDS))
    if "contrast" in settings and not isinstance(settings["contrast"], (tuple, list, str)):
        try:
            settings["contrast"] = tuple(settings["contrast"])  # an OmegaConf ListConfig
        except TypeError:
            pass
    pipeline = settings.pop("pipeline", "code")
    check(pipeline in PIPELINES, SETTING + ".pipeline", pipeline, f"choose one of: {', '.join(PIPELINES)}")
    defaults = dict(DEFAULTS[pipeline])
    if pipeline == "code" and dataset == "svhn":
        defaults["flip"] = False
    return Augmentation(**{**defaults, **settings}, std=std, pipeline=pipeline)
