"""Convolutional benchmark models: AlexNet, Inception-v3 and ResNet-101 as operator graphs.

These are the three image-classification networks among the benchmarks that FlexFlow used
to evaluate its SOAP search (Jia et al., "Beyond Data and Model Parallelism for Deep Neural
Networks", SysML'19, §8): AlexNet and ResNet-101 are chains of layers with (for ResNet) short
skip connections, Inception-v3 has wide branching blocks whose branches can run on different
devices.

Each builder returns an :class:`~engine.graph.OpGraph` for one training step at a given
batch size: a ``data`` input ``[batch, 3, H, W]`` in the model's precision, an ``int64``
``labels`` input ``[batch]``, the network and a ``softmax_cross_entropy`` loss. The layer
structure follows torchvision's implementations (https://pytorch.org/vision/stable/models.html),
so that parameter counts and multiply-adds can be checked against the figures published on
the torchvision documentation pages:

=================  ==============  =======================  ====================
model              parameters      GFLOPS (multiply-adds)   input
=================  ==============  =======================  ====================
``alexnet``        61,100,840      0.714                    3 x 224 x 224
``inception_v3``   27,161,264 [*]  5.713                    3 x 299 x 299
``resnet101``      44,549,160      7.801                    3 x 224 x 224
=================  ==============  =======================  ====================

[*] with the auxiliary classifier; 23,834,568 without it (the default here).

Our FLOPs convention (see :mod:`engine.ops`) counts 2 FLOPs per multiply-add, so the
convolution and linear layers of each graph hold twice the torchvision figure; pointwise ops
(batchnorm, relu, pooling, residual adds, dropout, the loss) add a few percent on top.

Operators are named after torchvision's modules where one exists (``features.0`` becomes
``conv1`` in AlexNet, whose ``Sequential`` indices say little; ``Mixed_6c.branch7x7dbl_3.conv``
and ``layer3.12.conv2`` keep torchvision's names) and carry a ``block`` label naming the
repeated block they belong to (``Mixed_6c``, ``layer3.12``), plus ``stem`` and ``head`` (or
AlexNet's ``features`` and ``classifier``) for the rest, so that a viewer can collapse blocks.

Preconditions not checked here: the input resolution is fixed per model (224 or 299 pixels);
only ``batch`` and ``precision`` vary. Batchnorm running statistics are buffers, not
parameters, and are not counted (torchvision's ``num_params`` does not count them either).

References
----------
.. [1] A. Krizhevsky, I. Sutskever, G. E. Hinton. "ImageNet Classification with Deep
   Convolutional Neural Networks." NeurIPS 2012.
.. [2] A. Krizhevsky. "One weird trick for parallelizing convolutional neural networks."
   arXiv:1404.5997, 2014. (The single-tower 64-192-384-256-256 AlexNet that torchvision
   implements.)
.. [3] C. Szegedy, V. Vanhoucke, S. Ioffe, J. Shlens, Z. Wojna. "Rethinking the Inception
   Architecture for Computer Vision." CVPR 2016, arXiv:1512.00567.
.. [4] K. He, X. Zhang, S. Ren, J. Sun. "Deep Residual Learning for Image Recognition."
   CVPR 2016, arXiv:1512.03385.
.. [5] S. Ioffe, C. Szegedy. "Batch Normalization: Accelerating Deep Network Training by
   Reducing Internal Covariate Shift." ICML 2015.
.. [6] Z. Jia, M. Zaharia, A. Aiken. "Beyond Data and Model Parallelism for Deep Neural
   Networks." SysML 2019.
.. [7] torchvision model documentation, ``alexnet``, ``inception_v3`` and ``resnet101``
   pages (parameter counts and GFLOPS of the ImageNet-1K weights),
   https://pytorch.org/vision/stable/models.html
"""

from __future__ import annotations

from typing import Sequence

from ..graph import GraphBuilder, OpGraph, TensorRef

__all__ = ["alexnet", "inception_v3", "resnet101"]

#: ImageNet-1K classes, the classifier width of all three models.
NUM_CLASSES = 1000
#: Dropout rate of AlexNet's classifier and Inception-v3's head (torchvision defaults).
DROPOUT_RATE = 0.5


# --------------------------------------------------------------------------- helpers


def _check_batch(batch: int) -> None:
    if not isinstance(batch, int) or isinstance(batch, bool) or batch <= 0:
        raise ValueError(f"batch must be a positive integer, got {batch!r}")


