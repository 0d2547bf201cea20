"""A small client of the distribution (OCI registry) HTTP API: what the checkpoint images'
push confirmation and retention need (manifest digests, tag lists, deletes by digest).

Credentials come from a containers/docker auth file (`{"auths": {"host": {"auth": ...}}}`,
as a `kubernetes.io/dockerconfigjson` Secret mounts it). A registry that answers 401 is
answered with basic auth or, for a `Bearer` challenge, with a token fetched from its realm
with basic auth (distribution's token flow). Credentials never reach a log line or an
exception's text.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Mapping
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

MANIFEST_TYPES = (
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
)
ACCEPT = ", ".join(MANIFEST_TYPES)


class RegistryError(Exception):
    """A registry that could not be reached or refused a request. `str()` is one line and
    carries no credentials."""


class AuthFileError(RegistryError):
    """An auth file that cannot be read or holds no usable entry (its contents are never
    quoted)."""


@dataclass(frozen=True, repr=False)
class Credentials:
    """A user and password from an auth file; its repr shows neither."""

    username: str
    password: str = field(repr=False)

    def __repr__(self) -> str:
        return "Credentials(<hidden>)"

    def basic(self) -> str:
        pair = f"{self.username}:{self.password}".encode()
        return "Basic " + base64.b64encode(pair).decode("ascii")


def _auth_key(key: str) -> str:
    """An auth file's key as `host[/path]`: without scheme, `/v1/` or `/v2/`, or a trailing /."""
    key = re.sub(r"^[a-z]+://", "", key.strip())
    key = re.sub(r"/v[12]/?$", "", key)
    return key.rstrip("/")


def credentials_for(authfile: Path, host: str, repository: str = "") -> Credentials | None:
    """The entry of `authfile` for `host/repository`: the longest key that is the host or a
    path prefix of it (containers-auth.json(5)); None when no key matches."""
    try:
        data = json.loads(authfile.read_text())
    except OSError as exc:
        raise AuthFileError(f"auth file {authfile}: {exc.strerror or 'unreadable'}") from None
    except (ValueError, UnicodeDecodeError):
        raise AuthFileError(f"auth file {authfile} is not JSON") from None
    auths = data.get("auths") if isinstance(data, dict) else None
    if not isinstance(auths, dict):
        raise AuthFileError(f"auth file {authfile} has no `auths` mapping")
    wanted = f"{host}/{repository}".rstrip("/")
    best: tuple[int, Any] | None = None
    for raw_key, entry in auths.items():
        key = _auth_key(str(raw_key))
        if (wanted == key or wanted.startswith(key + "/")) and (best is None or len(key) > best[0]):
            best = (len(key), entry)
    if best is None:
        return None
    entry = best[1]
    if not isinstance(entry, dict):
        raise AuthFileError(f"auth file {authfile}: the entry for {host} is not a mapping")
    if entry.get("username") and entry.get("password"):
        return Credentials(str(entry["username"]), str(entry["password"]))
    try:
        user, sep, password = base64.b64decode(str(entry.get("auth", ""))).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        raise AuthFileError(f"auth file {authfile}: the entry for {host} is not base64") from None
    if not sep or not user:
        raise AuthFileError(f"auth file {authfile}: the entry for {host} has no user:password")
    return Credentials(user, password)


_CHALLENGE_PARAM = re.compile(r'(\w+)=(?:"([^"]*)"|([^,\s]*))')


def parse_challenge(header: str) -> tuple[str, dict[str, str]]:
    """`WWW-Authenticate: Bearer realm="...",service="...",scope="..."` as ("bearer", params)."""
    scheme, _, rest = header.strip().partition(" ")
    params = {
        m.group(1).lower(): m.group(2) or m.group(3) or "" for m in _CHALLENGE_PARAM.finditer(rest)
    }
    return scheme.lower(), params


