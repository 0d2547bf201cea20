"""`dcgmi diag -j` output as DCGM writes it (3.x: `"DCGM GPU Diagnostic"`, results with
`gpu_ids`; 4.x: `"DCGM Diagnostic"`, results with `entity_group`/`entity_id`), parsed into
the validation's checks."""

from __future__ import annotations

import json

from agents.gpu.validate import parse_dcgm_diag
from schemas.recovery import CheckStatus

DCGM3_PASS = {
    "DCGM GPU Diagnostic": {
        "test_categories": [
            {
                "category": "Deployment",
                "tests": [
                    {"name": "Denylist", "results": [{"status": "Pass"}]},
                    {"name": "NVML Library", "results": [{"status": "Pass"}]},
                ],
            },
            {
                "category": "Integration",
                "tests": [
                    {
                        "name": "PCIe",
                        "results": [
                            {"gpu_ids": "0", "status": "Skip"},
                            {"gpu_ids": "1", "status": "Pass"},
                        ],
                    }
                ],
            },
        ],
        "version": "3.3.5",
    }
}

DCGM3_FAIL = {
    "DCGM GPU Diagnostic": {
        "test_categories": [
            {
                "category": "Hardware",
                "tests": [
                    {
                        "name": "GPU Memory",
                        "results": [
                            {"gpu_ids": "0", "status": "Pass"},
                            {
                                "gpu_ids": "3",
                                "status": "Fail",
                                "warnings": [
                                    {
                                        "warning": "Pending page retirements detected on GPU 3",
                                        "error_id": 83,
                                        "error_category": 5,
                                        "error_severity": 2,
                                    }
                                ],
                            },
                        ],
                    }
                ],
            }
        ],
        "version": "3.3.5",
    }
}

DCGM4_FAIL = {
    "DCGM Diagnostic": {
        "test_categories": [
            {
                "category": "Deployment",
                "tests": [
                    {
                        "name": "software",
                        "results": [
                            {
                                "entity_group": "GPU",
                                "entity_group_id": 1,
                                "entity_id": 0,
                                "status": "Pass",
                            },
                            {
                                "entity_group": "GPU",
                                "entity_group_id": 1,
                                "entity_id": 5,
                                "status": "Fail",
                                "warnings": [{"warning": "GPU 5 is lost"}],
                            },
                        ],
                        "test_summary": {"status": "Fail"},
                    }
                ],
            }
        ],
        "version": "4.2.3",
    }
}


def test_a_passing_dcgm3_diag_passes() -> None:
    assert parse_dcgm_diag(json.dumps(DCGM3_PASS)) == ("pass", [])


def test_a_failed_result_names_its_gpu_and_warning() -> None:
    status, checks = parse_dcgm_diag("Successfully ran diagnostic.\n" + json.dumps(DCGM3_FAIL))
    assert status == "fail"
    assert [(c.name, c.gpu, c.status) for c in checks] == [("dcgm GPU Memory", 3, CheckStatus.FAIL)]
    assert "Pending page retirements" in checks[0].detail


def test_dcgm4_entities() -> None:
    status, checks = parse_dcgm_diag(json.dumps(DCGM4_FAIL))
    assert status == "fail"
    assert [(c.name, c.gpu) for c in checks] == [("dcgm software", 5)]


def test_a_runtime_error_or_no_json_is_an_error() -> None:
    status, checks = parse_dcgm_diag(
        json.dumps({"DCGM GPU Diagnostic": {"runtime_error": "host engine not running"}})
    )
    assert status == "error" and "host engine" in checks[0].detail
    assert parse_dcgm_diag("Error: unable to connect")[0] == "error"
