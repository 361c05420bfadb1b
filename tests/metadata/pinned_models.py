"""Two models, torch and JAX, that use every FLOP rule; their FLOPs are pinned."""

from __future__ import annotations


def torch_model():
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, padding=1)
            self.bn = nn.BatchNorm2d(4)
            self.act = nn.ReLU()
            self.pool = nn.MaxPool2d(2)
            self.up = nn.ConvTranspose2d(4, 2, 2, stride=2)
            self.avg = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(2, 8)
            self.norm = nn.LayerNorm(8)
            self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
            self.gn = nn.GroupNorm(2, 8)

        def forward(self, x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
            h = self.pool(self.act(self.bn(self.conv(x))))
            h = self.up(h)
            h = self.avg(h).flatten(1)
            h = self.norm(self.fc(h))
            q = h.unsqueeze(1) + s
            a, _ = self.attn(q, q, q)
            b = F.scaled_dot_product_attention(q, q, q)
            m = torch.matmul(a, b.transpose(1, 2))
            m = F.softmax(m, dim=-1).sum(dim=-1, keepdim=True) * F.gelu(a)
            m = self.gn(m.transpose(1, 2)).transpose(1, 2)
            return torch.addmm(m[:, 0], m[:, 0], torch.ones(8, 8)).mean() + torch.tanh(m).amax()

    return Net().eval(), (torch.randn(2, 3, 8, 8), torch.randn(2, 5, 8))


def jax_model():
    import jax
    import jax.numpy as jnp

    k = jax.random.split(jax.random.PRNGKey(0), 3)
    params = {
        "w": jax.random.normal(k[0], (6, 8)),
        "k": jax.random.normal(k[1], (4, 3, 3, 3)),
    }

    def model(params, x, img):
        h = jax.nn.relu(x @ params["w"])
        h = jax.nn.softmax(h, axis=-1) + jax.nn.gelu(h)
        c = jax.lax.conv_general_dilated(img, params["k"], (1, 1), "SAME")
        p = jax.lax.reduce_window(c, -jnp.inf, jax.lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")

        def step(carry, xs):
            y = jnp.tanh(carry * xs + 1.0)
            return y, y.sum()

        carry, ys = jax.lax.scan(step, h[0], h)
        e = jnp.einsum("bij,bjk->bik", h.reshape(2, 2, 8), h.reshape(2, 8, 2))
        return carry.mean() + ys.max() + p.sum() + jnp.exp(e).sum() + jax.nn.sigmoid(h).argmax()

    return model, (params, jnp.ones((4, 6)), jnp.ones((1, 3, 6, 6)))
