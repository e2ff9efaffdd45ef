"""Build what the functions are deployed from: Lambda zips and the Knative function folders.

``spotguard package lambda --out DIR`` writes one zip per ``functions/<name>/``
that has a ``lambda_function.py``: that file at the zip's root, the
``spotguard`` package without what a Lambda never runs (the simulated cluster,
the demo, the local servers and command line), and the runtime dependencies
the functions import, at the versions installed next to spotguard (the pins of
requirements.txt), as wheels for the Lambda's Python version and architecture.
Left out: boto3 and botocore (the Lambda runtime has them), and the servers
and their frameworks (gunicorn, hypercorn, flask, aiohttp). The infra/aws SAM
template deploys these zips.

``spotguard package knative [--out DIR]`` writes every Knative function
project into ``DIR/<name>/`` (default ``./functions``, under the current
directory; the projects are copied there from the checkout's ``functions/``,
or ``--functions-dir``, unless they are there already) and builds the
spotguard wheel into each one's ``vendor/``, where its ``pyproject.toml``
finds it; each folder then builds on its own (``func build`` and ``func
deploy`` see nothing outside it). Run from the checkout's root, that is the
checkout's own ``functions/``, as before.
"""

from __future__ import annotations

import argparse
import fnmatch
import importlib.metadata
import logging
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from spotguard.logs import UserError

log = logging.getLogger("spotguard.packaging")

# What a Lambda function imports, with every dependency of these (boto3 and
# botocore come with the runtime; aiohttp is only for kubernetes.aio, which is
# left out). tests/infra/test_lambda_package.py checks this set is closed.
LAMBDA_DISTRIBUTIONS = (
    "kubernetes",
    "certifi",
    "durationpy",
    "python-dateutil",
    "pyyaml",
    "requests",
    "charset-normalizer",
    "idna",
    "requests-oauthlib",
    "oauthlib",
    "six",
    "urllib3",
    "websocket-client",
    "prometheus-client",
    "orjson",
    "aws-lambda-powertools",
    "jmespath",
    "typing-extensions",
)
# Distributions the Lambda runtime provides, or that only unused modules need.
LAMBDA_PROVIDED = ("boto3", "botocore", "s3transfer")
LAMBDA_UNUSED = ("aiohttp",)
# Paths in the zip (relative, "/"-separated) that a Lambda never runs. The simulated
# cluster is a package of its own (spotguard_sim, beside spotguard in shared/) and the
# zip takes the spotguard package's folder only, so it never holds it; the operator's
# commands on it (spotguard.ops, the demo) stay out too.
LAMBDA_EXCLUDED = (
    "spotguard/ops/*",
    "spotguard/demo.py",
    "spotguard/cli.py",
    "spotguard/certs.py",
    "spotguard/packaging.py",
    "spotguard/*/cli.py",
    "spotguard/*/server.py",
    "spotguard/*/app.py",
    "spotguard/*/poller.py",
    "kubernetes/aio/*",
    "bin/*",
    "*-stubs/*",
    "*/__pycache__/*",
    "*.pyc",
)
ARCHITECTURES = {"arm64": "aarch64", "x86_64": "x86_64"}
# Amazon Linux 2023 (the python3.12 runtime) has glibc 2.34; pip also takes
# older manylinux tags for this one.
MANYLINUX = "manylinux_2_28"
ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # fixed, so the same input gives the same zip


@dataclass(frozen=True)
class Artifact:
    function: str
    path: Path
    size: int
    unpacked: int


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(title="artifacts", metavar="ARTIFACT")
    lam = sub.add_parser("lambda", help="one zip per function for AWS Lambda", description=__doc__.strip())
    lam.add_argument("--out", required=True, type=Path, help="directory for the zips (created)")
    lam.add_argument("--functions-dir", type=Path, help="the functions/ folder (default: the checkout's)")
    lam.add_argument("--python-version", default="3.12", help="the Lambda runtime's Python (default 3.12)")
    lam.add_argument("--arch", choices=sorted(ARCHITECTURES), default="arm64", help="Lambda architecture (arm64)")
    lam.set_defaults(_run=run_lambda)
    kn = sub.add_parser(
        "knative",
        help="write the function folders, each with the spotguard wheel in vendor/",
        description=__doc__.strip(),
    )
    kn.add_argument(
        "--out",
        type=Path,
        default=Path("functions"),
        help="where the function folders go (default: ./functions, under the current directory)",
    )
    kn.add_argument("--functions-dir", type=Path, help="the function projects to copy (default: the checkout's)")
    kn.set_defaults(_run=run_knative)


def run(args: argparse.Namespace) -> int:
    """``spotguard package`` without an artifact (each artifact sets its own ``_run``)."""
    print("usage: spotguard package {lambda,knative} ... (see spotguard package --help)", file=sys.stderr)
    return 2


def checkout() -> Path:
    """The source checkout spotguard runs from (its pyproject.toml beside shared/)."""
    root = Path(__file__).resolve().parents[2]
    if not (root / "pyproject.toml").is_file() or not (root / "shared" / "spotguard").is_dir():
        raise UserError(f"spotguard does not run from a source checkout ({root}): pass --functions-dir")
    return root


def functions_with(functions_dir: Path, entry: str) -> list[Path]:
    """The function folders holding ``entry`` (lambda_function.py, func.yaml), by name."""
    if not functions_dir.is_dir():
        raise UserError(f"{functions_dir}: no such directory")
    found = sorted(d for d in functions_dir.iterdir() if (d / entry).is_file())
    if not found:
        raise UserError(f"no function in {functions_dir} has a {entry}")
    return found


