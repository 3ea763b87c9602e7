"""Models at the edges of what `amp-harness diagnose` says (issue 54), beside the zoo of
tests/helpers/zoo.py (tests/lab/diagnose/test_diagnose_forecast.py):

| factory | what it shows |
|---|---|
| `contrastive_lse` | a contrastive loss at temperature 0.05, log-sum-exp by hand: exp(20) overflows fp16 at step 1; the fix that works is the loss computed outside autocast, not its outputs cast to fp32 inside it (its matmul runs in fp16 again) |
| `patch_rmsnorm` | patches of raw 0-255 pixels, embedded, under a hand-written RMSNorm whose square overflows fp16 for the brightest patches: those tokens are silently zeroed, every loss stays finite |

Every factory takes `seed` (the initial weights only; the batches are drawn from a fixed seed).
"""  # noqa: E501  (a table's rows)

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from harness.lab.diagnose import Subject

FEATURES, CLASSES, BATCH = 16, 4, 64
TEMPERATURE = 0.05


class _TwoViews(nn.Module):
    """An encoder applied to two noisy views of each input: the pair a contrastive loss pulls
    together."""

    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, 32))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.encoder(x[:, 0]), self.encoder(x[:, 1])


def _views(seed: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    while True:
        x = torch.randn(BATCH, FEATURES, generator=g)
        noise = 0.3 * torch.randn(BATCH, 2, FEATURES, generator=g)
        yield x[:, None] + noise, torch.arange(BATCH)


def _contrastive_loss(out: tuple[torch.Tensor, torch.Tensor], y: torch.Tensor) -> torch.Tensor:
    """InfoNCE at temperature 0.05 with log-sum-exp by hand: cosine logits up to 20, and exp(20)
    is past fp16's 65504. Its matmul runs in fp16 under autocast, whatever dtype `out` has."""
    a, b = (nn.functional.normalize(z, dim=-1) for z in out)
    logits = a @ b.T / TEMPERATURE
    lse = logits.exp().sum(1).log()
    return (lse - logits.gather(1, y[:, None]).squeeze(1)).mean()


def contrastive_lse(seed: int = 0) -> Subject:
    torch.manual_seed(seed)
    return Subject(_TwoViews(), _views(), _contrastive_loss)


class HandRMSNorm(nn.Module):
    """RMSNorm by hand, the mean of squares in its input's dtype: in fp16 a token with an entry
    past 256 squares to inf, its mean is inf, and x * rsqrt(inf) zeroes the token."""

    def __init__(self, eps: float = 1e-6):
        super().__init__()
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


class _PatchModel(nn.Module):
    """16 patches of 4x4 raw pixels, embedded, normalised by hand, mean-pooled, classified."""

    def __init__(self, width: int = 32):
        super().__init__()
        self.embed = nn.Linear(16, width)
        self.norm = HandRMSNorm()
        self.head = nn.Sequential(nn.Linear(width, 64), nn.ReLU(), nn.Linear(64, CLASSES))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        patches = x.unfold(1, 4, 4).unfold(2, 4, 4).reshape(x.shape[0], 16, 16)
        return self.head(self.norm(self.embed(patches)).mean(1))


def _pixels(seed: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """16x16 images in raw 0-255 units: a class prototype plus noise, clipped."""
    g = torch.Generator().manual_seed(seed)
    prototypes = torch.rand(CLASSES, 16, 16, generator=g) * 255
    while True:
        y = torch.randint(0, CLASSES, (BATCH,), generator=g)
        noisy = prototypes[y] + 60 * torch.randn(BATCH, 16, 16, generator=g)
        yield noisy.clamp(0, 255), y


def patch_rmsnorm(seed: int = 0) -> Subject:
    torch.manual_seed(seed)
    return Subject(_PatchModel(), _pixels(), nn.functional.cross_entropy)
