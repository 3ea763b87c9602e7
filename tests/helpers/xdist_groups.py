"""A pytest plugin of the tests: --dist loadgroup sends each xdist_group to one worker again.

pytest-xdist 3.8 names a test's group by appending `@group` to `item._nodeid`, which pytest
9.2's structured node ids no longer read: every group was silently scattered over the workers (a
server meant to be shared started on each, a result meant to be computed once computed twice;
pytest-dev/pytest-xdist#1386, fix open in #1388). Where xdist's own suffix took, or pytest has
no structured ids, this does nothing. tests/helpers/test_xdist_groups.py holds a group on one
worker.
"""

from __future__ import annotations

import pytest


@pytest.hookimpl(trylast=True)  # after xdist's own attempt
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if getattr(config.option, "loadgroup", False):  # set on the workers of --dist loadgroup
        for item in items:
            _name_its_group(item)


def _name_its_group(item: pytest.Item) -> None:
    names = sorted(
        {str(m.args[0] if m.args else m.kwargs.get("name", "default"))
         for m in item.iter_markers("xdist_group")}
    )  # fmt: skip
    if not names or "@" in item.nodeid.rpartition("]")[2] or not hasattr(item, "_id"):
        return
    from _pytest.nodeid import NodeId  # pytest >= 9.2, where `_id` exists

    item._id = NodeId.parse(f"{item.nodeid}@{'_'.join(names)}")
