"""A pod's Secret volumes, subPath binds and environment, as its node's kubelet sets them up.

Ported from the kubelet (`pkg/volume/secret/secret.go` `SetUpAt` and `MakePayload`,
`pkg/volume/projected/projected.go` `collectData`, `pkg/volume/util/atomic_writer.go`,
`pkg/kubelet/kubelet_pods.go` `makeMounts` and `makeEnvironmentVariables`,
`pkg/volume/util/subpath/subpath_linux.go`). A node's filesystem is `<root>/<node>/`; a pod's
directory is `<root>/<node>/var/lib/kubelet/pods/<pod uid>/`, and a volume's
`volumes/<plugin>/<volume>` in it (`kubernetes.io~secret`, `kubernetes.io~projected`).

A volume is written as the AtomicWriter writes it: the files in a hidden timestamped directory
(`..2026_01_02_03_04_05.123456789/`, mode 0755), a `..data` symlink to it, and one visible
symlink per top-level path (`key -> ..data/key`). A new payload goes to a new timestamped
directory and `..data` is swapped to it with a rename (`..data_tmp` renamed over it), so a
reader sees the old files or the new ones, never a mix; an unchanged payload writes nothing.

A `subPath` mount is a bind mount of the path taken when the container started, at
`<pod dir>/volume-subpaths/<volume>/<container>/<index of the mount>`: here a copy, never
updated, as a bind keeps the old file once `..data` moves on. Environment variables are
resolved once, when the container is created; a real kubelet keeps them in the process only
(`/proc/<pid>/environ`), the sim writes them to `<pod dir>/containers/<container>/env` in that
form (`NAME=value` entries, each ended by a NUL byte) so that tests can read them.
"""

from __future__ import annotations

import base64
import binascii
import os
import random
import shutil
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sim.cluster.checkpoints import local_path

Obj = dict[str, Any]
SecretLookup = Callable[[str], Obj | None]
"""A Secret of the pod's namespace by name; None if there is none."""

DATA_DIR = "..data"
NEW_DATA_DIR = "..data_tmp"
DEFAULT_MODE = 0o644  # `SecretVolumeSourceDefaultMode`, `ProjectedVolumeSourceDefaultMode`
PLUGIN_DIRS = {
    "secret": "kubernetes.io~secret",
    "projected": "kubernetes.io~projected",
    "configMap": "kubernetes.io~configmap",
    "emptyDir": "kubernetes.io~empty-dir",
    "downwardAPI": "kubernetes.io~downward-api",
}
"""A volume source's directory under `<pod dir>/volumes/` (`utilstrings.EscapeQualifiedName`
of the plugin's name)."""
SUBPATHS_DIR = "volume-subpaths"  # `containerSubPathDirectoryName`


@dataclass(frozen=True)
class Projection:
    """One file of a volume's payload: its bytes and mode (`volumeutil.FileProjection`)."""

    data: bytes
    mode: int


class MountError(Exception):
    """A volume cannot be set up; `str()` is the kubelet's event message,
    `MountVolume.SetUp failed for volume "X" : <cause>`."""

    def __init__(self, volume: str, cause: str) -> None:
        super().__init__(f"MountVolume.SetUp failed for volume {_quote(volume)} : {cause}")
        self.volume = volume
        self.cause = cause


class EnvError(Exception):
    """A container's environment cannot be resolved (`CreateContainerConfigError`)."""

    def __init__(self, container: str, message: str) -> None:
        super().__init__(message)
        self.container = container
        self.message = message


# --- where things are ---------------------------------------------------------------------


def pod_dir(root: Path, node: str, uid: str) -> Path:
    """The pod's directory on its node (`/var/lib/kubelet/pods/<uid>`)."""
    return local_path(root, node, f"/var/lib/kubelet/pods/{uid}")


def volume_path(root: Path, node: str, uid: str, volume: str, plugin: str = "secret") -> Path:
    """Where the pod's volume `volume` of source kind `plugin` (`secret`, `projected`, ...)
    is set up on its node."""
    return pod_dir(root, node, uid) / "volumes" / PLUGIN_DIRS.get(plugin, plugin) / volume


def subpath_target(
    root: Path, node: str, uid: str, volume: str, *, container: str, index: int
) -> Path:
    """Where the kubelet binds the `index`th volume mount of `container`, a subPath mount
    (`getSubpathBindTarget`)."""
    return pod_dir(root, node, uid) / SUBPATHS_DIR / volume / container / str(index)


def env_file(root: Path, node: str, uid: str, container: str) -> Path:
    """The sim's record of `container`'s environment (a real kubelet writes none)."""
    return pod_dir(root, node, uid) / "containers" / container / "env"


def _containers(pod: Obj) -> list[Obj]:
    spec = pod.get("spec") or {}
    return [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]


