"""Tests for engine.models.cnn: AlexNet, Inception-v3, ResNet-101 against torchvision's figures.

Published figures come from the torchvision documentation pages of each model (ImageNet-1K
weights), which list ``num_params`` and ``GFLOPS``; the GFLOPS there count multiply-adds of
one 224x224 (299x299 for Inception-v3) image, while soapbox counts 2 FLOPs per multiply-add
(engine/ops/__init__.py module docstring).

FLOPs tolerances:

* conv + linear FLOPs per image must equal 2 x GFLOPS within 0.1%: torchvision rounds to
  3 decimals (half a unit in the last place is 0.07% of AlexNet's 0.714, less for the
  others), and the measured gaps are 0.03% (AlexNet), 0.004% (Inception), 0.005% (ResNet).
* the whole forward pass adds pointwise work (batchnorm 8, relu 1, add 1, dropout 2 FLOPs
  per element, pooling, the loss): a few FLOPs per activation element, measured at 0.1%
  (AlexNet, few activations per multiply-add), 0.9% (Inception-v3) and 1.0% (ResNet-101,
  where batchnorm dominates) on top of the multiply-adds. 3% leaves room for a change of
  the pointwise constants in engine/ops/pointwise.py while still catching a missing or doubled
  layer (ResNet's smallest conv is 0.1% of its FLOPs, but a missing block is >1%; a missing
  layer also shows in the exact parameter count). So the total must lie in
  [2 x GFLOPS, 2 x GFLOPS x 1.03].
"""

from __future__ import annotations

from collections import Counter

import pytest

from engine.graph import OpGraph
from engine.models.cnn import alexnet, inception_v3, resnet101

MATMUL_KINDS = ("conv2d", "linear")


def matmul_flops_per_image(g: OpGraph, skip_block: str | None = None) -> float:
    return sum(op.fwd_flops for op in g if op.kind in MATMUL_KINDS and op.block != skip_block) / g.batch_size


def check_flops(g: OpGraph, gflops_macs: float, skip_block: str | None = None) -> None:
    published = 2 * gflops_macs * 1e9
    assert matmul_flops_per_image(g, skip_block) == pytest.approx(published, rel=1e-3)
    total = g.fwd_flops / g.batch_size
    assert published <= total <= published * 1.03


def shape(g: OpGraph, name: str) -> list[int]:
    return list(g[name].out_tensors[0].shape)


def check_common(g: OpGraph, batch: int, size: int) -> None:
    """Inputs, unique names, loss, block labels, description and source."""
    assert shape(g, "data") == [batch, 3, size, size]
    assert g["data"].out_tensors[0].dtype == g.precision
    assert shape(g, "labels") == [batch]
    assert g["labels"].out_tensors[0].dtype == "int64"
    assert len({op.name for op in g}) == len(g)
    assert shape(g, "loss") == [batch]
    assert all(op.block for op in g if op.kind != "input")
    assert g.description and str(batch) in g.description
    assert g.source.startswith(f"engine.models.cnn.{g.name}(batch={batch}")
    assert g.batch_size == batch


# --------------------------------------------------------------------------- AlexNet


