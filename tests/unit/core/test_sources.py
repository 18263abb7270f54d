"""Quota sources: each entry of `quota_sources` parsed to its kind, name and unit, or refused saying why; and a
quota value's error, stored bounded."""

from __future__ import annotations

import pytest

from vramguard.core.policy import DEFAULT_QUOTA_SOURCES
from vramguard.core.quantity import MiB
from vramguard.core.sources import (
    BURST_ANNOTATION,
    QuotaError,
    QuotaSource,
    SourceKind,
    parse_quota_source,
    reads_claims,
)

VRAM = "vramguard.io/vram"
GPUMEM = "nvidia.com/gpumem"
KAI = "gpu-memory"
KINDS = "must be resource:<name>, annotation:<name>, env:<name> or claim:<"
HUGE = "9" * 10_000_000  # a tenant can write a 10 MB annotation


@pytest.mark.parametrize(
    ("value", "marker"),
    [
        pytest.param("x" * 1024, "", id="at-the-limit-unchanged"),
        pytest.param("x" * 1025, "...[cut: 1025 characters]", id="one-over-is-cut-with-a-marker"),
        pytest.param(HUGE, "...[cut: 10000000 characters]", id="ten-megabytes-cut-with-a-marker"),
    ],
)
def test_quota_error_stores_its_value_bounded(value: str, marker: str) -> None:
    """QuotaError keeps at most 1024 characters of a value, saying how long it was, so no log line is megabytes."""
    error = QuotaError("metadata.annotations[x]", value, "is not a valid quantity")
    assert error.value == value[: QuotaError.MAX_CHARS - len(marker)] + marker
    assert len(error.value) == QuotaError.MAX_CHARS == 1024


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(f"resource:{VRAM}", QuotaSource(SourceKind.RESOURCE, VRAM, 1), id="resource-bytes"),
        pytest.param(f"resource:{GPUMEM}", QuotaSource(SourceKind.RESOURCE, GPUMEM, MiB), id="resource-MiB"),
        pytest.param(f"annotation:{KAI}", QuotaSource(SourceKind.ANNOTATION, KAI, MiB), id="annotation-MiB"),
    ],
)
def test_parse_quota_source(text: str, expected: QuotaSource) -> None:
    """Source strings parse to their kind, name and unit, and print back as written."""
    assert parse_quota_source(text) == expected
    assert str(expected) == text


@pytest.mark.parametrize(
    ("text", "message_part"),
    [
        pytest.param(VRAM, "must be resource:<name>, annotation:<name>, env:<name> or claim:<", id="missing-kind"),
        pytest.param(
            f"label:{VRAM}", "must be resource:<name>, annotation:<name>, env:<name> or claim:<", id="unknown-kind"
        ),
        pytest.param("claim:Gpu.Nvidia.com", "is not a DRA driver or device class name", id="claim-uppercase"),
        pytest.param("claim:", "is not a DRA driver or device class name", id="claim-empty"),
        pytest.param("claim:" + "a" * 254, "is not a DRA driver or device class name", id="claim-too-long"),
        pytest.param("resource:example.com/vram", "knows the unit of no resource", id="unknown-resource"),
        pytest.param(f"annotation:{VRAM}", "knows the unit of no annotation", id="resource-name-as-annotation"),
        pytest.param(f"annotation:{BURST_ANNOTATION}", "no annotation", id="burst-is-not-a-quota-source"),
    ],
)
def test_parse_quota_source_rejects(text: str, message_part: str) -> None:
    """Sources vramguard cannot read are rejected with a reason."""
    with pytest.raises(ValueError, match=message_part):
        parse_quota_source(text)


def test_reads_claims_only_with_a_claim_source() -> None:
    """Claims are read only when one of the quota sources is a valid `claim:` source."""
    assert reads_claims(("resource:vramguard.io/vram", "claim:gpu.nvidia.com"))
    assert not reads_claims(DEFAULT_QUOTA_SOURCES)
    assert not reads_claims(("claim:Not_A_Name",))  # the policy loader reports it; no claim source either


def test_a_quota_error_is_stored_cut() -> None:
    """A tenant's 10 MB annotation is kept as at most MAX_CHARS characters in every field."""
    error = QuotaError(field="annotation x", value="9" * 10_000_000, message="is not a valid quantity")
    assert len(error.value) <= QuotaError.MAX_CHARS
    assert error.message == "is not a valid quantity"


@pytest.mark.parametrize(
    ("text", "per_container", "keys"),
    [
        pytest.param("env:NVIDIA_GPU_MEMORY", True, ("NVIDIA_GPU_MEMORY_REQUEST", "NVIDIA_GPU_MEMORY_LIMIT"), id="env"),
        pytest.param(
            "annotation:nvidia.com/container.<container>.gpu-memory",
            True,
            ("nvidia.com/container.main.gpu-memory.request", "nvidia.com/container.main.gpu-memory.limit"),
            id="kai-per-container",
        ),
        pytest.param("annotation:gpu-memory", False, None, id="pod-wide"),
        pytest.param(f"resource:{VRAM}", True, None, id="resource"),
    ],
)
def test_nvidias_pairs_name_a_request_and_a_limit_per_container(
    text: str, per_container: bool, keys: tuple[str, str] | None
) -> None:
    """A pair source names the container's request and limit; a pod-wide annotation covers the whole pod."""
    source = parse_quota_source(text)
    assert str(source) == text and source.per_container is per_container and source.pair is (keys is not None)
    if keys is not None:
        assert source.pair_keys("main") == keys
