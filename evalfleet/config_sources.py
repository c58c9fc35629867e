"""Where a run config comes from: a local file, or an object in S3 (``s3://bucket/key``).

``resolve_config(uri)`` is the one way the launch path turns a config URI into a validated
``RunConfig``, the string recorded as the run's ``config_source`` and the run's idempotency key:

* a path (or ``file://`` URI): the file is read with the run-config loader; the key is the
  config's content hash.
* ``s3://bucket/key[?versionId=V]``: ``head_object`` first, and an object larger than 1 MiB is
  refused before a byte of it is downloaded; then ``get_object`` pinned to what was headed (its
  version, or its ETag with ``IfMatch``), read with the same bound. The idempotency key is
  ``s3://bucket/key?versionId=V`` on a versioned bucket, else ``s3://bucket/key#etag=E``: the
  same object dropped (or announced) twice is one run, a new upload is a new run. The config is
  validated as untrusted (``confine``): an ``instances: {file: ...}`` form is refused, since an
  S3 object has no folder; list the ids inline.

Every failure is a ``ConfigError`` naming the URI: bad content (too large, not YAML/JSON, an
invalid config) as a plain ``ConfigError``; a source that cannot be read (no such bucket or key,
access denied, S3 unreachable, no credentials) as ``ConfigSourceUnavailable`` with ``retryable``
set when trying later may help. Never a traceback, never the credentials.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from evalfleet.documents import MAX_DOCUMENT_BYTES, decode_text, parse_document
from evalfleet.errors import ConfigError, ConfigSourceUnavailable
from evalfleet.runconfig import RunConfig

MAX_CONFIG_BYTES = MAX_DOCUMENT_BYTES
MAX_URI_CHARS = 1024  # runs.config_source
MAX_IDENTITY_CHARS = 256  # runs.idempotency_key, s3_drops.identity
CONFIG_SUFFIXES = {".yaml": "yaml", ".yml": "yaml", ".json": "json"}
_BUCKET_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789.-")
_RETRYABLE_CODES = frozenset(
    {"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "InternalError", "503"}
)


@dataclass(frozen=True)
class ResolvedConfig:
    """A validated config, where it came from, and the idempotency key of its launch."""

    config: RunConfig
    source: str
    idempotency_key: str


@dataclass(frozen=True)
class S3Location:
    """A parsed ``s3://`` URI: bucket, key and (optionally) a pinned version."""

    bucket: str
    key: str
    version_id: str | None = None

    @property
    def uri(self) -> str:
        return s3_uri(self.bucket, self.key, self.version_id)


@dataclass(frozen=True)
class S3ObjectInfo:
    """What ``head_object`` (or a listing) says about one object version."""

    bucket: str
    key: str
    version_id: str | None  # None on an unversioned bucket (S3 says "null")
    etag: str
    size: int

    @property
    def uri(self) -> str:
        """The URI pinned to this version (unversioned: the plain key)."""
        return s3_uri(self.bucket, self.key, self.version_id)

    @property
    def identity(self) -> str:
        """The launch idempotency key of this object version."""
        return object_identity(self.bucket, self.key, self.version_id, self.etag)


def s3_uri(bucket: str, key: str, version_id: str | None = None) -> str:
    """``s3://bucket/key[?versionId=V]`` with ``%``, ``?`` and ``#`` in the key escaped."""
    uri = f"s3://{bucket}/{quote(key, safe='/ ')}"
    if version_id is not None:
        uri += f"?versionId={quote(version_id, safe='')}"
    return uri


def object_identity(bucket: str, key: str, version_id: str | None, etag: str) -> str:
    """Idempotency key of an object version: readable when it fits 256 characters, else hashed."""
    etag = etag.strip('"')
    if version_id is not None and version_id != "null":
        text = f"{s3_uri(bucket, key)}?versionId={version_id}"
    else:
        text = f"{s3_uri(bucket, key)}#etag={etag}"
    if len(text) <= MAX_IDENTITY_CHARS:
        return text
    return "s3:sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def bucket_problem(bucket: str) -> str | None:
    if not 3 <= len(bucket) <= 63:
        return f"bucket name must be 3 to 63 characters (got {len(bucket)})"
    if not set(bucket) <= _BUCKET_CHARS:
        return "bucket name may only contain a-z 0-9 . -"
    if not (bucket[0].isalnum() and bucket[-1].isalnum()):
        return "bucket name must start and end with a letter or digit"
    return None


