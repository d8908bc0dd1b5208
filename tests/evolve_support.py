"""OpenEvolve, offline, for the tests: an initial TAPO program, canned diffs, a loopback stub LLM, and a driver.

`python tests/evolve_support.py INITIAL EVALUATOR CONFIG OUT_DIR ITERATIONS RESULT_JSON` runs OpenEvolve's
documented library API (`openevolve.api.run_evolution`) in a process of its own, so its logging set-up and
signal handlers never touch the test process.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "my_tapo.py"
STUB = ROOT / "tests" / "openai_stub.py"

RATIO_RETURN = "    return prefix * torch.exp(here - here.detach())  # value prefix, gradient prefix * d logp_t"


def initial_program() -> str:
    """The plain-torch TAPO of tests/fixtures/my_tapo.py, its functions inside OpenEvolve's EVOLVE-BLOCK."""
    text = FIXTURE.read_text()
    start = text.index("def _work_dtype")
    return text[:start] + "# EVOLVE-BLOCK-START\n" + text[start:].rstrip("\n") + "\n# EVOLVE-BLOCK-END\n"


def diff(search: str, replace: str, why: str) -> str:
    """An LLM reply in OpenEvolve's SEARCH/REPLACE form."""
    return f"{why}\n\n<<<<<<< SEARCH\n{search}\n=======\n{replace}\n>>>>>>> REPLACE\n"


# Each edits lines no other one touches, so every diff applies to whichever program OpenEvolve picks as parent.
SCALED = diff(RATIO_RETURN, RATIO_RETURN.replace("return prefix", "return 1.01 * prefix"),
              "Scale the ratio slightly for stability.")
REFACTOR = diff("    inv_sqrt_T = T.rsqrt()\n    long = T > 1",
                "    inv_sqrt_T = torch.rsqrt(T)  # same value, the functional form\n    long = T > 1",
                "Use the functional rsqrt.")
OPTIMISTIC = diff("    surrogate = torch.minimum(live * adv, torch.clamp(live, lo, hi) * adv)",
                  "    surrogate = torch.maximum(live * adv, torch.clamp(live, lo, hi) * adv)",
                  "Take the optimistic branch of the surrogate.")
RENAME = diff("    n = int(m.sum())\n    if n == 0:", "    n = int(m.sum().item())\n    if n == 0:",
              "Read the token count with .item().")
REPLIES = [SCALED, REFACTOR, OPTIMISTIC, RENAME]


def config_yaml(port: int, iterations: int) -> str:
    return f"""\
max_iterations: {iterations}
checkpoint_interval: 1
log_level: WARNING
random_seed: 42
diff_based_evolution: true
max_code_length: 20000
llm:
  api_base: http://127.0.0.1:{port}/v1
  api_key: stub-key-not-a-secret
  models:
    - name: stub
      weight: 1.0
  temperature: 0.0
  max_tokens: 2048
  timeout: 30
  retries: 0
  retry_delay: 1
evaluator:
  timeout: 600
  max_retries: 0
  cascade_evaluation: true
  cascade_thresholds: [0.5, 0.75]
  parallel_evaluations: 1
database:
  population_size: 20
  num_islands: 1
"""


def offline_env() -> dict:
    """The environment OpenEvolve runs in: nothing that could send a request anywhere but the loopback stub."""
    env = {k: v for k, v in os.environ.items() if not k.upper().endswith("_PROXY") and "OPENAI" not in k.upper()}
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


@contextlib.contextmanager
def stub_server(folder: Path, replies: list[str], max_seconds: float = 600.0):
    """Start the loopback stub (yields its port and its request log), and stop it however the block ends."""
    replies_file, port_file = folder / "replies.json", folder / "stub.port"
    replies_file.write_text(json.dumps(replies))
    port_file.unlink(missing_ok=True)  # a port file left by an earlier stub would point at nothing
    proc = subprocess.Popen([sys.executable, str(STUB), str(replies_file), str(port_file),
                             "--max-seconds", str(max_seconds)], stdin=subprocess.PIPE, env=offline_env())
    try:
        end = time.monotonic() + 60
        while not port_file.exists():
            if proc.poll() is not None or time.monotonic() > end:
                raise RuntimeError(f"the stub server did not start (exit {proc.poll()})")
            time.sleep(0.05)
        yield int(port_file.read_text()), port_file.with_name(port_file.name + ".log")
    finally:
        try:
            proc.stdin.close()  # its signal to stop
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def run_openevolve(folder: Path, evaluator: Path, port: int, iterations: int, timeout: float = 900.0) -> dict:
    """Run OpenEvolve in a subprocess; its result, and every program of its last checkpoint."""
    initial = folder / "initial_program.py"
    initial.write_text(initial_program())
    config = folder / "config.yaml"
    config.write_text(config_yaml(port, iterations))
    out, result = folder / "openevolve_output", folder / "result.json"
    proc = subprocess.run([sys.executable, str(Path(__file__)), str(initial), str(evaluator), str(config), str(out),
                           str(iterations), str(result)], cwd=folder, env=offline_env(), capture_output=True,
                          text=True, timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"OpenEvolve exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    data = json.loads(result.read_text())
    checkpoints = sorted((out / "checkpoints").glob("checkpoint_*"), key=lambda p: int(p.name.split("_")[1]))
    programs = []
    if checkpoints:
        for f in sorted((checkpoints[-1] / "programs").glob("*.json")):
            p = json.loads(f.read_text())
            p["artifacts"] = json.loads(p.get("artifacts_json") or "{}")
            programs.append(p)
    data["programs"] = programs
    data["log"] = proc.stderr
    return data


def _drive(argv: list[str]) -> int:
    initial, evaluator, config, out, iterations, result = argv
    from openevolve.api import run_evolution

    r = run_evolution(initial, evaluator, config=config, iterations=int(iterations), output_dir=out, cleanup=False)
    Path(result).write_text(json.dumps({"best_score": r.best_score, "best_code": r.best_code,
                                        "best_metrics": r.metrics, "output_dir": r.output_dir}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(_drive(sys.argv[1:]))
