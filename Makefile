.PHONY: install test lint demo dry-run bench
install:
	pip install -e ".[test]"
test:
	python -m pytest -q
lint:
	ruff check .
demo:
	python -m spotlight_jax.main --config=configs/tiny.py --workdir=/tmp/spotlight_demo
dry-run:
	python -m spotlight_jax.main --config=configs/qwen_image.py --workdir=/tmp/q --dry_run
bench:
	python -m spotlight_jax.bench.attention
	python -m spotlight_jax.bench.sampler
	python -m spotlight_jax.bench.reconfig
