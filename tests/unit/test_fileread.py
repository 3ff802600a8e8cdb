"""The one reader: bounded, non-blocking, ``fstat`` before reading, a one-line refusal; and the
fingerprints, cache keys and comparisons made with it. FIFOs here are real ones: a read that blocked would hang
the test until pytest-timeout ends it, which is the failure this guards against."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from patcher.core import fileread
from patcher.core.errors import ConfigError, PatcherError
from patcher.core.schedconfig.source import MAX_SOURCE_BYTES
from patcher.core.settings import Files
from patcher.services import nodefiles
from tests.harness.helpers import EXTENDERS, node_folders

BIG = 200 * 1024 * 1024  # sparse: no disk, and no memory unless someone reads it


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The sizes asked of every ``os.read`` while the test runs."""
    asked: list[int] = []
    real = os.read

    def counted(fd: int, n: int) -> bytes:
        asked.append(n)
        return real(fd, n)

    monkeypatch.setattr(os, "read", counted)
    yield asked


def test_a_fifo_is_refused_in_one_line_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "f")
    with pytest.raises(PatcherError) as exc:
        fileread.read_file(tmp_path / "f", "manifest", "/etc/m.yaml", limit=10)
    assert str(exc.value) == "/etc/m.yaml: manifest is not a regular file (a FIFO); refusing to read it"


def test_a_file_over_the_limit_is_refused_before_a_byte_is_read(tmp_path: Path, reads: list[int]) -> None:
    big = tmp_path / "big"
    big.touch()
    os.truncate(big, BIG)
    with pytest.raises(fileread.TooLarge) as exc:
        fileread.read_file(big, "file", limit=1024)
    assert exc.value.size == BIG and exc.value.problem == f"file is {BIG} bytes, over the limit of 1024 bytes"
    assert reads == []


def test_at_most_one_byte_past_the_limit_is_read_whatever_the_file_grew_to(tmp_path: Path,
                                                                          reads: list[int]) -> None:
    """A file that grows between the ``fstat`` and the read: the append is made right after the ``fstat``."""
    path = tmp_path / "f"
    path.write_bytes(b"x" * 10)
    real_fstat = os.fstat

    def grown(fd: int) -> os.stat_result:
        st = real_fstat(fd)
        with path.open("ab") as f:  # someone appends right after our fstat
            f.write(b"y" * 5000)
        return st

    with pytest.MonkeyPatch.context() as m:
        m.setattr(os, "fstat", grown)
        with pytest.raises(fileread.TooLarge, match="over the limit of 100 bytes") as exc:
            fileread.read_file(path, "file", limit=100)
    assert exc.value.size is None and max(reads) <= 101


def test_what_is_read_is_bounded_by_the_file_not_the_limit(tmp_path: Path, reads: list[int]) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"abc")
    assert fileread.read_file(path, "file", limit=1 << 30) == b"abc"
    assert max(reads) <= 65536  # not a 1 GiB buffer for a 3-byte file


def test_refusals_name_the_file_as_shown_and_use_the_callers_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^/src/x: source file not found$"):
        fileread.read_file(tmp_path / "x", "source file", "/src/x", limit=1, error=ConfigError)
    with pytest.raises(ConfigError, match="source file is a directory"):
        fileread.read_file(tmp_path, "source file", limit=1, error=ConfigError)
    assert fileread.read_if_exists(tmp_path / "x", "file", limit=1) is None
    (tmp_path / "dangling").symlink_to("nowhere")
    assert fileread.read_if_exists(tmp_path / "dangling", "file", limit=1) is None


def test_holds_compares_reading_at_most_one_byte_more(tmp_path: Path, reads: list[int]) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"patched\n")
    assert fileread.holds(path, b"patched\n") and not fileread.holds(path, b"patche\n")
    assert not fileread.holds(path, None) and fileread.holds(tmp_path / "gone", None)
    os.truncate(path, BIG)
    assert not fileread.holds(path, b"patched\n")
    os.mkfifo(tmp_path / "fifo")
    assert not fileread.holds(tmp_path / "fifo", b"")
    assert max(reads) <= len(b"patched\n") + 1


def test_holds_with_refuse_names_a_file_it_cannot_read_and_still_answers_for_the_others(tmp_path: Path) -> None:
    """A re-check before a write must not take a FIFO in the file's place for "changed by someone else"."""
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(PatcherError, match=r"^/etc/m\.yaml: file is not a regular file \(a FIFO\)"):
        fileread.holds(tmp_path / "fifo", b"x", "/etc/m.yaml", refuse=True)
    path = tmp_path / "f"
    path.write_bytes(b"patched\n")
    assert fileread.holds(path, b"patched\n", refuse=True)
    assert not fileread.holds(path, b"patch\n", refuse=True)  # larger than asked: differs, not refused
    assert not fileread.holds(tmp_path / "gone", b"x", refuse=True) and fileread.holds(tmp_path / "gone", None,
                                                                                        refuse=True)


def test_a_fingerprint_of_a_refused_file_is_its_refusal_not_its_content(tmp_path: Path, reads: list[int]) -> None:
    """The same on every node for the same refusal, and nothing read: whoever acts on it refuses it."""
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "big").touch()
    os.truncate(tmp_path / "big", BIG)
    (tmp_path / "small").write_bytes(b"a")
    assert fileread.fingerprint(tmp_path / "fifo", limit=10) == "refused: file is not a regular file (a FIFO); " \
        "refusing to read it"
    assert fileread.fingerprint(tmp_path / "big", limit=10) == f"refused: file is {BIG} bytes, over the limit " \
        "of 10 bytes"
    assert fileread.fingerprint(tmp_path / "gone", limit=10) == "missing"
    before = fileread.folder_fingerprint(tmp_path, limit=10)
    (tmp_path / "small").write_bytes(b"b")
    assert fileread.folder_fingerprint(tmp_path, limit=10) != before
    assert reads and max(reads) <= 11


@pytest.fixture
def opts(tmp_path: Path) -> Files:
    root, src = node_folders(tmp_path)
    return Files(source=src, host_root=root)


@pytest.mark.parametrize("name", ["extenders.yaml", "notes.txt"])
def test_plan_and_apply_refuse_a_fifo_in_the_source_folder_and_do_not_block(opts: Files, name: str) -> None:
    """The render cache's fingerprint opened it with ``Path.read_bytes`` and waited for a writer."""
    target = opts.source / name
    if target.exists():
        target.unlink()
    os.mkfifo(target)
    if name == "extenders.yaml":
        for refuse in (nodefiles.plan_apply, lambda o: nodefiles.apply(o, nodefiles.plan_apply(o))):
            with pytest.raises(ConfigError, match=r"extenders.yaml: not a regular file \(a FIFO\)$"):
                refuse(opts)
    else:  # not a file the source form reads: fingerprinted by its refusal, never opened for reading
        plan = nodefiles.plan_apply(opts)
        assert plan.pending and plan.source_hash not in ("", "missing")


def test_plan_refuses_a_200_mb_source_file_without_reading_it(opts: Files, reads: list[int]) -> None:
    (opts.source / "extenders.yaml").unlink()
    big = opts.source / "extenders.yaml"
    big.write_text(EXTENDERS)
    os.truncate(big, BIG)
    with pytest.raises(ConfigError, match=rf"too large \({BIG} bytes; the limit for a source file is "
                                          rf"{MAX_SOURCE_BYTES}\)$"):
        nodefiles.plan_apply(opts)
    assert max(reads) <= nodefiles.MAX_MANIFEST_BYTES + 1  # the manifest's read is the largest
