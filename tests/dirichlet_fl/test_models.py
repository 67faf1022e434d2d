"""Models: logits shapes on every supported input, normalisation layers, and that they train."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dirichlet_fl.models.networks import MODEL_REGISTRY, MODELS, build_model, num_groups

INPUTS = [(1, 8), (1, 28), (3, 32)]  # digits, MNIST-like, CIFAR/SVHN-like


def has(model: nn.Module, kind: type) -> bool:
    return any(isinstance(module, kind) for module in model.modules())


def test_the_torch_free_name_table_names_exactly_the_models_built() -> None:
    assert tuple(MODEL_REGISTRY) == MODELS  # config validation reads MODELS (dirichlet_fl.models.norms) without torch


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize(("channels", "size"), INPUTS)
def test_logits_have_one_row_per_example_and_one_column_per_class(name: str, channels: int, size: int) -> None:
    torch.manual_seed(0)
    model = build_model(name, channels, 7, size)
    logits = model(torch.randn(3, channels, size, size))
    assert logits.shape == (3, 7)
    assert torch.isfinite(logits).all()
    assert (logits < 0).any()  # not softmax probabilities
    assert not torch.allclose(torch.logsumexp(logits, 1), torch.zeros(3), atol=1e-3)  # not log-probabilities


@pytest.mark.parametrize("name", MODELS)
def test_default_norm_is_batch_independent_batch_norm_only_on_request(name: str) -> None:
    default = build_model(name, 3, 10, 32)
    batch = build_model(name, 3, 10, 32, norm="batch")
    assert has(default, nn.GroupNorm) == (MODEL_REGISTRY[name].default_norm == "group")
    assert not has(default, nn.modules.batchnorm._BatchNorm)
    assert has(batch, nn.BatchNorm2d) and not has(batch, nn.GroupNorm)
    plain = build_model(name, 3, 10, 32, norm="none")
    assert not has(plain, nn.GroupNorm) and not has(plain, nn.modules.batchnorm._BatchNorm)
    assert all(conv.bias is not None for conv in plain.modules() if isinstance(conv, nn.Conv2d))


def test_lenet_has_no_norm_and_flattens_its_maps() -> None:
    model = build_model("lenet", 1, 10, 28)
    assert MODEL_REGISTRY["lenet"].default_norm == "none"
    assert not has(model, nn.GroupNorm) and not has(model, nn.AdaptiveAvgPool2d)
    assert [m.kernel_size for m in model.modules() if isinstance(m, nn.Conv2d)] == [(5, 5), (5, 5)]


@pytest.mark.parametrize("name", MODELS)
def test_default_models_treat_each_example_independently_of_its_batch(name: str) -> None:
    torch.manual_seed(1)
    model = build_model(name, 1, 10, 28).train()
    batch = torch.randn(4, 1, 28, 28)
    torch.testing.assert_close(model(batch)[:1], model(batch[:1]), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("norm", ["none", "group", "batch"])
def test_one_sgd_step_lowers_the_loss_on_a_tiny_batch(name: str, norm: str) -> None:
    torch.manual_seed(2)
    model = build_model(name, 1, 10, 8, norm=norm).train()
    x, y = torch.randn(8, 1, 8, 8), torch.arange(8)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    before = nn.functional.cross_entropy(model(x), y)
    before.backward()
    optimizer.step()
    with torch.no_grad():
        after = nn.functional.cross_entropy(model(x), y)
    assert after < before


def test_small_models_are_small() -> None:
    sizes = {name: sum(p.numel() for p in build_model(name, 1, 10, 28).parameters()) for name in MODELS}
    assert 1_000 < sizes["cnn"] < 100_000 and 1_000 < sizes["inception"] < 100_000 and sizes["lenet"] < 100_000
    assert sizes["cnn"] < sizes["resnet9"] < sizes["resnet18"]


def test_group_counts_divide_the_channels() -> None:
    assert [num_groups(c) for c in (1, 3, 8, 24, 32, 64, 512)] == [1, 1, 4, 12, 16, 32, 32]


def test_invalid_names_norms_and_sizes_list_the_valid_choices() -> None:
    with pytest.raises(ValueError, match="model='vgg' is unknown; valid: cnn, lenet, resnet9, resnet18, inception, "
                                         "logreg"):
        build_model("vgg", 1, 10, 28)
    with pytest.raises(ValueError, match="norm='layer' is unknown; valid: none, group, batch"):
        build_model("cnn", 1, 10, 28, norm="layer")
    with pytest.raises(ValueError, match="image_size=4 must be >= 8"):
        build_model("cnn", 1, 10, 4)
