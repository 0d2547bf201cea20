"""A real registry (Debian's docker-registry) and buildah for the checkpoint image tests:
fixtures that skip, with the reason, where either is missing or buildah cannot run here."""

from __future__ import annotations

import base64
import ctypes
import ctypes.util
import io
import json
import secrets
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest
import pytest_asyncio

from launch.registry import RegistryUnavailable, run_registry
from services.maintenance.image import CHECKPOINT_DIR, ImageSettings, node_path, remove_tree


def buildah_unusable(binary: str = "buildah") -> str | None:
    """Why buildah cannot build an image here (missing, or `from scratch` fails for this user:
    no user namespaces for a non-root user); None when it can."""
    if shutil.which(binary) is None:
        return "buildah not found (Debian package buildah; scripts/system-deps.sh)"
    with tempfile.TemporaryDirectory(
        prefix="nodeward-buildah-probe-", ignore_cleanup_errors=True
    ) as root:
        base = [binary, "--root", f"{root}/root", "--runroot", f"{root}/run"]
        base += ["--storage-driver", "vfs"]
        made = subprocess.run(
            [*base, "from", "--name", "probe", "scratch"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if made.returncode == 0:  # and add a root-owned tar, as the kubelet's archives are
            tar_path = Path(root) / "probe.tar"
            with tarfile.open(tar_path, "w") as tar:
                tar.addfile(tarfile.TarInfo("config.dump"), io.BytesIO())
            made = subprocess.run(
                [*base, "add", "probe", str(tar_path), "/"],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            subprocess.run([*base, "rm", "probe"], capture_output=True, timeout=60, check=False)
        remove_tree(Path(root))
        if made.returncode != 0:
            lines = [ln for ln in made.stderr.splitlines() if ln.strip()]
            return f"buildah cannot run here: {lines[-1] if lines else made.returncode}"
    return None


def htpasswd_line(user: str, password: str) -> str | None:
    """`user:<bcrypt>` for distribution's htpasswd auth: from the `bcrypt` package, Apache's
    `htpasswd`, or libcrypt's bcrypt (libxcrypt); None when none is here."""
    try:
        import bcrypt  # type: ignore[import-not-found, unused-ignore]

        hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=5)).decode()
        return f"{user}:{hashed}"
    except ImportError:
        pass
    tool = shutil.which("htpasswd")
    if tool:
        out = subprocess.run(
            [tool, "-nbB", user, password], capture_output=True, text=True, check=False
        )
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
    name = ctypes.util.find_library("crypt")
    if name is None:
        return None
    lib = ctypes.CDLL(name)
    if not hasattr(lib, "crypt_gensalt"):
        return None
    lib.crypt_gensalt.restype = ctypes.c_char_p
    lib.crypt.restype = ctypes.c_char_p
    salt = lib.crypt_gensalt(b"$2b$", 5, None, 0)
    hashed = lib.crypt(password.encode(), salt) if salt else None
    return f"{user}:{hashed.decode()}" if hashed and hashed.startswith(b"$2b$") else None


def write_authfile(path: Path, host: str, user: str, password: str) -> Path:
    """A containers/docker auth file with one entry, as a dockerconfigjson Secret holds it."""
    auth = base64.b64encode(f"{user}:{password}".encode()).decode()
    path.write_text(json.dumps({"auths": {host: {"auth": auth}}}))
    path.chmod(0o600)
    return path


def checkpoint_archive(
    node_root: Path, pod: str, namespace: str, container: str, at: datetime
) -> tuple[Path, str]:
    """A small archive with CRI-O's layout (config.dump, spec.dump, checkpoint/, rootfs-diff.tar)
    where the kubelet writes it under `node_root`: (its path here, its path on the node)."""
    stamp = at.strftime("%Y-%m-%dT%H:%M:%SZ")
    on_node = f"{CHECKPOINT_DIR}/checkpoint-{pod}_{namespace}-{container}-{stamp}.tar"
    here = node_path(str(node_root), "", on_node)
    here.parent.mkdir(parents=True, exist_ok=True)
    config = {"id": secrets.token_hex(32), "name": container, "rootfsImageName": "busybox"}
    config["checkpointedTime"] = at.isoformat()
    files = {
        "config.dump": json.dumps(config).encode(),
        "spec.dump": json.dumps({"annotations": {"io.kubernetes.pod.name": pod}}).encode(),
        "status.dump": b"{}",
        "checkpoint/inventory.img": secrets.token_bytes(64),
        "checkpoint/pages-1.img": secrets.token_bytes(512),
        "rootfs-diff.tar": b"",
    }
    with tarfile.open(here, "w") as tar:
        directory = tarfile.TarInfo("checkpoint")
        directory.type, directory.mode = tarfile.DIRTYPE, 0o700
        tar.addfile(directory)
        for name, data in files.items():
            info = tarfile.TarInfo(name)  # owned by root, as the kubelet's are
            info.size, info.mode = len(data), 0o600
            tar.addfile(info, io.BytesIO(data))
    return here, on_node


@dataclass
class LocalRegistry:
    """A running registry and settings that push to it (a temporary buildah storage each)."""

    address: str
    settings: ImageSettings
    state: Path
    login: tuple[str, str] | None = None
    """user and password, behind htpasswd auth"""


def _needs_tools() -> None:
    reason = buildah_unusable()
    if reason is not None:
        pytest.skip(reason)


@pytest_asyncio.fixture
async def registry(tmp_path: Path) -> AsyncIterator[LocalRegistry]:
    """docker-registry on a random loopback port, storage in tmp_path; buildah usable."""
    _needs_tools()
    try:
        async with run_registry(tmp_path / "registry") as address:
            settings = ImageSettings(registry=f"{address}/ckpt", insecure=True, retries=0)
            yield LocalRegistry(address, settings, tmp_path / "registry")
    except RegistryUnavailable as exc:
        pytest.skip(str(exc))


@pytest_asyncio.fixture
async def auth_registry(tmp_path: Path) -> AsyncIterator[LocalRegistry]:
    """As `registry`, behind htpasswd auth; its settings carry an auth file for the user."""
    _needs_tools()
    user, password = "pusher", secrets.token_urlsafe(12)
    line = htpasswd_line(user, password)
    if line is None:
        pytest.skip("no bcrypt: neither the bcrypt package, htpasswd, nor libcrypt's bcrypt")
    state = tmp_path / "auth-registry"
    state.mkdir()
    htpasswd = state / "htpasswd"
    htpasswd.write_text(line + "\n")
    try:
        async with run_registry(state, htpasswd=htpasswd) as address:
            authfile = write_authfile(state / "auth.json", address, user, password)
            settings = ImageSettings(
                registry=f"{address}/ckpt", insecure=True, retries=0, authfile=authfile
            )
            yield LocalRegistry(address, settings, state, (user, password))
    except RegistryUnavailable as exc:
        pytest.skip(str(exc))
