"""Which gateway a benchmark runs (this checkout's, or another's through ``PYTHONPATH``) and which
protocol its lean clients speak; starting one ``lib/gateway.py`` for such a variant."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from lib import gateways
from lib.gateways import Gateways
from lib.lean.books import EVENT
from lib.private_redis import RedisServer

RECEIPT_INCOMING_RATE = 1_000_000
"""Packets a second a client may send to a gateway whose clients acknowledge receipts (its own
guard allows 20, fewer than the messages a socket receives at saturation)."""


def package_layout(source: Path, into: Path) -> Path:
    """A directory for ``PYTHONPATH`` where ``bow_gateway`` is ``source``'s, with its bundled
    plugins as subpackages (as setup.cfg's package_dir installs them), made of symlinks."""
    package = into / "pythonpath" / "bow_gateway"
    package.mkdir(parents=True)
    for entry in (source / "bow_gateway").iterdir():
        if entry.name != "__pycache__":
            (package / entry.name).symlink_to(entry.resolve())
    for plugins in ("inbounds", "outbounds", "middlewares"):
        (package / plugins).symlink_to((source / plugins).resolve())
    return package.parent


@dataclass(frozen=True)
class Variant:
    """Which gateway (this checkout's, or ``--source``'s) and which protocol its clients speak."""

    proto: int  # Socket.IO's protocol (1 or 2)
    source: str | None = None  # a PYTHONPATH directory laid out by package_layout
    label: str = ""  # the commit or directory of ``source``
    protocol: str = "socketio"  # or flywheel, sse (then ``proto`` means nothing)
    receipt: int = 0  # seconds: every message asks for a receipt (``Bow-Receipt``); 0: none

    @property
    def name(self) -> str:
        receipt = f", receipt {self.receipt} s" if self.receipt else ""
        return f"{self.label or 'this'}, {self.clients}{receipt}"

    @property
    def clients(self) -> str:
        return f"proto {self.proto}" if self.protocol == "socketio" else self.protocol


def variants(args: argparse.Namespace, workdir: str) -> list[Variant]:
    """``--protocol`` (Socket.IO in each ``--proto``) on this checkout's (or ``--gateway``'s)
    gateway, each in every mode of ``--receipt`` (if any; 0: no ``Bow-Receipt``), then
    Socket.IO in each ``--source-proto`` on each ``--source``'s (never asked for receipts)."""
    main, label = None, ""
    if args.gateway:  # a snapshot rather than the working tree, which others may be editing
        main = str(package_layout(Path(args.gateway), Path(workdir) / "gateway"))
        label = source_label(args.gateway)
    receipts = [int(r) for r in str(getattr(args, "receipt", "0")).split(",") if r]
    found = []
    for protocol in args.protocol:
        if protocol == "socketio":
            protos = [int(p) for p in args.proto.split(",") if p]
            found += [Variant(p, main, label, receipt=r) for p in protos for r in receipts]
        else:
            found += [Variant(2, main, label, protocol, r) for r in receipts]
    for k, source in enumerate(args.source or []):
        path = package_layout(Path(source), Path(workdir) / f"source{k}")
        for p in args.source_proto.split(","):
            if p:
                found.append(Variant(int(p), str(path), source_label(source)))
    return found


def source_variant(source: str | None, proto: int, workdir: str) -> Variant:
    """Protocol ``proto`` on ``source``'s gateway (a checkout), or on this working tree's."""
    if not source:
        return Variant(proto)
    path = package_layout(Path(source), Path(workdir) / "source")
    return Variant(proto, str(path), source_label(source))


def source_label(source: str) -> str:
    """``source``'s directory, and the commit ``git archive`` wrote into it if it says."""
    name = Path(source).name
    return name if name.startswith("bow-") else source


def start_variant(
    variant: Variant, redis: RedisServer | None, namespace: str, extra: Sequence[str] = ()
) -> Gateways:
    """One ``lib/gateway.py`` (through ``PYTHONPATH`` for another checkout's gateway)."""
    env = dict(os.environ)
    if variant.source:
        env["PYTHONPATH"] = variant.source
    line = gateways.command("--namespace", namespace)
    if variant.receipt:  # every listener acknowledges every message: past the flood guard
        line += ["--incoming-rate", str(RECEIPT_INCOMING_RATE)]
    if redis is not None:
        line += ["--redis", redis.url]
    line += extra
    # cwd: no bow_gateway in the cwd to shadow the one meant
    process, started = gateways.spawn(line, env, variant.source or None)
    port, pid = started["port"], started["pid"]
    gateways.check_source(process, started, variant.source, "the source's")
    backplane = "in-process backplane" if redis is None else "Redis backplane"
    return gateways.controllable(
        f"lib/gateway.py of {variant.label or 'this checkout'} ({backplane}) on port "
        f"{port}, pid {pid}; clients speak {client_text(variant)}",
        [process],
        [pid],
        [f"http://127.0.0.1:{port}"],
    )


def client_text(variant: Variant) -> str:
    if variant.protocol == "socketio":
        return f"Socket.IO protocol {variant.proto}"
    return {"flywheel": f"Flywheel (subscribed to {EVENT!r})", "sse": "SSE"}[variant.protocol]