# ------------------------------------------------------------------ Lambda


def run_lambda(args: argparse.Namespace) -> int:
    functions_dir = args.functions_dir or checkout() / "functions"
    artifacts = build_lambda(functions_dir, args.out, python_version=args.python_version, arch=args.arch)
    for artifact in artifacts:
        print(
            f"{artifact.path}  {artifact.size / 2**20:.1f} MiB zipped, {artifact.unpacked / 2**20:.1f} MiB unpacked"
            f"  (Lambda allows 50 MiB zipped, 250 MiB unpacked)"
        )
    return 0


def pins(names: Iterable[str]) -> list[str]:
    """``name==version`` for each distribution, at the version installed here."""
    result = []
    for name in names:
        try:
            result.append(f"{name}=={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            raise UserError(
                f"{name} is not installed next to spotguard: pip install -r requirements.txt (or spotguard[lambda])"
            ) from None
    return result


def build_lambda(functions_dir: Path, out: Path, *, python_version: str, arch: str) -> list[Artifact]:
    functions = functions_with(functions_dir, "lambda_function.py")
    requirements = pins(LAMBDA_DISTRIBUTIONS)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="spotguard-lambda-") as tmp:
        deps = Path(tmp) / "deps"
        machine = ARCHITECTURES[arch]
        command = [
            sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
            "--no-deps", "--only-binary=:all:", "--implementation", "cp",
            "--python-version", python_version,
            "--platform", f"{MANYLINUX}_{machine}", "--platform", f"manylinux2014_{machine}",
            "--target", str(deps), *requirements,
        ]  # fmt: skip
        log.info("installing the Lambda dependencies", extra={"python": python_version, "arch": arch})
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise UserError(f"pip could not install the Lambda dependencies:\n{done.stderr.strip()}")
        package = Path(__file__).resolve().parent
        files = sorted(_tree(deps, deps)) + sorted(_tree(package, package.parent))
        artifacts = []
        for folder in functions:
            target = out / f"{folder.name}.zip"
            entries = [("lambda_function.py", folder / "lambda_function.py"), *files]
            artifacts.append(_zip(folder.name, target, entries))
    return artifacts


def _tree(top: Path, base: Path) -> Iterator[tuple[str, Path]]:
    for path in top.rglob("*"):
        if path.is_file():
            name = path.relative_to(base).as_posix()
            if not any(fnmatch.fnmatchcase(name, pattern) for pattern in LAMBDA_EXCLUDED):
                yield name, path


def _zip(function: str, target: Path, entries: list[tuple[str, Path]]) -> Artifact:
    partial = target.with_suffix(".zip.partial")
    unpacked = 0
    with zipfile.ZipFile(partial, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as archive:
        for name, path in entries:
            info = zipfile.ZipInfo(name, ZIP_TIME)
            info.external_attr = (stat.S_IFREG | 0o644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            data = path.read_bytes()
            unpacked += len(data)
            archive.writestr(info, data)
    os.replace(partial, target)
    return Artifact(function, target, target.stat().st_size, unpacked)


# ----------------------------------------------------------------- Knative


def run_knative(args: argparse.Namespace) -> int:
    root = checkout()
    source = args.functions_dir or root / "functions"
    for wheel in stage_knative(root, copy_functions(source, args.out)):
        print(wheel.resolve())
    return 0


def copy_functions(source: Path, out: Path) -> Path:
    """``out`` holding every Knative project of ``source`` (copied, without vendor/; none where they are one)."""
    functions = functions_with(source, "func.yaml")
    out.mkdir(parents=True, exist_ok=True)
    for folder in functions:
        target = out / folder.name
        if target.resolve() == folder.resolve():
            continue
        shutil.copytree(
            folder, target, dirs_exist_ok=True, ignore=shutil.ignore_patterns("vendor", "__pycache__", "*.pyc")
        )
    return out


def stage_knative(root: Path, functions_dir: Path) -> list[Path]:
    """Build the spotguard wheel once and copy it into each function's vendor/ (replacing older ones)."""
    functions = functions_with(functions_dir, "func.yaml")
    with tempfile.TemporaryDirectory(prefix="spotguard-wheel-") as tmp:
        wheel = build_wheel(root, Path(tmp))
        staged = []
        for folder in functions:
            vendor = folder / "vendor"
            vendor.mkdir(exist_ok=True)
            for old in vendor.glob("spotguard-*.whl"):
                old.unlink()
            shutil.copy2(wheel, vendor / wheel.name)
            staged.append(vendor / wheel.name)
    return staged


def build_wheel(root: Path, out: Path) -> Path:
    """The spotguard wheel for the Knative functions, built from a copy of the sources (the
    checkout stays clean), without the simulated cluster and the operator's commands."""
    src = out / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(root / name, src / name)
    shutil.copytree(
        root / "shared", src / "shared", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "*.pyc")
    )
    # A function runs the functions only: not the simulated cluster (spotguard_sim) nor the
    # operator's commands on it (spotguard.ops, spotguard.demo), as the image and the zips.
    for left_out in ("spotguard_sim", "spotguard/ops"):
        shutil.rmtree(src / "shared" / left_out, ignore_errors=True)
    (src / "shared" / "spotguard" / "demo.py").unlink(missing_ok=True)
    command = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(out), str(src)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise UserError(f"pip could not build the spotguard wheel:\n{done.stderr.strip()}")
    [wheel] = out.glob("spotguard-*.whl")
    return wheel
