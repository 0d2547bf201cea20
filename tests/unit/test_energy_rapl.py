"""RAPL reader on a temp powercap sysfs tree laid out as the kernel lays it out."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

import pytest

from agents.sources.power import SourceError
from agents.sources.rapl import RaplReader, RaplSettings
from schemas.energy import PowerSource
from tests.helpers.timing import median_us

MAX_UJ = 262143328850  # a real package zone's max_energy_range_uj


def make_zone(root: Path, zone: str, name: str, energy_uj: int, max_uj: int = MAX_UJ) -> Path:
    """A zone directory as `/sys/class/powercap` shows it (flat `intel-rapl:N[:M]` entries)."""
    d = root / zone
    d.mkdir(parents=True)
    (d / "name").write_text(f"{name}\n")
    (d / "energy_uj").write_text(f"{energy_uj}\n")
    (d / "max_energy_range_uj").write_text(f"{max_uj}\n")
    (d / "enabled").write_text("1\n")
    return d


def set_energy(zone_dir: Path, energy_uj: int) -> None:
    (zone_dir / "energy_uj").write_text(f"{energy_uj}\n")


@pytest.fixture
def tree(tmp_path: Path) -> dict[str, Path]:
    root = tmp_path / "powercap"
    (root / "intel-rapl").mkdir(parents=True)  # the control type, not a zone
    return {
        "pkg0": make_zone(root, "intel-rapl:0", "package-0", 1_000_000),
        "core0": make_zone(root, "intel-rapl:0:0", "core", 500_000),
        "dram0": make_zone(root, "intel-rapl:0:1", "dram", 200_000, max_uj=65712999613),
        "pkg1": make_zone(root, "intel-rapl:1", "package-1", 3_000_000),
        "root": root,
    }


def test_finds_packages_and_dram_not_core(tree: dict[str, Path]) -> None:
    reader = RaplReader(RaplSettings(root=tree["root"]))
    assert reader.describe() == "RAPL: dram-0, package-0, package-1"
    samples = reader.read()
    assert {s.component: s.energy_j for s in samples} == {
        "package-0": 1.0,
        "dram-0": 0.2,
        "package-1": 3.0,
    }
    assert all(s.source is PowerSource.RAPL and s.watts is None for s in samples)


def test_nested_subzones_are_found(tmp_path: Path) -> None:
    """Some kernels show the DRAM subzone only inside its package's directory."""
    root = tmp_path / "powercap"
    pkg = make_zone(root, "intel-rapl:0", "package-0", 10)
    make_zone(pkg, "intel-rapl:0:2", "dram", 20)
    assert RaplReader(RaplSettings(root=root)).describe() == "RAPL: dram-0, package-0"


def test_wrap_around_mid_interval_is_undone(tree: dict[str, Path]) -> None:
    pkg = tree["pkg0"]
    max_uj = 1_000_000_000  # wraps at 1000 J
    (pkg / "max_energy_range_uj").write_text(f"{max_uj}\n")
    set_energy(pkg, 999_000_000)  # 999 J
    reader = RaplReader(RaplSettings(root=tree["root"]))

    def package() -> float:
        (s,) = [s for s in reader.read() if s.component == "package-0"]
        assert s.energy_j is not None
        return s.energy_j

    first = package()
    assert first == 999.0
    set_energy(pkg, 500_000)  # +1 J to the wrap, then 0.5 J: 1.5 J in the interval
    second = package()
    assert second - first == pytest.approx(1.5)
    set_energy(pkg, 2_500_000)  # +2 J, no wrap
    third = package()
    assert third - second == pytest.approx(2.0)
    assert third == pytest.approx(1002.5)  # monotonic: 999 + 1.5 + 2
    set_energy(pkg, 100)  # a second wrap: 1000 J - 2.5 J + 0.0001 J
    assert package() - third == pytest.approx(997.5001)


def test_no_zones_reads_nothing(tmp_path: Path) -> None:
    reader = RaplReader(RaplSettings(root=tmp_path / "nothing-here"))
    assert reader.describe().startswith("RAPL: no package or dram zones under ")
    assert reader.read() == []


def test_garbage_counter_is_a_one_line_error(tree: dict[str, Path]) -> None:
    reader = RaplReader(RaplSettings(root=tree["root"]))
    set_energy(tree["dram0"], 0)
    (tree["dram0"] / "energy_uj").write_text("not a number\n")
    with pytest.raises(SourceError) as err:
        reader.read()
    assert "intel-rapl:0:1/energy_uj" in str(err.value) and "\n" not in str(err.value)


def test_vanished_counter_names_the_file(tree: dict[str, Path]) -> None:
    reader = RaplReader(RaplSettings(root=tree["root"]))
    (tree["pkg1"] / "energy_uj").unlink()
    with pytest.raises(SourceError, match=r"rapl: cannot read .*intel-rapl:1/energy_uj"):
        reader.read()


def _assert_permission_message(message: str, path: Path) -> None:
    assert message.startswith(f"rapl: cannot read {path}: permission denied")
    assert "root" in message and "udev rule" in message and "CVE-2020-8694" in message
    assert "\n" not in message


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores file modes; see the nobody test")
def test_unreadable_counter_names_the_permission(tree: dict[str, Path]) -> None:
    reader = RaplReader(RaplSettings(root=tree["root"]))
    counter = tree["pkg0"] / "energy_uj"
    counter.chmod(0)
    with pytest.raises(SourceError) as err:
        reader.read()
    _assert_permission_message(str(err.value), counter)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop to the nobody user")
def test_unreadable_counter_as_nobody() -> None:
    """As root, a forked child that drops to `nobody` reads a root-only (0400) counter,
    which is how `energy_uj` ships since Linux 5.10: the kernel refuses it for real."""
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o755)
        root = Path(tmp) / "powercap"
        zone = make_zone(root, "intel-rapl:0", "package-0", 42)
        for p in (root, zone):
            p.chmod(0o755)
        for f in zone.iterdir():
            f.chmod(0o444)
        (zone / "energy_uj").chmod(stat.S_IRUSR)  # root-only
        reader_fd, writer_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns into pytest
            code = 1
            try:
                os.close(reader_fd)
                os.setgid(65534)
                os.setuid(65534)
                reader = RaplReader(RaplSettings(root=root))
                lines = [reader.describe()]
                try:
                    reader.read()
                    lines.append("read succeeded")
                except SourceError as exc:
                    lines.append(str(exc))
                os.write(writer_fd, "\n".join(lines).encode())
                code = 0
            finally:
                os._exit(code)
        os.close(writer_fd)
        with os.fdopen(reader_fd) as pipe:
            out = pipe.read()
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, out
        describe, message = out.splitlines()
        assert describe == "RAPL: package-0"  # found: only the counter is root-only
        _assert_permission_message(message, zone / "energy_uj")


def test_read_cost(tree: dict[str, Path]) -> None:
    """A read of three zones stays well under a millisecond (median of 200)."""
    reader = RaplReader(RaplSettings(root=tree["root"]))
    median = median_us(reader.read, 200)
    print(f"RaplReader.read median {median:.1f} us for 3 zones")
    assert median < 5000
