"""Free memory as this process may use it: a memory cgroup's limit (a container, a systemd slice, a 16 GiB cgroup)
counts, not only the machine's free memory, so a model that does not fit in the cgroup is refused in one line
instead of the kernel's OOM killer ending the process. Fake cgroup trees stand in for the kernel's, v1 and v2."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.errors import ModelTooLargeError
from engine.load import memory

GIB = 1 << 30


def _files(folder: Path, files: dict[str, object]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(str(text))


@pytest.fixture
def machine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """20 GiB free on the machine; the cgroup tree under tmp_path/cgroup."""
    monkeypatch.setattr(memory, "_machine_available", lambda: 20 * GIB)
    monkeypatch.setattr(memory, "CGROUP_ROOT", tmp_path / "cgroup")
    monkeypatch.setattr(memory, "PROC_CGROUP", tmp_path / "proc-self-cgroup")
    return tmp_path


def test_a_v2_cgroup_limit_is_the_free_memory(machine: Path) -> None:
    (machine / "proc-self-cgroup").write_text("0::/user.slice/studio.scope\n")
    root = machine / "cgroup"
    _files(root, {"cgroup.controllers": "memory pids"})
    _files(
        root / "user.slice", {"memory.max": "max", "memory.current": str(5 * GIB), "memory.stat": "anon 1\nfile 0\n"}
    )
    scope = root / "user.slice" / "studio.scope"
    # 16 GiB limit, 7 GiB in use of which 3 GiB is page cache the kernel can take back: 12 GiB left
    _files(
        scope, {"memory.max": str(16 * GIB), "memory.current": str(7 * GIB), "memory.stat": f"anon 4\nfile {3 * GIB}\n"}
    )
    assert memory.cgroup_headroom() == 12 * GIB
    assert memory.free_memory_bytes("cpu") == 12 * GIB


def test_the_tightest_v1_limit_up_the_tree_counts(machine: Path) -> None:
    (machine / "proc-self-cgroup").write_text("9:pids:/\n4:memory:/outer/inner\n0::/\n")
    root = machine / "cgroup" / "memory"
    _files(
        root,
        {"memory.limit_in_bytes": str(9223372036854771712), "memory.usage_in_bytes": "0", "memory.stat": "cache 0\n"},
    )
    _files(
        root / "outer",
        {"memory.limit_in_bytes": str(6 * GIB), "memory.usage_in_bytes": str(2 * GIB), "memory.stat": "cache 0\n"},
    )
    _files(
        root / "outer" / "inner",
        {"memory.limit_in_bytes": str(16 * GIB), "memory.usage_in_bytes": str(GIB), "memory.stat": "cache 0\n"},
    )
    assert memory.cgroup_headroom() == 4 * GIB  # the outer group's 6 GiB less its 2 GiB in use


def test_no_limit_or_no_cgroup_leaves_the_machines_free_memory(machine: Path) -> None:
    assert memory.cgroup_headroom() is None  # no /proc/self/cgroup
    (machine / "proc-self-cgroup").write_text("4:memory:/\n")
    _files(
        machine / "cgroup" / "memory",
        {
            "memory.limit_in_bytes": str(9223372036854771712),
            "memory.usage_in_bytes": str(GIB),
            "memory.stat": "cache 0\n",
        },
    )
    assert memory.cgroup_headroom() is None and memory.free_memory_bytes("cpu") == 20 * GIB


def test_a_cgroup_at_its_limit_has_nothing_free_not_an_unknown_amount(machine: Path) -> None:
    """0 means "unknown" to the memory check (which then lets anything through): a full cgroup must not say 0."""
    (machine / "proc-self-cgroup").write_text("0::/full\n")
    _files(machine / "cgroup", {"cgroup.controllers": "memory"})
    _files(
        machine / "cgroup" / "full",
        {"memory.max": str(GIB), "memory.current": str(GIB + 4096), "memory.stat": "file 0\n"},
    )
    assert memory.cgroup_headroom() == -4096 and memory.free_memory_bytes("cpu") == 1


def test_a_model_larger_than_its_cgroup_allows_is_refused_in_one_line(machine: Path) -> None:
    from engine.load.loader import load_model

    (machine / "proc-self-cgroup").write_text("0::/small\n")
    _files(machine / "cgroup", {"cgroup.controllers": "memory"})
    _files(
        machine / "cgroup" / "small",
        {"memory.max": str(100 << 20), "memory.current": str(60 << 20), "memory.stat": "file 0\n"},
    )
    with pytest.raises(ModelTooLargeError) as caught:
        load_model()  # the embedded model: some hundreds of MiB, in 40 MiB
    assert "\n" not in str(caught.value) and "40.0 MiB of RAM is free" in str(caught.value)
