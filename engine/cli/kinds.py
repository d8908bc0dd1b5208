"""`contracts kinds`: the generic contract kinds, their parameter schemas and the contracts that use them."""

from __future__ import annotations

import textwrap

import typer

from engine.cli.common import JsonOpt, SpecsOpt, _console, _dirs, _print_json, app, handles_errors

WIDTH = 80  # the reviewer's terminal


def _used_by(specs_dir) -> dict[str, list[str]]:
    """kind -> ["METHOD/CONTRACT", ...] over every spec that parses (read as YAML; nothing imported)."""
    from engine.spec.loader import read_data, spec_files

    used: dict[str, list[str]] = {}
    for f in spec_files(specs_dir):
        try:
            data, _, _ = read_data(f, f.name)
        except Exception:  # noqa: BLE001 - a broken spec is `contracts validate`'s to report
            continue
        for c in (data or {}).get("contracts") or []:
            if not (isinstance(c, dict) and isinstance(c.get("kind"), str)):
                continue
            # a legacy label beside a bespoke check (kind: precision, check: x.y) is not a use of the kind
            if "check" in c and c["kind"] not in ("mechanism", "bespoke"):
                continue
            used.setdefault(c["kind"], []).append(f"{data.get('method')}/{c.get('id')}")
    return used


@app.command()
@handles_errors
def kinds(specs: SpecsOpt = None, json_out: JsonOpt = False) -> None:
    """List the generic contract kinds with their parameters and the contracts that use them."""
    from engine.kinds.base import all_kinds

    specs_dir, _ = _dirs(specs, None)
    used = _used_by(specs_dir)
    rows = [{"name": k.name, "description": k.description, "parameters": k.schema(), "metrics": dict(k.metrics),
             "used_by": sorted(used.get(k.name, []))} for k in all_kinds().values()]
    if json_out:
        _print_json({"kinds": rows})
        return
    con = _console()
    width = min(WIDTH, con.width)

    def say(text: str) -> None:
        # wrapped here, at 80 columns at most: rich would fill a wide terminal, and a pipe gets no wrapping at all
        for line in textwrap.wrap(text, width, initial_indent="  ", subsequent_indent="    ",
                                  break_long_words=False, break_on_hyphens=False):
            con.print(line, markup=False, highlight=False, soft_wrap=True)

    for r in rows:
        req = set(r["parameters"].get("required", []))
        params = ", ".join(p + ("*" if p in req else "") for p in r["parameters"].get("properties", {}))
        con.print(f"{r['name']}", style="bold", markup=False, soft_wrap=True)
        say(r["description"])
        say(f"params: {params or '(any; read by the check)'}")
        if r["metrics"]:
            say(f"metrics: {', '.join(r['metrics'])}")
        methods = sorted({u.split('/')[0] for u in r["used_by"]})
        say(f"used by: {len(r['used_by'])} contract(s) in {', '.join(methods) or 'no spec'}")
    typer.echo("\n".join(textwrap.wrap("(* required; --json prints each parameter's JSON Schema; docs/kinds.md)",
                                       width, break_long_words=False)), err=True)
