"""Small deterministic models, sized by a target parameter count.

Each family has one width knob (MLP hidden size, CNN channels, transformer d_model) and a fixed
depth. Its parameter count is a quadratic in the width, written out as a formula, so the width
for any target, up to 1e9 parameters and beyond, is solved for without building the model:

    spec = plan("transformer", 1_000_000_000)    # width and exact count, nothing allocated
    model = build("mlp", 100_000, seed=0)        # the model itself
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from harness.common.errors import HarnessError, closest

TOLERANCE = 0.1  # the largest relative gap between the target and the built count
HEAD_MULTIPLE = 8  # attention head sizes, where the target allows: tensor-core friendly


def head_size(spec: Plan) -> int | None:
    """The width of one attention head of a transformer plan; None for other kinds."""
    heads = spec.options.get("heads")
    return spec.width // heads if heads else None


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# --- MLP: Linear/GELU stack for classification ----------------------------------------------


def _mlp_count(width: int, input_dim: int, classes: int, depth: int) -> int:
    # `depth` hidden layers: input -> width, (depth - 1) x width -> width, width -> classes.
    return (input_dim + 1) * width + (depth - 1) * (width + 1) * width + (width + 1) * classes


def _mlp(width: int, input_dim: int, classes: int, depth: int) -> nn.Module:
    layers: list[nn.Module] = [nn.Linear(input_dim, width), nn.GELU()]
    for _ in range(depth - 1):
        layers += [nn.Linear(width, width), nn.GELU()]
    return nn.Sequential(*layers, nn.Linear(width, classes))


# --- CNN: ResNet-style, with BatchNorm -------------------------------------------------------


def _cnn_count(width: int, in_channels: int, classes: int, blocks: int) -> int:
    # Convolutions feed BatchNorm and carry no bias; each BatchNorm has a weight and a bias.
    stem = 9 * in_channels * width + 2 * width
    block = 2 * (9 * width * width + 2 * width)
    return stem + blocks * block + (width + 1) * classes


class _ResidualBlock(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.conv1 = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(x + self.bn2(self.conv2(y)))


def _cnn(width: int, in_channels: int, classes: int, blocks: int) -> nn.Module:
    # One width and no downsampling keep the count a plain quadratic in the width; the global
    # pool makes the model work for any image size.
    return nn.Sequential(
        nn.Conv2d(in_channels, width, 3, padding=1, bias=False),
        nn.BatchNorm2d(width),
        nn.ReLU(),
        *(_ResidualBlock(width) for _ in range(blocks)),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(width, classes),
    )


# --- Transformer: GPT-style decoder for next-token prediction -------------------------------


def _transformer_count(width: int, vocab: int, seq_len: int, layers: int, heads: int | None) -> int:
    # Per block: two LayerNorms (4d), qkv (3d^2 + 3d), out projection (d^2 + d), MLP d -> 4d -> d
    # (8d^2 + 5d). The head is an untied d x vocab matrix without bias. The number of heads
    # splits the same weights differently and does not change the count.
    block = 12 * width * width + 13 * width
    return (vocab + seq_len) * width + layers * block + 2 * width + width * vocab


class _CausalSelfAttention(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, width = x.shape
        q, k, v = (
            t.view(batch, tokens, self.heads, width // self.heads).transpose(1, 2)
            for t in self.qkv(x).split(width, dim=-1)
        )
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(batch, tokens, width))


class _Block(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.attention = _CausalSelfAttention(width, heads)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Pre-LayerNorm residual blocks, as GPT-2.
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class _GPT(nn.Module):
    def __init__(self, width: int, vocab: int, seq_len: int, layers: int, heads: int):
        super().__init__()
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(seq_len, width)
        self.blocks = nn.Sequential(*(_Block(width, heads) for _ in range(layers)))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        # GPT-2's initialisation: PyTorch's N(0, 1) embeddings would dwarf the small weights.
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Token ids (batch, tokens) -> next-token logits (batch, tokens, vocab)."""
        positions = torch.arange(x.shape[1], device=x.device)
        h = self.blocks(self.tokens(x) + self.positions(positions))
        return self.head(self.norm(h))