def _inputs(b: GraphBuilder, batch: int, size: int) -> tuple[TensorRef, TensorRef]:
    """The image batch ``data`` [batch, 3, size, size] and the class ids ``labels`` [batch]."""
    data = b.input("data", [batch, 3, size, size])  # [N, C, H, W] in the model precision
    labels = b.input("labels", [batch], dtype="int64")  # [N]
    return data, labels


def _classifier(b: GraphBuilder, x: TensorRef, labels: TensorRef, batch: int, prefix: str = "",
                dropout: float | None = None, loss: str = "loss") -> TensorRef:
    """Global average pool, flatten, optional dropout, linear to the classes, loss."""
    x = b.add("pool2d", f"{prefix}avgpool", [x], mode="avg", **{"global": True})  # [N, C, 1, 1]
    x = b.add("reshape", f"{prefix}flatten", [x], shape=[batch, -1])  # [N, C]
    if dropout is not None:
        x = b.add("dropout", f"{prefix}dropout", [x], rate=dropout)
    x = b.add("linear", f"{prefix}fc", [x], out_features=NUM_CLASSES)  # [N, classes]
    return b.add("softmax_cross_entropy", loss, [x, labels])  # [N]


def _conv_bn(b: GraphBuilder, name: str, x: TensorRef, out_channels: int,
             kernel: int | Sequence[int], stride: int = 1, padding: int | Sequence[int] = 0,
             relu: bool = True, conv: str = "conv", bn: str = "bn", act: str = "relu") -> TensorRef:
    """Convolution without bias, batchnorm, and (unless ``relu=False``) relu.

    This is torchvision's ``BasicConv2d`` in Inception-v3 and the conv/bn(/relu) triple of
    a ResNet bottleneck; ops are named ``{name}.{conv}``, ``{name}.{bn}``, ``{name}.{act}``
    (``name`` may be empty, then the suffixes alone are used).
    """
    prefix = f"{name}." if name else ""
    kernel = list(kernel) if not isinstance(kernel, int) else kernel
    padding = list(padding) if not isinstance(padding, int) else padding
    x = b.add("conv2d", prefix + conv, [x], out_channels=out_channels, kernel=kernel, stride=stride,
              padding=padding, bias=False)
    x = b.add("batchnorm", prefix + bn, [x])
    if relu:
        x = b.add("relu", prefix + act, [x])
    return x


# --------------------------------------------------------------------------- AlexNet


def alexnet(batch: int = 256, precision: str = "fp32") -> OpGraph:
    """AlexNet as implemented by torchvision: the single-tower variant of Krizhevsky 2014.

    Five convolutions (64 11x11/4, 192 5x5, 384 3x3, 256 3x3, 256 3x3, each with a bias and a
    relu; 3x3/2 max pools after the first, second and fifth) take a 224x224 image to
    256 x 6 x 6 = 9,216 features; the classifier is dropout, linear 4096, relu, dropout,
    linear 4096, relu, linear 1000. torchvision's adaptive average pool to 6x6 is the
    identity at this input size and is left out.

    Parameters
    ----------
    batch : int
        Images per training step.
    precision : str
        Dtype of activations and parameters: ``fp32``, ``fp16`` or ``bf16``.

    Returns
    -------
    OpGraph
        24 ops; 61,100,840 parameters, as torchvision's documentation states [7]_;
        about 2 x 0.714 GFLOPs per image in the forward pass.

    Raises
    ------
    ValueError
        For a non-positive batch or an unknown precision.

    References
    ----------
    .. [1] Krizhevsky, Sutskever, Hinton. NeurIPS 2012 (the original two-tower network).
    .. [2] Krizhevsky. "One weird trick for parallelizing convolutional neural networks."
       arXiv:1404.5997, 2014 (the one-tower variant built here).
    .. [7] https://pytorch.org/vision/stable/models/generated/torchvision.models.alexnet.html

    Examples
    --------
    >>> g = alexnet(batch=1)
    >>> g.param_count
    61100840
    >>> g["conv1"].out_tensors[0].shape
    (1, 64, 55, 55)
    """
    _check_batch(batch)
    b = GraphBuilder(
        "alexnet", precision,
        description=f"AlexNet (torchvision, one-tower variant of Krizhevsky 2014), batch {batch}, "
                    f"3x224x224 images, 1000 classes",
        source=f"engine.models.cnn.alexnet(batch={batch}, precision={precision!r})",
    )
    x, labels = _inputs(b, batch, 224)

    b.block = "features"
    # (name, out channels, kernel, stride, padding, max pool after)
    convs = [
        ("conv1", 64, 11, 4, 2, True),  # -> 55x55, pool -> 27x27
        ("conv2", 192, 5, 1, 2, True),  # -> 27x27, pool -> 13x13
        ("conv3", 384, 3, 1, 1, False),  # -> 13x13
        ("conv4", 256, 3, 1, 1, False),
        ("conv5", 256, 3, 1, 1, True),  # -> 13x13, pool -> 6x6
    ]
    for name, out, k, s, p, pool in convs:
        x = b.add("conv2d", name, [x], out_channels=out, kernel=k, stride=s, padding=p)
        x = b.add("relu", f"{name}.relu", [x])
        if pool:
            x = b.add("pool2d", f"{name}.maxpool", [x], mode="max", kernel=3, stride=2)

    b.block = "classifier"
    x = b.add("reshape", "flatten", [x], shape=[batch, -1])  # [N, 256*6*6]
    for name in ("fc6", "fc7"):
        x = b.add("dropout", f"{name}.dropout", [x], rate=DROPOUT_RATE)
        x = b.add("linear", name, [x], out_features=4096)
        x = b.add("relu", f"{name}.relu", [x])
    x = b.add("linear", "fc8", [x], out_features=NUM_CLASSES)
    b.add("softmax_cross_entropy", "loss", [x, labels])
    b.block = None
    return b.build()


