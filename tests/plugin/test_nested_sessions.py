"""tests/conftest.py keeps an installed library's modules across pytester's in-process sessions:
a module imported a second time can break (torch's operator registrations raised "Only a single
TORCH_LIBRARY can be used to register the namespace" in a later test). What a nested session
collected itself is still dropped, so that a later session's file of the same name is its own."""

from __future__ import annotations

import sys

LIBRARY = "json.tool"  # imported by nothing else here


def test_a_nested_session_keeps_the_libraries_it_imported_and_drops_its_own(pytester, monkeypatch):
    monkeypatch.delitem(sys.modules, LIBRARY, raising=False)
    pytester.makepyfile(
        helper_of_the_session="VALUE = 1",
        test_nested=f"import {LIBRARY}\nimport helper_of_the_session\n\ndef test_a():\n    pass\n",
    )
    pytester.runpytest_inprocess("-p", "no:cacheprovider", "--no-mlflow").assert_outcomes(passed=1)
    assert LIBRARY in sys.modules
    assert "helper_of_the_session" not in sys.modules and "test_nested" not in sys.modules
