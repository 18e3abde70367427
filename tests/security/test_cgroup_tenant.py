"""Tenant identity from what a user cannot choose: cgroups (issue 21).

Before: any cgroup path with ``kubepods...pod<uuid>`` anywhere in it was taken
as that Kubernetes pod, and a process in it got the pod's tenant. systemd
delegates ``user@<uid>.service`` to its user, who may create cgroups there
with any name, ``kubepods-pod<uuid>.slice`` included, and move her own
processes in: she then asked casfsd for caches as someone else's pod. Now a
pod's cgroup counts only where the container runtime made it (reached from the
hierarchy's root through the runtime's own components); such a process is
placed by its uid, ``u<uid>``, as any other process of that user.

Each break case here failed before the change (``pod_uid`` named the pod, and
``resolve`` gave the pod's domain or refused "pod ... has no casfs tenant").
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from casfs.errors import UsageError
from casfs.tenants import Credentials, Domain, TenantPolicy, pod_uid

POD = "0f5d3c1e-8a2b-4c6d-9e0f-1a2b3c4d5e6f"
U = POD.replace("-", "_")

# What the container runtimes make (kubelet's systemd and cgroupfs drivers, kind's
# nested kubelet, and the same seen from casfsd in a cgroup namespace of its own).
RUNTIME = [
    f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{U}.slice"
    "/cri-containerd-0123abcd.scope",
    f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{U}.slice"
    "/cri-containerd-0123abcd.scope",
    f"/kubepods.slice/kubepods-pod{U}.slice/crio-0123abcd.scope",  # guaranteed QoS
    f"/kubepods/besteffort/pod{POD}/0123456789abcdef",
    f"/kubepods/burstable/pod{POD}/0123456789abcdef",
    f"/kubepods/pod{POD}/0123456789abcdef",
    f"/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice"
    f"/kubelet-kubepods-besteffort-pod{U}.slice/cri-containerd-1.scope",
    f"/../../../kubepods-besteffort.slice/kubepods-besteffort-pod{U}.slice/c.scope",
    f"/kubepods/besteffort/pod{POD}",  # the pod's own cgroup (its pause process)
]

# What a user may create herself: her delegated subtree, named as she likes.
USER_MADE = [
    f"/user.slice/user-1000.slice/user@1000.service/kubepods-pod{U}.slice",
    f"/user.slice/user-1000.slice/user@1000.service/kubepods-pod{U}.slice/job.scope",
    f"/user.slice/user-1000.slice/user@1000.service/kubepods.slice/kubepods-besteffort.slice"
    f"/kubepods-besteffort-pod{U}.slice/cri-containerd-1.scope",
    f"/user.slice/user-1000.slice/user@1000.service/app.slice/kubepods/besteffort/pod{POD}/x",
    f"/user.slice/user-1000.slice/user@1000.service/user.slice/kubepods-burstable-pod{U}.slice",
    f"/../../user.slice/user-1000.slice/user@1000.service/kubepods-pod{U}.slice",
    # a system service that delegates its subtree to its own user (Delegate=yes)
    f"/system.slice/some-runner.service/kubepods-pod{U}.slice",
    f"/user.slice/user-1000.slice/session-4.scope/kubepods-pod{U}.slice",
    f"/kubepods-pod{U}.slice.evil/x",  # not the runtime's name
]


@pytest.mark.parametrize("cgroup", RUNTIME)
def test_the_runtimes_pod_cgroups_name_their_pod(cgroup: str) -> None:
    assert pod_uid(cgroup) == POD


@pytest.mark.parametrize("cgroup", USER_MADE)
def test_a_cgroup_a_user_made_is_no_pod(cgroup: str) -> None:
    assert pod_uid(cgroup) is None


def test_nothing_else_is_a_pod() -> None:
    for cg in ("", "/", "/user.slice/user-1000.slice", "/system.slice/casfsd.service",
               "/kubepods.slice", "/kubepods/besteffort", f"/pod{POD}x/y"):
        assert pod_uid(cg) is None, cg


def creds(uid: int, cgroup: str) -> Credentials:
    return Credentials(uid, uid, frozenset({uid}), cgroup)


def test_a_process_in_its_users_delegated_subtree_is_that_user(tmp_path: Path) -> None:
    """The break: the victim's pod is labelled (pod_tenants) for domain "ml"; a user
    who names a cgroup of her own after that pod gets u<uid>, never "ml"."""
    labels = tmp_path / "pods.json"
    labels.write_text(json.dumps({POD: "ml"}))
    p = TenantPolicy(domains=(Domain("ml", cgroups=(f"*pod{U}*", f"*pod{POD}*")),),
                     pod_tenants=labels)
    for cg in RUNTIME:
        assert p.resolve(creds(0, cg)).id == "ml", cg  # the real pod keeps its tenant
        assert p.resolve(creds(1000, cg)).id == "ml", cg  # whatever uid the image runs as
    for cg in USER_MADE:
        t = p.resolve(creds(1000, cg))
        assert (t.id, t.uid) == ("u1000", 1000), cg


def test_an_unlabelled_lookalike_is_not_refused_as_a_pod() -> None:
    """Before: a user-made "pod" cgroup with no label made casfs refuse her ("pod ...
    has no casfs tenant"); now she is served as herself."""
    p = TenantPolicy()
    with pytest.raises(UsageError, match="has no casfs tenant"):
        p.resolve(creds(0, RUNTIME[0]))
    assert p.resolve(creds(1000, USER_MADE[0])).id == "u1000"
