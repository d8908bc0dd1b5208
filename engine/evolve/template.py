"""The text of an OpenEvolve evaluator file, as `contracts evolve-evaluator` writes it.

Every value written into the file is a Python literal made with repr() (paths, the method key, numbers), so no
text from a spec or an option can become code. The file holds absolute paths: it belongs to the machine that
runs OpenEvolve, not to a receipt.
"""

from __future__ import annotations

from typing import Any

_TEXT = '''"""OpenEvolve evaluator for {method}: each candidate under the contracts of {spec_name}.

Written by `contracts evolve-evaluator {method}` (paper-contracts {version}); run OpenEvolve with
this file as its evaluator, in a Python where paper-contracts is installed with the [evolve] extra.

  evaluate_stage1  {stage1}
  evaluate_stage2  {stage2}
  evaluate_stage3  {stage3}
  evaluate         what stage 3 needs, without a cascade

combined_score: 0 for a candidate that breaks any contract (or cannot be checked); 0.5 once stage 1
holds and 0.75 once stage 2 holds (OpenEvolve's default cascade_thresholds); 0.9 + 0.1 x {score} once
every contract holds. Artifacts name each broken contract with its measured value against its
tolerance, and the receipt ids. Every stage writes a receipt to {receipts_shown}; its verdict
is read back from the receipts, never from a cache. Under strict (the default) a candidate's source
is screened against an allowlist of imports and constructs before it runs; each candidate runs in a
bubblewrap sandbox of its own (read-only views, no network, its own PID namespace, isolated Python),
killed before its receipt is signed.
See docs/evolve.md in paper-contracts.
"""

try:
    from engine.evolve.evaluator import Evaluator
except ImportError as exc:  # OpenEvolve runs in a Python without paper-contracts
    raise ImportError("this evaluator needs paper-contracts in the Python that runs OpenEvolve: "
                      "pip install -e '/path/to/paper-contracts[evolve]'") from exc

EVALUATOR = Evaluator(
    {method!r},
    specs={specs!r},
    receipts={receipts!r},
    device={device!r},
    seeds={seeds!r},
    timeout_s={timeout_s!r},
    memory_mb={memory_mb!r},
    jobs={jobs!r},
    sign_key={sign_key!r},
    sign_command={sign_command!r},
    trust={trust!r},
    sandbox={sandbox!r},
    strict={strict!r},
)


def evaluate(program_path):
    return EVALUATOR.evaluate(program_path)


def evaluate_stage1(program_path):
    return EVALUATOR.stage(1, program_path)


def evaluate_stage2(program_path):
    return EVALUATOR.stage(2, program_path)


def evaluate_stage3(program_path):
    return EVALUATOR.stage(3, program_path)
'''


def _doc_safe(text: str) -> str:
    """Spec-derived words inside the file's docstring: no quote run or backslash can end or bend it."""
    return text.replace("\\", "/").replace('"""', "'''")


def render(*, method: str, spec_name: str, version: str, stages: dict[int, str], score: str, options: dict[str, Any],
           receipts_shown: str) -> str:
    """The evaluator file for `method` with the Evaluator `options` (all literals)."""
    return _TEXT.format(method=method, spec_name=_doc_safe(spec_name), version=_doc_safe(version),
                        stage1=_doc_safe(stages[1]), stage2=_doc_safe(stages[2]), stage3=_doc_safe(stages[3]),
                        score=_doc_safe(score), receipts_shown=_doc_safe(receipts_shown), **options)
