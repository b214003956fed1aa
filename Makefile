# The two commands README gives a newcomer: `make demo` and `make test`.
VENV := .venv
KTS := $(VENV)/bin/kts
DEMO_DIR ?= $(CURDIR)/.kts/demo-logs
# Embedded defaults: kts's own files (Postgres, the local remote tier) under .kts; the Dagster
# instance is the repo's dagster.yaml, so `dagster dev` shows the demo's runs.
export KTS_HOME ?= $(CURDIR)/.kts
export KTS_LOG_DIRS ?= $(DEMO_DIR)

.PHONY: setup demo ui test bench

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml setup.py kts_resources/kafka/_batch_tally.c .ci/setup
	bash .ci/setup
	touch $@

# Simulate a broker's log dir, tier it with one pass of the Dagster pipeline, then inspect it.
demo: setup
	# Records stamped from an hour ago: Kafka's default 7-day retention keeps them.
	$(KTS) simulate --log-dir $(DEMO_DIR) --seed 7 --topics orders,page.views,user-events --partitions 2 --total-bytes 24MiB --segment-bytes 1MiB --start-time-ms $$(( $$(date +%s) * 1000 - 3600000 ))
	$(KTS) sync
	$(KTS) status
	$(KTS) offsets orders 0 --latest-tiered
	$(KTS) fetch orders 0 --offset 0 --max-bytes 1024 | tail -n 1
	$(KTS) segments $(DEMO_DIR)/orders-0
	$(KTS) index verify $(DEMO_DIR)/orders-0/00000000000000000000.log
	$(KTS) dump $(DEMO_DIR)/orders-0/00000000000000000000.log --records | head -n 20

# The Dagster UI (webserver + daemon) on the demo's instance and environment: http://127.0.0.1:3000
ui: setup
	$(KTS) ui --port $(or $(PORT),3000)

# Two to four worker processes (pytest-xdist), a test file each at a time: each worker starts its
# own embedded PostgreSQL, S3 endpoint and Spark Connect server; most tests wait on subprocesses
# and servers, so two workers keep two CPUs busy. `pytest` alone still runs everything in one.
test: setup
	$(VENV)/bin/python -m pytest -n auto --maxprocesses 4 --dist loadfile --no-loadscope-reorder

bench: setup
	$(VENV)/bin/python bench/scan_bench.py
	$(VENV)/bin/python bench/status_bench.py
