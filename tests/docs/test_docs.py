"""Every command and code block of the README and `docs/`, checked against the code.

Python blocks parse, and what they import from `agent_jobs` exists; shell blocks pass
`bash -n`, and each `agent-jobs` command and option they use (in a block or in inline
code) is one of the command line's; every `/v1/…` path is a route of the HTTP API; every
`AGENT_JOBS_…` variable is a setting, and every setting is documented; JSON, YAML and TOML
blocks parse; every path of the README's layer map exists, and every package of the code
is on it; every docs page is in the README's contents list, and every relative link (and
its anchor) resolves. No service is needed.
"""

from __future__ import annotations

import ast
import importlib
import json
import re
import shlex
import subprocess
import textwrap
import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import click
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
INLINE = re.compile(r"`(agent-jobs [^`]+)`")
HTTP_PATH = re.compile(r"/v1/[^\s\"'`<>)\]]+")
ENV = re.compile(r"AGENT_JOBS_[A-Z0-9_]*[A-Z0-9]")
MAP_PATH = re.compile(r"(?<![\w/.\-])((?:[\w.\-]+/)+[\w.\-]*|[\w\-]+\.py|Dockerfile)")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence
    language: str
    text: str

    def __str__(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}:{self.language}"


def blocks_of(page: Path) -> list[Block]:
    found: list[Block] = []
    opened: tuple[int, str, str] | None = None
    body: list[str] = []
    for number, line in enumerate(page.read_text().split("\n"), start=1):
        fence = FENCE.match(line)
        if fence and opened is None:
            opened, body = (number, fence.group(1), fence.group(2)), []
        elif fence and opened is not None:
            start, indent, language = opened
            text = textwrap.dedent("\n".join(body)) if indent else "\n".join(body)
            found.append(Block(page, start, language, text + "\n"))
            opened = None
        elif opened is not None:
            body.append(line)
    assert opened is None, f"{page.name}: the fence at line {opened[0]} is never closed"
    return found


def prose_of(page: Path) -> str:
    """The page without its fenced blocks."""
    text = page.read_text()
    for block in blocks_of(page):
        text = text.replace(block.text.rstrip("\n"), "")
    return text


BLOCKS = [block for page in PAGES for block in blocks_of(page)]


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    text = heading.strip().lower().replace("`", "")
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors_of(page: Path) -> set[str]:
    return {
        slug(match.group(1))
        for match in re.finditer(r"^#{1,6} (.+)$", prose_of(page), flags=re.MULTILINE)
    }


# --- the command line -------------------------------------------------------------------


def check_cli(words: list[str], where: str) -> None:
    """`words` follow `agent-jobs`: a real command, then only its real options."""
    from agent_jobs.cli import main

    command: click.Command = main
    rest = list(words)
    while isinstance(command, click.Group) and rest and not rest[0].startswith("-"):
        name = rest.pop(0)
        found = command.get_command(click.Context(command), name)
        assert found is not None, f"{where}: `agent-jobs … {name}` is no command"
        command = found
    options = {"--help", "-h"} | {
        opt for param in command.params for opt in (*param.opts, *param.secondary_opts)
    }
    if command is main:
        options.add("--version")
    for word in rest:
        flag = word.split("=", 1)[0]
        if flag.startswith("--") and len(flag) > 2:
            assert flag in options, f"{where}: `agent-jobs {command.name}` has no {flag}"


