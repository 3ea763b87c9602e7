"""The CPU kernel levels a hardware class can name, lowest first, without torch: the readers of
baselines (harness.reports.nearest) order CPU classes by them, harness.lab.machine.cpu reads
the level in force from torch and oneDNN."""

# VNNI (8-bit integer dot products) does not change a float16 or bfloat16 result, so it names no
# level of its own.
LEVELS = ("sse41", "avx", "avx2", "avx512", "avx512-bf16", "avx512-fp16", "amx", "amx-fp16")


def level_rank(level: str) -> int:
    """A level's place in LEVELS (higher is more); -1 for a level not on the list."""
    return LEVELS.index(level) if level in LEVELS else -1
