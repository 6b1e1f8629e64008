"""deploy/Dockerfile's install without Docker: its own COPY and pip lines into a scratch prefix.

No Docker engine runs here, so the image is not built. What the image holds is what its build
stage's ``COPY`` lines bring and its ``RUN`` lines install, and what it runs is its ``CMD`` with
its ``ENV`` and its config: the test replays exactly those lines from the file (``/opt/...`` and
``/src`` moved into a temporary directory), then serves through a real Redis and delivers.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest

from .support import SECRET, Listener, token
from .support.redis_server import RedisServer
from .support.served import clean_env, free_port, wait_for_health

REPOSITORY = Path(__file__).resolve().parent.parent
DOCKERFILE = REPOSITORY / "deploy" / "Dockerfile"
PREFIX = "/opt/bow-gateway"  # the image's virtual environment
PASSWORD = "a-dockerfile-test-password"


@dataclass
class Stage:
    """One ``FROM`` stage of the Dockerfile: its instructions in order, continuations joined."""

    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [argument for name, argument in self.instructions if name == keyword]


def stages(text: str) -> list[Stage]:
    """The Dockerfile's stages (comments dropped, ``\\``-continued lines joined)."""
    found: list[Stage] = []
    logical = re.sub(
        r"\\\n\s*",
        " ",
        "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#")),
    )
    for line in logical.splitlines():
        keyword, _, argument = line.strip().partition(" ")
        if keyword == "FROM":
            found.append(Stage())
        elif keyword and found:
            found[-1].instructions.append((keyword, argument.strip()))
    return found


def arguments(text: str) -> dict[str, str]:
    """Every ``ARG NAME=default`` of the file."""
    return dict(re.findall(r"^ARG (\w+)=(\S+)$", text, re.M))


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_the_dockerfiles_install_serves_and_delivers_through_redis(tmp_path: Path) -> None:
    # Regression: the image's `pip install ".[...]"` built a wheel without bow_gateway.outbound,
    # so the container could not start; no test ran the Dockerfile's install step.
    text = DOCKERFILE.read_text()
    build, run = stages(text)
    args = arguments(text)
    source, prefix = tmp_path / "src", tmp_path / "opt"
    [workdir] = build.all("WORKDIR")
    for copy in build.all("COPY"):
        *paths, target = copy.split()
        assert not copy.startswith("--"), f"a COPY this test cannot replay: {copy}"
        for path in paths:
            destination = source / target
            if (REPOSITORY / path).is_dir():
                shutil.copytree(REPOSITORY / path, destination, dirs_exist_ok=True)
            elif target.endswith("/"):
                destination.mkdir(parents=True, exist_ok=True)
                shutil.copy2(REPOSITORY / path, destination / Path(path).name)
            else:
                destination.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(REPOSITORY / path, destination)
    # `python` in the RUN lines: this interpreter, as the image's python is.
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "python").symlink_to(sys.executable)
    environment = {**os.environ, "PATH": f"{tools}:{os.environ['PATH']}"}
    for command in build.all("RUN"):
        for name, value in args.items():
            command = command.replace("${" + name + "}", value)
        command = command.replace(PREFIX, str(prefix)).replace(workdir, str(source))
        subprocess.run(command, shell=True, cwd=source, env=environment, check=True)

    # The run stage: its config file, its environment, its command.
    [config_copy] = [copy for copy in run.all("COPY") if not copy.startswith("--from")]
    config_source, config_target = config_copy.split()
    config = tmp_path / Path(config_target).name
    shutil.copy2(REPOSITORY / config_source, config)
    command = json.loads(run.all("CMD")[0])
    command = [str(config) if part == config_target else part for part in command]
    command[0] = str(prefix / "bin" / command[0])
    image_env = dict(re.findall(r"(\w+)=(\S+)", " ".join(run.all("ENV"))))
    port = free_port()
    with RedisServer() as redis:
        env = clean_env(
            **{
                **image_env,
                "PATH": f"{prefix / 'bin'}:{os.environ['PATH']}",
                # loopback only, on a free port, where the image listens on 0.0.0.0:8080
                "BOW_HOST": "127.0.0.1",
                "BOW_PORT": str(port),
                "BOW_REDIS_URL": redis.url,
                "BOW_JWT_SECRET": SECRET,
                "BOW_INBOUND_PASSWORD": PASSWORD,
            }
        )
        with subprocess.Popen(
            command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        ) as process:
            url = f"http://127.0.0.1:{port}"
            try:
                wait_for_health(url, process, timeout=30)
                with urllib.request.urlopen(url + "/health", timeout=2) as health:
                    assert health.status == 200
                listener = Listener(url)
                await listener.connect("v1")
                await listener.authenticate(token("USER/1", {"role": "admin"}))
                async with aiohttp.ClientSession() as http:
                    answer = await http.post(
                        url + "/v1/messages",
                        json={"name": "shipped", "audience": [{"role": "admin"}], "order": 7},
                        headers={"Authorization": aiohttp.encode_basic_auth("pusher", PASSWORD)},
                    )
                    assert answer.status == 204, await answer.text()
                event, data = await listener.next_event()
                assert (event, data["order"]) == ("shipped", 7)
                await listener.close()
            finally:
                process.terminate()
                _, stderr = process.communicate(timeout=15)
            assert process.returncode == 0, stderr.decode(errors="replace")[-2000:]
    # What served was the scratch prefix's install, not the tree.
    installed = subprocess.run(
        [str(prefix / "bin" / "python"), "-c", "import bow_gateway; print(bow_gateway.__file__)"],
        cwd=tmp_path,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert Path(installed.strip()).is_relative_to(prefix), installed
