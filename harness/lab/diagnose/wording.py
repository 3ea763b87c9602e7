"""How the reasons of diagnose's rules name what they point at: an op's module (and the modules a
fix keeps in fp32), a peak's distance from fp16's 65504, and the autocast op lists a run was
measured under (and where the other device's lists put an op in float32).
"""

from __future__ import annotations

from harness.lab.autocast import docs as autocast_docs
from harness.lab.diagnose.thresholds import FP16_MAX


def module_of(op: str) -> str:
    return op.rpartition(":")[0]


def modules_named(ops: list[str]) -> list[str]:
    """The modules to keep in fp32 for these ops; an op in the model's own forward is named."""
    named = []
    for op in ops:
        module, name = module_of(op), op.rpartition(":")[2]
        if module == "model":
            named.append(
                f"the {name} in the model's own forward (wrap it in "
                "torch.autocast(device_type, enabled=False) with fp32 inputs)"
            )
        elif module == "loss":
            named.append(
                f"the loss's {name} (the whole loss computed outside autocast, "
                "torch.autocast(device_type, enabled=False), on the outputs cast with .float(); "
                "cast inside autocast, its matmuls run in fp16 again: the code is below)"
            )
        else:
            named.append(module)
    return list(dict.fromkeys(named))


def fix_modules(ops: list[str]) -> tuple[str, ...]:
    """The submodules a fix keeps in fp32 for these ops (the root cannot be: that is fp32)."""
    return tuple(dict.fromkeys(module_of(k) for k in ops if module_of(k) not in ("model", "loss")))


def in_loss(ops: list[str]) -> bool:
    """Some of these ops are the loss's: the fix computes the loss in fp32 (fixes.loss_in_fp32)."""
    return any(module_of(k) == "loss" for k in ops)


def where(op: str) -> str:
    """An op in words: "exp in the loss", "exp in the model's own forward", "ff.wo's mm"."""
    module, name = module_of(op), op.rpartition(":")[2]
    if module == "loss":
        return f"{name} in the loss"
    if module == "model":
        return f"{name} in the model's own forward"
    return f"{module}'s {name}"


def margin(peak: float) -> str:
    """How far a peak |x| is from fp16's largest value, in words."""
    if peak >= FP16_MAX:
        return f"{peak / FP16_MAX:.2g}x fp16's largest value 65504"
    return f"{FP16_MAX / max(peak, 1e-30):.2g}x below fp16's 65504"


# --- the autocast policy a judgement was measured under -----------------------------------------


def autocast_policy(device_type: str, version: str) -> str:
    """Whose autocast op lists the runs followed, as the documentation of the release says."""
    documented = autocast_docs.documented(device_type, version)
    note = f"; {documented.note}" if documented.note else ""
    return (
        f"measured under {device_type.upper()} autocast's op lists (torch {documented.release}'s "
        f"documentation){note}"
    )


def other_device_note(op: str, device_type: str, version: str) -> str:
    """Where the other device's autocast documents `op` in float32: its hazard is this device's."""
    other = "cuda" if device_type == "cpu" else "cpu"
    name = op.rpartition(":")[2]
    documented = autocast_docs.documented(other, version)
    spellings = {name, name.lstrip("_"), name.removeprefix("native_")}  # aten's _softmax, ...
    if not any(autocast_docs.listed(n, documented, other) == "float32" for n in spellings):
        return ""
    return (
        f"on {other.upper()}, autocast runs {name.lstrip('_')} in float32 (torch "
        f"{documented.release}'s documented lists): this hazard is the {device_type.upper()}'s"
    )
