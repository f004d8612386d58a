# Set-up and entry points. `make demo`, `make test` and `make docs` each create
# .venv when it is missing, install the project with its test, plot, port and
# docs extras, and run.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Test processes (pytest-xdist), each a JAX process of 8 simulated devices that
# compiles most of the time: one per core of CI's two. `TEST_WORKERS=0` runs
# the suite in this process.
TEST_WORKERS ?= 2
# Python caches what it compiles (`__pycache__`) even where the environment
# turns that off: `make test` starts about a hundred Python processes (two
# workers, the docs' pages, the command line's and several-process tests),
# and each would otherwise compile every module it imports again. Modules are
# compiled when first imported, not all of site-packages ahead (a fifth of it
# is ever imported: 5 s against 18 s on two cores).
export PYTHONDONTWRITEBYTECODE :=

.PHONY: demo test docs nightly benchmark clean

demo: $(STAMP)
	$(BIN)/linen-nnx demo --devices 8

# Every test but those marked `nightly` (too slow for CI; see tests/README.md).
test: $(STAMP)
	$(BIN)/python -m pytest -m 'not nightly' -n $(TEST_WORKERS) --dist worksteal --durations=15

# Every test, as users compile (XLA's default optimisation level, 3, and
# fusion emitters; `make test` compiles with the cheaper options of
# tests/compile_options.py): `make test`'s, those marked `nightly` (too slow
# for CI; see tests/README.md) and every hypothesis property at the nightly
# profile (200 examples each), spread over TEST_WORKERS processes, ending with
# each property's example counts. TEST_SHARD=k/n runs the k-th of n shares
# (one per machine), e.g. `make nightly TEST_SHARD=2/4 TEST_WORKERS=4`.
nightly: $(STAMP)
	HYPOTHESIS_PROFILE=nightly XLA_FLAGS="$(XLA_FLAGS) --xla_backend_optimization_level=3 --xla_cpu_use_fusion_emitters=true" $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist load --durations=15 --hypothesis-show-statistics

benchmark: $(STAMP)
	$(BIN)/python benchmarks/train_step.py
	$(BIN)/python benchmarks/convert.py
	$(BIN)/python benchmarks/checkpoint.py
	$(BIN)/python benchmarks/infer_paths.py
	$(BIN)/python benchmarks/port.py

# The docs site, offline, in docs/_build/html (open index.html): fails on any
# warning, a public name the reference leaves out or a link that leads nowhere.
docs: $(STAMP)
	$(BIN)/sphinx-build -E -W --keep-going -q -b html docs docs/_build/html

# The venv gets pip and the build's setuptools from the interpreter's own pip
# (`--python`, pip 22.3 and later; ensurepip where that fails): a venv's
# bundled pip is older and slower, and installing it then upgrading it took
# 15 s against 5 s. The kit is built in the venv (`--no-build-isolation`, the
# setuptools pyproject.toml asks for), not in an environment of its own.
# (--no-compile: modules are compiled when first imported; see above.)
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv --without-pip $(VENV)
	$(PYTHON) -m pip --python $(BIN)/python install --quiet --upgrade pip 'setuptools>=77' \
	  || { $(BIN)/python -m ensurepip --upgrade && $(BIN)/python -m pip install --quiet --upgrade pip 'setuptools>=77'; }
	$(BIN)/python -m pip install --quiet --no-compile --no-build-isolation -e '.[test,plot,port,docs]'
	touch $(STAMP)

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .hypothesis docs/_build
