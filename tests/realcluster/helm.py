"""Helm 4, built from the Go module beside this file (cmd/helm), run on the repository's chart:
lint, template, install. Its cache, config and data directories are the test's own, so nothing
of the user's Helm (repositories, plugins) takes part."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "CHART",
    "DRIVER_NAMESPACE_KIND",
    "HELM_LABELS",
    "Helm",
    "generated_values",
    "without_helm_labels",
]

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "dra-gatekeeper"
HELM_LABELS = ("app.kubernetes.io/managed-by", "helm.sh/chart")
DRIVER_NAMESPACE_KIND = """\
kinds:
  - group: coordination.k8s.io
    resource: leases
    kind: Lease
    scope: Namespaced
    rule: DriverNamespace
    verbs: [get, create, update]
    encodings: [json, protobuf]
    versions:
      - names: [v1]
"""
"""A policy's end: a kind of rule DriverNamespace (its rights bound in each driver
namespace, by publish-ca as the namespace appears)."""
"""The labels the chart adds to every object, and kustomize does not."""


@dataclass
class Helm:
    """The helm binary, with its own home under ``home``."""

    binary: str
    home: Path

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = {
            **os.environ,
            "HELM_CACHE_HOME": str(self.home / "cache"),
            "HELM_CONFIG_HOME": str(self.home / "config"),
            "HELM_DATA_HOME": str(self.home / "data"),
        }
        done = subprocess.run(
            [self.binary, *args], capture_output=True, text=True, env=env, timeout=300
        )
        if check and done.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)}: {done.returncode}\n{done.stderr}")
        return done

    def template(
        self, *values: Path, namespace: str = "kube-system", sets: tuple[str, ...] = ()
    ) -> list[dict[str, Any]]:
        """The objects ``helm template`` renders, with the given values files and --set."""
        args = ["template", "dra-gatekeeper", str(CHART), "--namespace", namespace]
        for path in values:
            args += ["-f", str(path)]
        for item in sets:
            args += ["--set", item]
        return [doc for doc in yaml.safe_load_all(self.run(*args).stdout) if doc]


def without_helm_labels(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` without the labels only the chart adds."""
    labels = obj["metadata"].get("labels", {})
    for label in HELM_LABELS:
        labels.pop(label, None)
    return obj


def generated_values(
    tmp_path: Path, policy: str, service_account: str, name: str | None = None
) -> Path:
    """``dra-gatekeeper policy deploy --format helm-values`` for ``policy`` (the cluster-wide
    objects called ``name`` when given), as a values file for ``helm -f``."""
    (tmp_path / "policy.yaml").write_text(policy)
    args = ["--name", name] if name else []
    done = subprocess.run(
        [sys.executable, "-m", "gatekeeper", "policy", "deploy",
         "--policy", str(tmp_path / "policy.yaml"), "--service-account", service_account,
         "--format", "helm-values", *args],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    path = tmp_path / "generated-values.yaml"
    path.write_text(done.stdout)
    return path