def _plugin(volume: Obj) -> str:
    return next((k for k in PLUGIN_DIRS if volume.get(k) is not None), "")


def mount_source(root: Path, pod: Obj, container: str, path: str) -> Path:
    """The file or directory on the node (under `root`) that `container` of `pod` sees at
    `path`: the volume mount covering `path` (the longest `mountPath` that is it or above
    it) resolved to the volume's directory, or to its subPath bind for a `subPath` mount,
    then the rest of `path` below it. KeyError if the pod has no such container, ValueError
    if no volume is mounted there or the pod is bound to no node."""
    spec = pod.get("spec") or {}
    node = spec.get("nodeName")
    if not node:
        raise ValueError(f"pod {pod['metadata'].get('name')} is bound to no node")
    found = next((c for c in _containers(pod) if c.get("name") == container), None)
    if found is None:
        raise KeyError(f"pod {pod['metadata'].get('name')} has no container {container}")
    best: tuple[int, Obj, str] | None = None
    for i, mount in enumerate(found.get("volumeMounts") or []):
        at = str(mount.get("mountPath") or "").rstrip("/") or "/"
        if (path == at or path.startswith(at.rstrip("/") + "/")) and (
            best is None or len(at) > len(best[2])
        ):
            best = (i, mount, at)
    if best is None:
        raise ValueError(f"container {container} has no volume mounted at {path}")
    index, mount, at = best
    uid = pod["metadata"]["uid"]
    name = str(mount.get("name"))
    if mount.get("subPath"):
        base = subpath_target(root, node, uid, name, container=container, index=index)
    else:
        volume: Obj = next((v for v in spec.get("volumes") or [] if v.get("name") == name), {})
        base = volume_path(root, node, uid, name, _plugin(volume))
    rest = path[len(at) :].lstrip("/")
    return base / rest if rest else base


def read_env(root: Path, pod: Obj, container: str) -> dict[str, str]:
    """`container`'s environment as the sim's kubelet recorded it at container start."""
    uid, node = pod["metadata"]["uid"], pod["spec"]["nodeName"]
    raw = env_file(root, node, uid, container).read_bytes()
    return dict(entry.split("=", 1) for entry in raw.decode().split("\0") if entry)


# --- payloads -------------------------------------------------------------------------------


def uses_secret(pod: Obj, name: str) -> bool:
    """Whether the pod's volumes or its containers' env name Secret `name`."""
    return name in _volume_secrets(pod) or name in _env_secrets(pod)


def _volume_secrets(pod: Obj) -> set[str]:
    names: set[str] = set()
    for volume in (pod.get("spec") or {}).get("volumes") or []:
        if volume.get("secret") is not None:
            names.add(str(volume["secret"].get("secretName") or ""))
        for source in (volume.get("projected") or {}).get("sources") or []:
            if source.get("secret") is not None:
                names.add(str(source["secret"].get("name") or ""))
    return names


def _env_secrets(pod: Obj) -> set[str]:
    names: set[str] = set()
    for c in _containers(pod):
        for ref in c.get("envFrom") or []:
            if ref.get("secretRef") is not None:
                names.add(str(ref["secretRef"].get("name") or ""))
        for var in c.get("env") or []:
            ref = (var.get("valueFrom") or {}).get("secretKeyRef")
            if ref is not None:
                names.add(str(ref.get("name") or ""))
    return names


def _data(secret: Obj) -> dict[str, bytes]:
    out = {}
    for key, value in (secret.get("data") or {}).items():
        try:
            out[key] = base64.b64decode(value or "")
        except (binascii.Error, ValueError):
            out[key] = b""
    return out


def _not_found(name: str) -> str:
    # the secret manager's NotFound names the resource in the singular (`corev1.Resource("secret")`)
    return f"secret {_quote(name)} not found"


def make_payload(
    items: list[Obj] | None, data: dict[str, bytes], default_mode: int, optional: bool
) -> dict[str, Projection]:
    """`secret.MakePayload`: every key (or the `items` mapped to their paths, with their own
    `mode`); ValueError for an item whose key the Secret lacks, unless optional."""
    if not items:
        return {key: Projection(value, default_mode) for key, value in data.items()}
    payload = {}
    for item in items:
        key = str(item.get("key"))
        if key not in data:
            if optional:
                continue
            raise ValueError(f"references non-existent secret key: {key}")
        mode = item.get("mode")
        payload[str(item.get("path"))] = Projection(
            data[key], int(mode) if mode is not None else default_mode
        )
    return payload


