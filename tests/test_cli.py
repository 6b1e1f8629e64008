"""The ``bow-gateway`` command line, run as real processes: serve, token, listen, push."""

from __future__ import annotations

import asyncio
import configparser
import json
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import jwt
import pytest
from packaging.requirements import Requirement

from bow_gateway.app.standalone_defaults import DEV_JWT_SECRET
from bow_gateway.cli import main

from .support import SECRET
from .support.cli import SHELL_PRELUDE, Running, run, run_shell
from .support.served import BOW_GATEWAY, clean_env, free_port, wait_for_health


@dataclass
class Server:
    url: str
    tour: str
    process: subprocess.Popen[bytes]
    log: Path

    def command(self, start: str) -> str:
        """The first command of the printed tour that starts with ``start``."""
        for line in self.tour.splitlines():
            if line.strip().startswith(start):
                return line.strip()
        raise AssertionError(f"the tour prints no {start!r} command:\n{self.tour}")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """``bow-gateway serve`` on the embedded default, on a free port, for the whole module."""
    log = tmp_path_factory.mktemp("serve") / "stderr.log"
    port = free_port()
    with (
        open(log, "wb") as stderr,
        subprocess.Popen(
            [*BOW_GATEWAY, "serve", "--port", str(port)],
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=clean_env(),
        ) as process,
    ):
        try:
            url = f"http://127.0.0.1:{port}"
            wait_for_health(url, process)
            assert process.stdout is not None
            tour = []
            for raw in process.stdout:
                tour.append(raw.decode())
                if raw.startswith(b"Ctrl-C stops"):
                    break
            yield Server(url, "".join(tour), process, log)
        finally:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                process.wait(10)


# -- the five-minute tour, exactly as serve prints it ------------------------------------------


async def test_serve_prints_what_a_newcomer_needs(server: Server) -> None:
    tour = server.tour
    assert f"serving on {server.url}" in tour
    assert f"POST {server.url}/v1/messages" in tour
    assert "pusher / change-me" in tour  # the documented password of the embedded default
    assert DEV_JWT_SECRET in tour
    for command in ("TOKEN=$(bow-gateway token", "bow-gateway listen", "bow-gateway push"):
        assert command in tour
    assert f"curl -N -H \"Authorization: Bearer $TOKEN\" '{server.url}/events?v=v1'" in tour
    assert f"Flywheel WebSocket {server.url.replace('http', 'ws', 1)}/broker?v=v1" in tour
    assert f"Gobbler WebSocket {server.url.replace('http', 'ws', 1)}/gobbler?v=v1" in tour
    assert f"--url {server.url}" in tour  # not the default port: the commands say where


async def test_the_printed_tour_works(server: Server) -> None:
    token_line = server.command("TOKEN=$(bow-gateway token")
    minted = await run_shell(token_line + '\nprintf %s "$TOKEN"')
    assert minted.code == 0, minted.err
    token = minted.out
    assert jwt.decode(token, DEV_JWT_SECRET, algorithms=["HS256"])["criteria"] == {"role": "admin"}
    assert "development secret" in minted.err

    listener = await Running.start(
        "bash",
        "-c",
        SHELL_PRELUDE + server.command("bow-gateway listen"),
        env=clean_env(TOKEN=token),
    )
    try:
        await listener.stderr_until(lambda line: line.startswith("listening"))

        pushed = await run_shell(server.command("bow-gateway push"))
        assert pushed.code == 0, pushed.err
        assert pushed.out.startswith("204")
        assert json.loads(await listener.stdout_line()) == {
            "event": "greeting",
            "data": {"name": "greeting", "audience": [{"role": "admin"}], "text": "hello"},
        }

        assert shutil.which("curl"), "curl is missing: run tests/install-system-packages.sh"
        logged = server.log.stat().st_size
        streamed = await Running.start(
            "bash", "-c", "exec " + server.command("curl -N "), env=clean_env(TOKEN=token)
        )
        try:
            await logged_after(
                server.log, logged, "sse connection", "authenticated as listener 'USER/1'"
            )
            curled = await run_shell(server.command("curl -i "))
            assert curled.code == 0, curled.err
            assert "204 No Content" in curled.out
            assert json.loads(await listener.stdout_line())["data"]["text"] == "hello"
            event = [await streamed.stdout_line() for _ in range(3)]
        finally:
            await streamed.stop()
        assert event[0].startswith("id: ")
        assert event[1] == "event: greeting\n"
        assert json.loads(event[2].removeprefix("data: "))["text"] == "hello"
    finally:
        stopped = await listener.stop(signal_number=signal.SIGINT)  # Ctrl-C
    assert stopped.code == 0, stopped.err
    assert "disconnected" not in stopped.err


