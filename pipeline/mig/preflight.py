"""``k8s/preflight.sh``: what the MIG bundle's pods need from the cluster, checked with read-only ``kubectl`` before applying.

A pod that cannot be scheduled or started says so late and far from the cause (Pending without a reason in the
Deployment, a CreateContainerConfigError on a missing Secret). The script checks, in the namespace ``$NAMESPACE``
(default: kubectl's current one):

- the GPU nodes run the device plugin with the **mixed** MIG strategy (node label ``nvidia.com/mig.strategy``, set by
  the GPU Operator's feature discovery): under ``single`` a node advertises ``nvidia.com/gpu``, never the
  ``nvidia.com/mig-<profile>`` resources the pods request;
- some node advertises each requested ``nvidia.com/mig-<profile>``;
- the Secrets the pods read exist (``triton-admin``; ``triton-s3`` for an ``s3://`` repository), with their keys;
- the repository's PersistentVolumeClaim exists and its access modes let pods on several nodes mount it
  (``ReadOnlyMany`` or ``ReadWriteMany``: a ``ReadWriteOnce`` claim pins every replica to one node);
- every taint of the GPU nodes that keeps pods off (``NoSchedule``, ``NoExecute``) is one the Deployments tolerate.

Only ``get`` calls: nothing in the cluster changes. One line per check (``ok:`` or ``FAIL:`` with what to do), exit 1
when any fails. The script passes ``shellcheck`` (tests/mig/test_preflight.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from pipeline.mig.servers import BundleSettings

# The taints the Deployments tolerate (pipeline.mig.k8s): the GPU Operator's and the cloud providers' GPU node taint.
TOLERATED_TAINTS = ("nvidia.com/gpu",)
SCRIPT = "k8s/preflight.sh"


def tolerations() -> list[dict[str, str]]:
    """The pod spec's tolerations: every effect of each key in :data:`TOLERATED_TAINTS`."""
    return [{"key": key, "operator": "Exists"} for key in TOLERATED_TAINTS]


