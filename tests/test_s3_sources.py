"""The config resolver: local files and s3:// objects on a moto S3 server (server mode).

Checks the size limit comes before any download, each way an object can be unreadable is a
clear ConfigError naming the URI, and the idempotency key follows the object version (or its
ETag on an unversioned bucket): the same object is one key, a new upload is a new key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from botocore.stub import Stubber

from evalfleet.config_sources import (
    MAX_CONFIG_BYTES,
    object_identity,
    parse_s3_uri,
    resolve_config,
    s3_uri,
)
from evalfleet.errors import ConfigError, ConfigSourceUnavailable

pytest_plugins = ["s3_support"]
GOOD_CONFIG = b"""name: smoke
harness: {name: simulated}
alias: sim-anthropic
instances: [astropy__astropy-12907, django__django-11099]
caps: {spend_usd: 5}
"""

ROOT = Path(__file__).resolve().parent


def _versioned(s3: Any, bucket: str) -> None:
    s3.create_bucket(Bucket=bucket)
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})


def _count_calls(s3: Any, operation: str) -> list[str]:
    calls: list[str] = []
    s3.meta.events.register(f"before-call.s3.{operation}", lambda **_: calls.append(operation))
    return calls


def test_a_local_file_resolves_with_its_content_hash() -> None:
    path = ROOT / "data" / "configs" / "good" / "minimal.yaml"
    resolved = resolve_config(str(path))
    assert resolved.config.name == "smoke"
    assert resolved.source == str(path.resolve())
    assert resolved.idempotency_key == resolved.config.content_hash
    assert resolve_config(path.resolve().as_uri()).idempotency_key == resolved.idempotency_key


def test_a_versioned_object_resolves_pinned_to_its_version(moto_s3: Any) -> None:
    s3 = moto_s3
    _versioned(s3, "runs")
    put = s3.put_object(Bucket="runs", Key="drop/smoke.yaml", Body=GOOD_CONFIG)
    resolved = resolve_config("s3://runs/drop/smoke.yaml", s3=s3)
    assert resolved.config.instances == ("astropy__astropy-12907", "django__django-11099")
    version = put["VersionId"]
    assert resolved.source == f"s3://runs/drop/smoke.yaml?versionId={version}"
    assert resolved.idempotency_key == f"s3://runs/drop/smoke.yaml?versionId={version}"
    # the same object resolved again (an event delivered twice): the same key
    assert resolve_config(resolved.source, s3=s3).idempotency_key == resolved.idempotency_key

    # a new upload is a new version, hence a new key; the pinned URI still reads the old one
    s3.put_object(Bucket="runs", Key="drop/smoke.yaml", Body=GOOD_CONFIG.replace(b"smoke", b"two"))
    latest = resolve_config("s3://runs/drop/smoke.yaml", s3=s3)
    assert latest.config.name == "two"
    assert latest.idempotency_key != resolved.idempotency_key
    assert resolve_config(resolved.source, s3=s3).config.name == "smoke"


def test_an_unversioned_object_is_keyed_by_its_etag(moto_s3: Any) -> None:
    s3 = moto_s3
    s3.create_bucket(Bucket="plain")
    put = s3.put_object(
        Bucket="plain",
        Key="a.json",
        Body=b'{"name": "j", "harness": {"name": '
        b'"simulated"}, "alias": "sim-openai", "instances": ["x"], "caps": {"spend_usd": 1}}',
    )
    first = resolve_config("s3://plain/a.json", s3=s3)
    etag = put["ETag"].strip('"')
    assert first.idempotency_key == f"s3://plain/a.json#etag={etag}"
    assert first.source == "s3://plain/a.json"
    # the same bytes dropped again: same ETag, same key (one run)
    s3.put_object(
        Bucket="plain",
        Key="a.json",
        Body=s3.get_object(Bucket="plain", Key="a.json")["Body"].read(),
    )
    assert resolve_config("s3://plain/a.json", s3=s3).idempotency_key == first.idempotency_key


def test_an_oversized_object_is_refused_before_any_download(moto_s3: Any) -> None:
    s3 = moto_s3
    s3.create_bucket(Bucket="big")
    s3.put_object(Bucket="big", Key="huge.yaml", Body=b"#" * (MAX_CONFIG_BYTES + 1))
    gets = _count_calls(s3, "GetObject")
    with pytest.raises(ConfigError) as err:
        resolve_config("s3://big/huge.yaml", s3=s3)
    assert not isinstance(err.value, ConfigSourceUnavailable)
    assert "too large" in str(err.value) and "1,048,577 bytes" in str(err.value)
    assert gets == []


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (b"name: [unclosed\n", "line"),
        (b"- a list\n", "top level must be a mapping"),
        (GOOD_CONFIG.replace(b"spend_usd: 5", b"spend_usd: -5"), "caps.spend_usd"),
        (GOOD_CONFIG + b"instances_file: x\n", "instances_file"),
        (b"\xff\xfe", "UTF-8"),
    ],
)
def test_malformed_or_invalid_content_is_a_config_error(
    moto_s3: Any, body: bytes, needle: str
) -> None:
    s3 = moto_s3
    s3.create_bucket(Bucket="bad")
    s3.put_object(Bucket="bad", Key="c.yaml", Body=body)
    with pytest.raises(ConfigError) as err:
        resolve_config("s3://bad/c.yaml", s3=s3)
    assert not isinstance(err.value, ConfigSourceUnavailable)
    assert err.value.source.startswith("s3://bad/c.yaml")
    assert needle in str(err.value)


def test_an_instances_file_cannot_be_used_from_s3(moto_s3: Any) -> None:
    s3 = moto_s3
    s3.create_bucket(Bucket="bad")
    body = GOOD_CONFIG.replace(
        b"instances: [astropy__astropy-12907, django__django-11099]",
        b"instances: {file: ids.txt}",
    )
    s3.put_object(Bucket="bad", Key="c.yaml", Body=body)
    with pytest.raises(ConfigError, match="instances"):
        resolve_config("s3://bad/c.yaml", s3=s3)


def test_missing_bucket_key_and_version_are_clear_errors(moto_s3: Any) -> None:
    s3 = moto_s3
    with pytest.raises(ConfigSourceUnavailable, match="bucket 'nope' does not exist") as err:
        resolve_config("s3://nope/c.yaml", s3=s3)
    assert err.value.retryable is False
    _versioned(s3, "there")
    with pytest.raises(ConfigSourceUnavailable, match="the object does not exist"):
        resolve_config("s3://there/c.yaml", s3=s3)
    s3.put_object(Bucket="there", Key="c.yaml", Body=GOOD_CONFIG)
    with pytest.raises(ConfigSourceUnavailable, match="version"):
        resolve_config("s3://there/c.yaml?versionId=bogus", s3=s3)


def test_access_denied_is_a_clear_error(moto_endpoint: str, s3_factory: Any) -> None:
    client = s3_factory(moto_endpoint)
    with Stubber(client) as stub:
        stub.add_client_error("head_object", "403", "Forbidden", http_status_code=403)
        with pytest.raises(ConfigSourceUnavailable, match="access denied") as err:
            resolve_config("s3://locked/c.yaml", s3=client)
    assert err.value.retryable is False
    assert "Traceback" not in str(err.value)


def test_unreachable_s3_is_retryable(s3_factory: Any) -> None:
    client = s3_factory(
        f"http://127.0.0.1:{_closed_port()}",
        retries={"total_max_attempts": 1},
        connect_timeout=1,
    )
    with pytest.raises(ConfigSourceUnavailable, match="cannot reach S3") as err:
        resolve_config("s3://any-bucket/c.yaml", s3=client)
    assert err.value.retryable is True


def _closed_port() -> int:
    from s3_support import free_port

    port: int = free_port()  # nothing listens on it once the probe socket is closed
    return port


@pytest.mark.parametrize(
    ("uri", "needle"),
    [
        ("s3://", "bucket name"),
        ("s3://Bad_Bucket/c.yaml", "may only contain"),
        ("s3://bucket/", "must name an object"),
        ("s3://bucket/c.yaml?foo=1", "versionId"),
        ("s3://bucket/c.yaml#x", "'#'"),
        ("s3://bucket/c.txt", "unsupported file type"),
        ("http://bucket/c.yaml", "unsupported scheme"),
        ("", "file path or an s3://"),
        ("s3://bucket/" + "k" * 1100 + ".yaml", "at most 1024"),
    ],
)
def test_bad_uris_are_refused_without_a_request(uri: str, needle: str, s3_factory: Any) -> None:
    client = s3_factory("http://127.0.0.1:9")  # never contacted
    calls = _count_calls(client, "*")
    with pytest.raises(ConfigError, match=needle):
        resolve_config(uri, s3=client)
    assert calls == []


def test_uri_round_trip_and_identity_forms() -> None:
    key = "drop/a b%c?d#e.yaml"
    loc = parse_s3_uri(s3_uri("bkt", key, "v1"))
    assert (loc.bucket, loc.key, loc.version_id) == ("bkt", key, "v1")
    assert object_identity("bkt", "k.yaml", "null", '"abc"') == "s3://bkt/k.yaml#etag=abc"
    long_id = object_identity("bkt", "k" * 300 + ".yaml", "v", "e")
    assert long_id.startswith("s3:sha256:") and len(long_id) <= 256
    assert long_id == object_identity("bkt", "k" * 300 + ".yaml", "v", "e")
