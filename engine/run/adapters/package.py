"""What every framework adapter does the same way: find the framework's core file and its installed version
without importing the framework (the parent process never imports it; only the worker does)."""

from __future__ import annotations

import importlib.machinery
from pathlib import Path

from engine.errors import EnvironmentProblem


def core_file(package: str, core: tuple[str, ...], install: str, pin_note: str) -> tuple[Path, Path]:
    """(import root, PACKAGE/CORE...), found on the worker's search path; a missing package or file says how to
    install the pinned release."""
    from engine.run.impl_loader import search_path

    spec = importlib.machinery.PathFinder.find_spec(package, search_path())
    if spec is None or not spec.submodule_search_locations:
        raise EnvironmentProblem(f"--impl {package}:...: {package} is not installed here; install it with {install}")
    pkg = Path(list(spec.submodule_search_locations)[0]).resolve()
    path = pkg.joinpath(*core)
    if not path.is_file():
        raise EnvironmentProblem(f"--impl {package}:...: this {package} has no {'/'.join(core)}; {pin_note}: "
                                 f"{install}")
    return pkg.parent, path


def version(distribution: str) -> str | None:
    """The installed version of `distribution`, or None."""
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None
