"""The reader's view of a caller: a ServiceAccount in the kube-apiserver's log is the token the
driver would show the token listener (its pod, its namespace), as in the gatekeeper's own log."""

from __future__ import annotations

from gatekeeper.audit.tools.reader import to_record
from gatekeeper.listenerkind import ListenerKind
from gatekeeper.types import Identity
from tests.audit.logs import SA_GPU, apiserver_event

POD_NAME = "authentication.kubernetes.io/pod-name"


def test_a_service_account_in_the_kube_apiserver_log_is_its_token_user() -> None:
    record = to_record(apiserver_event("get", "/api/v1/nodes/node-a", SA_GPU), {SA_GPU: "gpu"})
    user = record.token_user
    assert user is not None and user.username == SA_GPU
    assert "system:serviceaccounts:gpu-system" in user.groups
    assert user.first_extra(POD_NAME) == "driver-x7k2p"
    identity = Identity("gpu", ListenerKind.TOKEN, user=user)
    assert identity.service_account == ("gpu-system", "gpu-driver")
    assert identity.pod == ("driver-x7k2p", "5b7f1a52-0c1e-4c7e-9b59-2b8f4e1c0d11")


def test_other_users_of_the_kube_apiserver_log_show_no_token() -> None:
    event = apiserver_event("get", "/api/v1/nodes/node-a", "system:node:node-a")
    assert to_record(event, {"system:node:node-a": "gpu"}).token_user is None
