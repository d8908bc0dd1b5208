"""Where specs, receipts and bound source files live."""

from __future__ import annotations

import os
from pathlib import Path

from engine.errors import UsageError
from engine.spec.loader import check_key


def project_root() -> Path:
    """The checkout holding engine/, methods/ and specs/ (the project is installed editable)."""
    return Path(__file__).resolve().parent.parent


def default_specs_dir() -> Path:
    env = os.environ.get("CONTRACTS_SPECS")
    return Path(env) if env else project_root() / "specs"


def default_receipts_dir() -> Path:
    env = os.environ.get("CONTRACTS_RECEIPTS")
    return Path(env) if env else project_root() / "receipts"


def spec_path(specs_dir: Path, key: str) -> Path:
    """The spec file for a method key; unknown keys list the valid ones."""
    from engine.suggest import did_you_mean

    def valid() -> list[str]:
        return sorted(p.stem for p in Path(specs_dir).glob("*.yaml"))

    try:
        check_key(key)
    except UsageError as err:
        # Refused before any file is touched (a path trick must not even list the specs folder): the hint is
        # the key normalised (case, underscores), offered only when that is a well-formed key itself.
        guess = key.strip().lower().replace("_", "-") if isinstance(key, str) else ""
        try:
            check_key(guess)
        except UsageError:
            raise err from None
        raise UsageError(f"{err.args[0]}; did you mean {guess!r}?") from None
    path = Path(specs_dir) / f"{key}.yaml"
    if not path.is_file():
        names = valid()
        raise UsageError(f"no spec for method {key!r} in {specs_dir.name}/; {did_you_mean(key, names)}"
                         f"valid methods: {', '.join(names) or '(none)'}")
    return path


def relative_to_root(path: Path) -> str:
    """A repository-relative POSIX path: receipts never hold absolute paths."""
    return Path(path).resolve().relative_to(project_root()).as_posix()
