"""Test support for the S3 launch path: a moto S3 server on 127.0.0.1 (server mode, a free port)
and boto3 clients pointed at it with dummy credentials. Import the fixtures into a test module:
``from s3_support import moto_endpoint, moto_s3  # noqa: F401``.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import boto3
import httpx
import pytest


def free_port() -> int:
    """A TCP port nothing listens on right now (the probe socket is closed on return)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


DUMMY_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}

GOOD_CONFIG = b"""name: smoke
harness: {name: simulated}
alias: sim-anthropic
instances: [astropy__astropy-12907, django__django-11099]
caps: {spend_usd: 5}
"""


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """A moto S3 server (ThreadedMotoServer) for the session; yields its endpoint URL."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    url = f"http://127.0.0.1:{port}"
    try:
        yield url
    finally:
        server.stop()


def make_client(endpoint: str, **config: Any) -> Any:
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        config=Config(**config),
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    )


@pytest.fixture
def moto_s3(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A boto3 S3 client on an empty moto server (state reset before the test); the AWS_*
    variables are set to dummy values so code that builds its own client finds credentials."""
    for name, value in DUMMY_CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    httpx.post(f"{moto_endpoint}/moto-api/reset", timeout=10).raise_for_status()
    yield make_client(moto_endpoint)


@pytest.fixture
def s3_factory(monkeypatch: pytest.MonkeyPatch) -> Any:
    """``make_client`` (a boto3 S3 client for any endpoint, dummy credentials)."""
    for name, value in DUMMY_CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    return make_client


@pytest.fixture
def good_config() -> bytes:
    """A valid two-instance run config (YAML bytes)."""
    return GOOD_CONFIG