class TestAlexNet:
    @pytest.fixture(scope="class")
    @staticmethod
    def g() -> OpGraph:
        return alexnet()

    def test_param_count(self, g):
        # https://pytorch.org/vision/stable/models/generated/torchvision.models.alexnet.html
        # (AlexNet_Weights.IMAGENET1K_V1: num_params 61100840)
        assert g.param_count == 61_100_840

    def test_flops(self, g):
        # same page: GFLOPS 0.714
        check_flops(g, 0.714)

    def test_shapes(self, g):
        assert shape(g, "conv1") == [256, 64, 55, 55]
        assert shape(g, "conv1.maxpool") == [256, 64, 27, 27]
        assert shape(g, "conv2.maxpool") == [256, 192, 13, 13]
        assert shape(g, "conv5.maxpool") == [256, 256, 6, 6]
        assert shape(g, "flatten") == [256, 9216]
        assert shape(g, "fc8") == [256, 1000]

    def test_op_counts(self, g):
        kinds = Counter(op.kind for op in g)
        assert kinds["conv2d"] == 5 and kinds["linear"] == 3
        assert kinds["pool2d"] == 3 and kinds["relu"] == 7 and kinds["dropout"] == 2
        assert len(g) == 24

    def test_common(self, g):
        check_common(g, 256, 224)
        assert {op.block for op in g if op.kind != "input"} == {"features", "classifier"}

    def test_deterministic(self, g):
        assert alexnet().fingerprint == g.fingerprint

    def test_batch_scales_flops_not_params(self, g):
        small = alexnet(batch=8)
        assert small.param_count == g.param_count
        assert small.fwd_flops * 32 == pytest.approx(g.fwd_flops)
        assert small.fingerprint != g.fingerprint

    def test_precision(self):
        g16 = alexnet(batch=2, precision="fp16")
        assert g16.precision == "fp16"
        assert g16["data"].out_tensors[0].dtype == "fp16"
        assert g16["conv1"].param_bytes == 2 * g16["conv1"].param_count

    @pytest.mark.parametrize("batch", [0, -1, 2.5, True])
    def test_bad_batch(self, batch):
        with pytest.raises(ValueError, match="batch"):
            alexnet(batch=batch)

    def test_bad_precision(self):
        with pytest.raises(ValueError, match="precision"):
            alexnet(precision="int8")


# --------------------------------------------------------------------------- Inception-v3


class TestInceptionV3:
    @pytest.fixture(scope="class")
    @staticmethod
    def g() -> OpGraph:
        return inception_v3()

    @pytest.fixture(scope="class")
    @staticmethod
    def g_aux() -> OpGraph:
        return inception_v3(aux_logits=True)

    def test_param_count(self, g, g_aux):
        # https://pytorch.org/vision/stable/models/generated/torchvision.models.inception_v3.html
        # (Inception_V3_Weights.IMAGENET1K_V1: num_params 27161264, aux classifier included)
        assert g_aux.param_count == 27_161_264
        # without the aux classifier (conv0 98,560 + conv1 2,459,136 + fc 769,000 = 3,326,696)
        assert g.param_count == 23_834_568
        assert g_aux.param_count - g.param_count == 3_326_696

    def test_flops(self, g, g_aux):
        # same page: GFLOPS 5.713, inference (eval mode, no aux branch)
        check_flops(g, 5.713)
        check_flops(g_aux, 5.713, skip_block="AuxLogits")
        assert g_aux.fwd_flops > g.fwd_flops

    def test_shapes(self, g):
        assert shape(g, "Conv2d_1a_3x3.conv") == [64, 32, 149, 149]
        assert shape(g, "maxpool2") == [64, 192, 35, 35]
        assert shape(g, "Mixed_5b.concat") == [64, 256, 35, 35]
        assert shape(g, "Mixed_5d.concat") == [64, 288, 35, 35]
        assert shape(g, "Mixed_6a.concat") == [64, 768, 17, 17]
        assert shape(g, "Mixed_6c.branch7x7dbl_3.conv") == [64, 160, 17, 17]
        assert shape(g, "Mixed_6e.concat") == [64, 768, 17, 17]
        assert shape(g, "Mixed_7a.concat") == [64, 1280, 8, 8]
        assert shape(g, "Mixed_7c.concat") == [64, 2048, 8, 8]
        assert shape(g, "fc") == [64, 1000]

    def test_aux_shapes(self, g_aux):
        assert shape(g_aux, "AuxLogits.avgpool0") == [64, 768, 5, 5]
        assert shape(g_aux, "AuxLogits.conv1.conv") == [64, 768, 1, 1]
        assert shape(g_aux, "AuxLogits.fc") == [64, 1000]
        assert shape(g_aux, "aux_loss") == [64]
        assert g_aux["AuxLogits.avgpool0"].inputs[0].op == "Mixed_6e.concat"

    def test_op_counts(self, g, g_aux):
        kinds = Counter(op.kind for op in g)
        # torchvision's Inception3 without aux has 94 BasicConv2d modules
        assert kinds["conv2d"] == kinds["batchnorm"] == kinds["relu"] == 94
        assert all(len(op.params) == 1 for op in g if op.kind == "conv2d")  # no conv bias
        # 11 block outputs + 2 inner concats in each of Mixed_7b/7c
        assert kinds["concat"] == 15
        assert Counter(op.kind for op in g_aux)["conv2d"] == 96
        assert Counter(op.kind for op in g_aux)["softmax_cross_entropy"] == 2

    def test_blocks(self, g):
        blocks = [op.block for op in g if op.kind != "input"]
        mixed = sorted({blk for blk in blocks if blk.startswith("Mixed_")})
        assert mixed == ["Mixed_5b", "Mixed_5c", "Mixed_5d", "Mixed_6a", "Mixed_6b", "Mixed_6c",
                         "Mixed_6d", "Mixed_6e", "Mixed_7a", "Mixed_7b", "Mixed_7c"]
        assert g["Mixed_6c.branch7x7dbl_3.conv"].block == "Mixed_6c"
        assert set(blocks) - set(mixed) == {"stem", "head"}

    def test_common(self, g, g_aux):
        check_common(g, 64, 299)
        check_common(g_aux, 64, 299)
        assert "auxiliary" in g_aux.description

    def test_deterministic(self, g, g_aux):
        assert inception_v3().fingerprint == g.fingerprint
        assert inception_v3(aux_logits=True).fingerprint == g_aux.fingerprint
        assert g.fingerprint != g_aux.fingerprint


