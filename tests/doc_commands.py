"""The project commands that the docs, notebooks, configs and launch files show a reader.

:func:`documented_commands` collects every ``python -m spotlight_jax...`` command in README.md,
docs/, results/README.md, configs/, colab/, launch/ and the Makefile, as a reader would copy
it: continuation lines joined, comments, redirects and pipes dropped, ``[--optional flags]``
kept without their brackets, and the docs' placeholders (``W``, ``S``, ``MODE``,
``$SPOTLIGHT_TRACES``, ...) put in place (:data:`PLACEHOLDERS`). ``tests/test_doc_commands.py``
checks each one without running it; ``tests/cluster/test_launch.py`` also reads the launch files
with :func:`shell_commands`.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
import re
import shlex

ROOT = pathlib.Path(__file__).resolve().parents[1]
COMMAND = re.compile(r"python -m (spotlight_jax[\w.<>]*)")

# The words the docs write for "your value": a workdir, a config seed, an iteration count, a
# mode, an objective, a trace name, an output directory or file, a host. Replaced where they
# stand alone as a flag's value or one component of a path.
PLACEHOLDERS = {"W": "/tmp/doc_run", "RUN": "/tmp/doc_run", "PT": "/tmp/doc_pretrain",
                "DIR": "/tmp/doc_out", "FILE": "/tmp/doc_out/file", "S": "0", "N": "40",
                "MODE": "spotlight", "OBJ": "nft", "T": "synthetic", "REWARD_HOST": "127.0.0.1"}
SHELL_VARS = {"S": "0"}             # $S in a loop over seeds


@dataclasses.dataclass(frozen=True)
class Command:
    """One documented command: where it is written, the module and its arguments."""
    where: str
    module: str
    args: tuple[str, ...]

    @property
    def pattern(self) -> bool:
        """A family of commands (``spotlight_jax.bench.<name>``), not one command."""
        return "<" in self.module or self.module.endswith(".") or any("<" in a
                                                                       for a in self.args)

    def __str__(self):
        return f"{self.where}: python -m {self.module} {' '.join(self.args)}".rstrip()


def _substitute(arg: str, traces: str) -> str:
    """``arg`` with the shell's trace variable and the docs' placeholders put in place."""
    arg = re.sub(r"\$\{SPOTLIGHT_TRACES(:-[^}]*)?\}|\$SPOTLIGHT_TRACES", traces, arg)
    for name, value in SHELL_VARS.items():
        arg = re.sub(rf"\${name}\b", value, arg)
    flag, eq, value = arg.partition("=")
    if not eq:
        return PLACEHOLDERS.get(arg, arg)
    parts = value.split("/")
    return f"{flag}={'/'.join(PLACEHOLDERS.get(p, p) for p in parts)}"


def _parse(where: str, text: str, traces: str) -> Command | None:
    """The command that starts at ``text`` (``python -m ...`` to the end of its code span)."""
    m = COMMAND.match(text)
    if m is None:
        return None
    rest = text[m.end():]
    rest = re.split(r"\s#|\s\d?>|\s\||\s&&|;", rest)[0]         # comments, redirects, pipes
    rest = rest.replace("[", " ").replace("]", " ")              # [--optional flags]
    try:
        words = shlex.split(rest)
    except ValueError:                                           # an unbalanced quote
        words = rest.split()
    if "..." in words:                                           # "and so on": the rest is prose
        words = words[:words.index("...")]
    return Command(where, m.group(1), tuple(_substitute(w, traces) for w in words))


def _markdown_spans(text: str):
    """``(line number, code)`` of every code span of a markdown text: each line of a fenced
    block, each line that is a command by itself (an indented block), continuation lines joined,
    and each inline `code` span, also one that wraps over lines of its paragraph."""
    lines = text.splitlines()
    fenced = False
    paragraph: list[tuple[int, str]] = []

    def inline():
        joined = "\n".join(line for _, line in paragraph)
        for m in re.finditer(r"`([^`]+)`", joined):
            yield paragraph[0][0] + joined[:m.start()].count("\n"), " ".join(m.group(1).split())

    i = 0
    while i < len(lines):
        line, start = lines[i], i + 1
        if line.lstrip().startswith("```"):
            yield from inline()
            paragraph = []
            fenced = not fenced
        elif fenced or line.lstrip().startswith(("python -m spotlight_jax", "!python -m")):
            while line.rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                line = line.rstrip()[:-1] + " " + lines[i].strip()
            yield start, line.strip()
        elif not line.strip():
            yield from inline()
            paragraph = []
        else:
            paragraph.append((start, line))
        i += 1
    yield from inline()


def _from_text(where: str, text: str, traces: str) -> list[Command]:
    out = []
    for lineno, span in _markdown_spans(text):
        for m in COMMAND.finditer(span):
            cmd = _parse(f"{where}:{lineno}", span[m.start():], traces)
            if cmd is not None:
                out.append(cmd)
    return out


def _notebook_text(path: pathlib.Path) -> str:
    """A notebook as markdown: markdown cells as they are, code cells fenced."""
    cells = json.loads(path.read_text())["cells"]
    parts = []
    for c in cells:
        src = "".join(c["source"])
        parts.append(src if c["cell_type"] == "markdown" else f"```\n{src}\n```")
    return "\n\n".join(parts)


def _expand(text: str) -> str:
    """Shell variables -> plain words: ${X:-default} -> default, $(cmd) / $X / ${X...} -> 3;
    a script's own arguments passed on ("$@") -> nothing (they are the caller's to check)."""
    text = re.sub(r'"?\$@"?', "", text)
    text = re.sub(r"\$\{[A-Za-z_]+:-([^}]*)\}", r"\1", text)
    text = re.sub(r"\$\(\([^)]*\)\)", "3", text)
    text = re.sub(r"\$\([^)]*\)", "3", text)
    return re.sub(r"\$\{[^}]*\}|\$[A-Za-z_]+", "3", text)


def shell_commands(path: pathlib.Path) -> list[list[str]]:
    """``python -m spotlight_jax...`` invocations of a shell script, continuation lines joined
    and the script's own variables (OVERRIDES=...) substituted: ``[module, *args]`` each."""
    text = path.read_text().replace("\\\n", " ")
    vars_ = dict(re.findall(r'^([A-Z_]+)="(.*?)"$', text, flags=re.M | re.S))
    for name, value in vars_.items():
        text = text.replace(f'"${name}"', shlex.quote(_expand(value).replace('\\"', '"')))
    out = []
    for line in text.splitlines():
        m = re.search(r"(\$\()?python -m (spotlight_jax[\w.]*)(.*)", line)
        if m:
            rest = m.group(3).split(")")[0] if m.group(1) else m.group(3)   # inside $( ... )
            rest = re.split(r"\s(?:\d?>|\|)", _expand(rest))[0]   # drop redirects, pipes
            out.append([m.group(2), *shlex.split(rest)])
    return out


def documented_commands(traces: str) -> list[Command]:
    """Every project command a reader is shown; ``traces``: the folder that stands for
    ``$SPOTLIGHT_TRACES``."""
    out = []
    docs = [ROOT / "README.md", ROOT / "results" / "README.md",
            *sorted((ROOT / "docs").glob("*.md"))]
    for path in docs:
        out += _from_text(str(path.relative_to(ROOT)), path.read_text(), traces)
    for path in sorted((ROOT / "colab").glob("*.ipynb")):
        out += _from_text(str(path.relative_to(ROOT)), _notebook_text(path), traces)
    for path in sorted((ROOT / "configs").glob("*.py")):
        out += _from_text(str(path.relative_to(ROOT)), f"```\n{path.read_text()}\n```", traces)
    for path in [ROOT / "Makefile", *sorted((ROOT / "launch").rglob("*.s*"))]:  # .sh, .sbatch
        for module, *args in shell_commands(path):
            out.append(Command(str(path.relative_to(ROOT)), module,
                               tuple(_substitute(a, traces) for a in args)))
    return out
