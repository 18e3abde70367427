"""What casfs's own processes inherit (casfs.util.child): an allow-list, paths absolute."""

from __future__ import annotations

import os
import sys

from casfs.util.child import CHILD_CWD, child_env, python_module


def test_only_the_allow_list_passes_and_paths_become_absolute() -> None:
    parent = {"PATH": "/usr/bin", "HOME": "/home/u", "CASFS_STATE_DIR": "state",
              "CASFS_ROOT": "s3://bucket/p", "AWS_PROFILE": "x", "LC_ALL": "C",
              "PYTHONPATH": "/opt/casfs", "LD_PRELOAD": "/tmp/evil.so",
              "PYTHONSTARTUP": "/tmp/evil.py", "PYTHONINSPECT": "1", "PYTHONHOME": "/tmp",
              "TRITON_CACHE_DIR": "/x"}
    env = child_env(parent)
    assert set(env) == {"PATH", "HOME", "CASFS_STATE_DIR", "CASFS_ROOT", "AWS_PROFILE",
                        "LC_ALL", "PYTHONPATH"}
    assert env["CASFS_STATE_DIR"] == os.path.join(os.getcwd(), "state")  # the caller's ./state
    assert env["CASFS_ROOT"] == "s3://bucket/p"  # a URL stays as it is


def test_children_start_without_the_cwd_on_sys_path() -> None:
    argv = python_module("casfs.node.worker")
    assert argv[:3] == [sys.executable, "-P", "-m"] and CHILD_CWD == "/"
