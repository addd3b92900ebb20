# Two commands matter: `make demo` and `make test`. Both set up from nothing.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test setup apt shaders bench bench-peers clean

$(VENV)/bin/python:
	@test -n "$(PYTHON)" || { echo "need python3.11 on PATH"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(STAMP): pyproject.toml $(VENV)/bin/python
	$(PY) -m pip install -q --no-cache-dir -e '.[dev,webui,vulkan,ultralytics,lightning,import,cluster]'
	touch $(STAMP)

apt:
	bash scripts/apt-deps.sh vulkan browser postgres

setup: apt $(STAMP)

demo: setup
	$(VENV)/bin/tracker demo

test: setup
	$(PY) -m pytest -q -p no:cacheprovider -n 2 --dist loadfile --durations=25

shaders: apt
	$(PY) -m gpu.build_shaders

bench: setup
	# peers: `make bench-peers`; system_cuda exits 2 where there is no CUDA device (nothing to check)
	for b in bench/[a-z]*.py; do n=$$(basename $$b .py); case $$n in \
	  peers) ;; \
	  system_cuda) $(PY) -m bench.$$n; [ $$? -ne 1 ] || exit 1 ;; \
	  *) $(PY) -m bench.$$n || exit 1 ;; \
	esac; done

# Minutes long: each peer in its own venv under TRACKER_BENCH_CACHE (default ~/.cache/tracker-bench-peers).
bench-peers: setup
	$(PY) -m bench.peers

clean:
	rm -rf $(VENV) .tracker build *.egg-info