# --------------------------------------------------------------------------- Inception-v3


def _concat(b: GraphBuilder, name: str, branches: Sequence[TensorRef]) -> TensorRef:
    return b.add("concat", name, list(branches), axis=1)  # along channels


def _pool_branch(b: GraphBuilder, block: str, x: TensorRef, out_channels: int) -> TensorRef:
    """3x3/1 average pool (padded, so the size is kept) and a 1x1 BasicConv2d."""
    y = b.add("pool2d", f"{block}.branch_pool.avgpool", [x], mode="avg", kernel=3, stride=1, padding=1)
    return _conv_bn(b, f"{block}.branch_pool", y, out_channels, 1)


def _inception_a(b: GraphBuilder, name: str, x: TensorRef, pool_features: int) -> TensorRef:
    """35x35 block (Szegedy et al. 2016, Fig. 5): 1x1; 1x1-5x5; 1x1-3x3-3x3; pool-1x1."""
    b1 = _conv_bn(b, f"{name}.branch1x1", x, 64, 1)
    b5 = _conv_bn(b, f"{name}.branch5x5_1", x, 48, 1)
    b5 = _conv_bn(b, f"{name}.branch5x5_2", b5, 64, 5, padding=2)
    b3 = _conv_bn(b, f"{name}.branch3x3dbl_1", x, 64, 1)
    b3 = _conv_bn(b, f"{name}.branch3x3dbl_2", b3, 96, 3, padding=1)
    b3 = _conv_bn(b, f"{name}.branch3x3dbl_3", b3, 96, 3, padding=1)
    bp = _pool_branch(b, name, x, pool_features)
    return _concat(b, f"{name}.concat", [b1, b5, b3, bp])  # 224 + pool_features channels


def _inception_b(b: GraphBuilder, name: str, x: TensorRef) -> TensorRef:
    """Grid reduction 35x35 -> 17x17 (Szegedy et al. 2016, §5 and Fig. 10)."""
    b3 = _conv_bn(b, f"{name}.branch3x3", x, 384, 3, stride=2)
    bd = _conv_bn(b, f"{name}.branch3x3dbl_1", x, 64, 1)
    bd = _conv_bn(b, f"{name}.branch3x3dbl_2", bd, 96, 3, padding=1)
    bd = _conv_bn(b, f"{name}.branch3x3dbl_3", bd, 96, 3, stride=2)
    bp = b.add("pool2d", f"{name}.branch_pool.maxpool", [x], mode="max", kernel=3, stride=2)
    return _concat(b, f"{name}.concat", [b3, bd, bp])  # 384 + 96 + in channels


