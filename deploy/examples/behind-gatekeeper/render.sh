#!/bin/sh
# Helm's rendered manifests on stdin; on stdout the same with the Component of this directory
# (behind-gatekeeper.yaml: env and volumes of the kubelet plugin's DaemonSet) applied, by
# `kubectl kustomize` ($KUBECTL, else kubectl on PATH).
set -eu
here=${HELM_PLUGIN_DIR:-$(dirname "$0")}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/behind-gatekeeper"
cp "$here/kustomization.yaml" "$here/behind-gatekeeper.yaml" \
  "$work/behind-gatekeeper/"
cat > "$work/chart.yaml"
printf 'resources: [chart.yaml]\ncomponents: [behind-gatekeeper]\n' > "$work/kustomization.yaml"
"${KUBECTL:-kubectl}" kustomize "$work"
