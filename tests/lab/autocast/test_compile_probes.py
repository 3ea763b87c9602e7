"""harness.lab.autocast.torch_compile's probes: whether the C++ compiler's -ffast-math turns
flush-to-zero on in a process that loads its library (what 2.4's and 2.5's inductor kernels do
only where it does), told from the compiler's behaviour and not from its name or release; and
the fresh cache a compiled test gets."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from harness.lab.autocast import torch_compile


def _wrapper(tmp_path: Path, name: str, body: str) -> str:
    """A C++ compiler named `name`: g++ with its arguments rewritten by `body` (bash)."""
    script = tmp_path / name
    script.write_text(
        f'#!/bin/bash\nargs=()\nfor a in "$@"; do {body}; done\nexec g++ "${{args[@]}}"\n'
    )
    script.chmod(0o755)
    return str(script)


@pytest.fixture
def compiler():
    """Inductor's C++ compiler set to a wrapper of g++ (the probe's cache emptied around it).
    Slow: inductor's config takes seconds to import, and each probe builds a library."""
    if shutil.which("g++") is None:
        pytest.skip("no g++ to wrap")
    from torch._inductor import config

    with contextlib.ExitStack() as stack:

        def use(path: str) -> None:
            stack.enter_context(config.patch({"cpp.cxx": (None, path)}))
            torch_compile.fast_math_flushes.cache_clear()

        yield use
    torch_compile.fast_math_flushes.cache_clear()


@pytest.mark.slow
def test_a_compiler_that_links_crtfastmath_is_predicted_to_flush(compiler, tmp_path):
    found = subprocess.run(
        ["g++", "-print-file-name=crtfastmath.o"], capture_output=True, text=True
    )
    crt = found.stdout.strip()
    if not os.path.isabs(crt):  # g++ names the file back where it has none
        pytest.skip("this g++ ships no crtfastmath.o")
    compiler(
        _wrapper(tmp_path, "with-crt", f'args+=("$a"); [[ "$a" == -shared ]] && args+=({crt!r})')
    )
    flushes, how = torch_compile.fast_math_flushes()
    assert flushes is True, how
    assert "turns flush-to-zero on" in how


@pytest.mark.slow
def test_a_compiler_whose_fast_math_links_nothing_is_predicted_to_keep_denormals(
    compiler, tmp_path
):
    """The control: the same build without -ffast-math reaching the link (what clang and gcc
    13 on do for a shared library) leaves the mode alone, whatever g++ this machine has."""
    compiler(_wrapper(tmp_path, "without", '[[ "$a" == -ffast-math ]] || args+=("$a")'))
    flushes, how = torch_compile.fast_math_flushes()
    assert flushes is False, how


@pytest.mark.slow
def test_a_compiler_that_fails_is_unmeasured_not_guessed(compiler, tmp_path):
    compiler(_wrapper(tmp_path, "broken", "args+=(--no-such-flag)"))
    flushes, how = torch_compile.fast_math_flushes()
    assert flushes is None and "failed" in how


def test_each_fresh_cache_is_new_and_the_environment_is_put_back(monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/users/cache")
    with torch_compile.fresh_cache_dir() as first, torch_compile.fresh_cache_dir() as second:
        assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == second != first
        assert not os.listdir(second)
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == "/users/cache"