def _inception_c(b: GraphBuilder, name: str, x: TensorRef, c7: int) -> TensorRef:
    """17x17 block with factorised 7x7 convolutions (1x7 then 7x1; Szegedy et al. 2016, Fig. 6)."""
    row, col = ([1, 7], [0, 3]), ([7, 1], [3, 0])  # (kernel, padding) keeping 17x17
    b1 = _conv_bn(b, f"{name}.branch1x1", x, 192, 1)
    b7 = _conv_bn(b, f"{name}.branch7x7_1", x, c7, 1)
    b7 = _conv_bn(b, f"{name}.branch7x7_2", b7, c7, row[0], padding=row[1])
    b7 = _conv_bn(b, f"{name}.branch7x7_3", b7, 192, col[0], padding=col[1])
    bd = _conv_bn(b, f"{name}.branch7x7dbl_1", x, c7, 1)
    for i, ((k, p), out) in enumerate([(col, c7), (row, c7), (col, c7), (row, 192)], start=2):
        bd = _conv_bn(b, f"{name}.branch7x7dbl_{i}", bd, out, k, padding=p)
    bp = _pool_branch(b, name, x, 192)
    return _concat(b, f"{name}.concat", [b1, b7, bd, bp])  # 768 channels


def _inception_d(b: GraphBuilder, name: str, x: TensorRef) -> TensorRef:
    """Grid reduction 17x17 -> 8x8."""
    b3 = _conv_bn(b, f"{name}.branch3x3_1", x, 192, 1)
    b3 = _conv_bn(b, f"{name}.branch3x3_2", b3, 320, 3, stride=2)
    b7 = _conv_bn(b, f"{name}.branch7x7x3_1", x, 192, 1)
    b7 = _conv_bn(b, f"{name}.branch7x7x3_2", b7, 192, [1, 7], padding=[0, 3])
    b7 = _conv_bn(b, f"{name}.branch7x7x3_3", b7, 192, [7, 1], padding=[3, 0])
    b7 = _conv_bn(b, f"{name}.branch7x7x3_4", b7, 192, 3, stride=2)
    bp = b.add("pool2d", f"{name}.branch_pool.maxpool", [x], mode="max", kernel=3, stride=2)
    return _concat(b, f"{name}.concat", [b3, b7, bp])  # 320 + 192 + in channels


def _inception_e(b: GraphBuilder, name: str, x: TensorRef) -> TensorRef:
    """8x8 block with expanded filter banks (1x3 and 3x1 side by side; Szegedy et al. 2016, Fig. 7)."""
    b1 = _conv_bn(b, f"{name}.branch1x1", x, 320, 1)
    b3 = _conv_bn(b, f"{name}.branch3x3_1", x, 384, 1)
    b3 = _concat(b, f"{name}.branch3x3_2.concat", [
        _conv_bn(b, f"{name}.branch3x3_2a", b3, 384, [1, 3], padding=[0, 1]),
        _conv_bn(b, f"{name}.branch3x3_2b", b3, 384, [3, 1], padding=[1, 0]),
    ])
    bd = _conv_bn(b, f"{name}.branch3x3dbl_1", x, 448, 1)
    bd = _conv_bn(b, f"{name}.branch3x3dbl_2", bd, 384, 3, padding=1)
    bd = _concat(b, f"{name}.branch3x3dbl_3.concat", [
        _conv_bn(b, f"{name}.branch3x3dbl_3a", bd, 384, [1, 3], padding=[0, 1]),
        _conv_bn(b, f"{name}.branch3x3dbl_3b", bd, 384, [3, 1], padding=[1, 0]),
    ])
    bp = _pool_branch(b, name, x, 192)
    return _concat(b, f"{name}.concat", [b1, b3, bd, bp])  # 320 + 768 + 768 + 192 = 2048


