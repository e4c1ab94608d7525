"""Data augmentation of normalized batches (fedrun.data.augment; Nagura et al. appendix C.6)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fedrun.data.augment import Augmentation, Draws, make_augmentation
from fedrun.errors import ConfigError
from fedrun.seeding import torch_generator

STD = (0.247, 0.243, 0.261)
IDENTITY = dict(crop=1.0, flip=False, brightness=0.0, contrast=(1.0, 1.0))


def batch(b=8, c=3, h=32, w=32, seed=0, dtype=torch.float32):
    return torch.randn(b, c, h, w, generator=torch_generator(seed, "x"), dtype=torch.float64).to(dtype)


def gen(seed=1):
    return torch_generator(seed, "augment", 0, 0)


def test_same_seed_same_output_different_seed_different():
    x, aug = batch(), Augmentation(std=STD)
    a, b, c = aug(x, gen(1)), aug(x, gen(1)), aug(x, gen(2))
    assert torch.equal(a, b)
    assert not torch.allclose(a, c)
    assert not torch.allclose(a, x)


def test_shape_dtype_preserved_and_input_untouched():
    for dtype in (torch.float32, torch.float64):
        x = batch(b=5, c=3, h=28, w=20, dtype=dtype)
        before = x.clone()
        y = Augmentation(std=STD)(x, gen())
        assert y.shape == x.shape and y.dtype == dtype
        assert torch.equal(x, before)
    assert Augmentation()(batch(b=0), gen()).shape == (0, 3, 32, 32)


def test_disabled_settings_are_the_identity():
    x = batch()
    assert torch.allclose(Augmentation(**IDENTITY, std=STD)(x, gen()), x)


def test_crop_resize_matches_interpolate_of_the_crop_and_flip_order():
    x, aug = batch(b=16, h=32, w=30), Augmentation(crop=0.75, flip=True, brightness=0.0, contrast=(1.0, 1.0))
    d = aug.draw(16, 32, 30, gen())
    assert (d.crop_h, d.crop_w) == (24, 22)
    assert 0 <= int(d.top.min()) and int(d.top.max()) <= 8 and int(d.left.max()) <= 8
    y = aug.apply(x, d)
    for i in range(16):
        t, l = int(d.top[i]), int(d.left[i])
        crop = x[i:i + 1, :, t:t + 24, l:l + 22]
        ref = F.interpolate(crop, size=(32, 30), mode="bilinear", align_corners=False)
        if d.flip[i]:
            ref = torch.flip(ref, dims=[-1])
        torch.testing.assert_close(y[i:i + 1], ref, atol=1e-5, rtol=1e-5)
    assert 0 < int(d.flip.sum()) < 16 and len(set(d.top.tolist())) > 1


def test_flip_alone_flips_asymmetric_images_about_half_the_time():
    x = torch.arange(32.0).expand(400, 3, 32, 32).contiguous()  # a horizontal ramp
    aug = Augmentation(crop=1.0, flip=True, brightness=0.0, contrast=(1.0, 1.0))
    d = aug.draw(400, 32, 32, gen())
    y = aug.apply(x, d)
    flipped = torch.flip(x, dims=[-1])
    for i in range(400):
        torch.testing.assert_close(y[i], flipped[i] if d.flip[i] else x[i])
    assert 160 < int(d.flip.sum()) < 240
    assert not Augmentation(crop=1.0, flip=False).draw(400, 32, 32, gen()).flip.any()


def test_brightness_shifts_each_channel_by_delta_over_std():
    x = batch(b=64, dtype=torch.float64)
    aug = Augmentation(crop=1.0, flip=False, brightness=63 / 255, contrast=(1.0, 1.0), std=STD)
    d = aug.draw(64, 32, 32, gen())
    shift = aug.apply(x, d) - x
    expected = d.delta[:, None] / torch.tensor(STD, dtype=torch.float64)[None, :]
    torch.testing.assert_close(shift, expected[:, :, None, None].expand_as(x))
    assert float(d.delta.abs().max()) <= 63 / 255 and float(d.delta.min()) < 0 < float(d.delta.max())
    # std=None means unnormalized pixels: the shift is delta itself.
    plain = Augmentation(crop=1.0, flip=False, contrast=(1.0, 1.0))
    torch.testing.assert_close(plain.apply(x, d) - x, d.delta[:, None, None, None].expand_as(x))


def test_contrast_keeps_each_image_channel_mean_and_scales_deviations():
    x = batch(b=32, dtype=torch.float64)
    aug = Augmentation(crop=1.0, flip=False, brightness=0.0, contrast=(0.2, 1.8), std=STD)
    d = aug.draw(32, 32, 32, gen())
    y = aug.apply(x, d)
    torch.testing.assert_close(y.mean(dim=(2, 3)), x.mean(dim=(2, 3)))
    m = x.mean(dim=(2, 3), keepdim=True)
    torch.testing.assert_close(y - m, (x - m) * d.factor[:, None, None, None])
    assert 0.2 <= float(d.factor.min()) and float(d.factor.max()) <= 1.8
    # The full pipeline keeps each image's channel mean up to the brightness shift (crop aside).
    full = Augmentation(crop=1.0, flip=True, std=STD)
    d = full.draw(32, 32, 32, gen())
    shift = d.delta[:, None] / torch.tensor(STD, dtype=torch.float64)
    torch.testing.assert_close(full.apply(x, d).mean(dim=(2, 3)), x.mean(dim=(2, 3)) + shift)


def test_crop_resize_of_a_constant_image_is_constant():
    x = torch.full((6, 3, 32, 32), 0.7)
    x[:, 1] = -1.3
    y = Augmentation(crop=0.75, flip=True, brightness=0.0, contrast=(0.2, 1.8))(x, gen())
    torch.testing.assert_close(y, x)


def test_draws_do_not_depend_on_dtype_or_settings():
    aug = Augmentation(std=STD)
    x32, x64 = batch(dtype=torch.float32), batch(dtype=torch.float64)
    y32, y64 = aug(x32, gen()), aug(x64, gen())
    torch.testing.assert_close(y32.double(), y64, atol=1e-5, rtol=1e-5)
    a = Augmentation().draw(8, 32, 32, gen())
    b = Augmentation(flip=False, brightness=0.1, contrast=(0.5, 1.5)).draw(8, 32, 32, gen())
    assert torch.equal(a.top, b.top) and torch.equal(a.left, b.left)
    # the generator advances by the same amount whatever the settings
    g1, g2 = gen(), gen()
    Augmentation()(x32, g1)
    Augmentation(**IDENTITY)(x32, g2)
    assert torch.equal(torch.rand(3, generator=g1), torch.rand(3, generator=g2))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    x, aug = batch(), Augmentation(std=STD)
    torch.testing.assert_close(aug(x.cuda(), gen()).cpu(), aug(x, gen()), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kwargs, setting", [
    (dict(crop=0), "hyperparams.augment.crop"),
    (dict(crop=1.5), "hyperparams.augment.crop"),
    (dict(flip=1), "hyperparams.augment.flip"),
    (dict(brightness=-0.1), "hyperparams.augment.brightness"),
    (dict(contrast=(1.8, 0.2)), "hyperparams.augment.contrast"),
    (dict(contrast=(-1, 1)), "hyperparams.augment.contrast"),
    (dict(contrast=(1,)), "hyperparams.augment.contrast"),
    (dict(std=(0.2, 0.0, 0.3)), "hyperparams.augment.std"),
])
def test_bad_values_raise_one_line_config_errors(kwargs, setting):
    with pytest.raises(ConfigError) as err:
        Augmentation(**kwargs)
    assert err.value.setting == setting and "\n" not in str(err.value)


def test_std_must_match_channels():
    with pytest.raises(ConfigError, match="one value per channel"):
        Augmentation(std=(0.5, 0.5))(batch(c=3), gen())


def test_make_augmentation():
    assert make_augmentation(None) is None and make_augmentation(False) is None
    assert make_augmentation({"enabled": False, "crop": 0.5}) is None
    # true: the released code's pipeline (fl_noniid.py 83-98), which does not flip SVHN.
    assert make_augmentation(True) == Augmentation(brightness=0.0, contrast=(0.0, 1.5), pipeline="code")
    assert make_augmentation(True, dataset="svhn") == Augmentation(flip=False, brightness=0.0, contrast=(0.0, 1.5),
                                                                   pipeline="code")
    assert make_augmentation({"pipeline": "text"}, STD) == Augmentation(std=STD)
    aug = make_augmentation({"pipeline": "text", "crop": 0.5, "contrast": [0.5, 1.5]}, list(STD))
    assert aug == Augmentation(crop=0.5, contrast=(0.5, 1.5), std=STD)
    with pytest.raises(ConfigError, match=r"^hyperparams\.augment\.brightness=0\.1: must be 0 with pipeline=code"):
        make_augmentation({"brightness": 0.1})
    with pytest.raises(ConfigError, match=r"^hyperparams\.augment\.pipeline=tutorial: choose one of: code, text$"):
        make_augmentation({"pipeline": "tutorial"})
    with pytest.raises(ConfigError, match="hyperparams.augment.rotate"):
        make_augmentation({"rotate": 10})
    with pytest.raises(ConfigError):
        make_augmentation("yes")


def test_code_pipeline_crops_and_pads_without_rescaling():
    # One 1-channel 4x4 image 0..15, already standardized; a 2x2 crop (crop=0.5) at row 1, column 0,
    # no flip, contrast factor 1: the crop's pixels [[4, 5], [8, 9]] (standardized: (v - 7.5) / std)
    # land unscaled in the centre (rows 1-2, columns 1-2) of a zero 4x4 image, as TF's
    # resize_image_with_crop_or_pad puts a 24x24 crop in a 32x32 frame (4 pixels a side).
    x = torch.arange(16.0).view(1, 1, 4, 4)
    x = (x - x.mean()) / x.std(unbiased=False)
    aug = Augmentation(crop=0.5, flip=False, brightness=0.0, contrast=(1.0, 1.0), pipeline="code")
    d = Draws(torch.tensor([1]), torch.tensor([0]), torch.tensor([False]), torch.tensor([0.0], dtype=torch.float64),
              torch.tensor([1.0], dtype=torch.float64), 2, 2)
    out = aug.apply(x, d)
    expected = torch.zeros(1, 1, 4, 4)
    expected[0, 0, 1:3, 1:3] = x[0, 0, 1:3, 0:2]
    torch.testing.assert_close(out, expected)


def test_code_pipeline_contrast_is_followed_by_standardization():
    # Contrast f scales each channel's deviations from its mean; the per-image standardization that
    # follows then gives mean 0 and std 1 whatever f (no crop here): the released code's order.
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 3, 6, 6, generator=g) * 2 + 1
    aug = Augmentation(crop=1.0, flip=False, brightness=0.0, contrast=(0.0, 1.5), pipeline="code")
    out = aug(x, gen())
    flat = out.flatten(1)
    torch.testing.assert_close(flat.mean(1), torch.zeros(3), atol=1e-5, rtol=0)
    torch.testing.assert_close(flat.std(1, unbiased=False), torch.ones(3), atol=1e-5, rtol=0)
