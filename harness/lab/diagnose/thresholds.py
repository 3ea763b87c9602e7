"""The thresholds the rules of `amp-harness diagnose` judge by (harness.lab.diagnose.rules), each
with the measurement it was set from, and fp16's largest value they measure against;
docs/diagnose.md lists each rule with its threshold.
"""

import torch

FP16_MAX = torch.finfo(torch.float16).max  # 65504
# An op whose fp32 peak comes within this factor of 65504 is flagged: activations grow as
# training goes on, and a few steps see only its start (t5 with its feed-forward 3x below
# 65504 overflowed at step 426 of 1000: docs/diagnose.md).
HEADROOM_FACTOR = 8.0
# The forecast looks this many steps ahead (--horizon).
HORIZON = 1000
# The forecast extends an op's growth only where it is steady over at least FORECAST_MIN_STEPS
# steps: its last peak at least GROWTH_MIN_RATIO times its first, every step's peak above the
# first step's, and Kendall's tau of the peaks against the steps at least GROWTH_TAU (a batch's
# largest value jitters: 8 independent draws reach a tau of 0.5 and stay above the first in
# 2.4% of cases, so the ratio, which a jitter of a few percent does not reach, is needed). The
# fitted curve's power is held to at most MAX_POWER (a square's growth: a pow, a sum of squares,
# of an activation growing in a straight line). Ops whose input, not output, is extended: exp
# overflows fp16 past an input of ln 65504 = 11.09, with an output far under 65504 until then.
FORECAST_MIN_STEPS = 4
GROWTH_TAU = 0.5
GROWTH_MIN_RATIO = 1.5
MAX_POWER = 2.0
# A gain that slowed over the steps (a fitted power under 1) is extended as a straight line (the
# forecast's step) and as it slowed, its power held to at least MIN_POWER (the far end of the
# range said). Over the growth models of tests/helpers/zoo_growth.py the straight line ran
# ahead of training by 1.3x to 1.9x: the step is the start of the range, not a date.
MIN_POWER = 0.5
EXP_OPS = ("exp", "exp2", "expm1")
# Fp16 without loss scaling is flagged when, at the last step, more than this share of the
# gradient would be lost to fp16's underflow: of the non-zero entries under AdamW (its update
# is scale-free per entry), of the squared norm under SGD (a tiny gradient is a tiny update).
UNDERFLOW_MAX = 0.01
# ...unless the share stays under UNDERFLOW_SEVERE and the recipe's first gradient keeps fp32's
# direction (cosine at least COSINE_KEPT): a BatchNorm CNN flushes 6% of its entries, all tiny,
# and trains as fp32 does over 300 steps; a loss x1e-6 flushes 100% and learns nothing.
UNDERFLOW_SEVERE = 0.25
COSINE_KEPT = 0.99
# A recipe whose first gradient (same weights, same batch as fp32's) has a cosine under this
# with fp32's has lost the gradient's direction to precision (attention logits of 1e5 in bf16:
# cosine 0.01, and the model never learns).
COSINE_MIN = 0.5
# Drift, at the end of the window (its last quarter, at least 2 steps), either way (better or
# worse): a finding only beyond each of: DRIFT_MAX of fp32's loss, NOISE_FACTOR times fp32's own
# seed spread (fp32 re-run from weights initialised under other seeds: what a user's rerun
# varies, harness.lab.diagnose.runs.seed_spread), and LOSS_FLOOR times fp32's first loss (a
# floor in the loss's own units: a relative gap to a loss near zero means nothing).
DRIFT_MAX = 0.05
NOISE_FACTOR = 2.0
LOSS_FLOOR = 1e-3
# A half model's AdamW whose fp16 second moments are 0 on more than this share of the entries
# that have a first moment is flagged (those entries step by m/eps). Set between the zoo's
# largest share that trained as fp32 over 150 steps (bn_raw with eps 1e-4: 10.6% at step 8;
# healthy 0.2%, mlp_mse 5.0%) and its smallest that did not (attn_hot: 29.2%; gpt2, llama,
# bert, t5: 69-84%): docs/diagnose-zoo-table.md. 13 models: a calibration, not a law.
MOMENTS_LOST_MAX = 0.2
# The GradScaler's scale falling under 1 means fp16's gradients overflow before any scaling.
SCALE_FLOOR = 1.0
# GradScaler starts at 65536, a guess, and halves on each overflow until the gradients fit: those
# back-offs are calibration wherever they fall (an 8-16-1 MLP backs off at steps 4 and 5 and
# trains as fp32). Once it has taken a step at a backed-off scale it has settled; a skip at or
# below a settled scale recurs. One recurrence is one more halving, as calibration does (its
# growth_interval, 2000, keeps the scale from growing back in a short window), so recurrences are
# a finding from RECURRENT_MIN of them, on more than RECURRENT_SHARE of the steps since it
# settled: at one in 8 the scale halves every 8 steps and leaves 65536 for under 1 (16
# halvings) within about 128 steps.
RECURRENT_MIN = 2
RECURRENT_SHARE = 1 / 8
# A scaler that skipped the look's first steps, each halving its scale (GradScaler's documented
# backoff_factor, 0.5, from its init_scale, 65536), with every loss finite (the scale multiplies
# the backward only: a forward's inf is no calibration), is calibrating its guess: the initial
# scale is meant to be too large, its first few iterations' gradients overflow and each halves
# it until one fits, and from then on growth_interval (2000) keeps skips rare (GradScaler's
# author, discuss.pytorch.org/t/model-training-with-automatic-mixed-precision-is-not-learning/
# 75756; those first iterations skip optimizer.step(): pytorch/pytorch#55585). It took at most
# half of a short look's steps without being unstable (bert_naive_softmax's loss outside
# autocast: 5 skips from 65536 to 2048, then steps, trains as fp32 over 150 steps). It has
# calibrated once it took CALIBRATED_TAKEN steps after its back-offs (the loss of the second is
# the first that the stepped weights computed); with fewer, the look cannot tell.
BACKOFF = 0.5
CALIBRATED_TAKEN = 2