async def logged_after(log: Path, offset: int, *said: str, timeout: float = 10) -> None:
    """Wait until serve's log, past ``offset``, has a line saying each of ``said``."""
    async with asyncio.timeout(timeout):
        while True:
            lines = log.read_bytes()[offset:].decode(errors="replace").splitlines()
            if any(all(part in line for part in said) for line in lines):
                return
            await asyncio.sleep(0.05)


async def test_listen_mints_its_own_token_and_push_reaches_only_the_audience(
    server: Server,
) -> None:
    admin = await Running.start(
        *BOW_GATEWAY,
        "listen",
        "--url",
        server.url,
        "--id",
        "USER/1",
        "--criteria",
        '{"role": "admin"}',
    )
    guest = await Running.start(
        *BOW_GATEWAY,
        "listen",
        "--url",
        server.url,
        "--id",
        "USER/2",
        "--criteria",
        '{"role": "guest"}',
    )
    try:
        await asyncio.gather(
            admin.stderr_until(lambda line: line.startswith("listening")),
            guest.stderr_until(lambda line: line.startswith("listening")),
        )
        pushed = await run(
            "push",
            "--url",
            server.url,
            "--name",
            "only-admins",
            "--audience",
            '[{"role": "admin"}]',
            "--payload",
            '{"n": 1}',
        )
        assert pushed.code == 0, pushed.err
        pushed = await run(
            "push",
            "--url",
            server.url,
            "--name",
            "everyone",
            "--audience",
            '[{"role": "admin"}, {"role": "guest"}]',
        )
        assert pushed.code == 0, pushed.err
        assert [json.loads(await admin.stdout_line()) for _ in range(2)] == [
            {
                "event": "only-admins",
                "data": {"name": "only-admins", "audience": [{"role": "admin"}], "n": 1},
            },
            {
                "event": "everyone",
                "data": {"name": "everyone", "audience": [{"role": "admin"}, {"role": "guest"}]},
            },
        ]
        assert json.loads(await guest.stdout_line())["event"] == "everyone"
    finally:
        results = await asyncio.gather(admin.stop(signal_number=signal.SIGINT), guest.stop())
    assert [result.code for result in results] == [0, 0]


async def test_refusals_exit_1_with_the_reason(server: Server) -> None:
    bad_token, bad_version, bad_password, nobody = await asyncio.gather(
        run("listen", "--url", server.url, "--token", "not-a-token"),
        run("listen", "--url", server.url, "--version", "v9", "--id", "USER/1"),
        run(
            "push",
            "--url",
            server.url,
            "--password",
            "wrong",
            "--name",
            "n",
            "--audience",
            "[]",
        ),
        run("push", "--url", f"http://127.0.0.1:{free_port()}", "--name", "n", "--audience", "[]"),
    )
    assert bad_token.code == 1
    assert "alert:" in bad_token.err and "authentication refused" in bad_token.err
    assert bad_version.code == 1
    assert "refused the connection" in bad_version.err and "v9" in bad_version.err
    assert bad_password.code == 1
    assert "401 Unauthorized" in bad_password.err
    assert nobody.code == 1
    assert "cannot reach" in nobody.err


# -- serve's life ------------------------------------------------------------------------------


async def test_serve_stops_gracefully_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    serve = await Running.start(*BOW_GATEWAY, "serve", "--port", str(port))
    listener: Running | None = None
    try:
        await serve.stderr_until(lambda line: f"serving on 127.0.0.1:{port}" in line)
        listener = await Running.start(*BOW_GATEWAY, "listen", "--url", url, "--id", "USER/1")
        await listener.stderr_until(lambda line: line.startswith("listening"))

        started = time.monotonic()
        served = await serve.stop(timeout=5)
        assert served.code == 0, served.err
        assert time.monotonic() - started < 5
        assert "stopped" in served.err

        ended = await listener.finish(timeout=5)
        assert ended.code == 1
        assert "disconnected by the server" in ended.err
    finally:
        await serve.stop()
        if listener is not None:
            await listener.stop()


