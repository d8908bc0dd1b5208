"""What every verb shares: the Typer app, the common options, one-line errors, folders, output."""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Annotated, Any, Callable, Optional

import typer
from typer.core import TyperArgument, TyperCommand, TyperOption

from engine import errors as E
from engine import paths as _paths
from engine.paths import default_receipts_dir, default_specs_dir
from engine.spec.loader import SpecError, display_path, spec_files
from engine.text import json_term_safe, term_safe

class _HelpArgument(TyperArgument):
    """An argument as `--help` and usage lines show it: METHOD, [METHOD], PATHS... (no `{method}`, no type)."""

    def display_type_rich(self, ctx):  # noqa: ARG002
        return None

    def _usage_display_name(self) -> str:
        name = self.display_name_raw
        return (name if self.required else f"[{name}]") + ("..." if self.nargs != 1 else "")


class _HelpCommand(TyperCommand):
    """A verb whose help names values, not Python types: a flag shows no placeholder (no `<bool>`), an option its
    metavar (DIR, N, CONTRACT) and an argument its name in capitals (METHOD, not `{method}` or `<list[Path]>`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for p in self.params:
            if isinstance(p, TyperArgument):
                p.__class__ = _HelpArgument
                p.metavar = p.metavar or p.name.upper()
            elif isinstance(p, TyperOption) and p.metavar is None:
                p.metavar = "" if p.is_flag or p.count else p.name.upper().replace("_", "-")


class _App(typer.Typer):
    def command(self, *args: Any, **kwargs: Any):
        kwargs.setdefault("cls", _HelpCommand)
        return super().command(*args, **kwargs)


app = _App(
    name="contracts",
    help="Check RL post-training implementations against their paper's math; gate their promotion.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Help text is shown as written: Rich markup would eat "[ray]" and render spec-like text as styles.
    rich_markup_mode=None,
)

SpecsOpt = Annotated[Optional[Path], typer.Option("--specs", metavar="DIR",
                                                  help="Folder of spec YAML files (default: specs/).")]
ReceiptsOpt = Annotated[Optional[Path], typer.Option("--receipts", metavar="DIR",
                                                     help="Receipt store (default: receipts/).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output on stdout; messages go to stderr.")]
NoCacheOpt = Annotated[bool, typer.Option(
    "--no-cache", help="Judge every receipt and spec from its bytes alone: read and write nothing of the "
                       "sealed cache (docs/performance.md).")]
TrustOpt = Annotated[Optional[Path], typer.Option(
    "--trust", metavar="FILE", help="Trust policy YAML (default: $CONTRACTS_TRUST): count only receipts signed by a key it trusts "
                    "for their device kind. Keep it outside the receipt store.")]
PolicyOpt = Annotated[Optional[str], typer.Option(
    "--policy", metavar="hf:PATH", help="Train the mechanism runs on this instead of the tiny policies: hf:PATH, a local Hugging Face "
                     "causal-LM checkpoint folder (needs the 'hf' extra; never downloads).")]
LoraRankOpt = Annotated[Optional[int], typer.Option(
    "--lora-rank", metavar="N", help="LoRA rank for --policy hf:PATH (default 8; 0 trains every weight).")]


def _err(text: str) -> None:
    """A message on stderr; whatever a spec, receipt or file name put into it shows escaped (engine/text.py)."""
    typer.echo(term_safe(text), err=True)


def _out(text: str) -> None:
    """A line of human-readable output on stdout, made terminal-safe like `_err`."""
    typer.echo(term_safe(text))


def quiet_broken_pipe() -> None:
    """The reader of stdout went away (`contracts list | head -1`): stop quietly.

    As Python's documentation recommends (signal module, "Note on SIGPIPE"):
    point stdout at devnull so the interpreter's final flush cannot raise again.
    """
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout has no file descriptor (captured in tests): nothing to flush into
        pass


def handles_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """User errors become one line and their exit code; nothing reaches the user as a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from engine.store import cache

        cache.reset()  # each command reads the cache afresh: in tests, many commands share one process
        try:
            return fn(*args, **kwargs)
        except typer.Exit:
            raise
        except E.ContractsError as exc:
            _err(f"error: {exc.line()}")
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt:
            _err("interrupted")
            raise typer.Exit(E.EXIT_INTERRUPTED) from None
        except BrokenPipeError:
            quiet_broken_pipe()
            raise typer.Exit(E.EXIT_FAILED) from None
        except Exception as exc:  # a bug of ours: still one line, with where to look
            _err(f"internal error: {type(exc).__name__}: {exc} (please report this; rerun with "
                 "CONTRACTS_DEBUG=1 for the traceback)")
            import os

            if os.environ.get("CONTRACTS_DEBUG"):
                import traceback

                traceback.print_exc()
            raise typer.Exit(E.EXIT_INTERNAL) from None
        finally:
            cache.flush_all()  # whatever was validated afresh, for the next command; never fails

    return wrapper


