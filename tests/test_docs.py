"""The README stays one a newcomer finishes (under 1,500 words, the reference in docs/), every
relative link of the documentation leads to a file, the documentation cites no file outside the
repository, and the tour's step 4 works as written."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import signal
import urllib.error
import urllib.request
from pathlib import Path

from .support.served import BOW_GATEWAY, clean_env, free_port

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*```.*?^\s*```", re.MULTILINE | re.DOTALL)
# What the project was written from, never shipped: the contract's specs, its seeds.
OUTSIDE = re.compile(r"\b(?:seeds|spec)/|\.\./shared\b|/work/shared\b")
MARKDOWN_NAME = re.compile(r"[\w.-]+\.md\b")
# Runs a command as printed: `bow-gateway` is the console script beside this interpreter
# (exec, so that signals reach it), whether or not it is on PATH.
PRELUDE = f'bow-gateway() {{ exec "{BOW_GATEWAY[0]}" "$@"; }}\n'
PIPE = asyncio.subprocess.PIPE


def relative_links(page: Path) -> list[str]:
    """The targets of the Markdown links of ``page`` outside code blocks, other sites left out."""
    text = FENCE.sub("", page.read_text())
    return [target for target in LINK.findall(text) if not re.match(r"^[a-z][a-z0-9+.-]*:", target)]


def test_the_readme_is_under_1500_words() -> None:
    words = len(README.read_text().split())  # what `wc -w` counts
    assert words < 1500, f"README.md has {words} words: move reference material to docs/"


def test_every_relative_link_leads_to_a_file_without_an_anchor() -> None:
    assert DOCS, "no docs/*.md"
    for page in [README, *DOCS]:
        for target in relative_links(page):
            assert "#" not in target, f"{page.name}: {target}: link to a file, not an anchor"
            assert (page.parent / target).exists(), f"{page.name}: {target} does not exist"


def repository_markdown() -> set[str]:
    """The names of the repository's Markdown files (hidden folders and build/ left out)."""
    found = set()
    for pattern in ("*.md", "*/*.md", "*/*/*.md"):
        for path in ROOT.glob(pattern):
            parts = path.relative_to(ROOT).parts
            if not any(part.startswith(".") or part == "build" for part in parts):
                found.add(path.name)
    return found


def test_the_documentation_cites_no_file_outside_the_repository() -> None:
    """The docs stand on their own: no contract section or seed a reader cannot open."""
    known = repository_markdown()
    assert {"README.md", "sse.md", "flywheel.md", "history.md"} <= known
    # The performance history is a dated record of what was run then, outside files included.
    for page in [README, *(page for page in DOCS if page.name != "performance-history.md")]:
        text = page.read_text()
        outside = [match.group() for match in OUTSIDE.finditer(text)]
        assert not outside, f"{page.name} cites files outside the repository: {outside}"
        unknown = sorted(set(MARKDOWN_NAME.findall(text)) - known)
        assert not unknown, f"{page.name} names Markdown files the repository lacks: {unknown}"


def test_the_readme_links_every_docs_page() -> None:
    linked = {(ROOT / target).resolve() for target in relative_links(README)}
    assert not set(DOCS) - linked, f"not linked from README.md: {set(DOCS) - linked}"


def test_the_test_command_block_follows_its_marker() -> None:
    lines = README.read_text().splitlines()
    at = lines.index("<!-- test-command -->")
    assert lines[at + 1] == "```sh" and lines[at + 3] == "```", lines[at : at + 4]
    assert "pytest" in lines[at + 2]


def step_4() -> list[str]:
    """The shell lines of the tour's step 4, in order."""
    text = README.read_text()
    step = text[text.index("4. Your own configuration") : text.index("## Concepts")]
    blocks = re.findall(r"```sh\n(.*?)```", step, re.DOTALL)
    assert len(blocks) == 2, step
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip()]


async def wait_for_health(url: str, serve: asyncio.subprocess.Process) -> None:
    async with asyncio.timeout(20):
        while True:
            assert serve.returncode is None, "serve ended"
            try:
                await asyncio.to_thread(urllib.request.urlopen, url + "/health", None, 1)
                return
            except (urllib.error.URLError, OSError):
                await asyncio.sleep(0.1)


async def test_the_tours_step_4_works_as_written(tmp_path: Path) -> None:
    (tmp_path / "deploy").mkdir()
    shutil.copy(ROOT / "deploy" / "gateway.example.toml", tmp_path / "deploy")
    port = free_port()
    lines = [line.replace("8081", str(port)) for line in step_4()]
    starts = [line.split()[1] if line.startswith("bow-gateway") else "" for line in lines]
    export = next(line for line in lines if line.startswith("export BOW_JWT_SECRET="))
    setup = lines[: starts.index("serve")]
    serve_line, listen_line, push_line = (
        lines[starts.index(cmd)] for cmd in ("serve", "listen", "push")
    )
    env = clean_env()

    async def shell(*script: str) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            "bash",
            "-c",
            PRELUDE + "\n".join(script),
            cwd=tmp_path,
            env=env,
            stdout=PIPE,
            stderr=PIPE,
        )

    prepared = await shell(*setup)
    _, err = await prepared.communicate()
    assert prepared.returncode == 0, err
    assert len((tmp_path / ".jwt-secret").read_text().strip()) >= 32
    serve = await shell(export, serve_line)
    processes = [serve]
    try:
        await wait_for_health(f"http://127.0.0.1:{port}", serve)
        listen = await shell(export, listen_line)
        processes.insert(0, listen)
        assert listen.stderr is not None and listen.stdout is not None
        async with asyncio.timeout(20):
            while not (line := (await listen.stderr.readline()).decode()).startswith("listening"):
                assert line, "listen ended before listening"
        push = await shell(export, push_line)
        _, err = await push.communicate()
        assert push.returncode == 0, err
        event = json.loads(await asyncio.wait_for(listen.stdout.readline(), 10))
        assert event["event"] == "greeting"
    finally:
        for process in processes:
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
            await asyncio.wait_for(process.communicate(), 15)
    assert serve.returncode == 0


BENCH = ROOT / "bench"
# A benchmark as the reference's commands name it, bench/<name>.py or .sh (not the shared harness).
BENCH_SCRIPT = re.compile(r"(?<![\w./-])bench/([\w-]+\.(?:py|sh))\b")


def test_the_benchmark_reference_has_at_most_400_lines() -> None:
    lines = len((BENCH / "README.md").read_text().splitlines())
    assert lines <= 400, f"bench/README.md has {lines} lines: dated runs go to the history"


def test_every_benchmark_the_reference_names_is_in_bench() -> None:
    named = set(BENCH_SCRIPT.findall((BENCH / "README.md").read_text()))
    assert named, "bench/README.md names no bench/ script"
    missing = sorted(name for name in named if not (BENCH / name).is_file())
    assert not missing, f"bench/README.md names scripts bench/ lacks: {missing}"
