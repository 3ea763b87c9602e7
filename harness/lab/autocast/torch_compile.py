"""torch.compile for the scenarios: a fresh compile per case, the count of graphs dynamo built,
and the upstream settings that make compiled code do what eager does.

torch._dynamo and torch._inductor are imported inside the functions: importing them takes
seconds, and every session imports this module (harness.records.torch_state reads its
flush-to-zero switch), most of which never compile anything.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch

# What torch.compile is measured with. aot_eager runs dynamo's graph through AOTAutograd (the
# joint forward-backward graph, the autocast it is traced under) and then runs ATen's eager
# kernels; inductor adds its own code generation and fusion. A difference both show comes from
# dynamo or AOTAutograd, one only inductor shows comes from inductor.
BACKENDS = ("aot_eager", "inductor")
INDUCTOR = "inductor_compile"  # the capability inductor's arm needs (harness.lab.devices)


def backends_here(amp_device, backends: tuple[str, ...] = BACKENDS) -> tuple[list[str], str]:
    """The backends of `backends` measured on this machine: aot_eager always; inductor where
    the machine has what it builds with (else the note says why: no C++ compiler), and a
    sentence for the evidence on what was left out. Where inductor is expected and broken,
    DeviceInfo.optional raises: the test fails as a capability regression."""
    lack = amp_device.optional(INDUCTOR) if "inductor" in backends else None
    found = [b for b in backends if b != "inductor" or lack is None]
    return found, f" Inductor not measured: {lack.reason}." if lack else ""


def fresh(
    fn: Callable, backend, *, dynamic: bool | None = None, fullgraph: bool = True
) -> Callable:
    """`fn` compiled anew with `backend` (a name, or a backend callable). Dynamo's caches are
    reset first, so that a case never runs a graph an earlier case compiled. Inductor's on-disk
    caches are another matter (AOTAutograd's keyed no autocast dtype before 2.13): a compiled
    test gets a fresh one of its own with fresh_cache_dir.
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


_CACHES: list[str] = []  # the folder holding every fresh cache, made once per process


@contextlib.contextmanager
def fresh_cache_dir() -> Iterator[str]:
    """A fresh inductor cache directory (TORCHINDUCTOR_CACHE_DIR, which holds the AOTAutograd
    cache too) for the block: nothing compiled earlier, by another test or process, is served.

    Kept until the process ends, not removed after the block: inductor keeps paths into the
    cache it compiled with (2.4's precompiled header), and a later compile elsewhere that
    includes them would fail on a folder gone."""
    if not _CACHES:
        _CACHES.append(tempfile.mkdtemp(prefix="amp_inductor_cache_"))
        atexit.register(shutil.rmtree, _CACHES[0], ignore_errors=True)
    before = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = path = tempfile.mkdtemp(dir=_CACHES[0])
    try:
        yield path
    finally:
        if before is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = before


def autograd_cache_on() -> bool:
    """Whether AOTAutograd's cache of compiled graphs is on (off by default before 2.7, on
    since: pytorch/pytorch#141981; absent in releases that predate it)."""
    from torch._functorch import config

    return bool(getattr(config, "enable_autograd_cache", False))


def autograd_cache_counts() -> dict[str, int]:
    """AOTAutograd's cache counters so far in this process: hit, miss, bypass (a graph the
    cache refuses, e.g. one holding an autocast region of its own on 2.12 on)."""
    from torch._dynamo.utils import counters

    found = counters["aot_autograd"]
    return {k: int(found[f"autograd_cache_{k}"]) for k in ("hit", "miss", "bypass")}


@dataclass(frozen=True)
class Compiled:
    """One compile of `linear_compiles`: the dtype its Linear computed in, and what it did with
    AOTAutograd's cache."""

    dtype: torch.dtype
    counts: dict[str, int]  # the compile's cache hits, misses, bypasses

    def __str__(self) -> str:
        counted = ", ".join(f"{n} {c}" for n, c in self.counts.items() if c) or "no cache use"
        return f"{str(self.dtype).removeprefix('torch.')} ({counted})"


def linear_compiles(
    device: torch.device, dtypes: tuple[torch.dtype, ...], setting: Setting | None = None
) -> list[Compiled]:
    """One Linear compiled by inductor afresh (dynamo reset, same process and cache) under each
    autocast dtype in turn, a training step each. A plain Linear: a model with an autocast
    region of its own is one the cache refuses from 2.12 (a bypass), so it never meets the key;
    a repeated dtype shows the cache was reached (a hit)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        layer = torch.nn.Linear(8, 8).to(device)
        x = torch.randn(4, 8, device=device)
    found = []
    with setting.applied() if setting else contextlib.nullcontext():
        for low in dtypes:
            before = autograd_cache_counts()
            call = fresh(layer, "inductor")
            with torch.autocast(device.type, dtype=low):
                out = call(x.detach().clone().requires_grad_())
            out.float().sum().backward()
            after = autograd_cache_counts()
            found.append(Compiled(out.dtype, {k: after[k] - before[k] for k in after}))
    return found


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


# Loads the library and says whether a subnormal result flushes to zero: a double's, which the
# SSE unit computes under the same MXCSR flags as float32's (Python floats; no torch needed).
_LOADS_AND_FLUSHES = (
    "import ctypes, sys; tiny = float(sys.argv[2]); kept = tiny * 0.5 != 0.0; "
    "ctypes.CDLL(sys.argv[1]); print(int(kept and tiny * 0.5 == 0.0))"
)


@cache
def fast_math_flushes() -> tuple[bool | None, str]:
    """Whether a shared library the C++ compiler builds with -ffast-math turns flush-to-zero on
    for the process that loads it (gcc links crtfastmath.o into it, whose start-up code sets
    FTZ/DAZ: what 2.4's and 2.5's inductor kernels do, pytorch/pytorch#126848; GCC 13 stopped
    linking it into shared libraries, clang never did), and how that was found. None where it
    could not be measured (no compiler, a build that failed). Built and loaded in a child
    process, so that this one's mode is left alone."""
    found, names = cpp_compiler()
    if found is None:
        return None, f"no C++ compiler ({names})"
    with tempfile.TemporaryDirectory(prefix="amp_fast_math_") as folder:
        source, library = Path(folder, "probe.cpp"), Path(folder, "probe.so")
        source.write_text('extern "C" double probe(double x) { return x * 0.5; }\n')
        build = [found, "-shared", "-fPIC", "-O2", "-ffast-math", str(source), "-o", str(library)]
        built = subprocess.run(build, capture_output=True, text=True, timeout=120)
        if built.returncode:
            return None, f"{' '.join(build)} failed: {built.stderr.strip()[:200]}"
        run = [sys.executable, "-c", _LOADS_AND_FLUSHES, str(library), repr(2.0**-1022)]
        loaded = subprocess.run(run, capture_output=True, text=True, timeout=120)
        if loaded.returncode or loaded.stdout.strip() not in ("0", "1"):
            return None, f"loading the probe failed: {loaded.stderr.strip()[:200]}"
    flushes = loaded.stdout.strip() == "1"
    verb = "turns" if flushes else "leaves"
    return flushes, f"{found} -ffast-math: a shared library {verb} flush-to-zero on when loaded"


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
# AOTAutograd's cache of compiled graphs keyed a graph by whether autocast was on, not by its
# dtype, wherever it is on (by default from 2.7; see KB-AOT-CACHE-AUTOCAST-DTYPE for the
# releases): a later compile under float16 was served the graph compiled under bfloat16. Off,
# every compile traces its own graph; on, where it is off by default, the key can be measured.
CACHE_ON = Setting(
    "torch._functorch.config",
    "enable_autograd_cache",
    True,
    "AOTAutograd's cache, off by default before 2.7",
    "pytorch/pytorch#141981 (the cache turned on for open source)",
)
NO_AUTOGRAD_CACHE = Setting(
    "torch._functorch.config",
    "enable_autograd_cache",
    False,
    "a graph traced for the call's own autocast dtype",
    "pytorch/pytorch#181564 (the autocast dtype added to the cache key, shipped in 2.13)",
)
