"""The mode comparison: every mode of ``registry.MODES`` with the same seeds, prompts and spot
trace, each into ``workdir/<mode>`` (each resumes on its own); then ``reports.write_report``
writes ``report.md`` and the reward-vs-time / reward-vs-cost plots, and the spot trace as
``spotlight`` met it is drawn as ``spot_timeline.png``. With ``compare.seeds``, once per config
seed and ``reports.write_seed_report`` over them.
"""
from __future__ import annotations

import json
import os

from absl import logging

from spotlight_jax.config import RunSpec
from spotlight_jax.emulation.cost_models import Assumption
from spotlight_jax.reporting.compare_report import write_report, write_seed_report
from spotlight_jax.reporting.plots import spot_timeline
from spotlight_jax.runner.build import build_and_run
from spotlight_jax.runner.modes import MODES


def run_compare(spec: RunSpec, workdir: str, graphdef, base, *, base_source: str = "",
                progress: bool = True) -> str:
    """Runs every mode of the run ``spec`` with the same seeds, prompts and trace; writes and
    returns the report. With ``compare.seeds`` set, once per config seed into
    ``workdir/seed_<s>``, then the seeds' report (``report_seeds.md``: every ratio's mean and
    spread)."""
    st = spec.settings
    seeds = st.compare_seeds
    if seeds:
        dirs = {}
        for seed in seeds:
            dirs[seed] = os.path.join(workdir, f"seed_{seed}")
            run_compare(spec.replace({"seed": seed, "compare.seeds": ()}), dirs[seed],
                        graphdef, base, base_source=base_source, progress=progress)
        return write_seed_report(workdir, dirs, header=f"Base: {base_source}.")
    histories, phases, assumptions = {}, {}, None
    for mode in MODES:
        logging.info("compare: running %s", mode)
        mode_dir = os.path.join(workdir, mode)
        histories[mode] = build_and_run(spec.replace({"mode": mode}), mode_dir, graphdef,
                                        base, base_source=base_source, progress=progress)
        with open(os.path.join(mode_dir, "phases.json")) as f:
            info = json.load(f)
        phases[mode], assumptions = info["phases"], info["assumptions"]
    tc, dc = spec.trace, spec.deployment
    trace = tc.path or "synthetic"
    if tc.path and tc.start_s:
        trace += f" from {tc.start_s:g} s on"
    header = (f"Config seed {spec.seed}; trace: {trace}; base: {base_source}. Learning is real "
              "(tiny model); time and cost are emulated from the cost model below.")
    timeline = "spot_timeline.png"
    spot_timeline(os.path.join(workdir, timeline), spec.make_deployment().replay,
                  dc.spot_devices_per_node, histories["spotlight"],
                  title=f"spotlight on the {'SkyPilot' if tc.path else 'synthetic'} "
                        "trace")
    return write_report(workdir, histories, target_frac=st.target_frac,
                        target_gain=st.target_gain,
                        phases=phases, assumptions=[Assumption(**a) for a in assumptions],
                        header=header, timeline=timeline)
