.PHONY: install lint typecheck test test-quick test-chaos demo bench docs docs-build
install:
	deploy/local/install.sh
lint:
	ruff check agent_worker tasks store tests bench
typecheck:
	mypy
test:
	deploy/local/test.sh
test-quick:
	deploy/local/test.sh -m "not chaos"
test-chaos:
	deploy/local/test.sh -m chaos
demo:
	deploy/local/demo.sh
bench:
	python -m bench.run
docs:
	mkdocs serve
docs-build:
	mkdocs build --strict --site-dir .data/site
