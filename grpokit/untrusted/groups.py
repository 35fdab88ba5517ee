"""A caged worker's cgroups: made by its keeper (keeper.py) as it starts, one per hierarchy the cage made one in, and
removed by the zygote (cage.py) once that keeper is gone, or by the trainer for a cage killed before it could.
Only groups of grpokit's names (`w<keeper pid>`, the cage's own) are removed, and only once the kernel counts no
process in them.
"""

from __future__ import annotations

import os
import re
import time

from grpokit.untrusted import child as layers


def group_name(keeper: int) -> str:
    """The name of a worker's cgroup, under the cage's: its keeper's pid (the zygote removes it once that is gone)."""
    return f"w{keeper}"


def make_groups(cage_groups: list, limits: dict, me: int) -> list:
    """The worker's cgroups, one per hierarchy the cage made one in: `[(folder, name)]` for the runner to join."""
    if not cage_groups:
        return []
    with open("/proc/self/statm") as f:
        resident = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")  # the warm worker, as forked
    values = {"memory": resident + ((limits["memory_mb"] + limits["file_mb"]) << 20), "pids": limits["processes"] + 1}
    made, name = [], group_name(me)
    try:
        for folder, version, controllers in cage_groups:
            _remove_group(folder, name)  # a leftover of an earlier keeper with this pid
            os.mkdir(name, dir_fd=folder)
            made.append((folder, name))
            layers._cgroup_limit(folder, name, version, controllers, values)
    except OSError:  # no half a layer: the worker runs without cgroups, and its layers say so
        for folder, made_name in made:
            _remove_group(folder, made_name)
        return []
    return made


def _remove_group(folder: int, name: str) -> bool:
    """Kill what is left in a worker's cgroup and remove it; False while the kernel still counts a process there."""
    try:
        os.rmdir(name, dir_fd=folder)
        return True
    except FileNotFoundError:
        return True
    except OSError:
        layers._kill_members(folder, name)
        return False


def sweep(cage_groups: list, keepers: set) -> bool:
    """Remove the cgroups of workers whose keeper is gone (the zygote calls this as it reaps); whether all went."""
    live, done = {group_name(pid) for pid in keepers}, True
    for folder, _, _ in cage_groups:
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for name in names:
            if re.fullmatch(r"w\d+", name) and name not in live:
                done = _remove_group(folder, name) and done
    return done


def remove_cage_group(name: str) -> None:
    """Remove the cage's cgroup `name` and its workers' (from the trainer's side: for a cage killed before it could).
    Only that name, and only empty groups (the kernel refuses the rest); a little wait for a dying worker's last
    processes to leave."""
    try:
        places = layers._cgroup_places()
    except (OSError, ValueError):
        return
    for parent, _, _ in places:
        try:
            folder = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            inside = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=folder)
        except OSError:
            os.close(folder)
            continue
        drop_cage_group(folder, name, inside, tries=50)


def drop_cage_group(folder: int, name: str, inside: int, tries: int = 100) -> None:
    """Remove a cage's cgroup (`name` in `folder`, open as `inside`) once its workers' groups are gone, waiting a
    little for a dying worker's last processes to leave; closes both descriptors."""
    for _ in range(tries):
        if sweep([(inside, None, None)], set()):
            break
        time.sleep(0.01)
    os.close(inside)
    try:
        os.rmdir(name, dir_fd=folder)
    except OSError:
        pass
    os.close(folder)
