"""How many bytes one training step of the GPT-style transformer (harness.lab.models) holds at its
peak.

    spec = transformer_plan(1024, layers=4, vocab=8192, seq_len=512)
    estimate(spec, "amp-fp16", batch=4).total    # bytes, nothing allocated
    extrapolate_7b("fp32").static                  # ~107 GB: weights + grads + AdamW state

Training with AdamW, the memory is:
- static, held from step to step: weights, gradients, the two AdamW moments, all in the
  parameter dtype, plus one fp32 step count per parameter tensor. fp32 parameters, with or
  without autocast: 4 + 4 + 8 = 16 bytes/param; `half`: 2 + 2 + 4 = 8. (Rajbhandari et al.
  2020, ZeRO, arXiv:1910.02054, count 16 bytes/param for mixed-precision Adam too: fp16 weights
  and gradients 2 + 2, fp32 master weights and moments 12. Native AMP has no master copy: its
  parameters are the fp32 copy, and its gradients are fp32.)
- the autocast weight cache: autocast casts each fp32 weight to fp16/bf16 once per forward and
  caches the cast (torch.autocast docs; `cached_cast` in aten/src/ATen/autocast_mode.cpp); the
  linear layers save the copy for their backward, so 2 bytes per matmul weight stay alive until
  the backward reaches them.
- activations saved for the backward (below), and the loss's working set at the start of the
  backward. Their sum with the static part and the cache is the step's peak: it is reached at
  the start of the backward, where every saved tensor is still alive and the gradients (kept
  allocated between steps, zero_grad(set_to_none=False)) are too.
- fused AdamW (`fused=True`) updates in place; the default foreach AdamW also materialises
  sqrt(exp_avg_sq) for every parameter at once (torch/optim/adam.py, `_multi_tensor_adam`):
  a second, shorter peak of static + one parameter-sized buffer.

Activations per block, for t = batch x seq tokens, width h, a heads. Korthikanti et al. 2022
(arXiv:2205.05198, section 4.1) count sbh(34 + 5as/h) bytes for a 16-bit GPT block with dropout
and an explicit attention matrix. This model has no dropout (their 2 x 1-byte masks of the sbh
term go), uses scaled_dot_product_attention with a fused kernel (flash / memory-efficient: no
s x s matrix, only the output and a logsumexp are saved; Dao et al. 2022, arXiv:2205.14135: the
5as/h term goes), and keeps the residual stream in the parameter dtype (fp32 under autocast: the
sum of an fp32 residual and an fp16 branch is fp32). Tensors saved, in bytes per token:
- residual stream saved by the two LayerNorms: 2 x p x h        (p: parameter dtype bytes)
- LayerNorm outputs saved by qkv and fc1: 2 x c x h             (c: matmul dtype bytes; under
  autocast these are the fp16/bf16 casts, the fp32 LayerNorm outputs are freed)
- qkv output (q, k, v saved by attention): 3 x c x h; attention output (saved by the
  attention and by proj, one tensor): c x h; fc1 output saved by GELU: 4 x c x h; GELU output
  saved by fc2: 4 x c x h
- LayerNorm mean and rstd, fp32: 2 x 2 x 4; the attention logsumexp, fp32: 4 x a
so h(2p + 14c) + 16 + 4a bytes per token: 64h + ... in fp32, 36h + ... under autocast (the 34 of
Korthikanti - 2 dropout masks + 4 for the fp32 LayerNorm inputs), 32h + ... in `half`. After the
last block: the final LayerNorm's input (p x h) and the head's input (c x h).

The loss: the logits are cast to fp32 for the cross-entropy (autocast's fp32 list; the scenario
casts in every recipe). log_softmax saves its fp32 output (4 bytes per logit); at the start of
the backward the fp32 gradients of nll_loss and of log_softmax (4 + 4) join it: 12 x t x vocab.

Not counted: gradients of activations inside one block's backward (they replace saved tensors
as these are freed), cuBLAS and attention workspaces, allocator rounding. `activation_factor`
absorbs what the formula misses: fit it on one measured size (`fit_activation_factor`) and
validate it on the others.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.common.errors import HarnessError
from harness.lab import models, recipes

GB = 1e9  # decimal gigabytes, as the article's "24 GB" and "14 GB" (7e9 params x 2 bytes = 14 GB)
ADAMW = ("fused", "foreach")

# The "7B" configuration the article's claim is checked at: LLaMA-7B's width, depth, vocabulary
# and context (Touvron et al. 2023) in this GPT-style architecture (~6.7e9 parameters), trained
# with one 2048-token sequence per step, the smallest batch there is.
SEVEN_B = {"width": 4096, "layers": 32, "heads": 32, "vocab": 32000, "seq_len": 2048}
SEVEN_B_BATCH = 1


@dataclass(frozen=True)
class Breakdown:
    """Bytes of one training step's peak, by what holds them."""

    params: int
    grads: int
    optimizer: int  # the AdamW moments and step counts
    weight_cache: int  # autocast's low-precision copies of the matmul weights
    activations: int  # saved for the backward by the blocks, the final norm and the head
    logits: int  # the loss's fp32 working set at the start of the backward
    step_transient: int = 0  # foreach AdamW's sqrt(exp_avg_sq) buffers, alive during step()

    @property
    def static(self) -> int:
        """What training holds between steps (measure.state_bytes counts the same)."""
        return self.params + self.grads + self.optimizer

    @property
    def total(self) -> int:
        """The peak: the start of the backward, or foreach AdamW's step if that is higher."""
        return self.static + max(
            self.weight_cache + self.activations + self.logits, self.step_transient
        )

    @property
    def rest(self) -> int:
        return self.total - self.static


