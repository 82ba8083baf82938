"""deploy/examples/behind-gatekeeper: the kustomize Component and the Helm post-renderer that
run it put a kubelet plugin behind the gatekeeper whatever its container is called (the patch
matches the first container by position), and touch nothing but env and volumes."""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from gatekeeper.testing.harness import KUBECTL

EXAMPLES = Path(__file__).resolve().parent.parent / "deploy" / "examples"
COMPONENT = EXAMPLES / "behind-gatekeeper"
DRIVER = EXAMPLES / "token-driver" / "driver.yaml"


def _driver(container: str) -> list[dict[str, Any]]:
    """The example driver with its plugin container renamed."""
    documents = [d for d in yaml.safe_load_all(DRIVER.read_text()) if d]
    daemonset = next(d for d in documents if d["kind"] == "DaemonSet")
    daemonset["spec"]["template"]["spec"]["containers"][0]["name"] = container
    return documents


def _added(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """What ``after`` adds to ``before``'s pod spec; asserts nothing else differs."""
    spec, old = copy.deepcopy(after["spec"]["template"]["spec"]), before["spec"]["template"]["spec"]
    container, old_container = spec["containers"][0], old["containers"][0]

    def tail(items: list[dict[str, Any]], keep: int, key: str) -> list[str]:
        added = [item[key] for item in items[keep:]]
        del items[keep:]
        return added

    added = {
        "automount": spec.pop("automountServiceAccountToken"),
        "container": container["name"],
        "env": tail(container["env"], len(old_container["env"]), "name"),
        "mounts": tail(container["volumeMounts"], len(old_container["volumeMounts"]), "mountPath"),
        "volumes": tail(spec["volumes"], len(old["volumes"]), "name"),
    }
    assert spec == old
    assert {k: v for k, v in after.items() if k != "spec"} == {
        k: v for k, v in before.items() if k != "spec"
    }
    return added


WANT = {
    "automount": False,
    "env": ["KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"],
    "mounts": ["/var/run/secrets/kubernetes.io/serviceaccount"],
    "volumes": ["gatekeeper-serviceaccount"],
}


@pytest.mark.kubectl
@pytest.mark.parametrize("container", ["plugin", "kubelet-plugin", "gpu"])
def test_the_component_patches_the_plugin_whatever_its_name(container: str, tmp_path: Path) -> None:
    documents = _driver(container)
    (tmp_path / "driver.yaml").write_text(yaml.safe_dump_all(documents))
    shutil.copytree(COMPONENT, tmp_path / "behind-gatekeeper")
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump({"resources": ["driver.yaml"], "components": ["behind-gatekeeper"]})
    )
    built = subprocess.run(
        [str(KUBECTL), "kustomize", str(tmp_path)], capture_output=True, text=True, check=True
    ).stdout
    after = next(d for d in yaml.safe_load_all(built) if d and d["kind"] == "DaemonSet")
    before = next(d for d in documents if d["kind"] == "DaemonSet")
    assert _added(before, after) == {**WANT, "container": container}


@pytest.mark.kubectl
def test_the_helm_post_renderer_applies_the_component_to_what_helm_renders() -> None:
    """render.sh as Helm 4 runs a postrenderer/v1 plugin: manifests on stdin (with Helm's
    ``# Source`` comments), ``HELM_PLUGIN_DIR`` set; the other objects pass unchanged."""
    documents = _driver("kubelet-plugin")
    stdin = "".join(
        f"---\n# Source: chart/templates/{i}.yaml\n{yaml.safe_dump(d)}"
        for i, d in enumerate(documents)
    )
    done = subprocess.run(
        [str(COMPONENT / "render.sh")],
        input=stdin,
        capture_output=True,
        text=True,
        env={**os.environ, "HELM_PLUGIN_DIR": str(COMPONENT), "KUBECTL": str(KUBECTL)},
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(done.stdout) if d}
    assert sorted(out) == sorted((d["kind"], d["metadata"]["name"]) for d in documents)
    for document in documents:
        after = out[(document["kind"], document["metadata"]["name"])]
        if document["kind"] == "DaemonSet":
            assert _added(document, after) == {**WANT, "container": "kubelet-plugin"}
        else:
            assert after == document
