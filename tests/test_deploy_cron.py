"""deploy/cron: entries that run as written on a fresh machine, writing to no file nothing makes."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

CRON = Path(__file__).resolve().parent.parent / "deploy" / "cron" / "bow-gateway-criteria-job"


def entries() -> list[tuple[str, str]]:
    """Each schedule line of the cron.d file as (user, command)."""
    found = []
    for line in CRON.read_text().splitlines():
        if not line.strip() or line.startswith("#") or re.match(r"^[A-Z_]+=", line):
            continue
        fields = line.split(None, 6)
        assert len(fields) == 7, f"not a cron.d line (5 times, a user, a command): {line!r}"
        found.append((fields[5], fields[6]))
    return found


def test_the_cron_entries_are_shell_and_log_to_syslog_not_to_a_file() -> None:
    commands = entries()
    assert len(commands) == 2
    for user, command in commands:
        assert user == "bow"
        subprocess.run(["sh", "-n", "-c", command], check=True)
        # A redirection to a file needs a directory someone made and a rotation someone set up:
        # the output goes to logger(1), hence syslog or the journal, instead.
        assert not re.search(r">>?\s*/", command), command
        assert command.endswith("2>&1 | logger -t bow-gateway-criteria-job"), command


def test_the_state_directory_the_job_file_names_is_made_by_an_install_line() -> None:
    example = (CRON.parent.parent / "criteria-job.example.toml").read_text()
    state_dir = re.search(r'^state_dir = "(/[^"]+)"', example, re.MULTILINE)
    assert state_dir is not None
    parent = str(Path(state_dir.group(1)).parent)
    assert f"install -d -o bow -g bow -m 0750 {parent}" in CRON.read_text()