def preflight_script(resources: Sequence[str], settings: BundleSettings, admin_secret: str, s3_secret: str) -> str:
    """The script for pods requesting ``resources`` (``nvidia.com/mig-…``), with ``settings``' claim or bucket and the
    Secrets named ``admin_secret`` (key ``admin-key``) and, for a bucket, ``s3_secret``."""
    secrets = [f"{admin_secret}:admin-key"]
    if settings.s3 is not None:
        secrets.append(f"{s3_secret}:AWS_ACCESS_KEY_ID,AWS_SECRET_ACCESS_KEY")
    claim = "" if settings.s3 is not None else settings.pvc_claim
    lines = [
        "#!/usr/bin/env bash",
        "# Read-only checks of what the MIG bundle's pods need (pipeline/mig/preflight.py). Written by the pipeline.",
        "set -uo pipefail",
        'NS=(); [ -n "${NAMESPACE:-}" ] && NS=(-n "$NAMESPACE")',
        "failed=0",
        'ok() { echo "ok: $*"; }',
        'fail() { echo "FAIL: $*"; failed=1; }',
        'command -v kubectl >/dev/null || { echo "FAIL: kubectl is not installed"; exit 1; }',
        'nodes=$(kubectl get nodes -o name) || { echo "FAIL: kubectl cannot list the nodes (check the context and your access)"; exit 1; }',
        '[ -n "$nodes" ] || { echo "FAIL: the cluster has no nodes"; exit 1; }',
        "",
        "# the MIG strategy of every GPU node (GPU feature discovery labels it)",
        "strategies=$(kubectl get nodes -o jsonpath='{range .items[*]}{.metadata.name}{\" \"}"
        "{.metadata.labels.nvidia\\.com/mig\\.strategy}{\"\\n\"}{end}')",
        'gpu_nodes=""',
        "while read -r node strategy; do",
        '  [ -n "$node" ] || continue',
        '  case "$strategy" in',
        '    mixed) gpu_nodes="$gpu_nodes $node"; ok "node $node: MIG strategy mixed" ;;',
        '    "") ;;',
        '    *) gpu_nodes="$gpu_nodes $node"; fail "node $node: MIG strategy $strategy; the pods request nvidia.com/mig-<profile>, '
        'which only the mixed strategy advertises: set mig.strategy=mixed in the GPU Operator (or the device plugin)" ;;',
        "  esac",
        'done <<< "$strategies"',
        '[ -n "$gpu_nodes" ] || fail "no node carries the nvidia.com/mig.strategy label: install the GPU Operator (GPU feature discovery) '
        'with mig.strategy=mixed"',
        "",
        "# each MIG resource the pods request, advertised by some node",
        "allocatable=$(kubectl get nodes -o jsonpath='{range .items[*]}{.status.allocatable}{\"\\n\"}{end}')",
    ]
    for resource in resources:
        lines.append(f'if grep -q \'"{resource}"\' <<< "$allocatable"; then ok "{resource} is advertised"; '
                     f'else fail "no node advertises {resource}: partition a GPU with that profile (mig-parted / the GPU Operator\'s MIG manager)"; fi')
    lines += ["", "# the Secrets the pods read, with their keys"]
    for entry in secrets:
        name, _, keys = entry.partition(":")
        lines.append(f"if data=$(kubectl get secret {name} ${{NS[@]+\"${{NS[@]}}\"}} -o jsonpath='{{.data}}' 2>/dev/null); then")
        for key in keys.split(","):
            lines.append(f'  if grep -q \'"{key}"\' <<< "$data"; then ok "secret {name} has {key}"; '
                         f'else fail "secret {name} has no key {key}: kubectl create secret generic {name} --from-literal={key}=..."; fi')
        lines.append(f'else fail "secret {name} is missing: kubectl create secret generic {name} '
                     + " ".join(f"--from-literal={k}=..." for k in keys.split(",")) + '"; fi')
    if claim:
        lines += [
            "",
            "# the repository's claim, mountable by pods on several nodes",
            f"if modes=$(kubectl get pvc {claim} ${{NS[@]+\"${{NS[@]}}\"}} -o jsonpath='{{.spec.accessModes}}' 2>/dev/null); then",
            '  if grep -q -e ReadOnlyMany -e ReadWriteMany <<< "$modes"; then ok "claim ' + claim + ' is mountable from several nodes ($modes)"; '
            'else fail "claim ' + claim + ' has access modes $modes: replicas on other nodes cannot mount it; use a ReadOnlyMany or '
            'ReadWriteMany volume (NFS, a CSI driver that offers it)"; fi',
            f'else fail "claim {claim} is missing: create a PersistentVolumeClaim named {claim} holding the model repository"; fi',
        ]
    tolerated = "|".join(TOLERATED_TAINTS)
    lines += [
        "",
        "# taints of the GPU nodes that would keep the pods off",
        "for node in $gpu_nodes; do",
        "  taints=$(kubectl get node \"$node\" -o jsonpath='{range .spec.taints[*]}{.key}{\"=\"}{.value}{\":\"}{.effect}{\"\\n\"}{end}')",
        "  while read -r taint; do",
        '    [ -n "$taint" ] || continue',
        '    key=${taint%%=*}; effect=${taint##*:}',
        '    case "$effect" in NoSchedule|NoExecute) ;; *) continue ;; esac',
        f'    case "$key" in {tolerated}) ok "node $node: taint $taint is tolerated" ;;',
        '      *) fail "node $node: taint $taint keeps the pods off: add a toleration for $key to the pod specs in k8s/, or remove the taint" ;;',
        "    esac",
        '  done <<< "$taints"',
        "done",
        "",
        '[ "$failed" = 0 ] && echo "preflight passed" || echo "preflight failed: fix the lines above, then kubectl apply"',
        'exit "$failed"',
        "",
    ]
    return "\n".join(lines)