async def test_serve_from_a_config_file_and_the_environment(tmp_path: Path) -> None:
    example = Path(__file__).resolve().parent.parent / "deploy" / "gateway.example.toml"
    port = free_port()
    serve = await Running.start(
        *BOW_GATEWAY,
        "serve",
        "--config",
        str(example),
        env=clean_env(BOW_PORT=str(port), BOW_JWT_SECRET=SECRET, BOW_INBOUND_PASSWORD="pw"),
    )
    try:
        await serve.stderr_until(lambda line: f"serving on 127.0.0.1:{port}" in line)
        pushed = await run(
            "push",
            "--url",
            f"http://127.0.0.1:{port}",
            "--name",
            "n",
            "--audience",
            "[]",
            env=clean_env(BOW_INBOUND_PASSWORD="pw"),
        )
        assert pushed.code == 0, pushed.err
    finally:
        served = await serve.stop()
    assert served.code == 0
    assert str(example) in served.out
    assert "$BOW_INBOUND_PASSWORD" in served.out and "pw" not in served.out.split()


async def test_a_bad_configuration_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("port = 'eighty'\n")
    missing, invalid, from_env = await asyncio.gather(
        run("serve", "--config", str(tmp_path / "missing.toml")),
        run("serve", "--config", str(bad)),
        run("serve", env=clean_env(BOW_OUTBOUND_TIMEOUT="-1")),
    )
    assert missing.code == 2 and "cannot read the config file" in missing.err
    assert invalid.code == 2 and "port: Not a valid integer" in invalid.err
    assert from_env.code == 2 and "BOW_OUTBOUND_TIMEOUT" in from_env.err


async def test_a_partial_file_is_checked_with_the_flags_and_the_environment(
    tmp_path: Path,
) -> None:
    # Regression: a file without `port` failed with "port: Missing data" despite --port.
    example = Path(__file__).resolve().parent.parent / "deploy" / "gateway.example.toml"
    text = example.read_text()
    assert text.count("\nport = ") == 1
    partial = tmp_path / "partial.toml"
    partial.write_text("\n".join(line for line in text.splitlines() if not line.startswith("port")))
    port = free_port()
    env = clean_env(BOW_JWT_SECRET=SECRET, BOW_INBOUND_PASSWORD="pw")
    serve = await Running.start(
        *BOW_GATEWAY, "serve", "--config", str(partial), "--port", str(port), env=env
    )
    try:
        await serve.stderr_until(lambda line: f"serving on 127.0.0.1:{port}" in line)
    finally:
        served = await serve.stop()
    assert served.code == 0, served.err
    without = await run("serve", "--config", str(partial), env=env)
    assert without.code == 2 and "port: Missing data" in without.err


async def test_a_bad_redis_url_names_the_variable_and_the_value_without_its_password() -> None:
    # Regression: "Redis URL must specify one of the following schemes", naming neither.
    urls = ["nonsense", "http://x", "redis://:s3cret@127.0.0.1:notaport/0"]
    results = await asyncio.gather(
        *(run("serve", "--port", "0", env=clean_env(BOW_REDIS_URL=url)) for url in urls)
    )
    for url, result in zip(urls, results, strict=True):
        assert result.code == 2, result.err
        shown = url.replace("s3cret", "***")
        assert f"redis: '{shown}' is not a Redis URL: " in result.err, result.err
        assert "(redis is set by BOW_REDIS_URL)" in result.err
        assert "s3cret" not in result.err


# -- help and arguments (in this process: no network) ----------------------------------------


async def test_help_lists_the_commands_as_a_process() -> None:
    result = await run("--help")
    assert result.code == 0
    for command in ("serve", "token", "listen", "push"):
        assert command in result.out


@pytest.mark.parametrize(
    ("command", "options"),
    [
        ([], ["serve", "token", "listen", "push", "--version"]),
        (["serve"], ["--config", "--host", "--port", "BOW_PORT", "BOW_REDIS_URL"]),
        (["token"], ["--id", "--criteria", "--secret", "--ttl", "BOW_JWT_SECRET"]),
        (
            ["listen"],
            ["--url", "--version", "--token", "--id", "--criteria", "--ttl", "--proto", "--since"],
        ),
        (
            ["push"],
            ["--url", "--path", "--user", "--password", "--name", "--audience", "--payload"],
        ),
    ],
)
def test_each_command_has_help(
    command: list[str], options: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*command, "--help"]) == 0
    out = capsys.readouterr().out
    for option in options:
        assert option in out


def test_no_command_prints_the_help_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "serve" in capsys.readouterr().err


