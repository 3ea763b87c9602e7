"""Factories for `amp-harness diagnose`, as docs/diagnose.md runs them: the harness's own three
models on their synthetic tasks, and one model built to break fp16.

    amp-harness diagnose harness.lab.diagnose.examples:mlp
    amp-harness diagnose harness.lab.diagnose.examples:fragile

Each returns a harness.lab.diagnose.Subject: the model, endless batches, the loss.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from harness.lab.data import make_task
from harness.lab.diagnose import Subject
from harness.lab.models import build

BATCH = 64


def _harness_model(kind: str, params: int) -> Subject:
    task = make_task(kind, seed=0)
    model = build(kind, params, seed=0, **task.model_options)
    return Subject(model, task.batches(BATCH, seed=0), task.loss)


def mlp() -> Subject:
    return _harness_model("mlp", 100_000)


def cnn() -> Subject:
    return _harness_model("cnn", 20_000)  # fp16 convolutions are slow on the CPU


def transformer() -> Subject:
    return _harness_model("transformer", 100_000)


class Fragile(nn.Module):
    """An MLP whose middle layer, `amplifier`, outputs values beyond fp16's 65504 (its weights
    are scaled by AMPLIFY): finite in fp32 and bf16, inf in fp16. A LayerNorm after it brings the
    values back, so that fp32 trains normally."""

    AMPLIFY = 1e5

    def __init__(self, inputs: int = 16, width: int = 64, classes: int = 4):
        super().__init__()
        self.inp = nn.Linear(inputs, width)
        self.act = nn.ReLU()
        self.amplifier = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, classes)
        with torch.no_grad():
            self.amplifier.weight.mul_(self.AMPLIFY)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.amplifier(self.act(self.inp(x)))))


def _fragile_batches(seed: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    while True:
        x = torch.randn(BATCH, 16, generator=generator)
        yield x, (x[:, 0] > 0).long() + 2 * (x[:, 1] > 0).long()  # four learnable classes


def fragile() -> Subject:
    torch.manual_seed(0)
    return Subject(Fragile(), _fragile_batches(), nn.functional.cross_entropy)