def inception_v3(batch: int = 64, precision: str = "fp32", aux_logits: bool = False) -> OpGraph:
    """Inception-v3 (Szegedy et al. 2016) as implemented by torchvision.

    Stem: BasicConv2d (conv without bias, batchnorm, relu) 32 3x3/2, 32 3x3, 64 3x3 pad 1,
    3x3/2 max pool, 80 1x1, 192 3x3, 3x3/2 max pool (299 -> 35 pixels). Then three 35x35
    blocks ``Mixed_5b``-``Mixed_5d``, a grid reduction ``Mixed_6a``, four 17x17 blocks
    ``Mixed_6b``-``Mixed_6e`` (7x7 factorised into 1x7 and 7x1 with 128, 160, 160, 192
    channels), a grid reduction ``Mixed_7a``, two 8x8 blocks ``Mixed_7b``/``Mixed_7c``
    (2048 channels), global average pool, dropout 0.5, linear 1000, loss.

    Parameters
    ----------
    batch : int
        Images per training step.
    precision : str
        Dtype of activations and parameters: ``fp32``, ``fp16`` or ``bf16``.
    aux_logits : bool
        Add the auxiliary classifier after ``Mixed_6e`` (5x5/3 average pool, 128 1x1,
        768 5x5, global pool, linear 1000) with its own loss ``aux_loss``, as in training
        (Szegedy et al. 2016, §8 use it as a regulariser).

    Returns
    -------
    OpGraph
        23,834,568 parameters, or 27,161,264 with ``aux_logits`` (torchvision's figure, which
        includes the auxiliary classifier [7]_); about 2 x 5.713 GFLOPs per image forward.

    Raises
    ------
    ValueError
        For a non-positive batch or an unknown precision.

    References
    ----------
    .. [3] Szegedy, Vanhoucke, Ioffe, Shlens, Wojna. "Rethinking the Inception Architecture
       for Computer Vision." CVPR 2016.
    .. [7] https://pytorch.org/vision/stable/models/generated/torchvision.models.inception_v3.html

    Examples
    --------
    >>> inception_v3(batch=1).param_count
    23834568
    >>> inception_v3(batch=1, aux_logits=True).param_count
    27161264
    """
    _check_batch(batch)
    aux = " with auxiliary classifier" if aux_logits else ""
    b = GraphBuilder(
        "inception_v3", precision,
        description=f"Inception-v3 (Szegedy et al. 2016, torchvision){aux}, batch {batch}, "
                    f"3x299x299 images, 1000 classes",
        source=f"engine.models.cnn.inception_v3(batch={batch}, precision={precision!r}, "
               f"aux_logits={aux_logits})",
    )
    x, labels = _inputs(b, batch, 299)

    b.block = "stem"
    x = _conv_bn(b, "Conv2d_1a_3x3", x, 32, 3, stride=2)  # [N, 32, 149, 149]
    x = _conv_bn(b, "Conv2d_2a_3x3", x, 32, 3)  # 147x147
    x = _conv_bn(b, "Conv2d_2b_3x3", x, 64, 3, padding=1)  # 147x147
    x = b.add("pool2d", "maxpool1", [x], mode="max", kernel=3, stride=2)  # 73x73
    x = _conv_bn(b, "Conv2d_3b_1x1", x, 80, 1)
    x = _conv_bn(b, "Conv2d_4a_3x3", x, 192, 3)  # 71x71
    x = b.add("pool2d", "maxpool2", [x], mode="max", kernel=3, stride=2)  # [N, 192, 35, 35]

    for name, pool_features in (("Mixed_5b", 32), ("Mixed_5c", 64), ("Mixed_5d", 64)):
        b.block = name
        x = _inception_a(b, name, x, pool_features)  # [N, 256 or 288, 35, 35]
    b.block = "Mixed_6a"
    x = _inception_b(b, "Mixed_6a", x)  # [N, 768, 17, 17]
    for name, c7 in (("Mixed_6b", 128), ("Mixed_6c", 160), ("Mixed_6d", 160), ("Mixed_6e", 192)):
        b.block = name
        x = _inception_c(b, name, x, c7)  # [N, 768, 17, 17]

    if aux_logits:
        b.block = "AuxLogits"
        a = b.add("pool2d", "AuxLogits.avgpool0", [x], mode="avg", kernel=5, stride=3)  # 5x5
        a = _conv_bn(b, "AuxLogits.conv0", a, 128, 1)
        a = _conv_bn(b, "AuxLogits.conv1", a, 768, 5)  # [N, 768, 1, 1]
        _classifier(b, a, labels, batch, prefix="AuxLogits.", loss="aux_loss")

    b.block = "Mixed_7a"
    x = _inception_d(b, "Mixed_7a", x)  # [N, 1280, 8, 8]
    for name in ("Mixed_7b", "Mixed_7c"):
        b.block = name
        x = _inception_e(b, name, x)  # [N, 2048, 8, 8]

    b.block = "head"
    _classifier(b, x, labels, batch, dropout=DROPOUT_RATE)
    b.block = None
    return b.build()


# --------------------------------------------------------------------------- ResNet-101