# --------------------------------------------------------------------------- ResNet-101


class TestResNet101:
    @pytest.fixture(scope="class")
    @staticmethod
    def g() -> OpGraph:
        return resnet101()

    def test_param_count(self, g):
        # https://pytorch.org/vision/stable/models/generated/torchvision.models.resnet101.html
        # (ResNet101_Weights.IMAGENET1K_V1 and _V2: num_params 44549160)
        assert g.param_count == 44_549_160

    def test_flops(self, g):
        # same page: GFLOPS 7.801
        check_flops(g, 7.801)

    def test_shapes(self, g):
        assert shape(g, "conv1") == [64, 64, 112, 112]
        assert shape(g, "maxpool") == [64, 64, 56, 56]
        assert shape(g, "layer1.2.relu") == [64, 256, 56, 56]
        # v1.5: the stride is on the 3x3 conv, the first 1x1 keeps the resolution
        assert shape(g, "layer2.0.conv1") == [64, 128, 56, 56]
        assert shape(g, "layer2.0.conv2") == [64, 128, 28, 28]
        assert shape(g, "layer3.12.conv2") == [64, 256, 14, 14]
        assert shape(g, "layer3.22.relu") == [64, 1024, 14, 14]
        assert shape(g, "layer4.2.relu") == [64, 2048, 7, 7]
        assert shape(g, "fc") == [64, 1000]

    def test_op_counts(self, g):
        kinds = Counter(op.kind for op in g)
        # 33 bottlenecks x 3 convs + 4 downsample convs + the stem conv
        assert kinds["conv2d"] == kinds["batchnorm"] == 104
        assert kinds["add"] == 33
        assert kinds["relu"] == 1 + 3 * 33
        assert all(not op.attrs["bias"] for op in g if op.kind == "conv2d")
        downsample = [op.name for op in g if op.name.endswith(".downsample.0")]
        assert downsample == ["layer1.0.downsample.0", "layer2.0.downsample.0",
                              "layer3.0.downsample.0", "layer4.0.downsample.0"]

    def test_residual_edges(self, g):
        # an identity shortcut feeds the previous block's output into the add
        assert [r.op for r in g["layer3.5.add"].inputs] == ["layer3.5.bn3", "layer3.4.relu"]
        assert [r.op for r in g["layer3.0.add"].inputs] == ["layer3.0.bn3", "layer3.0.downsample.1"]

    def test_blocks(self, g):
        blocks = {op.block for op in g if op.kind != "input"}
        assert len(blocks) == 33 + 2  # each bottleneck, stem, head
        assert g["layer3.12.conv2"].block == "layer3.12"
        assert {"stem", "head", "layer1.0", "layer3.22", "layer4.2"} <= blocks

    def test_common(self, g):
        check_common(g, 64, 224)

    def test_deterministic(self, g):
        assert resnet101().fingerprint == g.fingerprint
        assert resnet101(precision="bf16").fingerprint != g.fingerprint