@dataclass(frozen=True)
class _Family:
    defaults: dict[str, int | None]  # the data tasks' defaults (harness.lab.data) and the depth
    count: Callable[..., int]  # (width, **options) -> exact parameter count
    make: Callable[..., nn.Module]  # (width, **options) -> the model


FAMILIES = {
    "mlp": _Family({"input_dim": 32, "classes": 10, "depth": 3}, _mlp_count, _mlp),
    "cnn": _Family({"in_channels": 3, "classes": 10, "blocks": 3}, _cnn_count, _cnn),
    "transformer": _Family(
        {"vocab": 64, "seq_len": 32, "layers": 4, "heads": None}, _transformer_count, _GPT
    ),
}


@dataclass(frozen=True)
class Plan:
    """A model's shape, solved from a target parameter count, before anything is allocated."""

    kind: str
    width: int
    options: dict[str, int]  # every option of the family, defaults filled in
    params: int  # the exact parameter count of the model `build` makes from this plan


def plan(kind: str, params: int, **options: int) -> Plan:
    """The width whose model is closest to `params` parameters, from the formula alone."""
    family = _family(kind)
    unknown = sorted(set(options) - set(family.defaults))
    if unknown:
        raise HarnessError(
            f"{kind}: unknown option(s) {', '.join(unknown)}: known are "
            f"{', '.join(family.defaults)} (closest: {closest(unknown[0], family.defaults)})"
        )
    bad = {name: value for name, value in options.items() if not _positive_int(value)}
    if bad or not _positive_int(params):
        raise HarnessError(
            f"{kind}: params and options must be positive integers, got params={params!r}"
            + "".join(f", {name}={value!r}" for name, value in bad.items())
        )
    resolved = {**family.defaults, **options}

    # count(w) = a w^2 + b w + c: three evaluations of the formula give a, b and c.
    counts = [family.count(w, **resolved) for w in (0, 1, 2)]
    c = counts[0]
    a = (counts[2] - 2 * counts[1] + c) / 2
    b = counts[1] - c - a
    if a > 0:
        ideal = (-b + math.sqrt(b * b + 4 * a * (params - c))) / (2 * a) if params > c else 0.0
    else:  # a single hidden layer: the count is linear in the width
        ideal = (params - c) / b

    multiples = [resolved.get("heads") or 1]  # d_model must split evenly into the heads
    if "heads" in resolved and resolved["heads"] is None:
        # Unless given, one attention head per ~64 channels, as GPT-2 (768 wide, 12 heads), and
        # heads a multiple of 8 wide where a width within TOLERANCE allows it: tensor cores and
        # the fused attention kernels work in multiples of 8 (an odd head size falls back to
        # slower kernels, which would bias a speed comparison between sizes).
        resolved["heads"] = max(1, round(ideal / 64))
        multiples = [HEAD_MULTIPLE * resolved["heads"], resolved["heads"]]
    for multiple in multiples:
        below = max(multiple, math.floor(ideal / multiple) * multiple)
        width = min(
            (below, below + multiple), key=lambda w: abs(family.count(w, **resolved) - params)
        )
        count = family.count(width, **resolved)
        if abs(count - params) <= TOLERANCE * params:
            break
    if abs(count - params) > TOLERANCE * params:
        raise HarnessError(
            f"{kind}: no width gets within {TOLERANCE:.0%} of {params:,} parameters with "
            f"{resolved} (closest: {count:,} at width {width}); change the target or the options"
        )
    return Plan(kind, width, resolved, count)


def build(kind: str, params: int, seed: int = 0, **options: int) -> nn.Module:
    """A freshly initialised model of about `params` parameters, the same for the same seed."""
    spec = plan(kind, params, **options)
    # Seed a fork of the CPU generator: the weights depend on `seed` alone and the caller's
    # random stream is left exactly where it was.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return FAMILIES[kind].make(spec.width, **spec.options)


def _positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _family(kind: str) -> _Family:
    try:
        return FAMILIES[kind]
    except KeyError:
        raise HarnessError(
            f"unknown model kind {kind!r}: known kinds are {', '.join(FAMILIES)} "
            f"(closest: {closest(kind, FAMILIES)})"
        ) from None