def split_reference(ref: str) -> tuple[str, str, str]:
    """`host[:port]/repo/name:tag` (or `@digest`) as (host, repository, tag or digest)."""
    ref = ref.removeprefix("docker://")
    host, slash, rest = ref.partition("/")
    if not slash or not rest:
        raise ValueError(f"not an image reference with a registry host: {ref!r}")
    if "@" in rest:
        repository, _, tag = rest.partition("@")
    else:
        repository, colon, tag = rest.rpartition(":")
        if not colon or "/" in tag:
            raise ValueError(f"image reference without a tag: {ref!r}")
    return host, repository, tag


def _next_link(header: str | None) -> str | None:
    """The `rel="next"` target of a tags list's `Link` header."""
    if not header:
        return None
    m = re.search(r'<([^>]+)>\s*;\s*rel="?next"?', header)
    return m.group(1) if m else None


class Registry:
    """One registry host. `insecure`: HTTPS without verification, or plain HTTP where the
    registry speaks no TLS (as `buildah --tls-verify=false`).

    Use as `async with contextlib.aclosing(Registry(...)) as registry:`; tokens are cached per scope for the
    client's life.
    """

    def __init__(
        self,
        host: str,
        *,
        insecure: bool = False,
        authfile: Path | None = None,
        timeout: float = 30.0,
    ) -> None:
        self.host = host
        self.insecure = insecure
        self.authfile = authfile
        self._client = httpx.AsyncClient(
            verify=not insecure, timeout=timeout, follow_redirects=True
        )
        self._scheme = "https"
        self._probed = not insecure  # an insecure registry may be plain HTTP: found out once
        self._auth: dict[str, str] = {}  # scope -> Authorization header

    async def aclose(self) -> None:
        await self._client.aclose()

    def url(self, path: str) -> str:
        return f"{self._scheme}://{self.host}{path}"

    async def request(
        self,
        method: str,
        path: str,
        *,
        repository: str = "",
        actions: str = "pull",
        headers: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        """One request, answering a 401 challenge (basic, or a bearer token for the scope
        `repository:<repository>:<actions>`) once."""
        scope = f"repository:{repository}:{actions}" if repository else ""
        sent = dict(headers or {})
        if scope in self._auth:
            sent["Authorization"] = self._auth[scope]
        response = await self._send(method, path, sent)
        if response.status_code != 401 or "Authorization" in sent:
            return response
        authorization = await self._answer(response, repository, scope)
        if authorization is None:
            return response
        self._auth[scope] = sent["Authorization"] = authorization
        return await self._send(method, path, sent)

    async def _send(self, method: str, path: str, headers: Mapping[str, str]) -> httpx.Response:
        """`path` on this registry (or a full URL, as a `Link` header may give)."""
        if not self._probed:  # as buildah --tls-verify=false: HTTPS unverified, else HTTP
            self._probed = True
            with suppress(httpx.ConnectError):
                return await self._client.request(method, self.url(path), headers=headers)
            self._scheme = "http"
        url = path if path.startswith(("http://", "https://")) else self.url(path)
        try:
            return await self._client.request(method, url, headers=headers)
        except httpx.HTTPError as exc:
            raise RegistryError(
                f"registry {self.host}: {method} {httpx.URL(url).path}: {type(exc).__name__}"
                f"{': ' + str(exc) if str(exc) else ''}"
            ) from None

    async def _answer(self, response: httpx.Response, repository: str, scope: str) -> str | None:
        """The Authorization header that answers a 401, or None without credentials."""
        creds = credentials_for(self.authfile, self.host, repository) if self.authfile else None
        if creds is None:
            return None
        scheme, params = parse_challenge(response.headers.get("WWW-Authenticate", ""))
        if scheme != "bearer":
            return creds.basic()
        realm = params.get("realm")
        if not realm:
            raise RegistryError(f"registry {self.host}: a bearer challenge without a realm")
        query = {k: v for k, v in (("service", params.get("service")),) if v}
        wanted = params.get("scope") or scope
        if wanted:
            query["scope"] = wanted
        try:
            answer = await self._client.get(
                realm, params=query, headers={"Authorization": creds.basic()}
            )
        except httpx.HTTPError as exc:
            raise RegistryError(
                f"registry {self.host}: token service {httpx.URL(realm).host}: {type(exc).__name__}"
            ) from None
        if answer.status_code != 200:
            raise RegistryError(
                f"registry {self.host}: token service answered {answer.status_code}"
            )
        with suppress(ValueError):
            body = answer.json()
            token = (
                body.get("token") or body.get("access_token") if isinstance(body, dict) else None
            )
            if token:
                return f"Bearer {token}"
        raise RegistryError(f"registry {self.host}: token service gave no token")

    def _fail(self, what: str, response: httpx.Response) -> RegistryError:
        detail = ""
        with suppress(ValueError, KeyError, IndexError, TypeError, AttributeError):
            detail = f": {response.json()['errors'][0]['code']}"
        return RegistryError(f"registry {self.host}: {what}: {response.status_code}{detail}")

    async def ping(self) -> bool:
        """True once `GET /v2/` answers (200, or 401 asking for credentials)."""
        response = await self._send("GET", "/v2/", {})
        return response.status_code in (200, 401)

    async def _manifest(
        self, method: str, repository: str, reference: str
    ) -> httpx.Response | None:
        """`method` on the manifest of `repository:reference`; None when there is none."""
        response = await self.request(
            method,
            f"/v2/{repository}/manifests/{reference}",
            repository=repository,
            headers={"Accept": ACCEPT},
        )
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            raise self._fail(f"{method} manifest {repository}:{reference}", response)
        return response

    async def digest(self, repository: str, reference: str) -> str | None:
        """The manifest digest a tag (or digest) resolves to (`Docker-Content-Digest` of a
        HEAD); None when there is no such manifest."""
        response = await self._manifest("HEAD", repository, reference)
        if response is None:
            return None
        held = response.headers.get("Docker-Content-Digest")
        return str(held) if held else None

    async def manifest(self, repository: str, reference: str) -> dict[str, Any] | None:
        """The manifest (OCI or docker v2) as JSON; None when there is none."""
        response = await self._manifest("GET", repository, reference)
        if response is None:
            return None
        body = response.json()
        if not isinstance(body, dict):
            raise RegistryError(
                f"registry {self.host}: the manifest of {repository} is not an object"
            )
        return body

    async def blob(self, repository: str, digest: str) -> bytes:
        response = await self.request(
            "GET", f"/v2/{repository}/blobs/{digest}", repository=repository
        )
        if response.status_code != 200:
            raise self._fail(f"GET blob {repository}@{digest}", response)
        return response.content

    async def tags(self, repository: str) -> list[str]:
        """Every tag of `repository` (following `Link` pages); [] for an unknown repository."""
        found: list[str] = []
        path: str | None = f"/v2/{repository}/tags/list"
        while path:
            response = await self.request("GET", path, repository=repository)
            if response.status_code == 404:
                return found
            if response.status_code != 200:
                raise self._fail(f"GET tags of {repository}", response)
            body = response.json()
            found.extend((body.get("tags") or []) if isinstance(body, dict) else [])
            path = _next_link(response.headers.get("Link"))
        return found

    async def delete(self, repository: str, digest: str) -> bool:
        """Delete the manifest `digest` (and so every tag on it); False when it was gone
        already. A registry without deletes (distribution's `storage.delete.enabled`)
        answers 405: `RegistryError`."""
        response = await self.request(
            "DELETE",
            f"/v2/{repository}/manifests/{digest}",
            repository=repository,
            actions="delete",
        )
        if response.status_code in (200, 202):
            return True
        if response.status_code == 404:
            return False
        if response.status_code == 405:
            raise RegistryError(
                f"registry {self.host}: deletes are disabled (distribution: storage.delete.enabled)"
            )
        raise self._fail(f"DELETE {repository}@{digest}", response)
