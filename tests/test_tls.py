"""The ``https`` setting: HTTPS and WSS with a self-signed certificate made by the test."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
import socketio
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from bow_gateway import Bow

from .support import AUTH, PATH, base_config, standard_bow, token

StartBow = Callable[[Bow], Awaitable[Bow]]


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and localhost, and its key."""
    folder = tmp_path_factory.mktemp("tls")
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    certfile, keyfile = folder / "cert.pem", folder / "key.pem"
    certfile.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    keyfile.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return certfile, keyfile


@pytest.fixture
async def tls_bow(start_bow: StartBow, certificate: tuple[Path, Path]) -> Bow:
    certfile, keyfile = certificate
    return await start_bow(
        standard_bow(base_config(https={"certfile": str(certfile), "keyfile": str(keyfile)}))
    )


def trusting(certificate: tuple[Path, Path]) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(certificate[0]))


async def test_https_serves_the_inbound_and_health(
    tls_bow: Bow, certificate: tuple[Path, Path]
) -> None:
    connector = aiohttp.TCPConnector(ssl=trusting(certificate))
    async with aiohttp.ClientSession(connector=connector) as http:
        base = f"https://127.0.0.1:{tls_bow.port}"
        async with http.get(base + "/health") as response:
            assert response.status == 200
        body = {"name": "N", "audience": []}
        async with http.post(base + PATH, json=body, headers=AUTH) as response:
            assert response.status == 204


async def test_plain_http_is_not_served_when_https_is_configured(tls_bow: Bow) -> None:
    async with aiohttp.ClientSession() as http:
        with pytest.raises(aiohttp.ClientError):
            async with http.get(f"http://127.0.0.1:{tls_bow.port}/health") as response:
                await response.read()


async def test_wss_delivers_to_an_authenticated_socket(
    tls_bow: Bow, certificate: tuple[Path, Path]
) -> None:
    connector = aiohttp.TCPConnector(ssl=trusting(certificate))
    async with aiohttp.ClientSession(connector=connector) as http:
        client = socketio.AsyncClient(reconnection=False, http_session=http)
        received: asyncio.Queue[object] = asyncio.Queue()
        client.on("N", received.put_nowait)
        base = f"https://127.0.0.1:{tls_bow.port}"
        await client.connect(base + "?v=1.3", transports=["websocket"], wait_timeout=5)
        try:
            await client.call("authenticate", token("USER/1", {"role": "admin"}), timeout=5)
            body = {"name": "N", "audience": [{"role": "admin"}]}
            async with http.post(base + PATH, json=body, headers=AUTH) as response:
                assert response.status == 204
            assert await asyncio.wait_for(received.get(), 5) == body
        finally:
            await client.disconnect()


def test_https_without_a_keyfile_is_refused() -> None:
    with pytest.raises(ValueError, match="https"):
        Bow(base_config(https={"certfile": "cert.pem"}))
