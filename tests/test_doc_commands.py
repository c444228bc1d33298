"""Every project command a reader is shown (README, docs/, results/README.md, configs/, colab/,
launch/) is accepted without running its job: the module exists, its own flag parser takes the
flags, the config file loads with every ``--config.*`` override, and for
``spotlight_jax.main`` the run's :class:`RunSpec` builds (validated as the command line does);
a study or benchmark's flags parse and its positional words are commands it has.

What a reader supplies is put in place first (``tests/doc_commands.py``): the docs'
placeholders, ``$SPOTLIGHT_TRACES`` (stand-in trace files of the SkyPilot format where the real
traces are absent), and for a real model the tiny random Qwen-Image (Wan) pipeline fixture as
``/models/Qwen-Image`` (``/models/Wan2.1-T2V-14B-Diffusers``; ``/models/Qwen-Image-Edit``: the
Qwen-Image fixture beside an edit pipeline's model_index.json; ``/models/Z-Image``,
``/models/FLUX.2-dev``, ``/models/FLUX.2-klein-4B``: folders of links to the Z-Image and FLUX.2
transformer fixtures and a VAE of their channels, ``helpers.stand_in_pipe``) with a
prompt-embedding file of the config's widths (an editing model's: an edit file with input-image
latents; Z-Image's and FLUX.2's: a stand-in of their pipeline's file, FLUX.2's rows
``model.text_len`` tokens long).
"""
import importlib
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
from absl import flags
from doc_commands import ROOT, documented_commands
from helpers import (
    QWEN_PIPE,
    WAN_PIPE,
    edit_prompt_file,
    pipeline_prompt_file,
    qwen_edit_pipe,
    stand_in_pipe,
    world_prompt_file,
    write_stand_in_trace,
)

from spotlight_jax.config import ConfigError, RunSpec, model_config
from spotlight_jax.emulation.traces import default_trace_dir

# the Qwen-Image-Edit stand-in is made by the `qwen_edit` fixture (a folder of links)
QWEN_EDIT_PIPE = Path(tempfile.gettempdir()) / f"spotlight_doc_qwen_edit_{os.getpid()}"
# the Z-Image and FLUX.2 stand-ins (made by the `stand_ins` fixture), by transformer fixture
STAND_INS = Path(tempfile.gettempdir()) / f"spotlight_doc_stand_ins_{os.getpid()}"
STAND_IN_FOLDERS = {"/models/Z-Image": "z_image", "/models/FLUX.2-dev": "flux2_dev",
                    "/models/FLUX.2-klein-4B": "flux2_klein"}
REAL_MODEL_FOLDERS = {"/models/Qwen-Image": QWEN_PIPE, "/models/Wan2.1-T2V-14B-Diffusers": WAN_PIPE,
                      "/models/Qwen-Image-Edit": QWEN_EDIT_PIPE,
                      **{k: STAND_INS / v for k, v in STAND_IN_FOLDERS.items()}}


def _real_model_stand_in(arg: str) -> str:
    """A ``base_checkpoint`` that only exists on the reader's machine -> its tiny fixture."""
    flag, _, value = arg.partition("=")
    if flag == "--config.base_checkpoint" and value in REAL_MODEL_FOLDERS:
        return f"{flag}={REAL_MODEL_FOLDERS[value]}"
    return arg


# the folder the commands' $SPOTLIGHT_TRACES stands for (filled by the `traces` fixture)
TRACES = Path(tempfile.gettempdir()) / f"spotlight_doc_traces_{os.getpid()}"
COMMANDS = documented_commands(str(TRACES))


@pytest.fixture(scope="module")
def traces():
    """``TRACES``: a link to the real traces where they are, else a stand-in for every trace
    file a command names (4 nodes alive for 10 days in 300 s ticks)."""
    real = default_trace_dir()
    shutil.rmtree(TRACES, ignore_errors=True)
    if (real / "skypilot").is_dir():
        TRACES.symlink_to(real.resolve(), target_is_directory=True)
    else:
        for cmd in COMMANDS:
            for arg in cmd.args:
                for path in arg.partition("=")[2].split(","):
                    if path.startswith(str(TRACES)) and path.endswith(".json"):
                        write_stand_in_trace(path)
    yield TRACES
    if TRACES.is_symlink():
        TRACES.unlink()
    else:
        shutil.rmtree(TRACES, ignore_errors=True)


@pytest.fixture(scope="module")
def qwen_edit():
    """``QWEN_EDIT_PIPE``: the tiny Qwen-Image fixture as a Qwen-Image-Edit folder."""
    yield qwen_edit_pipe(QWEN_EDIT_PIPE)
    shutil.rmtree(QWEN_EDIT_PIPE, ignore_errors=True)


@pytest.fixture(scope="module")
def stand_ins():
    """``STAND_INS``: the Z-Image and FLUX.2 stand-in folders (links to the fixtures)."""
    for fixture in STAND_IN_FOLDERS.values():
        stand_in_pipe(STAND_INS / fixture, fixture)
    yield STAND_INS
    shutil.rmtree(STAND_INS, ignore_errors=True)


def test_the_docs_show_commands_of_every_kind():
    """The collector finds what the docs hold (a collector that finds nothing checks nothing)."""
    modules = {c.module for c in COMMANDS}
    assert len(COMMANDS) >= 80, len(COMMANDS)
    assert {"spotlight_jax.main", "spotlight_jax.studies.compare_grid",
            "spotlight_jax.rewards.serve", "spotlight_jax.tools.encode_prompts"} <= modules
    wheres = {c.where.split(":")[0] for c in COMMANDS}
    assert {"README.md", "docs/spotlight.md", "colab/quickstart.ipynb",
            "launch/local_cluster.sh", "configs/tiny.py"} <= wheres


