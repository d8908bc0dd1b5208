"""OpenEvolve integration: `contracts evolve-evaluator METHOD --out FILE` and the evaluator that file calls.

`stages` says which contract cells each cascade stage needs, `score` turns
assessed receipts into OpenEvolve metrics and artifacts, `evaluator` runs a
candidate's missing cells in warm isolated workers (engine/run/warm.py) and
writes a receipt per stage, and `template` is the evaluator file's text.
Like the CLI, this package drives runs and judges their receipts; it never
measures (engine.run.binding.FRONT_DOORS), so editing it leaves receipts fresh.
Importing it does not import torch.
"""
