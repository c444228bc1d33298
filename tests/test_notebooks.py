"""The Colab notebooks run top to bottom, headless, with a reduced-size setting.

Each notebook has one cell tagged ``parameters``; the test inserts a cell right after it that
overrides those parameters (a micro model, a few iterations), as papermill would, and executes
the notebook in a fresh kernel with nbclient. Assertions inside the notebooks (SP attention equals
dense, regroups compile nothing, rollouts survive a device loss) fail the test like any cell error.
"""
import pathlib

import nbformat
import pytest
from helpers import MICRO_RUN_OVERRIDES
from nbclient import NotebookClient

COLAB = pathlib.Path(__file__).resolve().parents[1] / "colab"

# The notebooks set mode and evaluation cadence themselves, and run the default objective.
MICRO_OVERRIDES = {k: v for k, v in MICRO_RUN_OVERRIDES.items()
                   if k not in ("mode", "rl.eval_every", "rl.objective")}
MICRO_OVERRIDES.update({
    "num_cpu_devices": 8, "compilation_cache_dir": "", "base_checkpoint": "none",
    "pretrain.steps": 20, "pretrain.batch_size": 8, "pretrain.eval_every": 0,
    "pretrain.warmup": 5,
})

SMALL = {
    "quickstart": dict(MAX_MINUTES=5.0, EVAL_EVERY=3,
                       OVERRIDES={**MICRO_OVERRIDES, "rl.iterations": 3}),
    "sequence_parallel": dict(SEQ=256, REPEATS=1, STEPS=2, OVERRIDES={
        k: v for k, v in MICRO_OVERRIDES.items() if k.startswith("model.")}),
    "seed_exploration": dict(ITERATIONS=2, PROMPTS=2, SEEDS=6, OVERRIDES=MICRO_OVERRIDES),
    # the shipped tiny editing base, 1 iteration, a small held-out set
    "edit": dict(MAX_MINUTES=5.0, EVAL_EVERY=1, OVERRIDES={
        "num_cpu_devices": 8, "compilation_cache_dir": "", "rl.iterations": 1,
        "rl.max_minutes": 0.0, "rl.eval_prompts": 4, "rl.eval_seeds": 1, "rl.prompts_per_iter": 2,
        "rl.group_size": 4, "sampler.num_steps": 6, "sampler.eval_steps": 4}),
    # the shipped tiny video base, 1 iteration, a small held-out set
    "video": dict(ITERATIONS=1, EVAL_EVERY=1, OVERRIDES={
        "num_cpu_devices": 8, "compilation_cache_dir": "", "rl.iterations": 1,
        "rl.max_minutes": 0.0, "rl.eval_prompts": 2, "rl.eval_seeds": 1, "rl.prompts_per_iter": 2,
        "rl.group_size": 4, "sampler.num_steps": 6, "sampler.eval_steps": 4}),
}


def test_every_notebook_has_a_reduced_setting():
    assert sorted(SMALL) == sorted(p.stem for p in COLAB.glob("*.ipynb"))


@pytest.mark.parametrize("name", sorted(SMALL))
def test_notebook_is_stripped_and_parametrised(name):
    nb = nbformat.read(COLAB / f"{name}.ipynb", as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code), "outputs not stripped"
    params = [c for c in code if "parameters" in c.metadata.get("tags", [])]
    assert len(params) == 1, "exactly one cell tagged 'parameters'"
    for key in SMALL[name]:
        assert f"\n{key} = " in "\n" + params[0].source, f"{key} is not a parameter of {name}"
    assert "import spotlight_jax" in code[0].source or "spotlight_jax" in code[0].source


@pytest.mark.notebooks
@pytest.mark.parametrize("name", sorted(SMALL))
def test_notebook_runs(name, tmp_path):
    nb = nbformat.read(COLAB / f"{name}.ipynb", as_version=4)
    i = next(i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", []))
    values = dict(SMALL[name])
    if "WORKDIR = " in nb.cells[i].source:
        values["WORKDIR"] = str(tmp_path / "work")
    nb.cells.insert(i + 1, nbformat.v4.new_code_cell(
        "# test overrides\n" + "\n".join(f"{k} = {v!r}" for k, v in values.items())))
    NotebookClient(nb, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                     for o in c.outputs)
    images = sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code"
                 for o in c.outputs)
    assert images >= 2, f"{name} displayed {images} figures"
    expected = {"quickstart": "held-out reward", "sequence_parallel": "equals the single-device",
                "seed_exploration": "Kendall tau", "video": "(count ",
                "edit": "(applied "}[name]
    assert expected in text