def test_token_signs_the_id_and_criteria(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["token", "--id", "USER/9", "--criteria", '{"team": "blue"}', "--secret", SECRET]
    assert main([*args, "--ttl", "60"]) == 0
    claims = jwt.decode(capsys.readouterr().out.strip(), SECRET, algorithms=["HS256"])
    assert claims["sub"] == "USER/9" and claims["criteria"] == {"team": "blue"}
    assert claims["exp"] - claims["iat"] == 60


@pytest.mark.parametrize(("ttl", "seconds"), [("60", 60), ("90.9", 90), ("1", 1)])
def test_token_ttl_sets_exp_to_now_plus_ttl(
    ttl: str, seconds: int, capsys: pytest.CaptureFixture[str]
) -> None:
    before = int(time.time())
    assert main(["token", "--id", "USER/9", "--secret", SECRET, "--ttl", ttl]) == 0
    after = int(time.time())
    claims = jwt.decode(capsys.readouterr().out.strip(), SECRET, algorithms=["HS256"])
    assert before + seconds <= claims["exp"] <= after + seconds  # whole seconds
    assert claims["exp"] == claims["iat"] + seconds


def test_token_ttl_defaults_to_an_hour_and_its_help_says_it_sets_exp(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["token", "--id", "USER/9", "--secret", SECRET]) == 0
    claims = jwt.decode(capsys.readouterr().out.strip(), SECRET, algorithms=["HS256"])
    assert claims["exp"] - claims["iat"] == 3600
    assert main(["token", "--help"]) == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--ttl SECONDS the token's lifetime: its exp claim is now + SECONDS" in help_text
    assert "(default: 3600)" in help_text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["token", "--id", "a", "--criteria", "{bad"], "--criteria is not valid JSON"),
        (["token", "--id", "a", "--criteria", "[1]"], "--criteria must be a JSON object"),
        (["token", "--id", "a", "--ttl", "0"], "--ttl must be a positive"),
        (["token", "--id", "a", "--ttl", "0.5"], "--ttl must be a positive number of seconds"),
        (["push", "--name", "n", "--audience", "[{"], "--audience is not valid JSON"),
        (["push", "--name", "n", "--audience", "[]", "--payload", "3"], "must be a JSON object"),
        (["listen"], "give --token TOKEN, or --id ID"),
        (["listen", "--token", "t", "--id", "a"], "not both"),
        (["serve", "--port", "http"], "not a port number"),
    ],
)
def test_bad_arguments_exit_2_with_a_clear_message(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(args) == 2
    assert message in capsys.readouterr().err


def test_criteria_job_without_pyspark_names_the_spark_extra_s_requirements_and_exits_3(
    tmp_path: Path,
) -> None:
    # Regression: a plain `pip install` printed a traceback from deep in the job; then its hint,
    # `pip install 'bow-gateway[spark]'`, failed from a clone (not on PyPI), exiting 2 as for a
    # bad job file.
    job = tmp_path / "job.toml"
    job.write_text(
        '[redis]\nurl = "redis://127.0.0.1:1"\n[[inputs]]\nname = "u"\nformat = "csv"\n'
        'path = "u.csv"\n[criteria]\nquery = "SELECT 1 AS id"\n[snapshot]\nstate_dir = "s"\n'
    )
    # First on the path, a pyspark that fails to import as a missing one does.
    shadow = tmp_path / "shadow" / "pyspark"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'pyspark'\", name='pyspark')\n"
    )
    run = subprocess.run(
        [*BOW_GATEWAY, "criteria-job", "--config", str(job)],
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_env(PYTHONPATH=str(shadow.parent)),
    )
    assert run.returncode == 3, run.stderr
    assert "Traceback" not in run.stderr
    last = run.stderr.strip().splitlines()[-1]
    prefix = "bow-gateway criteria-job: pyspark is not installed: pip install "
    assert last.startswith(prefix) and last.endswith(" (the spark extra of bow-gateway)"), last
    named = shlex.split(last.removeprefix(prefix).removesuffix(" (the spark extra of bow-gateway)"))
    setup = configparser.ConfigParser()
    setup.read(Path(__file__).resolve().parent.parent / "setup.cfg")
    spark = setup["options.extras_require"]["spark"].split("\n")
    wanted = [str(Requirement(line)) for line in spark if line.strip()]
    assert sorted(str(Requirement(item)) for item in named) == sorted(wanted)


def test_the_command_line_starts_without_the_gateways_server_or_aiohttp() -> None:
    # Regression: `bow-gateway criteria-job` imported the whole gateway (server, aiohttp,
    # python-socketio, marshmallow) before Spark started: ~0.5-0.9 s of every run.
    check = (
        "import sys; from bow_gateway.cli import main, _parser; _parser()\n"
        "loaded = [m for m in ('bow_gateway.app.server', 'aiohttp', 'socketio', 'marshmallow')"
        " if m in sys.modules]\n"
        "print(','.join(loaded))"
    )
    run = subprocess.run(
        [sys.executable, "-c", check], capture_output=True, text=True, timeout=60, check=True
    )
    assert run.stdout.strip() == "", run.stdout
