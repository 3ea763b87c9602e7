"""torch.compile for the scenarios: a fresh compile per case, the count of graphs dynamo built,
and the upstream settings that make compiled code do what eager does.

torch._dynamo and torch._inductor are imported inside the functions: importing them takes
seconds, and every session imports this module (harness.records.torch_state reads its
flush-to-zero switch), most of which never compile anything.
"""

from __future__ import annotations

import contextlib
import importlib
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

# What torch.compile is measured with. aot_eager runs dynamo's graph through AOTAutograd (the
# joint forward-backward graph, the autocast it is traced under) and then runs ATen's eager
# kernels; inductor adds its own code generation and fusion. A difference both show comes from
# dynamo or AOTAutograd, one only inductor shows comes from inductor.
BACKENDS = ("aot_eager", "inductor")


def fresh(
    fn: Callable, backend, *, dynamic: bool | None = None, fullgraph: bool = True
) -> Callable:
    """`fn` compiled anew with `backend` (a name, or a backend callable). Dynamo's caches are
    reset first, so that a case never runs a graph an earlier case compiled. Inductor's on-disk
    caches stay, as they do between a user's processes: they are keyed by the graph (a key that
    left the autocast dtype out on torch 2.9 to 2.11: scenarios/test_compiled_amp.py names it).
    fullgraph, so that a graph break is an error instead of a part of `fn` silently run
    eagerly; `fullgraph=False` for a user's model, compiled as its owner would, graph breaks
    and all."""
    import torch._dynamo

    torch._dynamo.reset()
    return torch.compile(fn, backend=backend, fullgraph=fullgraph, dynamic=dynamic)


def casting_backend(target: Callable, dtype: torch.dtype, backend: str = "aot_eager") -> Callable:
    """A torch.compile backend that casts every output of calls to `target` (a torch function
    as dynamo records it: torch.mm) to `dtype` inside the graph, then compiles with `backend`:
    a compiled op whose dtype is broken, for the negative controls of comparisons with eager."""
    import torch._dynamo

    def compile_graph(gm: torch.fx.GraphModule, example_inputs):
        for node in list(gm.graph.nodes):
            if node.op == "call_function" and node.target is target:
                with gm.graph.inserting_after(node):
                    cast = gm.graph.call_method("to", (node, dtype))
                node.replace_all_uses_with(cast, delete_user_cb=lambda user, c=cast: user is not c)
        gm.recompile()
        return torch._dynamo.lookup_backend(backend)(gm, example_inputs)

    return compile_graph


def error_line(exc: BaseException) -> str:
    """An exception in one line: its type and first line, and the error a compiler wrapper
    (BackendCompilerFailed: "backend='inductor' raised:") carries on its next line."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = " ".join(lines[:2] if lines and lines[0].endswith("raised:") else lines[:1])
    return f"{type(exc).__name__}: {text[:200]}"


def graphs_compiled() -> int:
    """How many graphs dynamo has compiled in this process so far (a recompile adds one)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


# float32's smallest subnormal: flushed to zero by a product where the thread flushes denormals.
_SUBNORMAL = 2.0**-149


def flushes_denormals() -> bool:
    """Whether this thread flushes float32 subnormals to zero (torch.set_flush_denormal has no
    getter: a subnormal times 1 says)."""
    tiny = torch.full((1,), _SUBNORMAL, dtype=torch.float32, device="cpu")
    return torch.mul(tiny, 1.0).item() == 0.0


@contextlib.contextmanager
def denormals_kept() -> Iterator[list[bool]]:
    """Leaves the thread's flush-denormal mode as the block found it, and says (the list it
    gives holds one bool once the block ends) whether the block changed it. torch 2.4's
    inductor builds its CPU kernels with -ffast-math, whose start-up code turns flush-to-zero
    on for the process when a kernel is loaded (pytorch/pytorch#126848, #135758; 2.5 builds
    without it, #133842): a compiled call changes eager arithmetic after it."""
    before, changed = flushes_denormals(), []
    try:
        yield changed
    finally:
        changed.append(flushes_denormals() != before)
        torch.set_flush_denormal(before)


def cpp_compiler() -> tuple[str | None, str]:
    """The C++ compiler inductor would build CPU kernels with, and where it was looked for:
    the names of torch._inductor.config.cpp.cxx (CXX, else g++; None there means a compiler
    installed from conda, only with TORCH_INDUCTOR_INSTALL_GXX) looked up on PATH."""
    from torch._inductor import config

    names = [name for name in config.cpp.cxx if name]
    found = next((path for path in map(shutil.which, names) if path), None)
    return found, " or ".join(names) or "no name"


@dataclass(frozen=True)
class Setting:
    """An upstream switch that makes compiled code do something eager does, and the release
    that introduced it (where it is absent, the evidence says so)."""

    config: str  # the config module: "torch._functorch.config"
    name: str  # its attribute: "backward_pass_autocast"
    value: object  # what restores eager's behaviour
    restores: str  # what of eager's it restores, in words
    source: str  # the upstream issue or pull request that says so

    @property
    def label(self) -> str:
        return f"{self.config}.{self.name}={self.value!r}"

    def available(self) -> bool:
        return hasattr(importlib.import_module(self.config), self.name)

    @contextlib.contextmanager
    def applied(self) -> Iterator[None]:
        """The setting in force inside the block, its previous value back after it."""
        module = importlib.import_module(self.config)
        with module.patch(**{self.name: self.value}):
            yield


# AOTAutograd traces a compiled region's backward under the autocast state its forward ran in
# ("same_as_forward", the default since the switch came in 2.9; before it, that was the only
# behaviour), while eager's backward runs in the state backward() is called in: outside
# autocast, as torch.amp's docs recommend.
BACKWARD_OUTSIDE_AUTOCAST = Setting(
    "torch._functorch.config",
    "backward_pass_autocast",
    "off",
    "a backward run outside autocast, as eager's is",
    "pytorch/pytorch#156356 (the switch), #153044 and #179804 (the mismatch)",
)
# Inductor fuses a chain of low-precision ops and keeps the intermediates in float32 where
# eager rounds each op's output to the low dtype; this mode keeps eager's roundings.
EAGER_ROUNDING = Setting(
    "torch._inductor.config",
    "emulate_precision_casts",
    True,
    "eager's rounding of each intermediate to the low dtype",
    "pytorch/pytorch#131595 (the mode), #150638 and #179561 (the rounding lost)",
)
# AOTAutograd's cache of compiled graphs keyed a graph with an autocast region of its own by
# whether autocast was on, not by its dtype, on 2.9 to 2.11: a later compile under float16 was
# served the graph compiled under bfloat16. Off, every compile traces its own graph.
NO_AUTOGRAD_CACHE = Setting(
    "torch._functorch.config",
    "enable_autograd_cache",
    False,
    "a graph traced for the call's own autocast dtype",
    "pytorch/pytorch#181564 (the autocast dtype added to the cache key, for 2.12)",
)
