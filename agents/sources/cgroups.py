"""Pods' CPU time from the node's cgroup v2 tree.

A pod's CPU time is `usage_usec` of `cpu.stat` in its cgroup directory, found by the
pod's UID under `kubepods.slice` (systemd driver: `kubepods-<qos>-pod<uid_with_underscores>.slice`;
cgroupfs driver: `kubepods/<qos>/pod<uid>`). The energy agent shares CPU energy by it; the
idleness agent reads it as a session's CPU activity.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from pathlib import Path

_KUBEPODS = ("kubepods.slice", "kubepods")


def _uid_of(dirname: str) -> str | None:
    """The pod UID in a pod cgroup's directory name, or None if it is not a pod's."""
    name = dirname.removesuffix(".slice")
    at = name.rfind("pod")
    if at < 0 or (at > 0 and name[at - 1] != "-"):
        return None
    uid = name[at + 3 :].replace("_", "-")
    return uid if len(uid) == 36 and uid.count("-") == 4 else None


def _usage_usec(directory: Path) -> int | None:
    try:
        text = (directory / "cpu.stat").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "usage_usec":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def read_cpu_usage(cgroup_root: Path) -> tuple[int | None, dict[str, int]]:
    """(the node's CPU µs, each pod UID's CPU µs) from a cgroup v2 tree."""
    node = _usage_usec(cgroup_root)
    pods: dict[str, int] = {}
    for top in _KUBEPODS:
        base = cgroup_root / top
        if not base.is_dir():
            continue
        if node is None:
            node = _usage_usec(base)
        for dirpath, dirnames, _ in os.walk(base):
            for d in list(dirnames):
                uid = _uid_of(d)
                if uid is None:
                    continue
                dirnames.remove(d)  # a pod's own children are its containers: not walked
                usage = _usage_usec(Path(dirpath) / d)
                if usage is not None:
                    pods[uid] = usage
    return node, pods


class CgroupCpu:
    """Each pod's CPU time from the cgroup tree at `root` (a `CpuUsage`), and the node's
    with it (`cpu_usec`, the energy agent's `CpuTime`).

    The walk blocks on the filesystem, so it runs in a worker thread.
    """

    def __init__(self, root: Path = Path("/sys/fs/cgroup")) -> None:
        self.root = root

    async def usage_usec(self) -> Mapping[str, int]:
        _, pods = await asyncio.to_thread(read_cpu_usage, self.root)
        return pods

    async def cpu_usec(self) -> tuple[int | None, Mapping[str, int]]:
        """(the node's CPU µs, each pod UID's CPU µs), as `read_cpu_usage`."""
        return await asyncio.to_thread(read_cpu_usage, self.root)
