"""The one way the project reads and writes files (`attention/files.py`): regular files only, read with a byte limit
counted while reading; writes that never replace a file unless asked, checked before the work."""

import errno
import json
import os
import pathlib
import threading

import pytest

from attention import files


def test_a_regular_file_is_read_whole(tmp_path):
    path = tmp_path / "a.json"
    path.write_bytes(b'{"a": [1, 2.5, "x"]}')
    assert files.read_bytes(path, 100) == b'{"a": [1, 2.5, "x"]}'
    assert files.read_json(path, 100) == {"a": [1, 2.5, "x"]}


def test_a_file_longer_than_the_limit_is_refused_naming_it(tmp_path):
    path = tmp_path / "long.json"
    path.write_bytes(b"x" * 101)
    assert files.read_bytes(path, 101) == b"x" * 101
    with pytest.raises(ValueError, match=r"long\.json: longer than 100 bytes"):
        files.read_bytes(path, 100)


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero (a POSIX system)")
def test_a_symlink_is_refused_even_to_an_endless_device(tmp_path):
    link = tmp_path / "zero.json"
    link.symlink_to("/dev/zero")
    with pytest.raises(ValueError, match=r"zero\.json: a symbolic link, not a regular file"):
        files.read_bytes(link, 2**20)
    target = tmp_path / "real.json"
    target.write_text("{}")
    (tmp_path / "to-real.json").symlink_to(target)  # even to a harmless file: its contents are not shown
    with pytest.raises(ValueError, match="symbolic link"):
        files.read_json(tmp_path / "to-real.json", 100)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs os.mkfifo (a POSIX system)")
def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    outcome = []
    reader = threading.Thread(target=lambda: outcome.append(_error_of(files.read_bytes, fifo, 100)), daemon=True)
    reader.start()
    reader.join(timeout=10)
    assert not reader.is_alive(), "reading a FIFO blocked"
    assert "a FIFO, not a regular file" in outcome[0]


def _error_of(function, *args):
    try:
        function(*args)
    except (ValueError, OSError) as error:
        return str(error)
    return "no error"


def test_a_folder_and_a_missing_file_are_refused(tmp_path):
    with pytest.raises(ValueError, match="a folder, not a regular file"):
        files.read_bytes(tmp_path, 100)
    with pytest.raises(FileNotFoundError):
        files.read_bytes(tmp_path / "absent.json", 100)


@pytest.mark.parametrize("text, problem", [
    ('{"status": "<img src=x>", "status": "ok"}', "the key 'status' appears twice"),
    ('{"a": {"b": 1, "b": 2}}', "the key 'b' appears twice"),
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ('{"a": ', "Expecting value"),
    ("1" * 5000, "digits"),
])
def test_bad_json_is_one_value_error_naming_the_file(tmp_path, text, problem):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=r"bad\.json: .*" + problem):
        files.read_json(path, 2**20)


def test_text_that_is_not_utf8_is_refused(tmp_path):
    path = tmp_path / "latin.json"
    path.write_bytes('{"a": "caf\u00e9"}'.encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin\.json: not UTF-8"):
        files.read_json(path, 100)


def test_nan_is_read_for_the_validator_to_name(tmp_path):
    path = tmp_path / "nan.json"
    path.write_text('{"x": NaN}')
    assert files.read_json(path, 100)["x"] != files.read_json(path, 100)["x"]  # NaN: the caller's rules refuse it


def test_a_new_file_is_written_and_an_existing_one_kept_unless_forced(tmp_path):
    path = tmp_path / "out.json"
    files.write_bytes(path, json.dumps({"run": 1}))
    assert json.loads(path.read_text()) == {"run": 1}
    with pytest.raises(FileExistsError, match=r"out\.json: exists already; pass --force"):
        files.write_bytes(path, "replaced?")
    assert json.loads(path.read_text()) == {"run": 1}
    files.write_bytes(path, b"replaced", force=True)
    assert path.read_bytes() == b"replaced"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]  # no temporary file left behind


def test_a_path_is_checked_before_the_work(tmp_path):
    (tmp_path / "existing.txt").write_text("precious")
    with pytest.raises(FileExistsError, match="existing.txt"):
        files.check_new_file(tmp_path / "existing.txt")
    assert files.check_new_file(tmp_path / "existing.txt", force=True) == tmp_path / "existing.txt"
    with pytest.raises(ValueError, match="a folder; name a file"):
        files.check_new_file(tmp_path)
    with pytest.raises(ValueError, match="does not exist"):
        files.check_new_file(tmp_path / "no" / "such" / "file.json")
    (tmp_path / "link.json").symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(ValueError, match="a symbolic link"):
        files.check_new_file(tmp_path / "link.json", force=True)
    assert (tmp_path / "existing.txt").read_text() == "precious"


