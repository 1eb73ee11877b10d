"""Test ordering for the fast tier on pytest-xdist (scripts/test.sh).

pytest-xdist hands each worker a whole file at a time (`--dist loadfile`), in collection order when
`--no-loadscope-reorder` is given (by default it starts with the files that have the most tests, which are not the
ones that take longest). The files below start real processes and wait on them (the VM sandbox, the fake `pulumi`
CLI, real request timeouts), so each takes several times longer than most; started last, one of them alone would be
the tier's tail. They go first, longest first, and the short files fill in around them. Order only: every test
still runs, and none depends on another.
"""

from __future__ import annotations

import pytest

LONGEST_FIRST = (  # seconds each took in one run of the tier on 2 cores
    "test_supervisor.py",  # 23
    "test_startup_script.py",  # 19
    "test_fleet.py",  # 9
    "test_gate.py",  # 9
    "test_up.py",  # 7
    "test_k8s_manifests.py",  # 6
    "test_router_agent.py",  # 5
    "test_probe_goldens.py",  # 5
    "test_policy.py",  # 4
    "test_status.py",  # 4
    "test_up_script.py",  # 4
    "test_mutation_tool.py",  # 3
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: index for index, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: within a file, nothing moves
