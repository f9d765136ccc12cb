"""DESIGN §3: the planning core (cost, plan/, workloads, presets, the planning CLI) imports numpy only — never
torch. A failure means `import fcp_data.plan` (or `fcp plan`) started pulling torch (seconds of import time,
and no torch-free planning service)."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("torch", "cvxpy", "matplotlib", "decord", "ray", "transformers", "tokenizers")

CODE = r"""
import io, json, sys, contextlib
import numpy as np
import fcp_data, fcp_data.plan, fcp_data.cost, fcp_data.workloads, fcp_data.presets
from fcp_data.plan import plan_batch, SOLVER_NAMES
cm = fcp_data.cost.CostModel.preset("Qwen3-8B", "h100")
lengths = np.array([120000, 3000, 800, 45000, 200, 9000, 17000])
for s in SOLVER_NAMES:
    if s != "ilp":
        plan_batch(lengths, num_ranks=8, cost_model=cm, solver=s, micro_batches="auto")
from fcp_cli.main import main
with open(sys.argv[1], "w") as f:
    f.write("\n".join(map(str, lengths)))
with contextlib.redirect_stdout(io.StringIO()):
    assert main(["plan", "--lengths", sys.argv[1], "--ranks", "8", "--preset", "qwen3-8b", "--hardware", "h100",
                 "--json"]) == 0
print(json.dumps(sorted({m.split(".")[0] for m in sys.modules})))
"""


def test_planning_core_does_not_import_torch(tmp_path):
    r = subprocess.run([sys.executable, "-c", CODE, str(tmp_path / "l.txt")], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    loaded = set(json.loads(r.stdout.strip().splitlines()[-1]))
    assert not loaded & set(HEAVY), sorted(loaded & set(HEAVY))
