#!/bin/sh
# A Helm post-renderer that adds the txnguard sidecar to the broker StatefulSet of the chart you install Kafka with.
# Usage:
#   helm template kafka deploy/helm/txnguard -f my-values.yaml --set shape=sidecar-container \
#     --show-only templates/sidecar-container.yaml > txnguard/kustomization.yaml
#   helm template kafka deploy/helm/txnguard -f my-values.yaml --set shape=sidecar-container \
#     --show-only templates/configmap.yaml > txnguard/configmap.yaml
#   helm upgrade --install kafka <your Kafka chart> ... \
#     --post-renderer deploy/kustomize/txnguard-post-render.sh --post-renderer-args "$PWD/txnguard"
# Helm writes the rendered manifests to stdin; kustomize merges the component (docs/deployment/sidecar.md).
set -eu
component=$(cd "${1:?the folder holding the txnguard component (kustomization.yaml, configmap.yaml)}" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat > "$work/rendered.yaml"
cp -R "$component" "$work/txnguard"
printf 'resources: [rendered.yaml]\ncomponents: [txnguard]\n' > "$work/kustomization.yaml"
if command -v kustomize > /dev/null; then kustomize build "$work"; else kubectl kustomize "$work"; fi