def volume_payload(volume: Obj, secrets: SecretLookup) -> dict[str, Projection] | None:
    """The payload of a `secret` volume or of a `projected` one's secret sources (None for a
    volume with neither). MountError where the kubelet's `SetUpAt` fails: a Secret missing
    and not optional, a key missing from `items`."""
    name = str(volume.get("name"))
    source = volume.get("secret")
    if source is not None:
        optional = bool(source.get("optional"))
        found = secrets(str(source.get("secretName") or ""))
        if found is None and not optional:
            raise MountError(name, _not_found(str(source.get("secretName") or "")))
        mode = source.get("defaultMode")
        try:
            return make_payload(
                source.get("items"),
                _data(found or {}),
                int(mode) if mode is not None else DEFAULT_MODE,
                optional,
            )
        except ValueError as exc:
            raise MountError(name, str(exc)) from None
    projected = volume.get("projected")
    sources = [s["secret"] for s in (projected or {}).get("sources") or [] if s.get("secret")]
    if not sources:
        return None
    mode = (projected or {}).get("defaultMode")
    payload: dict[str, Projection] = {}
    errors = []
    for src in sources:  # `collectData`: the errors of every source, aggregated
        optional = bool(src.get("optional"))
        found = secrets(str(src.get("name") or ""))
        if found is None and not optional:
            errors.append(_not_found(str(src.get("name") or "")))
            continue
        try:
            payload.update(
                make_payload(
                    src.get("items"),
                    _data(found or {}),
                    int(mode) if mode is not None else DEFAULT_MODE,
                    optional,
                )
            )
        except ValueError as exc:
            errors.append(str(exc))
    if errors:  # `utilerrors.NewAggregate`: one error alone, else `[a, b]`
        raise MountError(name, errors[0] if len(errors) == 1 else f"[{', '.join(errors)}]")
    return payload


def set_up_volumes(root: Path | None, pod: Obj, secrets: SecretLookup, only: str = "") -> None:
    """Set up (or refresh) the pod's secret-backed volumes (those naming Secret `only`, if
    given) on its node under `root`, each independently, as the volume manager does; then
    raise the first volume's MountError, if any. With no `root` only the errors are found."""
    spec = pod.get("spec") or {}
    first: MountError | None = None
    for volume in spec.get("volumes") or []:
        if only and only not in _volume_secrets({"spec": {"volumes": [volume]}}):
            continue
        try:
            payload = volume_payload(volume, secrets)
        except MountError as exc:
            first = first or exc
            continue
        if payload is None or root is None:
            continue
        target = volume_path(
            root, spec["nodeName"], pod["metadata"]["uid"], str(volume["name"]), _plugin(volume)
        )
        try:
            atomic_write(target, payload)
        except (OSError, ValueError) as exc:
            first = first or MountError(str(volume["name"]), str(exc))
    if first is not None:
        raise first


# --- the AtomicWriter -------------------------------------------------------------------------


def _check_path(path: str) -> str:
    """`validatePath`: a relative path with no `..` element and not starting with `..`."""
    if not path:
        raise ValueError(f'invalid path: must not be empty: "{path}"')
    if os.path.isabs(path):
        raise ValueError(f"invalid path: must be relative path: {path}")
    items = path.split("/")
    if ".." in items:
        raise ValueError(f"invalid path: must not contain '..': {path}")
    if items[0].startswith("..") and len(items[0]) > 2:
        raise ValueError(f"invalid path: must not start with '..': {path}")
    return os.path.normpath(path)


def _walk(base: Path) -> Iterator[str]:
    for dirpath, dirnames, filenames in os.walk(base):
        for name in [*dirnames, *filenames]:
            yield os.path.relpath(os.path.join(dirpath, name), base)


def atomic_write(target: Path, payload: dict[str, Projection]) -> bool:
    """`AtomicWriter.Write`: project `payload` (path -> file) into `target` (made if
    missing); False if the files there already hold it. ValueError for an invalid path."""
    clean = {_check_path(p): f for p, f in payload.items()}
    target.mkdir(parents=True, exist_ok=True)
    data_dir = target / DATA_DIR
    try:
        old = os.readlink(data_dir)
    except FileNotFoundError:
        old = ""
    old_path = target / old if old else None
    remove: set[str] = set()
    if old_path is not None:
        wanted = {str(parent) for p in clean for parent in [Path(p), *Path(p).parents]} - {"."}
        remove = set(_walk(old_path)) - wanted
        if not remove and not any(_differs(old_path / p, f.data) for p, f in clean.items()):
            return False
    ts_dir = _new_timestamp_dir(target)
    for p, f in clean.items():
        full = ts_dir / p
        full.parent.mkdir(parents=True, exist_ok=True)
        full.write_bytes(f.data)
        os.chmod(full, f.mode)
    for p in clean:
        top = p.split("/", 1)[0]
        if not os.path.lexists(target / top):
            os.symlink(f"{DATA_DIR}/{top}", target / top)
    new_data_dir = target / NEW_DATA_DIR
    if os.path.lexists(new_data_dir):
        os.remove(new_data_dir)
    os.symlink(ts_dir.name, new_data_dir)
    os.replace(new_data_dir, data_dir)  # rename(2): atomic
    for p in remove:
        if "/" not in p and os.path.lexists(target / p):
            os.remove(target / p)
    if old_path is not None:
        shutil.rmtree(old_path, ignore_errors=True)
    return True