def _parse(module, args, monkeypatch):
    """The module's own flags parsed from ``args``; returns (the module, flag values,
    positional words)."""
    program = importlib.import_module(module)
    # where --config.* overrides are read from, also by a default config parsed at definition
    monkeypatch.setattr(sys, "argv", [module, *args])
    fv = flags.FlagValues()
    program.define_flags(fv)
    rest = fv([module, *args])              # absl's parser: an unknown flag fails here
    return program, fv, rest[1:]


def _stand_in_prompts(config, tmp_path: Path) -> None:
    """A prompt-embedding file of the run's model widths where the command names one that only
    exists on the reader's machine."""
    p = config.prompts
    if not p.embeddings_file or os.path.exists(p.embeddings_file):
        return
    m = model_config(config)
    path = tmp_path / "prompts.safetensors"
    if getattr(m, "reference_images", 0):        # an editing model: pairs with their images
        edit_prompt_file(path, m.text_embed_dim, channels=m.channels)
        p.embeddings_file = str(path)
        return
    family = config.model.get("family", "mmdit")
    if family in ("z_image", "flux2"):           # the file of the folder's own pipeline
        fixture = ("z_image" if family == "z_image" else
                   "flux2_dev" if m.guidance_embeds else "flux2_klein")
        pipeline_prompt_file(path, fixture, text_len=m.text_len, dim=m.text_embed_dim)
        p.embeddings_file = str(path)
        return
    world_prompt_file(path, m.text_embed_dim, image_size=32,
                      pooled_dim=m.pooled_dim if m.pooled == "input" else 0,
                      video=config.model.get("family", "mmdit") == "wan")
    p.embeddings_file = str(path)


def _check_main(fv, tmp_path):
    if not fv["config"].present:            # a fragment in prose (--distributed ...)
        return
    config = fv.config
    _stand_in_prompts(config, tmp_path)
    if config.deployment.transport == "ray" and importlib.util.find_spec("ray") is None:
        # without the cluster extra the command is refused with its install hint, and nothing
        # past that check can be validated here
        with pytest.raises(ConfigError, match=r"needs Ray: pip install -e '\.\[cluster\]'"):
            RunSpec.from_config(config)
        pytest.skip("a Ray command: needs pip install -e '.[cluster]' (refused without it)")
    spec = RunSpec.from_config(config)                  # validated as the command line does
    assert spec.settings.mode == config.mode


@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: c.where)
def test_documented_command_is_accepted(cmd, traces, qwen_edit, stand_ins, tmp_path,
                                        monkeypatch):
    monkeypatch.chdir(ROOT)                 # the docs' paths are relative to the repository
    if cmd.pattern:                         # e.g. spotlight_jax.bench.<name>: the family exists
        package = cmd.module.split("<")[0].rstrip(".")
        assert importlib.util.find_spec(package) is not None, str(cmd)
        return
    assert importlib.util.find_spec(cmd.module) is not None, f"no module: {cmd}"
    if not cmd.args:                        # the module named in prose
        return
    args = [_real_model_stand_in(a) for a in cmd.args]
    program, fv, positional = _parse(cmd.module, args, monkeypatch)
    allowed = getattr(program, "COMMANDS", ())
    if not getattr(program, "POSITIONAL_RUN_DIRS", False):
        assert all(p in allowed for p in positional), \
            f"{cmd}: positional words {positional}, the program takes {allowed or 'none'}"
    if cmd.module == "spotlight_jax.main":
        _check_main(fv, tmp_path)
    elif cmd.module == "spotlight_jax.rewards.serve":
        program.check_reward(fv.reward)
    elif "config" in fv and fv["config"].present:
        assert fv.config is not None        # a study's config loads with its overrides


def _slug(heading: str) -> str:
    """GitHub's anchor of a markdown heading: lower case, punctuation dropped, spaces -> '-'."""
    text = re.sub(r"[`*]|\[|\]\([^)]*\)", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    return {_slug(h) for h in re.findall(r"^#+ (.+)$", path.read_text(), flags=re.M)}


def test_every_relative_link_in_the_docs_reaches_its_file_and_heading():
    """A link a reader follows (README, docs/, results/README.md) names a file that exists and,
    with ``#anchor``, one of its headings (a split or renamed page must take its links along)."""
    pages = [ROOT / "README.md", ROOT / "results" / "README.md",
             *sorted((ROOT / "docs").glob("*.md"))]
    broken, checked = [], 0
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"[a-z]+://|mailto:", target):
                continue
            file, _, anchor = target.partition("#")
            dest = (page.parent / file).resolve() if file else page
            checked += 1
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert checked > 50, checked
    assert not broken, "\n".join(broken)


def _user_pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
            *sorted((ROOT / "results").rglob("*.md")), *sorted((ROOT / "colab").glob("*.ipynb"))]


def test_user_facing_text_names_no_internal_issue_numbers():
    """A reader cannot open the project's internal tickets: pages name the feature or the
    measurement, and provenance is a commit."""
    ticket = re.compile(r"\b[Ii]ssues? ?#?\d+\b")
    found = [f"{p.relative_to(ROOT)}:{n}: {m.group(0)}" for p in _user_pages()
             for n, line in enumerate(p.read_text().splitlines(), 1)
             for m in ticket.finditer(line)]
    assert not found, "\n".join(found)
    assert ticket.search("see issue 53") and ticket.search("Issue #7") \
        and not ticket.search("the issue of cost")


def test_docs_pages_stay_readable_in_length():
    """A page a reader scrolls (README, docs/) stays within 600 lines: longer ones are split by
    topic."""
    long = {str(p.relative_to(ROOT)): n for p in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]
            if (n := len(p.read_text().splitlines())) > 600}
    assert not long, long
