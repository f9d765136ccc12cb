# Two commands on a fresh clone: `make demo` and `make test`. Both create .venv on first use.
PY      ?= python3
VENV    := .venv
VPY     := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
TORCH   ?= torch==2.13.0

.PHONY: demo test test-slow install evaluation bench clean

$(VPY):
	$(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip

# torch first (CPU build pinned) only when the venv has none, so users keep their CUDA/NPU build.
$(STAMP): $(VPY) pyproject.toml
	@$(VPY) -c "import torch" 2>/dev/null || $(VPY) -m pip install -q "$(TORCH)"
	$(VPY) -m pip install -q -e ".[all,dev]"
	$(VPY) -m pip install -q --no-deps "torchtitan==0.3.0"  # its models and Trainer (tests/exec/test_torchtitan*.py)
	$(VPY) -m fcp_data.plan.compile_kernels
	@touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VPY) -m fcp_exec.demo

test: $(STAMP)
	$(VPY) -m pytest -q -x -n auto --dist loadfile --no-loadscope-reorder --durations=15

test-slow: $(STAMP)
	$(VPY) -m pytest -q -m slow

evaluation: $(STAMP)
	$(VPY) benchmarks/paper/run_all.py

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache
