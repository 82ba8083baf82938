"""Reading ``/metrics`` in tests: the exposition text parsed by prometheus-client's own parser."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["metric_samples", "metric_value"]


def metric_samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the exposition text, keyed by name and sorted labels."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def metric_value(text: str, name: str, **labels: str) -> float:
    """The sample ``name`` with exactly ``labels``; 0.0 when absent (a counter not yet moved)."""
    return metric_samples(text).get((name, tuple(sorted(labels.items()))), 0.0)