#: Bottleneck blocks per stage of ResNet-101 (He et al. 2016, Table 1).
RESNET101_LAYERS = (3, 4, 23, 3)
#: Bottleneck width (3x3 conv channels) per stage; the block output is 4x this.
RESNET_WIDTHS = (64, 128, 256, 512)
#: Output channels of a bottleneck relative to its width.
BOTTLENECK_EXPANSION = 4


def _bottleneck(b: GraphBuilder, name: str, x: TensorRef, in_channels: int, width: int,
                stride: int) -> TensorRef:
    """1x1 reduce, 3x3 (carrying the stride: ResNet v1.5), 1x1 expand, residual add, relu.

    The shortcut is the identity, or a 1x1 conv (with the stride) and batchnorm when the
    shape changes (He et al. 2016, §3.3 option B).
    """
    out = width * BOTTLENECK_EXPANSION
    y = _conv_bn(b, name, x, width, 1, conv="conv1", bn="bn1", act="relu1")
    y = _conv_bn(b, name, y, width, 3, stride=stride, padding=1, conv="conv2", bn="bn2", act="relu2")
    y = _conv_bn(b, name, y, out, 1, relu=False, conv="conv3", bn="bn3")
    if stride != 1 or in_channels != out:
        x = _conv_bn(b, f"{name}.downsample", x, out, 1, stride=stride, relu=False, conv="0", bn="1")
    y = b.add("add", f"{name}.add", [y, x])
    return b.add("relu", f"{name}.relu", [y])


def resnet101(batch: int = 64, precision: str = "fp32") -> OpGraph:
    """ResNet-101 (He et al. 2016) as implemented by torchvision (v1.5 bottlenecks).

    Stem: conv 64 7x7/2 (no bias), batchnorm, relu, 3x3/2 max pool (224 -> 56 pixels). Four
    stages ``layer1``-``layer4`` of 3, 4, 23 and 3 bottleneck blocks with widths 64, 128, 256
    and 512 (outputs 256, 512, 1024, 2048 channels); the first block of stages 2-4 halves the
    resolution with a stride-2 3x3 conv, which torchvision places on the 3x3 rather than on
    the first 1x1 as the paper does (the "v1.5" variant, torchvision docs [7]_). Global
    average pool, linear 1000, loss.

    Parameters
    ----------
    batch : int
        Images per training step.
    precision : str
        Dtype of activations and parameters: ``fp32``, ``fp16`` or ``bf16``.

    Returns
    -------
    OpGraph
        44,549,160 parameters, as torchvision's documentation states; about 2 x 7.801 GFLOPs
        per image forward.

    Raises
    ------
    ValueError
        For a non-positive batch or an unknown precision.

    References
    ----------
    .. [4] He, Zhang, Ren, Sun. "Deep Residual Learning for Image Recognition." CVPR 2016.
    .. [7] https://pytorch.org/vision/stable/models/generated/torchvision.models.resnet101.html

    Examples
    --------
    >>> g = resnet101(batch=1)
    >>> g.param_count
    44549160
    >>> g["layer4.2.relu"].out_tensors[0].shape
    (1, 2048, 7, 7)
    """
    _check_batch(batch)
    b = GraphBuilder(
        "resnet101", precision,
        description=f"ResNet-101 (He et al. 2016, torchvision v1.5), batch {batch}, "
                    f"3x224x224 images, 1000 classes",
        source=f"engine.models.cnn.resnet101(batch={batch}, precision={precision!r})",
    )
    x, labels = _inputs(b, batch, 224)

    b.block = "stem"
    x = _conv_bn(b, "", x, 64, 7, stride=2, padding=3, conv="conv1", bn="bn1", act="relu")  # 112x112
    x = b.add("pool2d", "maxpool", [x], mode="max", kernel=3, stride=2, padding=1)  # [N, 64, 56, 56]

    channels = 64
    for stage, (blocks, width) in enumerate(zip(RESNET101_LAYERS, RESNET_WIDTHS), start=1):
        for i in range(blocks):
            name = f"layer{stage}.{i}"
            b.block = name
            stride = 2 if (i == 0 and stage > 1) else 1
            x = _bottleneck(b, name, x, channels, width, stride)
            channels = width * BOTTLENECK_EXPANSION
    # x: [N, 2048, 7, 7]

    b.block = "head"
    _classifier(b, x, labels, batch)
    b.block = None
    return b.build()