def shell_words(line: str) -> list[list[str]]:
    """What follows each `agent-jobs` of a shell line, up to the end of its command."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        tokens = list(lexer)
    except ValueError:  # a quote left open across lines: read it word by word
        tokens = line.split()
    calls: list[list[str]] = []
    for index, token in enumerate(tokens):
        if token == "agent-jobs" or token.endswith("/agent-jobs"):
            words: list[str] = []
            for word in tokens[index + 1 :]:
                if set(word) <= set("|&;()<>"):
                    break
                words.append(word)
            calls.append(words)
    return calls


def logical_lines(script: str) -> list[str]:
    return script.replace("\\\n", " ").split("\n")


# --- the HTTP API -----------------------------------------------------------------------


@cache
def routes() -> list[list[str]]:
    from agent_jobs.http import factory

    modules = [
        getattr(factory, name)
        for name in (
            "service",
            "runs",
            "history",
            "decisions",
            "reconcile",
            "controls",
            "page",
            "scraping",
        )
    ]
    return [route.path.strip("/").split("/") for m in modules for route in m.router.routes]


def is_route(path: str) -> bool:
    wanted = path.split("?", 1)[0].rstrip(".,;:").strip("/").split("/")
    return any(
        len(route) == len(wanted)
        and all(r == w or (r.startswith("{") and w) for r, w in zip(route, wanted, strict=True))
        for route in routes()
    )


# --- settings ---------------------------------------------------------------------------


@cache
def setting_names() -> frozenset[str]:
    import agent_jobs.approvals.listener
    import agent_jobs.logs
    import agent_jobs.models.registry  # noqa: F401 (each defines a settings class)
    from agent_jobs.settings import SettingsBase

    names = set()
    for cls in SettingsBase.__subclasses__():
        prefix = cls.model_config.get("env_prefix", "")
        names |= {f"{prefix}{name.upper()}" for name in cls.model_fields}
    return frozenset(names)


# --- the checks of each block -----------------------------------------------------------


def check_python(block: Block) -> None:
    tree = ast.parse(block.text, filename=str(block))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("agent_jobs"):
            module = importlib.import_module(node.module or "")
            for alias in node.names:
                name = alias.name
                assert hasattr(module, name) or importlib.util.find_spec(f"{node.module}.{name}"), (
                    f"{block}: {node.module} has no {name}"
                )
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("agent_jobs"):
                    importlib.import_module(alias.name)


def check_shell(block: Block) -> None:
    done = subprocess.run(["bash", "-n"], input=block.text, capture_output=True, text=True)
    assert done.returncode == 0, f"{block}: bash -n: {done.stderr}"
    for line in logical_lines(block.text):
        for words in shell_words(line):
            check_cli(words, str(block))


def check_text(block: Block) -> None:
    """Sample output: its `$ agent-jobs …` lines are real commands."""
    for line in block.text.split("\n"):
        if line.startswith("$ "):
            for words in shell_words(line[2:]):
                check_cli(words, str(block))


CHECKS = {
    "python": check_python,
    "sh": check_shell,
    "bash": check_shell,
    "json": lambda block: json.loads(block.text),
    "yaml": lambda block: yaml.safe_load(block.text),
    "toml": lambda block: tomllib.loads(block.text),
    "text": check_text,
}


@pytest.mark.parametrize("block", BLOCKS, ids=str)
def test_each_block_is_checked_by_its_language(block: Block) -> None:
    assert block.language in CHECKS, f"{block}: a fence needs one of {sorted(CHECKS)}"
    CHECKS[block.language](block)


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_inline_commands_name_real_commands_and_options(page: Path) -> None:
    for span in INLINE.findall(prose_of(page)):
        words = [w.strip("[]()|,") for w in span.split()[1:]]
        words = [w for w in words if w and not w.startswith("…")]
        # A span may stop at a placeholder (`agent-jobs approve RUN_ID CALL_ID`).
        check_cli(words, f"{page.name}: `{span}`")


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_http_paths_are_routes(page: Path) -> None:
    missing = [path for path in HTTP_PATH.findall(page.read_text()) if not is_route(path)]
    assert not missing, f"{page.name}: no such route: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_environment_variables_are_settings(page: Path) -> None:
    unknown = sorted(set(ENV.findall(page.read_text())) - setting_names())
    assert not unknown, f"{page.name}: not a setting: {unknown}"


def test_every_setting_is_documented() -> None:
    documented = {name for page in PAGES for name in ENV.findall(page.read_text())}
    assert not sorted(setting_names() - documented)


def test_every_path_of_the_layer_map_exists_and_every_package_is_on_it() -> None:
    readme = ROOT / "README.md"
    start = readme.read_text().index("## The layers")
    [layer_map] = [
        block
        for block in blocks_of(readme)
        if block.text in readme.read_text()[start:] and block.language == "text"
    ][:1]
    paths = set(MAP_PATH.findall(layer_map.text))
    missing = sorted(path for path in paths if not (ROOT / path).exists())
    assert not missing, f"the layer map names paths that do not exist: {missing}"
    packages = {
        f"{path.parent.relative_to(ROOT)}/" for path in (ROOT / "agent_jobs").glob("*/__init__.py")
    }
    folders = {"tasks/", "bench/", "config/", "docs/", "tests/"}
    left_out = sorted((packages | folders) - paths)
    assert not left_out, f"the layer map leaves out {left_out}"


def test_every_docs_page_is_in_the_readmes_contents() -> None:
    linked = set(LINK.findall(prose_of(ROOT / "README.md")))
    left_out = [page.name for page in PAGES[1:] if f"docs/{page.name}" not in linked]
    assert not left_out, f"not in the README's contents: {left_out}"


@pytest.mark.parametrize(
    "page",
    [*PAGES, *sorted((ROOT / "bench" / "results").glob("*.md")), ROOT / "CHANGELOG.md"],
    ids=lambda page: str(page.relative_to(ROOT)),
)
def test_relative_links_resolve(page: Path) -> None:
    for target in LINK.findall(prose_of(page)):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        assert resolved.exists(), f"{page.name}: {target}: no such file"
        if anchor and resolved.suffix == ".md":
            assert anchor in anchors_of(resolved), f"{page.name}: {target}: no such heading"


def test_every_command_and_option_is_documented() -> None:
    from agent_jobs.cli import main

    text = " ".join(page.read_text() for page in PAGES)
    missing: list[str] = []

    def walk(command: click.Command, path: list[str]) -> None:
        if isinstance(command, click.Group):
            for name, sub in command.commands.items():
                walk(sub, [*path, name])
            return
        if f"agent-jobs {' '.join(path)}" not in text:
            missing.append(" ".join(path))
        for param in command.params:
            for opt in (*param.opts, *param.secondary_opts):
                if opt.startswith("--") and opt not in text:
                    missing.append(f"{' '.join(path)} {opt}")

    walk(main, [])
    assert not missing, f"not documented: {missing}"
