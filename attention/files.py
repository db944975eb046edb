"""The files the project reads and writes, handled one way: read only regular files, with a byte limit enforced while
reading; write only where the user said, never over an existing file unless asked to, checked before any work.

Every reader of a file that a contributor or a download could have made goes through `read_bytes` (results files,
checkpoints and their records); every command that writes a file checks its path with `check_new_file` before it
starts working, and writes it with `write_bytes`.
Problems raise one `ValueError` (`FileExistsError` for a file that is there already) whose message starts with the
path and says what is wrong.
"""

import errno
import json
import os
import stat
from pathlib import Path


def read_bytes(path, max_bytes):
    """The contents of the regular file at `path`, at most `max_bytes` of them.

    Refused with `ValueError`: a symbolic link, a folder, a FIFO, a device or a socket (a symlink to `/dev/zero`
    would be read until memory runs out, a FIFO would block forever), and a file longer than `max_bytes`, which is
    counted while reading (a file's reported size can be wrong, or change). `FileNotFoundError` if there is none.
    """
    path = Path(path)
    kind = stat.S_IFMT(os.lstat(path).st_mode)  # FileNotFoundError names the path
    if kind != stat.S_IFREG:
        raise ValueError(f"{path}: {KINDS.get(kind, 'not a regular file')}, not a regular file: refused")
    try:  # O_NOFOLLOW and O_NONBLOCK: the path may have changed since lstat; never follow it or wait on it
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise ValueError(f"{path}: a symbolic link, not a regular file: refused") from None
        raise
    with os.fdopen(descriptor, "rb") as file:
        if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
            raise ValueError(f"{path}: not a regular file: refused")
        data = file.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ValueError(f"{path}: longer than {_size(max_bytes)}, the most this file may hold: refused")
    return data


KINDS = {stat.S_IFLNK: "a symbolic link", stat.S_IFDIR: "a folder", stat.S_IFIFO: "a FIFO",
         stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket"}


def _size(count):
    return f"{count / 2**20:g} MiB" if count >= 2**20 else f"{count:,} bytes"


def _unique_keys(pairs):
    mapping = {}
    for key, value in pairs:
        if key in mapping:
            raise ValueError(f"the key {key[:40]!r} appears twice in one object")
        mapping[key] = value
    return mapping


def read_json(path, max_bytes):
    """The JSON value in the regular file at `path` (`read_bytes`), UTF-8, every object's keys unique.

    `ValueError` naming the file for anything else: not a regular file, too long, not UTF-8, not JSON, a key
    twice in one object (a reader would see one value and the program use another), nesting too deep to parse.
    NaN and infinities are read as floats: the caller's validator names the field that holds one.
    """
    data = read_bytes(path, max_bytes)
    try:
        return json.loads(data.decode("utf-8"), object_pairs_hook=_unique_keys)
    except UnicodeDecodeError as error:
        raise ValueError(f"{path}: not UTF-8 text ({error.reason} at byte {error.start})") from None
    except RecursionError:
        raise ValueError(f"{path}: JSON nested too deeply to read") from None
    except ValueError as error:  # json.JSONDecodeError, a repeated key, an integer of too many digits
        raise ValueError(f"{path}: {error}") from None


def check_new_file(path, force=False):
    """`path` as a `Path` if a file may be written there, checked before the work that makes the file.

    Refused: a folder (`ValueError`), a parent that is not an existing folder (`ValueError`), a symbolic link, and
    an existing file unless `force` (`FileExistsError`, saying to pass `--force` or choose another path).
    """
    path = Path(path)
    if path.is_symlink():
        raise ValueError(f"{path}: a symbolic link: name the file itself")
    if path.is_dir():
        raise ValueError(f"{path}: a folder; name a file to write")
    if not path.parent.is_dir():
        raise ValueError(f"{path}: its folder {path.parent} does not exist")
    if path.exists() and not force:
        raise FileExistsError(f"{path}: exists already; pass --force to replace it, or choose another path")
    return path


def write_bytes(path, data, force=False):
    """Write `data` (bytes or text, UTF-8) to `path` atomically: all of it or, if interrupted, none of it.

    The path is checked as `check_new_file` checks it, again at the moment of writing: a file that appeared
    since the work started is not replaced unless `force`.
    """
    path = check_new_file(path, force)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        temporary.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
        if force:
            temporary.replace(path)
        else:
            try:
                os.link(temporary, path)  # fails if the path exists now: never replaces a file without force
            except FileExistsError:
                raise
            except OSError:  # a file system without hard links: check, then replace (a narrow race is left)
                if path.exists():
                    raise FileExistsError(path) from None
                temporary.replace(path)
    except FileExistsError:
        raise FileExistsError(f"{path}: exists already; pass --force to replace it, or choose another path") from None
    finally:
        temporary.unlink(missing_ok=True)
    return path
