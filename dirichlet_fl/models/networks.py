"""The paper's image classifiers, returning logits; GroupNorm or no normalisation by default.

`cnn` is a small default for CPU runs, `logreg` a softmax (multinomial logistic) regression on the
flattened input, FedProx's model for its Synthetic data (dataset = "synthetic", 60 features as 60 x 1 x 1),
`lenet` a two-layer 5x5 CNN without normalisation that fits under the Dirichlet loss with plain SGD where
`cnn` collapses (the audit experiment's default); `resnet9` follows Klause et al. (2022) as used by Hölzl
et al. (2022) for DermaMNIST, `resnet18` is He et al.'s network with the CIFAR stem, `inception` a
simplified Inception (Szegedy et al. 2015) for MNIST-sized images. GroupNorm (the deeper models' default)
and no normalisation (`lenet`'s default, or `norm="none"`) keep each example's forward pass independent of
the rest of its batch (which per-example privacy accounting and DP-SGD need); BatchNorm is available only
by explicit opt-in (`norm="batch"`), as in the paper's own runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from dirichlet_fl.models.norms import MODELS, check_norm, group_size

MAX_GROUPS = 32


def num_groups(channels: int, channels_per_group: int = 0) -> int:
    """GroupNorm group count: with `channels_per_group` K, the largest divisor of `channels` that leaves
    at least K channels per group; with 0, the largest divisor <= 32 that leaves >= 2 channels per group."""
    if channels_per_group > 0:
        limit = max(1, channels // channels_per_group)
    else:
        limit = max(1, min(MAX_GROUPS, channels // 2))
    return max(d for d in range(1, limit + 1) if channels % d == 0)


def norm_layer(norm: str, channels: int) -> nn.Module:
    """GroupNorm (`group`, `group-K`), BatchNorm (`batch`) or nothing (`none`) over `channels` feature maps."""
    if norm == "none":
        return nn.Identity()
    if norm == "batch":
        return nn.BatchNorm2d(channels)
    per_group = group_size(check_norm(norm))
    assert per_group is not None
    return nn.GroupNorm(num_groups(channels, per_group), channels)


def conv_block(
    in_channels: int,
    out_channels: int,
    norm: str,
    *,
    kernel_size: int = 3,
    activation: Callable[[], nn.Module] = nn.ReLU,
    pool: bool = False,
) -> nn.Sequential:
    """Conv (same padding; a bias only without a norm, which otherwise has one) -> norm -> activation
    [-> 2x2 max-pool]."""
    layers = [
        nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2, bias=norm == "none"),
        norm_layer(norm, out_channels),
        activation(),
    ]
    if pool:
        layers.append(nn.MaxPool2d(2))
    return nn.Sequential(*layers)


class SmallCNN(nn.Sequential):
    """Two conv blocks (32, 64 channels, each pooled), 2x2 adaptive average pool, linear: ~21k parameters.

    The adaptive pool makes it work from 8x8 (scikit-learn digits) to 32x32 inputs. It suits the default
    federated job (digits, GroupNorm, large Dirichlet rates) but underfits centrally trained MNIST under
    the Dirichlet loss (see LeNet5x5); the audit experiment uses `lenet`.
    """

    def __init__(self, in_channels: int, num_classes: int, norm: str) -> None:
        super().__init__(
            conv_block(in_channels, 32, norm, pool=True),
            conv_block(32, 64, norm, pool=True),
            nn.AdaptiveAvgPool2d(2),
            nn.Flatten(),
            nn.Linear(64 * 4, num_classes),
        )


class LeNet5x5(nn.Sequential):
    """Two 5x5 conv blocks (32, 64 channels, each 2x2 max-pooled), flatten, linear: ~84k parameters on 28x28.

    Without normalisation (its default, norm="none") it fits under the Dirichlet loss with plain SGD,
    where SmallCNN collapses. Measured on 500 real MNIST digits (q = 0.01, T = 4,000, Dirichlet
    r = 0.2154, alpha 3, SGD at 0.703, seed 0): this network reaches 0.850 test accuracy (0.944 without
    privacy at 0.025) and predicts 9 classes; the same network with GroupNorm 0.089 (one class);
    SmallCNN 0.663 (7 classes; 0.505 at rate 0.2, so a smaller rate does not rescue it); SmallCNN
    without its norm but with its 2x2 average pool 0.300; SmallCNN with neither (flattened 3x3
    maps) 0.846; a zero-initialised last layer 0.768. So the norm and the global pool cause the
    collapse, not the kernel size: the Dirichlet loss's gradient scales with softmax[y], so classes
    the model is confidently wrong about barely recover. Flattening keeps the spatial layout; any
    image_size >= 8 works (8x8 digits flatten 2x2 maps).
    """

    def __init__(self, in_channels: int, num_classes: int, norm: str, image_size: int) -> None:
        side = image_size // 4
        super().__init__(
            conv_block(in_channels, 32, norm, kernel_size=5, pool=True),
            conv_block(32, 64, norm, kernel_size=5, pool=True),
            nn.Flatten(),
            nn.Linear(64 * side * side, num_classes),
        )


class ResNet9(nn.Module):
    """ResNet-9 of Klause et al. 2022 (used by Hölzl et al. 2022): conv-conv-res-conv-conv-res, Mish, max-pool head.

    Channels 64-128-128(res)-256-256-256(res), 3x3 convolutions, 2x2 adaptive max pool, linear on 1024 features.
    """

    def __init__(self, in_channels: int, num_classes: int, norm: str) -> None:
        super().__init__()

        def block(cin: int, cout: int, pool: bool = False) -> nn.Sequential:
            return conv_block(cin, cout, norm, activation=nn.Mish, pool=pool)

        self.stem = nn.Sequential(block(in_channels, 64), block(64, 128, pool=True))
        self.res1 = nn.Sequential(block(128, 128), block(128, 128))
        self.middle = nn.Sequential(block(128, 256, pool=True), block(256, 256, pool=True))
        self.res2 = nn.Sequential(block(256, 256), block(256, 256))
        self.head = nn.Sequential(nn.AdaptiveMaxPool2d(2), nn.Flatten(), nn.Linear(256 * 4, num_classes))

    def forward(self, x: Tensor) -> Tensor:
        """Logits for the batch x."""
        x = self.stem(x)
        x = self.res1(x) + x
        x = self.middle(x)
        x = self.res2(x) + x
        return self.head(x)


class BasicBlock(nn.Module):
    """ResNet basic block: two 3x3 convs with norms, identity or 1x1-conv shortcut."""

    def __init__(self, in_channels: int, out_channels: int, stride: int, norm: str) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=norm == "none"),
            norm_layer(norm, out_channels),
            nn.ReLU(),
            nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=norm == "none"),
            norm_layer(norm, out_channels),
        )
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=norm == "none"),
                norm_layer(norm, out_channels),
            )
        self.activation = nn.ReLU()

    def forward(self, x: Tensor) -> Tensor:
        """Residual sum, then ReLU."""
        return self.activation(self.body(x) + self.shortcut(x))


class ResNet18(nn.Module):
    """ResNet-18 (He et al. 2016) with the CIFAR stem: 3x3 stride-1 conv, no max-pool; ~11M parameters."""

    def __init__(self, in_channels: int, num_classes: int, norm: str) -> None:
        super().__init__()
        self.stem = conv_block(in_channels, 64, norm)
        stages, channels = [], 64
        for width, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            stages += [BasicBlock(channels, width, stride, norm), BasicBlock(width, width, 1, norm)]
            channels = width
        self.stages = nn.Sequential(*stages)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, num_classes))

    def forward(self, x: Tensor) -> Tensor:
        """Logits for the batch x."""
        return self.head(self.stages(self.stem(x)))


class InceptionBlock(nn.Module):
    """Four parallel branches concatenated on channels: 1x1; 1x1->3x3; 1x1->5x5; 3x3 max-pool->1x1."""

    def __init__(
        self, in_channels: int, out1: int, reduce3: int, out3: int, reduce5: int, out5: int, pool_out: int, norm: str
    ) -> None:
        super().__init__()
        self.branch1 = conv_block(in_channels, out1, norm, kernel_size=1)
        self.branch3 = nn.Sequential(
            conv_block(in_channels, reduce3, norm, kernel_size=1), conv_block(reduce3, out3, norm, kernel_size=3)
        )
        self.branch5 = nn.Sequential(
            conv_block(in_channels, reduce5, norm, kernel_size=1), conv_block(reduce5, out5, norm, kernel_size=5)
        )
        self.branch_pool = nn.Sequential(
            nn.MaxPool2d(3, stride=1, padding=1), conv_block(in_channels, pool_out, norm, kernel_size=1)
        )
        self.out_channels = out1 + out3 + out5 + pool_out

    def forward(self, x: Tensor) -> Tensor:
        """The four branch outputs, concatenated along channels."""
        branches = (self.branch1, self.branch3, self.branch5, self.branch_pool)
        return torch.cat([branch(x) for branch in branches], dim=1)


class SimpleInception(nn.Module):
    """Simplified Inception for MNIST-sized images: 3x3 stem, two Inception blocks (64, 128 channels)
    with a 2x2 max-pool between them, global average pool, linear; ~33k parameters."""

    def __init__(self, in_channels: int, num_classes: int, norm: str) -> None:
        super().__init__()
        first = InceptionBlock(32, 16, 16, 24, 8, 8, 16, norm)
        second = InceptionBlock(first.out_channels, 32, 32, 48, 8, 16, 32, norm)
        self.features = nn.Sequential(conv_block(in_channels, 32, norm), first, nn.MaxPool2d(2), second)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(second.out_channels, num_classes))

    def forward(self, x: Tensor) -> Tensor:
        """Logits for the batch x."""
        return self.head(self.features(x))


class SoftmaxRegression(nn.Sequential):
    """[Norm over the input channels,] flatten, linear: multinomial logistic regression (FedProx's model for
    Synthetic(alpha, beta)). By default without a norm, so every example's output depends on its input only."""

    def __init__(self, in_channels: int, num_classes: int, norm: str, image_size: int) -> None:
        super().__init__(norm_layer(norm, in_channels), nn.Flatten(),
                         nn.Linear(in_channels * image_size * image_size, num_classes))


