"""Models whose fp16 hazard is not there at the start and grows with training, for the forecast of
`amp-harness diagnose` (tests/lab/diagnose/test_diagnose_forecast.py): an 8-step quick look sees
every op inside fp16's range, and training takes one past it after tens to hundreds of steps.
The growth is training's own: a layer initialised at zero (as heads and residual branches often
are) that AdamW moves by about its learning rate per entry and step, on inputs in raw units.

| factory | where the hazard grows |
|---|---|
| `growing_exp_loss` | a hand-written `exp` in the loss (softmax by hand) on logits that sharpen |
| `growing_attention` | attention logits under a hand-written softmax (exp, no max taken) |
| `growing_penalty` | an activation penalty `a.pow(2).sum()` whose activations grow |
| `growing_norm` | a hand-written RMSNorm squaring an embedding that grows |

and the control the forecast must leave alone: `flat_exp_loss` (the same hand-written exp, its
logits held at unit scale by a LayerNorm). Hazards at the edges of what diagnose says, not of
growth, are in tests/helpers/zoo_edges.py.

Every factory takes `seed` (the initial weights only; the batches are drawn from a fixed seed).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from harness.lab.diagnose import Subject
from helpers.zoo_edges import HandRMSNorm

FEATURES, CLASSES, BATCH = 16, 4, 64


def _classes(scale: float = 1.0, seed: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Separable classes: the label is the sign pattern of the first two features."""
    g = torch.Generator().manual_seed(seed)
    while True:
        x = torch.randn(BATCH, FEATURES, generator=g)
        yield x * scale, (x[:, 0] > 0).long() + 2 * (x[:, 1] > 0).long()


def _zero(layer: nn.Linear) -> nn.Linear:
    nn.init.zeros_(layer.weight)
    nn.init.zeros_(layer.bias)
    return layer


def _exp_cross_entropy(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy by hand: log(exp(z_y) / sum exp(z)), no max subtracted. Under CPU autocast
    the logits are fp16 and so is exp, whose output overflows past an input of 11.09."""
    e = logits.exp()
    return -(e.gather(1, y[:, None]) / e.sum(1, keepdim=True)).log().mean()


def growing_exp_loss(seed: int = 0) -> Subject:
    """An MLP with a zero-initialised head on a separable task: its logits grow as it learns,
    nothing bounds them, under the hand-written exp of `_exp_cross_entropy`."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), _zero(nn.Linear(64, CLASSES)))
    return Subject(model, _classes(scale=8.0), _exp_cross_entropy)


class _NormedHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, CLASSES))
        self.norm = nn.LayerNorm(CLASSES, elementwise_affine=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.body(x))  # logits of unit scale, whatever the weights do


def flat_exp_loss(seed: int = 0) -> Subject:
    """The control: the same hand-written exp on logits a LayerNorm holds at unit scale."""
    torch.manual_seed(seed)
    return Subject(_NormedHead(), _classes(scale=8.0), _exp_cross_entropy)


class _ClassAttention(nn.Module):
    """Cross-attention of each input (raw units) to learned class keys, initialised at zero, its
    softmax written by hand (exp / sum exp, no max taken): the attention logits grow as the
    queries and keys align, and fp16's exp overflows past 11.09."""

    def __init__(self, width: int = 32):
        super().__init__()
        self.query = nn.Linear(FEATURES, width)
        self.keys = nn.Parameter(torch.zeros(CLASSES, width))
        self.values = nn.Parameter(torch.eye(CLASSES))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e = (self.query(x) @ self.keys.T).exp()
        return (e / e.sum(-1, keepdim=True)) @ self.values


def _attended_loss(probabilities: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.nll_loss(probabilities.clamp_min(1e-4).log(), y)


def growing_attention(seed: int = 0) -> Subject:
    torch.manual_seed(seed)
    return Subject(_ClassAttention(), _classes(scale=10.0), _attended_loss)


class _Penalised(nn.Module):
    """A zero-initialised hidden layer of 512 units, times a gain of 10, whose activations are
    also returned for an activity penalty."""

    GAIN = 10.0

    def __init__(self, width: int = 512):
        super().__init__()
        self.hidden = _zero(nn.Linear(FEATURES, width))
        self.head = nn.Linear(width, CLASSES)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = self.hidden(x) * self.GAIN
        return self.head(a), a


def _penalised_loss(out: tuple[torch.Tensor, torch.Tensor], y: torch.Tensor) -> torch.Tensor:
    logits, a = out
    # The mean square as sum / numel, with a weight too small to hold the activations back: the
    # sum of 64 x 512 squares grows as a square of the activations.
    return nn.functional.cross_entropy(logits, y) + 1e-6 * a.pow(2).sum() / a.numel()


def growing_penalty(seed: int = 0) -> Subject:
    torch.manual_seed(seed)
    return Subject(_Penalised(), _classes(), _penalised_loss)


class _EmbedNorm(nn.Module):
    """A zero-initialised embedding of raw inputs, times a gain of 10, under a hand-written
    RMSNorm whose square overflows fp16 once an entry passes 256 (its eps of 1 keeps the
    gradient of the zero embedding it follows inside fp16 at the start)."""

    GAIN = 10.0

    def __init__(self, width: int = 64):
        super().__init__()
        self.embed = _zero(nn.Linear(FEATURES, width))
        self.norm = HandRMSNorm(eps=1.0)
        self.head = nn.Sequential(nn.Linear(width, 64), nn.ReLU(), nn.Linear(64, CLASSES))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.embed(x) * self.GAIN))


def growing_norm(seed: int = 0) -> Subject:
    torch.manual_seed(seed)
    return Subject(_EmbedNorm(), _classes(scale=100.0), nn.functional.cross_entropy)


GROWING = ("growing_exp_loss", "growing_attention", "growing_penalty", "growing_norm")
FLAT = ("flat_exp_loss",)