def transformer_plan(width: int, **options: int) -> models.Plan:
    """The plan of the transformer exactly `width` wide, one head per 64 channels unless `heads`
    is given (head size 64: the fused attention kernels' best case)."""
    options.setdefault("heads", max(1, width // 64))
    family = models.FAMILIES["transformer"]
    count = family.count(width, **{**family.defaults, **options})
    spec = models.plan("transformer", count, **options)
    if spec.width != width:
        raise HarnessError(
            f"transformer width {width} with {options}: the width must be a multiple of the "
            f"number of heads (the plan came out {spec.width} wide)"
        )
    return spec


def parameter_tensors(spec: models.Plan) -> int:
    """The transformer's parameter tensors: 12 per block (2 LayerNorms x 2, qkv x 2, proj x 2,
    fc1 x 2, fc2 x 2), two embeddings, the final LayerNorm's two, the head's one. AdamW keeps
    one fp32 step count per tensor beside its two moments (torch/optim/adam.py, `_init_group`)."""
    return 12 * spec.options["layers"] + 5


def estimate(
    spec: models.Plan,
    recipe: str,
    batch: int,
    seq_len: int | None = None,
    activation_factor: float = 1.0,
    adamw: str = "fused",
) -> Breakdown:
    """The peak bytes of one AdamW training step of `spec` under `recipe`, on `batch` sequences
    of `seq_len` tokens (default: the model's context length)."""
    if spec.kind != "transformer":
        raise HarnessError(f"the memory model covers the transformer, not {spec.kind!r}")
    if adamw not in ADAMW:
        raise HarnessError(f"adamw={adamw!r}: use one of {', '.join(ADAMW)}")
    r = recipes.get(recipe)
    p = _size(r.param_dtype)  # weights, gradients, AdamW moments, the residual stream
    c = _size(r.autocast_dtype or r.param_dtype)  # matmul inputs and outputs, GELU, attention
    h, n = spec.width, spec.params
    layers, vocab, heads = (spec.options[k] for k in ("layers", "vocab", "heads"))
    t = batch * (spec.options["seq_len"] if seq_len is None else seq_len)

    tensors = parameter_tensors(spec)
    # Matmul weights: qkv 3h^2, proj h^2, fc1 and fc2 4h^2 each per block, and the h x vocab head.
    # Embeddings and LayerNorms are not cast by autocast; the biases' casts are not saved.
    matmul_weights = 12 * h * h * layers + h * vocab

    per_block = t * h * (2 * p + 14 * c) + 16 * t + 4 * heads * t
    after_blocks = t * h * (p + c) + 8 * t
    return Breakdown(
        params=n * p,
        grads=n * p,
        optimizer=2 * n * p + 4 * tensors,
        weight_cache=c * matmul_weights if r.autocast_dtype is not None else 0,
        activations=round(activation_factor * (layers * per_block + after_blocks)),
        logits=12 * t * vocab,
        step_transient=n * p if adamw == "foreach" else 0,
    )


def fit_activation_factor(predicted: Breakdown, measured_peak: int) -> float:
    """The activation factor that makes `predicted` (estimated with factor 1) equal a measured
    peak reached at the start of the backward."""
    fixed = predicted.static + predicted.weight_cache + predicted.logits
    return (measured_peak - fixed) / predicted.activations


def seven_b() -> models.Plan:
    """The plan of the 7B configuration (SEVEN_B)."""
    return transformer_plan(**SEVEN_B)


def extrapolate_7b(recipe: str, activation_factor: float = 1.0, adamw: str = "fused") -> Breakdown:
    """The model's peak for training the 7B configuration: SEVEN_B, one 2048-token sequence."""
    return estimate(seven_b(), recipe, SEVEN_B_BATCH, None, activation_factor, adamw)


def _size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()
