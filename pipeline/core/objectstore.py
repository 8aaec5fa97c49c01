"""Model repositories in object storage: what ``--repository`` accepts, and how S3 is reached.

``--repository`` is a local folder or ``s3://BUCKET/PREFIX`` (an S3-compatible store too: its endpoint
comes from ``AWS_ENDPOINT_URL``, or from Triton's own form ``s3://http://HOST:PORT/BUCKET/PREFIX``).
Any other URL (``gs://``, ``as://``, ``https://``, ...) is refused in one line, and so is anything that
looks like a mangled URL (``s3:/bucket``): no command takes a URL for a local folder.

Credentials, region and endpoint come from the standard AWS chain (environment, shared profile,
``AWS_ENDPOINT_URL``) through boto3. They are handed to a server only through its environment
(:func:`server_environment`), never on a command line, and nothing here logs them.
"""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.core.errors import PipelineError

SUPPORTED = "a local folder or s3://BUCKET/PREFIX (S3, or an S3-compatible store through AWS_ENDPOINT_URL)"
S3_EXTRA = "s3"  # pyproject.toml: boto3
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):/")
_STORES = {"gs": "Google Cloud Storage", "as": "Azure Storage", "abfs": "Azure Storage", "az": "Azure Storage"}
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
DEFAULT_REGION = "us-east-1"
_LOOPBACK = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True)
class S3Url:
    """``s3://BUCKET/PREFIX``; ``endpoint`` only when the URL itself names one (Triton's ``s3://http://HOST:PORT/...``)."""

    bucket: str
    prefix: str = ""  # no leading or trailing "/"
    endpoint: str | None = None

    def __str__(self) -> str:
        where = f"{self.endpoint}/" if self.endpoint else ""
        return f"s3://{where}{self.bucket}" + (f"/{self.prefix}" if self.prefix else "")

    def key(self, *parts: str) -> str:
        """The object key of ``parts`` under the prefix (``key("digits_fp32", "config.pbtxt")``)."""
        return "/".join(p.strip("/") for p in (self.prefix, *parts) if p.strip("/"))

    def child(self, name: str) -> S3Url:
        """The URL of ``name`` under this one (a model of the repository)."""
        return S3Url(self.bucket, self.key(name), self.endpoint)

    def triton_url(self, endpoint: str | None) -> str:
        """The URL tritonserver reads: with a custom endpoint, its ``s3://http://HOST:PORT/BUCKET/PREFIX`` form."""
        endpoint = self.endpoint or endpoint
        return str(S3Url(self.bucket, self.prefix, endpoint.rstrip("/") if endpoint else None))


Repository = Path | S3Url  # what --repository holds


def repository_from_text(text: str) -> Path | S3Url:
    """``--repository``'s value: a :class:`S3Url` for ``s3://``, a Path for a folder; PipelineError for any other URL."""
    match = _SCHEME.match(text)
    if match is None:
        return Path(text)
    scheme = match.group(1).lower()
    if scheme != "s3":
        store = _STORES.get(scheme, f"a {scheme}:// URL")
        raise PipelineError(f"{text}: {store} is not supported as a model repository", f"use {SUPPORTED}")
    if not text.startswith(("s3://", "S3://")):
        raise PipelineError(f"{text} is neither a folder nor an s3:// URL", "write s3://BUCKET/PREFIX (two slashes), or ./PATH for a folder")
    rest = text[5:]
    endpoint = None
    for web in ("http://", "https://"):  # Triton's form: s3://http://HOST:PORT/BUCKET/PREFIX
        if rest.startswith(web):
            host, _, rest = rest[len(web):].partition("/")
            endpoint = web + host
    bucket, _, prefix = rest.partition("/")
    if not _BUCKET.match(bucket) or ".." in prefix.split("/"):
        raise PipelineError(f"{text} names no valid bucket ('{bucket}')", "write s3://BUCKET/PREFIX with a bucket name of 3-63 lowercase letters, digits, '.' or '-'")
    return S3Url(bucket, prefix.strip("/"), endpoint)


def local_only(repository: Path | S3Url, command: str) -> Path:
    """``repository`` as a folder; PipelineError for an object-store URL where ``command`` needs a folder."""
    if isinstance(repository, S3Url):
        raise PipelineError(f"{command} reads and writes a local model repository, not {repository}",
                            "copy the repository to a folder (aws s3 sync) and pass that folder as --repository")
    return repository


def s3_client(url: S3Url) -> Any:
    """A boto3 S3 client for ``url``: credentials, region and endpoint from the AWS chain (the URL's own endpoint
    first); a store on loopback is reached directly, whatever ``http_proxy`` says."""
    from botocore.config import Config

    session = _session()
    client = session.client("s3", endpoint_url=url.endpoint, region_name=session.region_name or DEFAULT_REGION)
    if urllib.parse.urlsplit(client.meta.endpoint_url).hostname in _LOOPBACK:
        client = session.client("s3", endpoint_url=client.meta.endpoint_url, region_name=client.meta.region_name, config=Config(proxies={}))
    return client


def endpoint_of(client: Any) -> str | None:
    """The client's endpoint when it is not AWS's own (an S3-compatible store), else None."""
    endpoint = str(client.meta.endpoint_url or "")
    return None if not endpoint or endpoint.rstrip("/").endswith(".amazonaws.com") else endpoint.rstrip("/")


def server_environment(url: S3Url) -> tuple[dict[str, str], str]:
    """The variables a tritonserver needs to read ``url`` (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
    ``AWS_SESSION_TOKEN`` when there is one, ``AWS_DEFAULT_REGION``), resolved through the AWS chain, and the
    URL it is given (with the endpoint, never the keys); PipelineError when no credentials are found."""
    session = _session()
    credentials = session.get_credentials()
    if credentials is None:
        raise PipelineError(f"no AWS credentials found to read {url}",
                            "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) in the environment")
    frozen = credentials.get_frozen_credentials()
    env = {"AWS_ACCESS_KEY_ID": frozen.access_key, "AWS_SECRET_ACCESS_KEY": frozen.secret_key,
           "AWS_DEFAULT_REGION": session.region_name or DEFAULT_REGION}
    if frozen.token:
        env["AWS_SESSION_TOKEN"] = frozen.token
    client = session.client("s3", endpoint_url=url.endpoint, region_name=env["AWS_DEFAULT_REGION"])
    return env, url.triton_url(endpoint_of(client))


def _session() -> Any:
    try:
        import boto3
    except ImportError:
        raise PipelineError("s3:// repositories need boto3, which is not installed",
                            f"pip install -e '.[{S3_EXTRA}]'") from None
    return boto3.session.Session()