@dataclass(frozen=True)
class ModelEntry:
    """How to build a model and the normalisation it uses unless told otherwise (how it trains:
    dirichlet_fl.models.recipes, torch-free, which repeats the default norms; a test holds the two equal)."""

    build: Callable[[int, int, str, int], nn.Module]
    """(in_channels, num_classes, norm, image_size) -> the model."""
    default_norm: str
    min_image_size: int = 8
    """The smallest input side it takes (the image networks pool; logreg takes 1 x 1 feature vectors)."""


MODEL_REGISTRY: dict[str, ModelEntry] = {
    "cnn": ModelEntry(lambda channels, classes, norm, _: SmallCNN(channels, classes, norm), "group"),
    "lenet": ModelEntry(LeNet5x5, "none"),
    "resnet9": ModelEntry(lambda channels, classes, norm, _: ResNet9(channels, classes, norm), "group"),
    "resnet18": ModelEntry(lambda channels, classes, norm, _: ResNet18(channels, classes, norm), "group"),
    "inception": ModelEntry(lambda channels, classes, norm, _: SimpleInception(channels, classes, norm), "group"),
    "logreg": ModelEntry(SoftmaxRegression, "none", 1),
}
"""One entry per name of MODELS (dirichlet_fl.models.norms, the torch-free table that config validation reads)."""


def build_model(
    name: str, in_channels: int, num_classes: int, image_size: int, *, norm: str | None = None
) -> nn.Module:
    """A fresh model `name` (see MODELS) for in_channels x image_size x image_size inputs and num_classes logits.

    norm: one of NORMS, or None for the model's default (MODEL_REGISTRY). The others end in adaptive
    pooling and `lenet` flattens image_size // 4 maps, so any image_size >= 8 works (ResNet-9's
    three 2x2 max-pools need 8 pixels).
    """
    if name not in MODEL_REGISTRY:
        raise ValueError(f"model={name!r} is unknown; valid: {', '.join(MODELS)}")
    entry = MODEL_REGISTRY[name]
    norm = check_norm(entry.default_norm if norm is None else norm)
    if in_channels < 1 or num_classes < 2:
        raise ValueError(f"in_channels={in_channels} must be >= 1 and num_classes={num_classes} >= 2")
    if image_size < entry.min_image_size:
        raise ValueError(f"image_size={image_size} must be >= {entry.min_image_size} for model={name!r} (the smallest "
                         "supported images are 8x8 digits; dataset='synthetic' takes model='logreg')")
    return entry.build(in_channels, num_classes, norm, image_size)
