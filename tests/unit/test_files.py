"""Atomic writes into a folder that several launchers share (multi-node jobs on NFS/Lustre)."""

from __future__ import annotations

import threading

import pytest

from fsdp_tune.runfiles import write_atomic


def test_concurrent_writers_never_collide(tmp_path) -> None:
    target = tmp_path / "fsdp_tune_run.json"
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        try:
            for _ in range(200):
                write_atomic(target, f"writer {n}\n")
        except BaseException as e:  # noqa: BLE001 - collected and asserted below
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert target.read_text() in {f"writer {n}\n" for n in range(4)}
    assert [p.name for p in tmp_path.iterdir()] == [target.name]  # no temporary file left behind


def test_failed_write_leaves_the_old_file(tmp_path) -> None:
    target = tmp_path / "a.json"
    target.write_text("old")
    with pytest.raises(TypeError):
        write_atomic(target, object())  # type: ignore[arg-type] - not text: the write fails midway
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]