def parse_s3_uri(uri: str) -> S3Location:
    """Parse ``s3://bucket/key[?versionId=V]``, or raise ConfigError saying what is wrong."""
    if len(uri) > MAX_URI_CHARS:
        raise ConfigError("config_uri", [f"must be at most {MAX_URI_CHARS} characters"])
    if not uri.isprintable():
        raise ConfigError("config_uri", ["must not contain control characters"])
    parts = urlsplit(uri)
    if parts.scheme != "s3":
        raise ConfigError("config_uri", [f"not an s3:// URI: {uri[:80]!r}"])
    if parts.fragment:
        raise ConfigError(uri, ["'#' is not allowed (escape it in the key as %23)"])
    problem = bucket_problem(parts.netloc)
    if problem is not None:
        raise ConfigError(uri, [problem])
    key = unquote(parts.path.removeprefix("/"))
    if not key or key.endswith("/"):
        raise ConfigError(uri, ["must name an object: s3://bucket/path/to/config.yaml"])
    if len(key.encode("utf-8")) > 1024:
        raise ConfigError(uri, ["the object key must be at most 1024 bytes"])
    version_id: str | None = None
    if parts.query:
        name, sep, value = parts.query.partition("=")
        if name != "versionId" or not sep or not value or "&" in value:
            raise ConfigError(uri, ["the only query allowed is ?versionId=<version id>"])
        version_id = unquote(value)
    return S3Location(parts.netloc, key, version_id)


def config_format(key: str, source: str) -> str:
    """``yaml`` or ``json`` from the key's suffix, or ConfigError naming the allowed ones."""
    suffix = Path(key).suffix.lower()
    fmt = CONFIG_SUFFIXES.get(suffix)
    if fmt is None:
        raise ConfigError(
            source, [f"unsupported file type {suffix or '(none)'!r}: use .yaml, .yml or .json"]
        )
    return fmt


def s3_client(endpoint_url: str | None = None) -> Any:
    """A boto3 S3 client with bounded connect/read timeouts and retries.

    ``endpoint_url`` defaults to the ``s3_endpoint_url`` setting (MinIO, moto, LocalStack).
    """
    import boto3
    from botocore.config import Config

    from evalfleet.settings import get_settings

    endpoint = endpoint_url if endpoint_url is not None else get_settings().s3_endpoint_url
    config = Config(connect_timeout=5, read_timeout=15, retries={"max_attempts": 3})
    return boto3.client("s3", endpoint_url=endpoint, config=config)


def source_unavailable(source: str, exc: Exception, s3: Any, bucket: str, what: str) -> ConfigError:
    """Turn a boto3/botocore failure into a ConfigError that names the problem, not a trace."""
    from botocore.exceptions import (
        BotoCoreError,
        ClientError,
        ConnectionError,
        NoCredentialsError,
        PartialCredentialsError,
    )

    if isinstance(exc, NoCredentialsError | PartialCredentialsError):
        return ConfigSourceUnavailable(
            source, ["no usable AWS credentials (set them up as for the AWS CLI)"], retryable=False
        )
    if isinstance(exc, ConnectionError):
        return ConfigSourceUnavailable(
            source, [f"cannot reach S3 ({type(exc).__name__})"], retryable=True
        )
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        if code in ("NoSuchBucket",) or (
            code in ("404", "NotFound") and not _bucket_exists(s3, bucket)
        ):
            return ConfigSourceUnavailable(
                source, [f"bucket {bucket!r} does not exist"], retryable=False
            )
        if code in ("NoSuchKey", "NoSuchVersion", "404", "NotFound"):
            return ConfigSourceUnavailable(source, [f"{what} does not exist"], retryable=False)
        if code in ("AccessDenied", "403", "Forbidden", "AllAccessDisabled"):
            return ConfigSourceUnavailable(
                source,
                [f"access denied to {what} (the caller needs s3:GetObject on it)"],
                retryable=False,
            )
        if code in ("InvalidArgument", "400") and what.startswith("version"):
            return ConfigSourceUnavailable(source, ["invalid versionId"], retryable=False)
        if code in ("PreconditionFailed", "412"):
            return ConfigSourceUnavailable(
                source, ["the object changed while it was being read; try again"], retryable=True
            )
        retryable = code in _RETRYABLE_CODES or status >= 500
        return ConfigSourceUnavailable(
            source, [f"S3 refused the request: {code or status}"], retryable=retryable
        )
    if isinstance(exc, BotoCoreError):
        return ConfigSourceUnavailable(
            source, [f"S3 request failed ({type(exc).__name__})"], retryable=True
        )
    raise exc