def _dirs(specs: Optional[Path], receipts: Optional[Path]) -> tuple[Path, Path]:
    return (specs or default_specs_dir()), (receipts or default_receipts_dir())


def _print_json(data: Any) -> None:
    from engine.store.receipts import _json_safe

    typer.echo(json_term_safe(json.dumps(_json_safe(data), indent=2, ensure_ascii=False)))


def _console():
    from rich.console import Console

    import os

    # Piped output is read whole (logs, CI), so do not squeeze tables into 80 columns there, unless COLUMNS
    # says how wide to be (Rich reads it when width is None).
    # markup=False: spec text such as "logp_loo[k]" must print as written, not as Rich markup.
    wide = sys.stdout.isatty() or (os.environ.get("COLUMNS") or "").isdigit()
    return Console(highlight=False, markup=False, width=None if wide else 200)


def _spec_cache(receipts_dir: Path, use: bool = True):
    """The validation cache kept in the receipts store (engine/store/cache.py); with use=False one that lives in
    this process only, so every verdict is derived from the files."""
    from engine.store.cache import ValidationCache, for_store

    return for_store(receipts_dir) if use else ValidationCache(None)


def _sealed(no_cache: bool = False, policy=None):
    """The user's sealed cache (engine/store/sealed.py), or a disabled one with --no-cache, CONTRACTS_NO_CACHE=1 or
    a trust policy: under a policy the runner's signing key is the root of trust, and a key in the user's cache
    folder must not stand in for it, so every receipt and spec is judged from its bytes."""
    from engine.store.sealed import Sealed

    return Sealed.for_user(use=not no_cache and policy is None)


class SealedSpecs:
    """validate_file/load_spec as the reading verbs call them: a valid spec's validation from its sealed entry
    (engine.store.sealed.validate_spec), anything else validated from the file."""

    def __init__(self, sealed):
        self.sealed = sealed

    def validate_file(self, path: Path, root: Optional[Path] = None):
        from engine.store.sealed import validate_spec

        return validate_spec(path, root, self.sealed)

    def load_spec(self, path: Path, root: Optional[Path] = None):
        from engine.store.sealed import load_spec

        return load_spec(path, root, self.sealed)


def _trust_policy(trust: Optional[Path], receipts_dir: Path):
    """The policy of --trust or $CONTRACTS_TRUST (engine.store.trust), or None; a bad one is a usage error."""
    from engine.store.trust import policy_from_option

    return policy_from_option(trust, receipts_dir)


def shown_path(path: Path) -> str:
    """A path as every verb prints it, in text and JSON (docs/cli.md, "Paths"): relative to the working directory
    when under it, else to the checkout when under that, else whole."""
    return display_path(Path(path), _paths.project_root())


def receipt_shown(receipts_dir: Path) -> Callable[[str], str]:
    """Receipt files are named by their paths too (`receipts/mrtpo/...json`), never by the name inside the store."""
    base = Path(receipts_dir)
    return lambda rel: shown_path(base / rel)


def _store_name(receipts_dir: Path) -> str:
    """How gate --json names the store it read: by its path, like every other path."""
    return shown_path(receipts_dir)


def _load_valid_specs(specs_dir: Path, receipts_dir: Path, cache=None) -> tuple[list, list[SpecError]]:
    files = spec_files(specs_dir)
    cache = cache if cache is not None else _spec_cache(receipts_dir)
    good, bad = [], []
    for f in files:
        spec, errs = cache.validate_file(f, _paths.project_root())
        if spec is not None:
            good.append(spec)
        bad.extend(errs)
    return good, bad


def _flags(specs: Optional[Path], receipts: Optional[Path]) -> str:
    """The folder options exactly as given, so a suggested command works on the same store."""
    import shlex

    out = ""
    if specs is not None:
        out += f" --specs {shlex.quote(str(specs))}"
    if receipts is not None:
        out += f" --receipts {shlex.quote(str(receipts))}"
    return out


def _spec_states(specs_dir: Path, method: Optional[str], cache) -> tuple[dict[str, str], list[str]]:
    """promotion.state of each spec (one, or all), read without validating the rest; and why any could not be."""
    from engine.spec.loader import read_document

    paths = [specs_dir / f"{method}.yaml"] if method else spec_files(specs_dir)
    states, problems = {}, []
    for p in paths:
        if not p.is_file():
            continue
        try:
            spec, _ = cache.validate_file(p, _paths.project_root())
        except Exception:  # e.g. no methods package to check names against: the state alone is still readable
            spec = None
        if spec is not None:  # valid: read_document gives this same data, and the schema requires the state
            states[p.stem] = spec.data["promotion"]["state"]
            continue
        try:
            data, _, _ = read_document(p, display_path(p, _paths.project_root()))
            states[p.stem] = data["promotion"]["state"]
        except SpecError as e:
            problems.append(f"cannot read promotion.state to check the ledger: {e.line()}")
        except (KeyError, TypeError):
            problems.append(f"{display_path(p, _paths.project_root())}: no promotion.state to check the ledger against")
    return states, problems
