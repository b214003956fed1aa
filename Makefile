# The two commands README gives a newcomer: `make demo` and `make test`.
VENV := .venv
KTS := $(VENV)/bin/kts
DEMO_DIR ?= $(CURDIR)/.kts/demo-logs

.PHONY: setup demo test bench

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml .ci/setup
	bash .ci/setup
	touch $@

# Simulate a broker's log dir, then inspect it the way kts does before tiering.
demo: setup
	$(KTS) simulate --log-dir $(DEMO_DIR) --seed 7 --topics orders,page.views,user-events --partitions 2 --total-bytes 24MiB --segment-bytes 1MiB
	$(KTS) segments $(DEMO_DIR)/orders-0
	$(KTS) index verify $(DEMO_DIR)/orders-0/00000000000000000000.log
	$(KTS) dump $(DEMO_DIR)/orders-0/00000000000000000000.log --records | head -n 20

test: setup
	$(VENV)/bin/python -m pytest

bench: setup
	$(VENV)/bin/python bench/scan.py
