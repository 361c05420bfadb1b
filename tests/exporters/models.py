"""Small PyTorch and Equinox models shared by the exporter and CLI tests.

Imported lazily by each test (``pytest.importorskip`` first), so the framework-free tests
run without torch or jax.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def torch_models() -> dict[str, tuple[Any, tuple[Any, ...]]]:
    """name -> (model in eval mode, example args), every model seeded."""
    import torch
    from torch import nn

    torch.manual_seed(0)

    class MLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc2(torch.relu(self.fc1(x)))

    class CNN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, padding=1)
            self.bn = nn.BatchNorm2d(8)
            self.relu = nn.ReLU(inplace=True)
            self.pool = nn.MaxPool2d(2)
            self.fc = nn.Linear(8 * 4 * 4, 5)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(torch.flatten(self.pool(self.relu(self.bn(self.conv(x)))), 1))

    cnn = CNN()
    with torch.no_grad():  # non-trivial running statistics, so eval-mode BN is tested
        cnn.bn.running_mean.uniform_(-0.5, 0.5)
        cnn.bn.running_var.uniform_(0.5, 2.0)

    class Block(nn.Module):
        def __init__(self, width: int, heads: int = 2) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
            self.attn = nn.MultiheadAttention(width, heads, batch_first=True)
            self.mlp = nn.Sequential(
                nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
            )

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.ln1(x)
            x = x + self.attn(h, h, h, need_weights=False)[0]
            return x + self.mlp(self.ln2(x))

    return {
        "mlp": (MLP().eval(), (torch.randn(4, 8),)),
        "cnn": (cnn.eval(), (torch.randn(2, 3, 8, 8),)),
        "resnet": (resnet().eval(), (torch.randn(2, 3, 16, 16),)),
        "transformer": (Block(16).eval(), (torch.randn(2, 5, 16),)),
    }


def resnet() -> Any:
    """A ResNet-style model: stem, two stages of BasicBlocks (one downsampling), head."""
    import torch
    from torch import nn

    class BasicBlock(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.relu = nn.ReLU(inplace=True)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.downsample = None
            if stride != 1 or cin != cout:
                self.downsample = nn.Sequential(
                    nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
                )

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            identity = x if self.downsample is None else self.downsample(x)
            return self.relu(out + identity)

    class ResNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(3, 8, 3, 1, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(8)
            self.relu = nn.ReLU(inplace=True)
            self.layer1 = nn.Sequential(BasicBlock(8, 8), BasicBlock(8, 8))
            self.layer2 = nn.Sequential(BasicBlock(8, 16, 2), BasicBlock(16, 16))
            self.avgpool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(16, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = self.relu(self.bn1(self.conv1(x)))
            x = self.layer2(self.layer1(x))
            return self.fc(torch.flatten(self.avgpool(x), 1))

    torch.manual_seed(1)
    return ResNet()


def equinox_models() -> dict[str, tuple[Any, tuple[Any, ...]]]:
    """name -> (Equinox module, example args); the modules vmap over the batch."""
    import equinox as eqx
    import jax
    import jax.numpy as jnp

    class MLP(eqx.Module):
        fc1: eqx.nn.Linear
        fc2: eqx.nn.Linear

        def __init__(self, key: Any) -> None:
            k1, k2 = jax.random.split(key)
            self.fc1, self.fc2 = eqx.nn.Linear(8, 16, key=k1), eqx.nn.Linear(16, 4, key=k2)

        def __call__(self, x: Any) -> Any:
            return jax.vmap(lambda v: self.fc2(jax.nn.relu(self.fc1(v))))(x)

    class CNN(eqx.Module):
        conv1: eqx.nn.Conv2d
        pool: eqx.nn.MaxPool2d
        conv2: eqx.nn.Conv2d
        fc: eqx.nn.Linear

        def __init__(self, key: Any) -> None:
            k = jax.random.split(key, 3)
            self.conv1 = eqx.nn.Conv2d(3, 8, 3, padding=1, key=k[0])
            self.pool = eqx.nn.MaxPool2d(2, 2)
            self.conv2 = eqx.nn.Conv2d(8, 8, 3, padding=1, key=k[1])
            self.fc = eqx.nn.Linear(8, 5, key=k[2])

        def __call__(self, x: Any) -> Any:
            def one(v: Any) -> Any:
                h = self.pool(jax.nn.relu(self.conv1(v)))
                h = jax.nn.gelu(self.conv2(h))
                return jax.nn.softmax(self.fc(jnp.mean(h, axis=(1, 2))))

            return jax.vmap(one)(x)

    rng = np.random.default_rng(0)
    return {
        "mlp": (numpy_init(MLP, rng), (jnp.asarray(rng.normal(size=(4, 8)), jnp.float32),)),
        "cnn": (numpy_init(CNN, rng), (jnp.asarray(rng.normal(size=(2, 3, 8, 8)), jnp.float32),)),
    }


def numpy_init(cls: Any, rng: np.random.Generator) -> Any:
    """An Equinox module with random weights drawn by numpy.

    The module is built abstractly (``eqx.filter_eval_shape``) and filled from numpy, so no
    JAX kernel is compiled: eager ``jax.random`` calls cost seconds each on a busy CPU.
    """
    import equinox as eqx
    import jax
    import jax.numpy as jnp

    shapes = eqx.filter_eval_shape(cls, jax.random.PRNGKey(0))

    def fill(leaf: Any) -> Any:
        if isinstance(leaf, jax.ShapeDtypeStruct):
            return jnp.asarray(0.3 * rng.normal(size=leaf.shape), leaf.dtype)
        return leaf

    return jax.tree_util.tree_map(fill, shapes)