def _bucket_exists(s3: Any, bucket: str) -> bool:
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        s3.head_bucket(Bucket=bucket)
    except ClientError as exc:
        code = str(exc.response.get("Error", {}).get("Code", ""))
        return code not in ("404", "NoSuchBucket", "NotFound")
    except BotoCoreError:
        return True  # cannot tell: report the object as missing rather than guess
    return True


def head_s3_object(s3: Any, loc: S3Location) -> S3ObjectInfo:
    """Size, ETag and version of the object (pinned version if the URI has one)."""
    from botocore.exceptions import BotoCoreError, ClientError

    args: dict[str, Any] = {"Bucket": loc.bucket, "Key": loc.key}
    if loc.version_id is not None:
        args["VersionId"] = loc.version_id
    what = f"version {loc.version_id!r} of the object" if loc.version_id else "the object"
    try:
        head = s3.head_object(**args)
    except (BotoCoreError, ClientError) as exc:
        raise source_unavailable(loc.uri, exc, s3, loc.bucket, what) from None
    version = head.get("VersionId")
    return S3ObjectInfo(
        bucket=loc.bucket,
        key=loc.key,
        version_id=None if version in (None, "null") else str(version),
        etag=str(head.get("ETag", "")).strip('"'),
        size=int(head.get("ContentLength", 0)),
    )


def check_size(info: S3ObjectInfo) -> None:
    """ConfigError when the object is larger than a run config may be (checked before reading)."""
    if info.size > MAX_CONFIG_BYTES:
        raise ConfigError(
            info.uri,
            [
                f"object is too large ({info.size:,} bytes; the limit is "
                f"{MAX_CONFIG_BYTES:,} bytes) - not downloaded"
            ],
        )


def read_s3_config(s3: Any, info: S3ObjectInfo) -> RunConfig:
    """Download exactly the object version ``info`` describes (bounded) and validate it."""
    from botocore.exceptions import BotoCoreError, ClientError

    source = info.uri
    fmt = config_format(info.key, source)
    check_size(info)
    args: dict[str, Any] = {"Bucket": info.bucket, "Key": info.key}
    if info.version_id is not None:
        args["VersionId"] = info.version_id
    elif info.etag:
        args["IfMatch"] = f'"{info.etag}"'
    try:
        obj = s3.get_object(**args)
        body = obj["Body"]
        try:
            raw: bytes = body.read(MAX_CONFIG_BYTES + 1)
        finally:
            body.close()
    except (BotoCoreError, ClientError) as exc:
        raise source_unavailable(source, exc, s3, info.bucket, "the object") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(source, [f"object is larger than {MAX_CONFIG_BYTES:,} bytes"])
    data = parse_document(decode_text(raw, source), source, fmt)
    return RunConfig.from_mapping(data, None, source=source, confine=True)


def resolve_s3(uri: str, *, s3: Any | None = None) -> ResolvedConfig:
    """Resolve an ``s3://`` URI (see the module docstring)."""
    loc = parse_s3_uri(uri)
    config_format(loc.key, uri)
    client = s3 if s3 is not None else s3_client()
    info = head_s3_object(client, loc)
    check_size(info)
    config = read_s3_config(client, info)
    return ResolvedConfig(config=config, source=info.uri, idempotency_key=info.identity)


def resolve_config(uri: str, *, s3: Any | None = None) -> ResolvedConfig:
    """A validated config, its source and idempotency key, from a path or an ``s3://`` URI."""
    if not isinstance(uri, str) or not uri.strip():
        raise ConfigError("config_uri", ["must be a file path or an s3://bucket/key URI"])
    scheme = urlsplit(uri).scheme if "://" in uri else ""
    if scheme == "s3":
        return resolve_s3(uri, s3=s3)
    if scheme == "file":
        path = Path(unquote(urlsplit(uri).path))
    elif scheme == "":
        path = Path(uri)
    else:
        raise ConfigError(
            "config_uri", [f"unsupported scheme {scheme!r}: use a file path or s3://bucket/key"]
        )
    config = RunConfig.from_file(path)
    return ResolvedConfig(
        config=config, source=str(path.resolve()), idempotency_key=config.content_hash
    )
