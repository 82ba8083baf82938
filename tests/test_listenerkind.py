"""ListenerKind: the one definition of the kinds of listener, and their labels."""

from __future__ import annotations

import pytest

from gatekeeper.listenerkind import ListenerKind


def test_the_labels_metrics_and_audit_have_always_used() -> None:
    assert [kind.value for kind in ListenerKind] == ["unix", "mtls", "token", "health"]
    assert [kind for kind in ListenerKind if not kind.serves_drivers] == [ListenerKind.HEALTH]


@pytest.mark.parametrize(
    ("label", "kind"),
    [
        ("unix", ListenerKind.UNIX),
        ("mtls", ListenerKind.MTLS),
        ("token", ListenerKind.TOKEN),
        ("", ListenerKind.UNIX),
        (None, ListenerKind.UNIX),
        ("carrier-pigeon", ListenerKind.UNIX),
    ],
)
def test_a_label_read_back_from_a_log(label: str | None, kind: ListenerKind) -> None:
    assert ListenerKind.of_label(label, ListenerKind.UNIX) is kind
