"""Files that are never half-written (a temporary beside the target, then an atomic rename; a failed
write names the file, its size and what is still intact), and values made JSON-safe: what results.json,
the reports, repro.json and bench.json are written with."""

from __future__ import annotations

import errno
import math
import os
import shutil
import subprocess
import tempfile
from contextlib import contextmanager
from pathlib import Path

from attnlab.util.errors import WriteFailed


def git_sha(cwd: str | Path | None = None) -> str | None:
    """HEAD of the repository the run started in, with ``-dirty`` if tracked files changed."""
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10)
        if sha.returncode:
            return None
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD"], cwd=cwd, capture_output=True, timeout=10)
        return sha.stdout.strip() + ("-dirty" if dirty.returncode else "")
    except (OSError, subprocess.SubprocessError):
        return None


def source_commit() -> tuple[str | None, bool | None]:
    """The commit of the code that is running (the checkout holding this package, wherever the process
    started) and whether its src/ or conf/ differ from it; (None, None) for an installed wheel."""
    root = Path(__file__).resolve().parents[3]
    if not (root / ".git").exists():
        return None, None
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
        if sha.returncode:
            return None, None
        # only what a run executes or composes: a changed report or doc does not make a run's code dirty
        diff = subprocess.run(
            ["git", "diff", "--quiet", "HEAD", "--", "src", "conf"], cwd=root, capture_output=True, timeout=10
        )
        return sha.stdout.strip(), bool(diff.returncode)
    except (OSError, subprocess.SubprocessError):
        return None, None


@contextmanager
def atomic_file(path: Path, mode: str = "w"):
    """Open a temp file beside ``path``; on success fsync and rename it over ``path``.

    Readers see the old file or the new one, never a half-written one; on any error (a kill
    between steps included) the temp file is removed and ``path`` is untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    with atomic_file(path) as f:
        f.write(text)


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _os_error(err: BaseException) -> OSError | None:
    """The OSError behind ``err`` (torch's zip writer turns a failed write into a RuntimeError)."""
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, OSError) and err.errno:
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


DISK_HINTS = {
    errno.ENOSPC: "free space there or point hydra.run.dir at another disk",
    errno.EDQUOT: "free space there or point hydra.run.dir at another disk",
    errno.EACCES: "make the dir writable or point hydra.run.dir elsewhere",
    errno.EPERM: "make the dir writable or point hydra.run.dir elsewhere",
    errno.EROFS: "point hydra.run.dir at a writable disk",
}


def write_failure(what: str, path: Path, nbytes: int, err: BaseException) -> WriteFailed:
    """One line for a write that failed: what, where, how large, why, and that the previous file is intact.

    ``atomic_file`` never touches ``path`` before the rename, so whatever was there is still there.
    """
    path = Path(path)
    cause = _os_error(err)
    if cause is not None:
        code, reason = cause.errno, cause.strerror or str(cause)
    else:
        try:  # no errno to read: a full disk is the common reason, and it can be checked
            free = shutil.disk_usage(path.parent).free
        except OSError:
            free = None
        full = free is not None and free < nbytes
        code = errno.ENOSPC if full else None
        reason = f"No space left on device ({fmt_bytes(free)} free)" if full else " ".join(str(err).split())[:200]
    previous = (
        f"the previous {path.name} is intact"
        if path.is_file()
        else f"no earlier {path.name} existed, nothing was replaced"
    )
    if not path.is_file() and path.suffix == ".ckpt":  # a new step<N>.ckpt: name the checkpoint that is still there
        others = sorted((p for p in path.parent.glob("*.ckpt") if p != path), key=lambda p: p.stat().st_mtime)
        previous += f"; {others[-1].name} there is intact" if others else ""
    hint = f"; {DISK_HINTS[code]}" if code in DISK_HINTS else ""
    return WriteFailed(f"cannot write {what} {path} (about {fmt_bytes(nbytes)}): {reason}; {previous}{hint}", path)


def json_safe(value, digits: int | None = None, non_finite_as_null: bool = False):
    """``value`` in what JSON holds: NaN and inf as the strings "nan", "inf", "-inf" (JSON has
    neither; a diverged run stays visible as one), or as null with ``non_finite_as_null``; numpy
    and torch scalars as Python numbers; tuples as lists; floats rounded to ``digits`` significant
    digits when given. The one encoder for results.json, repro.json and bench.json."""
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:  # numpy / torch scalars
        value = value.item()
    if isinstance(value, float):
        if not math.isfinite(value):
            return None if non_finite_as_null else str(value)
        return float(f"{value:.{digits}g}") if digits else value
    if isinstance(value, dict):
        return {str(k): json_safe(v, digits, non_finite_as_null) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v, digits, non_finite_as_null) for v in value]
    return value