def _differs(path: Path, data: bytes) -> bool:
    try:
        return path.read_bytes() != data
    except FileNotFoundError:
        return True


def _new_timestamp_dir(target: Path) -> Path:
    """`newTimestampDir`: `os.MkdirTemp(target, "..2006_01_02_15_04_05.")`, mode 0755."""
    stamp = datetime.now(UTC).strftime("..%Y_%m_%d_%H_%M_%S.")
    while True:
        candidate = target / f"{stamp}{random.randrange(2**32)}"  # noqa: S311 - a name
        try:
            candidate.mkdir(mode=0o700)
        except FileExistsError:
            continue
        os.chmod(candidate, 0o755)  # noqa: S103 - the kubelet's, for the pod's users
        return candidate


# --- containers ---------------------------------------------------------------------------------


def bind_subpaths(root: Path, pod: Obj, container: str) -> None:
    """Take `container`'s subPath mounts as the kubelet binds them when it creates the
    container: a copy of what the volume's path holds now (a missing path is made an empty
    directory, as `SafeMakeDir` does), replacing an earlier one (a restarted container)."""
    spec = pod["spec"]
    uid, node = pod["metadata"]["uid"], spec["nodeName"]
    found = next((c for c in _containers(pod) if c.get("name") == container), {})
    volumes = {str(v.get("name")): v for v in spec.get("volumes") or []}
    for index, mount in enumerate(found.get("volumeMounts") or []):
        sub = str(mount.get("subPath") or "")
        if not sub:
            continue
        name = str(mount.get("name"))
        source = volume_path(root, node, uid, name, _plugin(volumes.get(name, {}))) / sub
        target = subpath_target(root, node, uid, name, container=container, index=index)
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif os.path.lexists(target):
            target.unlink()
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, symlinks=False)
        elif source.exists():
            shutil.copyfile(source, target)
            os.chmod(target, stat.S_IMODE(source.stat().st_mode))
        else:
            target.mkdir()


def container_env(pod: Obj, container: str, secrets: SecretLookup) -> dict[str, str]:
    """`makeEnvironmentVariables` for `container`, as far as Secrets go: `envFrom`
    `secretRef`s (each key, with the `prefix`; keys holding `=` skipped), then `env`'s
    literal `value`s and `secretKeyRef`s, later ones winning. EnvError as the kubelet's:
    `secret "x" not found`, `couldn't find key k in Secret ns/x` (unless optional)."""
    found = next((c for c in _containers(pod) if c.get("name") == container), {})
    namespace = pod["metadata"]["namespace"]
    env: dict[str, str] = {}
    for ref in found.get("envFrom") or []:
        source = ref.get("secretRef")
        if source is None:
            continue  # configMapRef: not resolved by the sim
        name = str(source.get("name") or "")
        secret = secrets(name)
        if secret is None:
            if source.get("optional"):
                continue
            raise EnvError(container, _not_found(name))
        prefix = str(ref.get("prefix") or "")
        for key, value in _data(secret).items():
            if key and "=" not in prefix + key:
                env[prefix + key] = value.decode(errors="replace")
    for var in found.get("env") or []:
        name = str(var.get("name"))
        source = var.get("valueFrom")
        if source is None:
            env[name] = str(var.get("value") or "")
            continue
        ref = source.get("secretKeyRef")
        if ref is None:
            continue  # configMapKeyRef, fieldRef, resourceFieldRef: not resolved by the sim
        secret_name = str(ref.get("name") or "")
        optional = bool(ref.get("optional"))
        secret = secrets(secret_name)
        if secret is None:
            if optional:
                continue
            raise EnvError(container, _not_found(secret_name))
        data = _data(secret)
        key = str(ref.get("key"))
        if key not in data:
            if optional:
                continue
            raise EnvError(
                container, f"couldn't find key {key} in Secret {namespace}/{secret_name}"
            )
        env[name] = data[key].decode(errors="replace")
    return env


def write_env(root: Path, pod: Obj, container: str, env: dict[str, str]) -> None:
    """Record `container`'s environment as `/proc/<pid>/environ` holds it."""
    path = env_file(root, pod["spec"]["nodeName"], pod["metadata"]["uid"], container)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(f"{k}={v}\0".encode() for k, v in env.items()))


def remove_pod(root: Path, node: str, uid: str) -> None:
    """Remove the pod's directory from its node (its volumes torn down, the pod gone)."""
    shutil.rmtree(pod_dir(root, node, uid), ignore_errors=True)


def _quote(text: str) -> str:
    """Go's `%q` of a plain string."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
