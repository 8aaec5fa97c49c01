"""A real S3 endpoint for tests: moto's server on loopback, on a port the OS picks, stopped afterwards.

``moto_server`` (the server moto ships for any client, the embedded tritonserver's AWS SDK included)
runs in a thread of the test process (``ThreadedMotoServer`` bound to port 0: no port is guessed, so
no other process can take it between a check and the bind). Credentials are made up per session and
unique, so a test can look for them in logs and command lines.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

REGION = "eu-west-1"


@dataclass(frozen=True)
class S3Endpoint:
    endpoint: str
    key_id: str
    secret: str

    @property
    def env(self) -> dict[str, str]:
        """The AWS variables a process needs (the standard chain reads them)."""
        return {"AWS_ACCESS_KEY_ID": self.key_id, "AWS_SECRET_ACCESS_KEY": self.secret, "AWS_DEFAULT_REGION": REGION,
                "AWS_ENDPOINT_URL": self.endpoint}

    def client(self) -> Any:
        import boto3
        from botocore.config import Config

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=self.key_id, aws_secret_access_key=self.secret,
                            region_name=REGION, config=Config(proxies={}))

    def bucket(self) -> str:
        """A new, empty bucket."""
        name = f"models-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name, CreateBucketConfiguration={"LocationConstraint": REGION})
        return name

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return sorted(item["Key"] for page in pages for item in page.get("Contents", []))

    def text(self, bucket: str, key: str) -> str:
        return str(self.client().get_object(Bucket=bucket, Key=key)["Body"].read().decode())


@pytest.fixture(scope="module")
def s3(monkeypatch_module: pytest.MonkeyPatch) -> Iterator[S3Endpoint]:
    """moto's S3 server on 127.0.0.1 (a free port from the OS), with this process's AWS variables pointing at it."""
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = S3Endpoint(f"http://{host}:{port}", f"AKIATEST{uuid.uuid4().hex[:12].upper()}", f"secret-{uuid.uuid4().hex}")
    for key, value in endpoint.env.items():
        monkeypatch_module.setenv(key, value)
    for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
        monkeypatch_module.delenv(key, raising=False)
    try:
        yield endpoint
    finally:
        server.stop()


@pytest.fixture(scope="module")
def monkeypatch_module() -> Iterator[pytest.MonkeyPatch]:
    with pytest.MonkeyPatch.context() as patch:
        yield patch