# A path swapped between the check (lstat) and the open: what `read_bytes` sees is the path as it was checked, so
# the swap is staged by reporting the earlier regular file's status for the checked path.

def _checked_as_regular(monkeypatch, tmp_path, swapped):
    regular = tmp_path / "regular.json"
    regular.write_text("{}")
    real_lstat = os.lstat
    monkeypatch.setattr(os, "lstat", lambda path: real_lstat(regular if str(path) == str(swapped) else path))


@pytest.mark.skipif(not hasattr(os, "O_NOFOLLOW"), reason="needs O_NOFOLLOW (a POSIX system)")
def test_a_file_swapped_for_a_symlink_after_the_check_is_refused(tmp_path, monkeypatch):
    swapped = tmp_path / "swapped.json"
    swapped.symlink_to("/dev/zero")
    _checked_as_regular(monkeypatch, tmp_path, swapped)
    with pytest.raises(ValueError, match=r"swapped\.json: a symbolic link, not a regular file: refused"):
        files.read_bytes(swapped, 2**20)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs os.mkfifo (a POSIX system)")
def test_a_file_swapped_for_a_fifo_after_the_check_is_refused_without_blocking(tmp_path, monkeypatch):
    swapped = tmp_path / "pipe.json"
    os.mkfifo(swapped)
    _checked_as_regular(monkeypatch, tmp_path, swapped)
    outcome = []
    reader = threading.Thread(target=lambda: outcome.append(_error_of(files.read_bytes, swapped, 100)), daemon=True)
    reader.start()
    reader.join(timeout=10)
    assert not reader.is_alive(), "reading a FIFO blocked"
    assert outcome == [f"{swapped}: not a regular file: refused"]


def test_a_file_that_cannot_be_opened_raises_the_systems_error(tmp_path, monkeypatch):
    """Not a refusal of the file's kind: the OS's own error (here permission), which names the file."""
    path = tmp_path / "locked.json"
    path.write_text("{}")

    def denied(name, flags, *args):
        raise PermissionError(errno.EACCES, "Permission denied", str(name))

    monkeypatch.setattr(os, "open", denied)
    with pytest.raises(PermissionError, match=r"Permission denied: .*locked\.json"):
        files.read_json(path, 100)


def test_a_file_that_appears_while_the_work_runs_is_not_replaced(tmp_path, monkeypatch):
    """`check_new_file` passed before the work; another process writes the file before `write_bytes` links its
    own: the other file stays, and the error says to pass --force."""
    path = tmp_path / "out.json"
    real_link = os.link

    def link_after_another_writer(source, target):
        pathlib.Path(target).write_text("the other writer's")
        return real_link(source, target)

    monkeypatch.setattr(os, "link", link_after_another_writer)
    with pytest.raises(FileExistsError, match=r"out\.json: exists already; pass --force"):
        files.write_bytes(path, "mine")
    assert path.read_text() == "the other writer's"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]  # no temporary file left behind


def _no_hard_links(source, target):
    raise OSError(errno.EPERM, "Operation not permitted")  # as on file systems without hard links (FAT, some mounts)


def test_a_file_system_without_hard_links_still_gets_the_file_and_keeps_an_existing_one(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "link", _no_hard_links)
    path = tmp_path / "out.json"
    files.write_bytes(path, "written")
    assert path.read_text() == "written"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]
    with pytest.raises(FileExistsError, match=r"out\.json: exists already; pass --force"):
        files.write_bytes(path, "replaced?")
    assert path.read_text() == "written"


def test_without_hard_links_a_file_that_appears_while_the_work_runs_is_not_replaced(tmp_path, monkeypatch):
    path = tmp_path / "out.json"

    def another_writer_then_no_link(source, target):
        pathlib.Path(target).write_text("the other writer's")
        _no_hard_links(source, target)

    monkeypatch.setattr(os, "link", another_writer_then_no_link)
    with pytest.raises(FileExistsError, match=r"out\.json: exists already; pass --force"):
        files.write_bytes(path, "mine")
    assert path.read_text() == "the other writer's"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]
