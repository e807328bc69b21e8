"""README.md's (and docs/energy.md's) Python and YAML examples run as written against today's code
(a new user copies them)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

import gpusim

README = Path(__file__).resolve().parents[1] / "README.md"
ENERGY = README.parent / "docs" / "energy.md"


def code_blocks(language: str, path: Path = README) -> list[str]:
    """The fenced blocks of ``language`` in ``path`` (README.md), in order.

    Parameters
    ----------
    language
        The fence's info string, e.g. ``"python"``.
    path
        The Markdown file.

    Returns
    -------
    list[str]
        Each block's text without its fences.
    """
    return re.findall(rf"^```{language}\n(.*?)^```", path.read_text(), flags=re.DOTALL | re.MULTILINE)


@pytest.mark.parametrize("index", range(len(code_blocks("python"))))
def test_readme_python_block_runs(index: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    block = code_blocks("python")[index]
    monkeypatch.chdir(tmp_path)  # the blocks write their files (timeline.json) where they run
    exec(compile(block, f"README.md python block {index}", "exec"), {"__name__": "__readme__"})


def test_readme_has_python_blocks() -> None:
    assert code_blocks("python")


def test_the_energy_page_python_block_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (block,) = code_blocks("python", ENERGY)
    monkeypatch.chdir(tmp_path)
    exec(compile(block, "docs/energy.md python block", "exec"), {"__name__": "__docs__"})


def test_readme_yaml_block_loads_as_it_says(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The what-if YAML names its file in its first line; it loads as its base preset with the
    block's values in place."""
    (block,) = code_blocks("yaml")
    name = re.match(r"# ([\w.-]+\.yaml):", block).group(1)
    monkeypatch.chdir(tmp_path)
    Path(name).write_text(block)
    system = gpusim.load_system(name)
    assert (system.gpu.num_cus, system.gpu.hbm.clock_hz) == (160, 2e9)
    assert system.config.links.bandwidth_bytes_per_s == 150e9
    assert system.num_gpus == gpusim.load_system("t3-ring8").num_gpus


def command_lines(path: Path) -> list[str]:
    """The ``gpusim ...`` command lines of a Markdown file's bash blocks (continuations joined,
    comments dropped)."""
    lines = []
    for block in re.findall(r"^```bash\n(.*?)^```", path.read_text(), flags=re.DOTALL | re.MULTILINE):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words[:1] == ["gpusim"]:
                lines.append(line)
    return lines


COMMAND_DOCS = [README, README.parent / "docs" / "what-if.md", README.parent / "docs" / "traces.md", ENERGY]


@pytest.mark.parametrize("path", COMMAND_DOCS, ids=[path.name for path in COMMAND_DOCS])
def test_documented_commands_parse(path: Path) -> None:
    """Every documented ``gpusim`` command line is one the command accepts: its options, and the
    ops, grids, overrides and systems it names (nothing is simulated)."""
    from gpusim.cli import build_parser, parse_op, parse_overrides, parse_vary, split_stream, template_names

    lines = command_lines(path)
    assert lines
    for line in lines:
        args = build_parser().parse_args(shlex.split(line, comments=True)[1:])
        grid = parse_vary(args.vary) if getattr(args, "vary", None) else {}
        for spec in getattr(args, "op", None) or []:
            spec, _ = split_stream(spec)
            names = template_names([spec])
            parse_op(spec.format(**{name: grid[name][0] for name in names}))
        overrides = parse_overrides(getattr(args, "set", None))
        systems = grid.get("system") or [getattr(args, "system", None) or getattr(args, "name", None)]
        for system in filter(None, systems):
            gpusim.load_system(system, overrides)
            for key in filter(lambda key: "." in key, grid):  # a field of the description
                for value in grid[key]:
                    gpusim.load_system(system, {**overrides, key: value})


def test_the_generators_signature_in_docs_traces_md_is_the_real_one() -> None:
    """docs/traces.md quotes transformer()'s whole signature, which readers copy keywords from."""
    import inspect

    from gpusim.trace import transformer

    text = (README.parent / "docs" / "traces.md").read_text()
    quoted = re.search(r"`gpusim\.trace\.transformer\((.*?)\)`\s*returns", text, flags=re.DOTALL)
    assert quoted, "docs/traces.md no longer quotes the signature"
    names = re.findall(r"(?:^|,)\s*(\w+)(?==|,|$)", re.sub(r"\([^)]*\)", "", quoted.group(1)))
    assert names == list(inspect.signature(transformer).parameters)
