"""pytorch-fid 0.3.0 as the parity tests' reference: its own InceptionV3 with seeded random
weights whose batch-norm statistics are calibrated, so that pool3 features are not near zero
(default initialisation gives a feature mean of 0.04; calibrated, about 0.4, max about 1.6).

Import this only after `pytest.importorskip("torch")`."""

import sys
import types

import pytest


def import_pytorch_fid():
    """pytorch_fid.inception, or skip. PyPI's torchvision imports beside the CPU build of torch
    only without its `_meta_registrations` (it registers kernels the CPU build lacks)."""
    pytest.importorskip("torch")
    if "torchvision" not in sys.modules:
        sys.modules.setdefault(
            "torchvision._meta_registrations", types.ModuleType("torchvision._meta_registrations")
        )
    pytest.importorskip("torchvision")
    return pytest.importorskip("pytorch_fid.inception")


def calibrated_state_dict(seed: int = 0, sizes=((64, 64),), images_per_size: int = 8):
    """The state dict (Inception3 names, as in pt_inception-2015-12-05-6726825d.pth) of
    pytorch-fid's FID InceptionV3 with random weights: batch-norm scales ~U(0.5, 1.5), shifts
    ~N(0, 0.1), running statistics those of one batch of uniform random images,
    `images_per_size` at each (height, width) of `sizes`, resized to 299x299 as pytorch-fid
    does. Calibrate on the sizes a test uses: a noise image's statistics after resizing
    depend on its size, and features of uncalibrated sizes can reach ~100."""
    import torch

    pfi = import_pytorch_fid()
    torch.manual_seed(seed)
    net = pfi._inception_v3(num_classes=1008, aux_logits=False, weights=None)
    net.Mixed_5b = pfi.FIDInceptionA(192, pool_features=32)
    net.Mixed_5c = pfi.FIDInceptionA(256, pool_features=64)
    net.Mixed_5d = pfi.FIDInceptionA(288, pool_features=64)
    net.Mixed_6b = pfi.FIDInceptionC(768, channels_7x7=128)
    net.Mixed_6c = pfi.FIDInceptionC(768, channels_7x7=160)
    net.Mixed_6d = pfi.FIDInceptionC(768, channels_7x7=160)
    net.Mixed_6e = pfi.FIDInceptionC(768, channels_7x7=192)
    net.Mixed_7b = pfi.FIDInceptionE_1(1280)
    net.Mixed_7c = pfi.FIDInceptionE_2(2048)
    net.fc = torch.nn.Linear(2048, 1008)
    with torch.no_grad():
        for module in net.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.weight.uniform_(0.5, 1.5)
                module.bias.normal_(0, 0.1)
                module.momentum = None  # a cumulative average: one batch's statistics
                module.reset_running_stats()
        generator = torch.Generator().manual_seed(seed + 1)
        resized = torch.cat(
            [
                torch.nn.functional.interpolate(
                    torch.rand(images_per_size, 3, height, width, generator=generator),
                    size=(299, 299),
                    mode="bilinear",
                    align_corners=False,
                )
                for height, width in sizes
            ]
        )
        net.train()
        net(2 * resized - 1)
    net.eval()
    return net.state_dict()


def pytorch_fid_inception(state_dict, monkeypatch: pytest.MonkeyPatch):
    """pytorch-fid's own `InceptionV3([3])` (pool3) built on `state_dict`: its download,
    `load_state_dict_from_url`, is patched to return it."""
    pfi = import_pytorch_fid()
    monkeypatch.setattr(pfi, "load_state_dict_from_url", lambda *args, **kwargs: state_dict)
    return pfi.InceptionV3([3]).eval()
