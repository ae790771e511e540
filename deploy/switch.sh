#!/bin/sh
# Flips client traffic (the Service "tandem") between the unsplit and the split backend by scaling
# Deployments: the others go to 0 first and their pods must be gone (GPUs freed) before the chosen
# ones scale to 1. Applying the manifests resets every Deployment to 0, so run this after apply.
#   ./switch.sh unsplit        tandem-head-unsplit
#   ./switch.sh split          tandem-worker + tandem-head-split
#   ./switch.sh split-remote   tandem-head-split only (its worker runs elsewhere, e.g. launchd)
#   ./switch.sh off            nothing
# KUBECTL (default kubectl) and NAMESPACE (default: the context's) pick the cluster.
set -eu

ALL="tandem-head-unsplit tandem-head-split tandem-worker"
case "${1:-}" in
  unsplit) chosen="tandem-head-unsplit" ;;
  split) chosen="tandem-worker tandem-head-split" ;;
  split-remote) chosen="tandem-head-split" ;;
  off) chosen="" ;;
  *)
    echo "Usage: $0 unsplit|split|split-remote|off" >&2
    exit 2
    ;;
esac

k() {
  ${KUBECTL:-kubectl} ${NAMESPACE:+--namespace "$NAMESPACE"} "$@"
}

others=""
for d in $ALL; do
  case " $chosen " in *" $d "*) ;; *) others="$others $d" ;; esac
done

for d in $others; do
  k scale "deployment/$d" --replicas=0
done
# Wait until the old pods are gone: a new backend would not get the GPU they hold.
for d in $others; do
  waited=0
  while [ -n "$(k get pods -l "app.kubernetes.io/name=$d" -o name)" ]; do
    if [ "$waited" -ge 300 ]; then
      echo "Cannot switch: pods of $d are still running after 300 s; check kubectl get pods" >&2
      exit 1
    fi
    sleep 2
    waited=$((waited + 2))
  done
done
for d in $chosen; do
  k scale "deployment/$d" --replicas=1
done
for d in $chosen; do
  k rollout status "deployment/$d" --timeout=900s
done
echo "tandem: ${1} (${chosen:-no backend})"
